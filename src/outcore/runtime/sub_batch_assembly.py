"""What a split step hands back besides parameter gradients: the model's kept outputs
(``outputs=True``), the gradients of batch tensors that require grad, and the new values of
batch tensors the forward changed in place (``x.mul_(0.5)``), assembled from each
sub-batch's into the whole batch's (``runtime.subbatch.run_sub_batches``).

Invariants:

* While the sub-batches run, each one's outputs and input gradients wait in host memory
  (``park``): the device holds no more than the plan of one sub-batch counted.
* Input gradients: sub-batch ``i``'s loss enters the step's loss with weight ``w_i``
  (``runtime.loss_split``) and reads only its own rows, so the full batch's gradient with
  respect to those rows is ``w_i`` times the sub-batch's. They are concatenated along each
  tensor's batch dimension (the one the batch was split along) and reach the user's
  tensors' ``.grad`` with the parameters' gradients, in one commit, as ``loss.backward()``
  fills them. They must land on the tensor's device: when the whole batch's do not fit
  beside what the step holds at its end without raising its peak, the step is refused
  before anything runs (``AfterStep``).
* In-place changes of batch tensors: each sub-batch's new rows, concatenated, are written
  into the user's tensor in the same commit, as eager's forward leaves it.
* Kept outputs: concatenated along the batch dimension ``outcore.graph.batch_dims`` proved
  when the sub-batch graph was captured (``graph.meta["output_dims"]``); a copy of the loss
  is the step's loss; an output no sample reaches is the first sub-batch's. They come back
  on the device when they fit beside the step's end (with the input gradients) within its
  peak, else in host memory (the Trainer says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch.utils._pytree import tree_flatten

from outcore.errors import UnsupportedModelError
from outcore.graph.batch_dims import (
    INPUT_GRAD,
    KEPT_OUTPUT,
    LOSS_COPY,
    UNASSEMBLED,
    input_batch_dims,
)
from outcore.graph.ir import Graph
from outcore.plan.memory import memory_curve
from outcore.plan.schedule import Schedule
from outcore.runtime.executor import INPUT_PREFIX, Executor, StepResult
from outcore.units import format_bytes


@dataclass(frozen=True)
class AfterStep:
    """What the device can take at the end of a split step without raising its peak (the
    plan's, by the memory rule): the whole batch's input gradients must fit
    (``input_grads_fit``), and the kept outputs come back on the device when they fit
    beside them (``outputs_on_device``)."""

    outputs_on_device: bool
    input_grads_fit: bool
    input_grad_bytes: int
    room: int
    #: the step keeps the model's outputs (``outputs=True``)
    keeps_outputs: bool = False


#: per executor, per split count: its ``AfterStep`` (computed once)
_AFTER: WeakKeyDictionary[Executor, dict[int, AfterStep]] = WeakKeyDictionary()


def room_after(graph: Graph, schedule: Schedule, parts: int) -> AfterStep:
    """``AfterStep`` of ``schedule`` (one sub-batch of ``graph``) split in ``parts``: one
    replay of the memory rule. Each sub-batch's share is one ``parts``-th of the whole
    batch's, the most any split gives."""
    kept_outputs = [t for t in graph.tensors if t.source.startswith(KEPT_OUTPUT)]
    kept = sum(t.nbytes for t in kept_outputs)
    grads = sum(t.nbytes for t in graph.tensors if t.source.startswith(INPUT_GRAD))
    trace = memory_curve(graph, schedule)
    room = trace.peak - (trace.device[-1] if trace.device else 0)
    return AfterStep(outputs_on_device=parts * (kept + grads) <= room,
                     input_grads_fit=parts * grads <= room,
                     input_grad_bytes=parts * grads, room=room,
                     keeps_outputs=bool(kept_outputs))


def after_step(executor: Executor, parts: int) -> AfterStep:
    """``room_after`` for ``executor``'s schedule, computed once per executor and split."""
    known = _AFTER.setdefault(executor, {})
    if parts not in known:
        known[parts] = room_after(executor.graph, executor.schedule, parts)
    return known[parts]


#: Plans ``with_room_for_input_grads`` makes for smaller budgets before it gives up.
ROOM_TRIES = 3


def with_room_for_input_grads(planned: Any, budget: int, plan_for: Callable[[int], Any],
                              unsplit: Callable[[int], Any]) -> Any:
    """A plan (``PlannedStep``) whose split step leaves room at its end for the whole
    batch's input gradients within its peak (``AfterStep.input_grads_fit``): when
    ``planned``'s does not, the step is planned again for the budget less the shortfall,
    up to ``ROOM_TRIES`` times, and the plan that leaves it is returned with a note; when
    none does, the step unsplit (``unsplit(budget)``, whose refusal names the least budget
    that holds the whole batch). Invariant: the result does not split, or its split
    step's input gradients fit."""
    from outcore.errors import InfeasibleBudgetError

    target = budget
    for tries in range(ROOM_TRIES + 1):
        parts = planned.plan.sub_batches
        if parts == 1:
            return planned
        after = room_after(planned.graph, planned.schedule, parts)
        if after.input_grads_fit:
            if target != budget:
                planned.notes.append(
                    f"planned for {format_bytes(target)} so that the whole batch's input "
                    f"gradients ({format_bytes(after.input_grad_bytes)}) fit on the device "
                    f"at the end of the split step within the budget of "
                    f"{format_bytes(budget)}")
            return planned
        target -= after.input_grad_bytes - after.room
        if tries == ROOM_TRIES or target <= 0:
            break
        try:
            planned = plan_for(target)
        except InfeasibleBudgetError:
            break
    try:
        return unsplit(budget)
    except InfeasibleBudgetError as exc:
        grads = format_bytes(room_after(planned.graph, planned.schedule,
                                        planned.plan.sub_batches).input_grad_bytes)
        out = InfeasibleBudgetError(
            exc.policy, exc.budget, exc.required,
            f"No plan of the whole batch fits, and sub-batches were tried: a batch tensor "
            f"requires grad, and no split step of this budget (plans for budgets down to "
            f"{format_bytes(target)}) left room at its end for the whole batch's input "
            f"gradients ({grads}), which land on the device as eager's do. Raise the budget "
            f"to {format_bytes(exc.required)}, shrink the batch, or step a batch that does "
            "not require grad.")
        out.lowest = exc.lowest
        raise out from exc


def unassembled(graph: Graph) -> list[int]:
    """Kept model outputs (positions) that sub-batches cannot assemble (statistics of the
    batch, ``batch_dims.UNASSEMBLED``): the step gives None in their places."""
    dims = graph.meta.get("output_dims", {})
    return sorted(int(k) for k, how in dims.items() if how == UNASSEMBLED)


def park(t: torch.Tensor) -> torch.Tensor:
    """A part held in host memory while later sub-batches run (the device's copy freed); a
    tensor already in host memory (cpu, the emulated devices) as it is."""
    return t if t.device.type == "cpu" else t.to("cpu")


class Assembly:
    """Collects each sub-batch's kept outputs and weighted input gradients, parked, and
    assembles the whole batch's (module doc). Built before anything runs: it refuses what
    cannot be assembled, so a refusal changes nothing."""

    def __init__(self, executor: Executor, batch: Any, parts: int,
                 dims: Sequence[int] | None) -> None:
        graph = executor.graph
        self.after = after_step(executor, parts)  # once per executor: no walk per step
        if self.after.keeps_outputs and "output_dims" not in graph.meta:
            raise UnsupportedModelError(
                f"graph {graph.name!r} keeps the model's outputs, but how to assemble them "
                "from sub-batches was not proven when it was captured (a sub-batch graph "
                "made outside moDNN's re-capture); nothing was run. Plan it with "
                "allow_sub_batches=True or policy='modnn', or drop outputs=True")
        self.graph = graph
        self.tensors = [leaf for leaf in tree_flatten(batch)[0] if isinstance(leaf, torch.Tensor)]
        if any(t.requires_grad for t in self.tensors) and not self.after.input_grads_fit:
            raise UnsupportedModelError(
                f"a batch tensor requires grad and the step is split into {parts} "
                f"sub-batches: the whole batch's input gradients "
                f"({format_bytes(self.after.input_grad_bytes)}) do not fit on the device "
                f"beside what the step holds at its end without raising its peak (room: "
                f"{format_bytes(self.after.room)}); nothing was run. Give a larger budget, or "
                "pass allow_sub_batches=False.")
        self.dims = input_batch_dims([t.shape for t in self.tensors], None, dims).dims
        self.kept: list[dict[int, torch.Tensor]] = []
        self.grads: list[dict[int, torch.Tensor]] = []
        self.updates: list[dict[int, torch.Tensor]] = []

    def add(self, result: StepResult, weight: float) -> None:
        """Park ``result``'s outputs, its input gradients times ``weight`` (zeros for a
        weight of 0: its loss, and so its gradients, are 0 / 0) and its batch tensors' new
        values, and take them out of ``result`` (its ``buffers`` keep the module's)."""
        self.kept.append({k: park(t) for k, t in result.outputs.items()})
        with torch.no_grad():
            self.grads.append({i: park(g * weight if weight else torch.zeros_like(g))
                               for i, g in result.input_grads.items()})
        self.updates.append({int(n.removeprefix(INPUT_PREFIX)): park(t)
                             for n, t in result.buffers.items() if n.startswith(INPUT_PREFIX)})
        result.outputs, result.input_grads = {}, {}
        result.buffers = {n: t for n, t in result.buffers.items()
                          if not n.startswith(INPUT_PREFIX)}

    def inputs(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor],
                              dict[str, torch.Tensor]]:
        """The whole batch's input gradients, the batch tensors' new values, and the tensors
        they go to, by ``StepResult`` name (``input:<index>``), on each tensor's device."""
        targets: dict[str, torch.Tensor] = {}

        def whole(parts: list[dict[int, torch.Tensor]]) -> dict[str, torch.Tensor]:
            out = {}
            for i in (parts[0] if parts else {}):
                joined = torch.cat([part[i] for part in parts], dim=self.dims[i])
                out[f"{INPUT_PREFIX}{i}"] = joined.to(self.tensors[i].device)
                targets[f"{INPUT_PREFIX}{i}"] = self.tensors[i]
            return out

        grads, updates = whole(self.grads), whole(self.updates)
        return grads, updates, targets

    def outputs(self, loss: torch.Tensor) -> dict[int, torch.Tensor]:
        """The whole batch's kept outputs (``assemble_outputs``), on the loss's device when
        they fit there (``AfterStep.outputs_on_device``), else in host memory."""
        out = assemble_outputs(self.graph, self.kept, loss)
        if self.after.outputs_on_device:
            out = {k: t.to(loss.device) for k, t in out.items()}
        return out


def assemble_outputs(graph: Graph | Any, kept: Sequence[dict[int, torch.Tensor]],
                     loss: torch.Tensor) -> dict[int, torch.Tensor]:
    """The whole batch's kept model outputs from each sub-batch's, by position, as
    ``graph.meta["output_dims"]`` says (``outcore.graph.batch_dims``: proven when the
    sub-batch graph was captured): concatenated along the batch dimension; a copy of the
    loss is the step's loss (``loss``: the sub-batches' weighted sum, as the caller
    computed it); an output that no sample reaches (parameters only) is the first
    sub-batch's, equal in all; a statistic of the batch is left out (the model's output
    gets None in its place). In host memory when the parts were."""
    if not kept or not kept[0]:
        return {}
    dims = graph.meta["output_dims"]
    out: dict[int, torch.Tensor] = {}
    for k in kept[0]:
        how = dims.get(str(k))
        if how == UNASSEMBLED:
            continue  # a statistic of the batch: given as None (``unassembled``)
        if how == LOSS_COPY:
            out[k] = loss.detach().to(kept[0][k].device).to(kept[0][k].dtype)
        elif how is None:
            out[k] = kept[0][k]
        else:
            out[k] = torch.cat([part[k] for part in kept], dim=int(how))
    return out

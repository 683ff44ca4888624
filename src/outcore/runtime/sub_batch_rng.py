"""Random ops under sub-batches draw what eager PyTorch draws for the whole batch.

Eager PyTorch runs each random op of a step once, on the whole batch: dropout draws one
``(N, ...)`` mask. A step split into ``k`` sub-batches runs the op ``k`` times on ``N / k``
samples; drawing per sub-batch gives other masks than eager for the same seed (and other
gradients). ``SubBatchRandom`` makes sub-batch ``i`` use *rows ``i`` of eager's draw*:

* In sub-batch 0, the first time op ``o`` runs, the generator is exactly where eager's is
  before ``o`` (forward ops run in the traced order, and nothing else draws): its state is
  recorded, and the op is called once on full-batch inputs (each batch-scaled input repeated
  ``k`` times along its batch dimension; a factory's size scaled), which advances the
  generator as eager's call does. Sub-batch 0 keeps rows ``0`` of the outputs.
* Any later call of ``o`` (a later sub-batch, or a recompute) sets the recorded state, calls
  the op on full-batch inputs again, keeps its sub-batch's rows and puts the generator back.
  After the step the generator is where eager leaves it.

Exact for random ops whose output row ``j`` depends only on input row ``j`` and the draw
(``EXACT`` below: dropout, bernoulli, ``rand*``/``randn*`` and the other elementwise
distributions). Cost: each call computes the op on the full batch, a transient of the op's
full-batch inputs and outputs (``draw_transient``) that the memory tracker counts and the
plan does not; it is done only where that does not raise the step's peak (``draw_peak``),
so the measured peak stays the predicted one.
A step with another random op (``randperm``, ``multinomial``, attention with dropout), whose
batch dimensions were not proven (``outcore.graph.batch_dims``, recorded by moDNN's
re-capture as ``graph.meta["random_scales"]``), or whose schedule runs random ops out of the
traced order, draws per sub-batch instead; ``why_not`` says why, and the note shown by
``explain()`` and ``trainer.stats.notes`` says so (``outcore.sub_batching.note``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._prims_common import (
    compute_elementwise_output_logical_to_physical_perm,
    is_non_overlapping_and_dense_or_false,
)

from outcore.capture.step import CapturedStep
from outcore.errors import SubBatchWarning
from outcore.graph.ir import Graph, Phase
from outcore.log import announce
from outcore.plan.memory import memory_curve
from outcore.plan.residency import default_workspace
from outcore.plan.schedule import Compute, Schedule
from outcore.units import format_bytes

#: Target name fragments of random ops whose rows of one draw are eager's (module docstring).
EXACT = ("native_dropout", "bernoulli", "rand_like", "randn_like", "randint_like",
         "aten.rand.", "aten.randn.", "aten.randint.", "normal", "uniform", "exponential",
         "geometric", "log_normal", "cauchy")


def exact_op(target: str) -> bool:
    """True for a random op whose sub-batch rows can be eager's (``EXACT``)."""
    return any(k in target for k in EXACT) and "backward" not in target


def random_ops(graph: Graph) -> list[int]:
    """Forward random ops of ``graph``, in traced order."""
    return [op.id for op in graph.ops if op.random and op.phase is Phase.FORWARD]


def why_not(graph: Graph, schedule: Schedule) -> str | None:
    """Why sub-batches of this step cannot draw eager's random numbers, or None."""
    ops = random_ops(graph)
    if not ops:
        return None
    others = [graph.ops[o].target for o in ops if not exact_op(graph.ops[o].target)]
    if others:
        return f"random op {others[0]} does not draw row by row"
    if "random_scales" not in graph.meta:
        return "the batch dimensions of its random ops were not proven"
    first: list[int] = []
    for ins in schedule.instructions:
        if isinstance(ins, Compute) and not ins.recompute and ins.op in ops \
                and ins.op not in first:
            first.append(ins.op)
    if first != ops:
        return "the schedule runs its random ops in another order than eager"
    return None


@dataclass
class _OpPlan:
    """How to call one random op on the full batch and cut its sub-batch rows."""

    arg_dims: dict[int | str, int]  # argument position/keyword -> batch dim of that tensor
    size_args: dict[int | str, int]  # factory size argument -> the dimension to scale
    out_dims: list[int | None]  # per output slot: batch dim (None: does not scale)
    out_layout: list[tuple[tuple[int, ...], tuple[int, ...]] | None]  # sub shape, stride


@dataclass
class SubBatchRandom:
    """Installed once on an executor; ``step(parts)`` then ``sub_batch(i)`` per sub-batch."""

    parts: int = 1
    index: int = -1  # -1: not inside a sub-batched step, ops run as they are
    states: dict[int, Any] = field(default_factory=dict)
    plans: dict[int, _OpPlan] = field(default_factory=dict)

    def begin_step(self, parts: int) -> None:
        self.parts, self.states = parts, {}

    def sub_batch(self, index: int) -> None:
        self.index = index

    def end_step(self) -> None:
        self.index, self.states = -1, {}

    def wrap(self, oid: int, real: Callable[..., Any]) -> Callable[..., Any]:
        def draw(*args: Any, **kwargs: Any) -> Any:
            if self.index < 0:
                return real(*args, **kwargs)
            return self._draw(oid, real, args, kwargs)

        return draw

    def _draw(self, oid: int, real: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        plan = self.plans[oid]
        full_args = [self._full(plan, k, a) for k, a in enumerate(args)]
        full_kwargs = {k: self._full(plan, k, a) for k, a in kwargs.items()}
        if self.index == 0 and oid not in self.states:
            self.states[oid] = _get_state()
            out = real(*full_args, **full_kwargs)
        else:
            current = _get_state()
            _set_state(self.states[oid])
            try:
                out = real(*full_args, **full_kwargs)
            finally:
                _set_state(current)
        del full_args, full_kwargs
        if isinstance(out, (tuple, list)):
            return type(out)(self._rows(plan, j, o) for j, o in enumerate(out))
        return self._rows(plan, 0, out)

    def _full(self, plan: _OpPlan, key: int | str, value: Any) -> Any:
        if key in plan.arg_dims and isinstance(value, torch.Tensor):
            return full_batch(value, self.parts, plan.arg_dims[key])
        if key in plan.size_args:
            size = list(value)
            size[plan.size_args[key]] *= self.parts
            return size
        return value

    def _rows(self, plan: _OpPlan, slot: int, value: Any) -> Any:
        d = plan.out_dims[slot] if slot < len(plan.out_dims) else None
        layout = plan.out_layout[slot] if slot < len(plan.out_layout) else None
        if d is None or layout is None or not isinstance(value, torch.Tensor):
            return value
        shape, stride = layout
        rows = value.narrow(d, self.index * shape[d], shape[d])
        out = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
        return out.copy_(rows)


def full_batch(value: torch.Tensor, parts: int, dim: int) -> torch.Tensor:
    """``value`` repeated ``parts`` times along ``dim``, laid out in memory as eager lays
    out the full batch's tensor: its dimensions in ``value``'s order.

    A random op draws in memory order (dropout's mask is ``empty_like(input)``, filled
    element by element as stored), so a full batch laid out otherwise than eager's gets
    other masks: ``torch.cat`` alone makes a contiguous tensor, and a batch-first view of a
    time-major tensor (an RNN's output, ``(B, T, H)`` with strides ``(H, B*H, 1)``) drew
    another mask than eager's. Invariant: a dense ``value``'s result has its dimension
    order (torch's own ``empty_like`` rule); a tensor that is not dense (``empty_like``
    gives it a contiguous mask) gets a contiguous one. One allocation of the full batch.
    """
    if value.is_contiguous() or not is_non_overlapping_and_dense_or_false(value):
        return torch.cat([value] * parts, dim=dim)
    order, _ = compute_elementwise_output_logical_to_physical_perm(value)
    shape = list(value.shape)
    shape[dim] *= parts
    laid = torch.empty_permuted(shape, order, dtype=value.dtype, device=value.device)
    return torch.cat([value] * parts, dim=dim, out=laid)


#: executor -> its SubBatchRandom (None: its random ops draw per sub-batch), once prepared
_INSTALLED: weakref.WeakKeyDictionary[Any, SubBatchRandom | None] = weakref.WeakKeyDictionary()


def install(executor: Any, parts: int) -> SubBatchRandom | None:
    """The executor's ``SubBatchRandom``, installed on first use (``prepare``)."""
    if executor not in _INSTALLED:
        prepare(executor, parts)
    return _INSTALLED[executor]


def prepare(executor: Any, parts: int) -> str | None:
    """Install eager-equal random draws on ``executor`` (run ``parts`` sub-batches) where
    possible, and return what its random ops do under sub-batches (None: it has none).

    Not possible (``why_not``, or the full-batch draws would raise the step's peak:
    ``draw_peak`` above the plan's): the ops draw per sub-batch, which is warned."""
    graph, schedule = executor.graph, executor.schedule
    _INSTALLED[executor] = None
    ops = random_ops(graph)
    if not ops:
        return None
    names = ", ".join(sorted({graph.ops[o].target.removeprefix("aten.") for o in ops}))
    reason = why_not(graph, schedule)
    if reason is None:
        peak, plain = draw_peak(graph, schedule, parts), _plain_peak(graph, schedule)
        if peak > plain:
            reason = (f"drawing for the full batch would raise the step's peak from "
                      f"{format_bytes(plain)} to {format_bytes(peak)}")
    if reason is not None:
        text = (f"{len(ops)} random ops ({names}) draw per sub-batch ({reason}): their masks "
                "and gradients differ from eager PyTorch's for the same seed")
        announce(text, SubBatchWarning, stacklevel=4)
        return text
    rng = SubBatchRandom()
    scales = {int(t): int(d) for t, d in graph.meta["random_scales"].items()}
    step = graph.source
    assert isinstance(step, CapturedStep)
    for oid in ops:
        rng.plans[oid] = _op_plan(graph, step, oid, scales)
    executor.replace_ops({oid: rng.wrap(oid, executor.kernel(oid)) for oid in ops})
    _INSTALLED[executor] = rng
    return (f"{len(ops)} random ops ({names}) draw the full batch's random numbers and keep "
            "each sub-batch's rows: the same masks as eager PyTorch for the same seed")


def _plain_peak(graph: Graph, schedule: Schedule) -> int:
    return memory_curve(graph, schedule).peak


def draw_transient(graph: Graph, oid: int, parts: int) -> int:
    """Bytes a full-batch draw of random op ``oid`` holds beside the op's own outputs: its
    batch-scaled inputs repeated ``parts`` times and its batch-scaled outputs at the full
    batch (``graph.meta["random_scales"]``)."""
    scales = graph.meta.get("random_scales", {})
    op = graph.ops[oid]
    scaled = [t for t in (*op.inputs, *op.outputs) if str(t) in scales]
    return parts * sum(graph.tensors[t].nbytes for t in scaled)


def draw_peak(graph: Graph, schedule: Schedule, parts: int) -> int:
    """The step's peak device bytes when its random ops draw for the full batch: the plan's
    memory curve with each random op's ``draw_transient`` as workspace."""
    base = default_workspace(graph, schedule)
    extra = {oid: draw_transient(graph, oid, parts) for oid in random_ops(graph)}
    return memory_curve(graph, schedule,
                        lambda o: (base(o) if base is not None else 0) + extra.get(o, 0)).peak


def _op_plan(graph: Graph, step: CapturedStep, oid: int, scales: dict[int, int]) -> _OpPlan:
    node = step.op_nodes[oid]
    op = graph.ops[oid]
    out_dims = [scales.get(t) for t in op.outputs]
    vals = node.meta.get("val")
    vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
    layouts = [(tuple(v.shape), tuple(v.stride())) if isinstance(v, torch.Tensor) else None
               for v in vals]
    arg_dims: dict[int | str, int] = {}
    size_args: dict[int | str, int] = {}
    first_shape = layouts[0][0] if layouts and layouts[0] is not None else None
    items: list[tuple[int | str, Any]] = [*enumerate(node.args), *node.kwargs.items()]
    for key, arg in items:
        if isinstance(arg, fx.Node):
            tid = step.nodes.node_tensors.get(arg)
            if tid is not None and tid in scales:
                arg_dims[key] = scales[tid]
        elif isinstance(arg, (list, tuple)) and first_shape is not None and out_dims \
                and out_dims[0] is not None and tuple(arg) == first_shape:
            size_args[key] = out_dims[0]
    return _OpPlan(arg_dims, size_args, out_dims, layouts)


def _get_state() -> Any:
    from outcore.runtime.executor import rng_state

    return rng_state()


def _set_state(state: Any) -> None:
    from outcore.runtime.executor import set_rng_state

    set_rng_state(state)

"""What a weights placement moved, what it costs, and why: ``WeightReport``.

Plain Python (no torch). Built from a ``WeightChoice`` and the memory rule's host curve of
its Schedule; ``PlannedStep.weights`` holds it, ``explain()`` and ``outcore explain`` print
its rows, ``outcore plan`` its summary.

Host memory (``HOST_KEYS``; ``outcore plan --json``'s ``weights`` and ``outcore run
--json`` report these keys with these meanings, ``host_memory``): ``host_bytes``, all the
host memory outcore holds for the step, is ``host_copies + host_state``:

* ``host_copies``: the step's host copies at their peak (the held weights, the sent
  gradients, the offloaded activations: the schedule's host peak by the memory rule);
* ``host_state``: the optimizer state in host memory, stepped by the CPU, pageable: the
  held parameters' state, and every fp32 master with its state (``MasterWeights``, or a
  named spec on bf16/fp16 parameters), which lives there whatever the placement.

Only the copies are DMA sources or targets, so only they are pinned: ``pinned`` is what a
pinned pool reserving each copy at ``PINNED_ALIGNMENT`` holds (``CudaDevice.reserve_host``'s
rule), and ``pinned_ratio = pinned / host_copies`` (at most 1.05 for the zoo's Llamas:
tested). ``device_state`` is the optimizer state on the device, beside the step's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from outcore.graph.ir import Graph
from outcore.plan.schedule import Offload, Schedule
from outcore.units import format_bytes

#: the memory keys of a weights plan, named and meant alike in plan and run JSON (module doc)
HOST_KEYS = ("device_state", "host_bytes", "host_copies", "host_state", "pinned")
#: bytes each pinned host copy is aligned to (``outcore.runtime.devices.cuda.HOST_ALIGNMENT``)
PINNED_ALIGNMENT = 64


def align_up(n: int, alignment: int = PINNED_ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


@dataclass
class WeightReport:
    """The weights side of a ``PlannedStep`` planned with an optimizer (module doc).

    Seconds: ``step_seconds`` the simulated forward+backward, ``optimizer_seconds`` the
    optimizer step, ``total_seconds`` both; ``lower_bound`` (seconds, joint) and ``gap``
    when a cost model was given. Bytes (module doc): ``device_state`` (optimizer state on
    the device, counted in the budget), ``host_copies``, ``host_state``, ``host_bytes``
    (their sum: the host memory the step needs), ``pinned``."""

    optimizer: str
    mode: str
    held: list[str]
    parameters: int
    held_weights: int
    weights: int
    sent_gradients: int
    device_state: int
    host_copies: int
    host_state: int
    pinned: int
    step_seconds: float
    optimizer_seconds: float
    lower_bound: float | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return self.step_seconds + self.optimizer_seconds

    @property
    def host_bytes(self) -> int:
        return self.host_copies + self.host_state

    @property
    def pinned_ratio(self) -> float:
        """Pinned bytes over the host copies' bytes (1.0 when nothing is copied)."""
        return self.pinned / self.host_copies if self.host_copies else 1.0

    @property
    def gap(self) -> float | None:
        if self.lower_bound is None or self.lower_bound <= 0:
            return None
        return self.total_seconds / self.lower_bound - 1.0

    def summary(self) -> str:
        """One sentence: what is held where and what the step costs."""
        moved = (f"{len(self.held)} of {self.parameters} parameters "
                 f"({format_bytes(self.held_weights)} of {format_bytes(self.weights)} "
                 f"weights) held in host memory with their gradients and {self.optimizer} "
                 f"state" if self.held else
                 f"all {self.parameters} parameters, their gradients and {self.optimizer} "
                 "state on the device")
        return (f"{moved}; host memory {format_bytes(self.host_bytes)} (pinned "
                f"{format_bytes(self.pinned)}), step {self.step_seconds * 1e3:.1f} ms + "
                f"optimizer {self.optimizer_seconds * 1e3:.1f} ms")

    def host_memory(self) -> dict[str, int]:
        """``HOST_KEYS`` -> bytes (module doc): what ``outcore run --json`` reports of the
        plan it trained under, as ``to_dict`` does for ``outcore plan --json``."""
        return {key: int(getattr(self, key)) for key in HOST_KEYS}

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "mode": self.mode, "held": list(self.held),
                "parameters": self.parameters, "held_weights": self.held_weights,
                "weights": self.weights, "sent_gradients": self.sent_gradients,
                "device_state": self.device_state, "host_copies": self.host_copies,
                "host_state": self.host_state, "host_bytes": self.host_bytes,
                "pinned": self.pinned, "pinned_ratio": self.pinned_ratio,
                "step_seconds": self.step_seconds,
                "optimizer_seconds": self.optimizer_seconds,
                "total_seconds": self.total_seconds, "lower_bound": self.lower_bound,
                "gap": self.gap, "candidates": list(self.lines)}


def pinned_bytes(graph: Graph, schedule: Schedule, host: list[int]) -> int:
    """Bytes a pinned pool holds for ``schedule``'s host copies: each held parameter and
    each Offload's storage (its bytes from the memory rule's ``host`` curve), aligned."""
    total = sum(align_up(graph.tensors[t].nbytes) for t in schedule.host_static)
    before = sum(graph.tensors[t].nbytes for t in schedule.host_static)
    for ins, now in zip(schedule.instructions, host, strict=False):
        if isinstance(ins, Offload):
            total += align_up(max(0, now - before))
        before = now
    return total


def build_report(graph: Graph, choice: Any, optimizer: str, mode: str,
                 host: list[int]) -> WeightReport:
    """The ``WeightReport`` of ``choice`` (a ``WeightChoice``); ``host``: the memory
    rule's host bytes after each instruction of its schedule."""
    held_ids = choice.placement.params
    facts = {f.name: f for f in getattr(choice, "facts", [])}
    held = sorted((graph.tensors[t].source.removeprefix("model.") for t in held_ids),
                  key=lambda n: (-facts[n].weight if n in facts else 0, n))
    rows = []
    for name in held:
        f = facts.get(name)
        if f is None:
            continue
        exposed = choice.exposed.get(name, 0.0)
        rows.append({"parameter": name, "bytes": f.weight, "size": format_bytes(f.weight),
                     "frees": f.freed, "where": "host",
                     "why": (f"frees {format_bytes(f.freed)} of the device (weight, gradient "
                             f"and {optimizer} state); prefetched before its forward and "
                             f"backward use ({f.h2d * 1e3:.3f} ms each, about "
                             f"{exposed * 1e3:.3f} ms not hidden by the compute before it); "
                             "gradient sent to host; optimizer step on the host")})
    weights = sum(f.weight for f in facts.values())
    return WeightReport(
        optimizer=optimizer, mode=mode, held=held, parameters=len(facts),
        held_weights=sum(graph.tensors[t].nbytes for t in held_ids), weights=weights,
        sent_gradients=len(choice.placement.grads), device_state=choice.device_state,
        host_copies=max(host, default=0), host_state=choice.host_state,
        pinned=pinned_bytes(graph, choice.schedule, host),
        step_seconds=choice.step_seconds, optimizer_seconds=choice.optimizer_seconds,
        lower_bound=choice.bound.seconds if choice.bound is not None else None,
        rows=rows, lines=choice.explain(graph))


def tokens_per_step(graph: Graph) -> int | None:
    """Tokens one step trains on: the elements of the graph's integer (batch, sequence)
    input, for a language model; None for another graph."""
    from outcore.graph.ir import TensorKind

    for t in graph.tensors:
        if t.kind is TensorKind.INPUT and len(t.shape) == 2 and "int" in t.dtype:
            return int(t.shape[0] * t.shape[1])
    return None

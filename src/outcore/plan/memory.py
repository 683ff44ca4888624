"""The one memory-accounting rule for a Schedule (plain Python): device bytes per instruction.

Both the predicted peak of a plan and the simulator's per-step memory use this rule, and the
executor's tracker measures the same quantity on real tensors. The rule is written once, in
``outcore.plan.residency`` (the replay, ``residency_steps``); ``memory_curve`` sums its
steps: the device bytes after each instruction (the peak of a Compute's transient workspace
and of a recompute's duplicates is included in that instruction's sample).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from outcore.graph.ir import Graph
from outcore.plan.residency import Step, residency_steps
from outcore.plan.schedule import Schedule


@dataclass
class MemoryTrace:
    """Device bytes after each instruction, the peak, and the host bytes after each."""

    device: list[int]
    host: list[int]
    live_tensors: list[int]
    static: int

    @property
    def peak(self) -> int:
        return max(self.device, default=self.static)

    @property
    def average(self) -> float:
        return sum(self.device) / len(self.device) if self.device else float(self.static)


def memory_curve(graph: Graph, schedule: Schedule,
                 workspace: Callable[[int], int] | None = None) -> MemoryTrace:
    """Replay ``schedule`` and return the device/host memory after each instruction.

    ``workspace(op_id)`` gives the transient bytes of an op's chosen variant; by default it
    is read from ``schedule.variants`` and each op's recorded ``variant_options``.
    The schedule is assumed verified (see ``outcore.plan.verify``).
    """
    return trace_of(residency_steps(graph, schedule, workspace))


def trace_of(steps: Iterable[Step]) -> MemoryTrace:
    """The MemoryTrace of ``residency_steps``' output (its first step is the static state)."""
    steps = iter(steps)
    static = next(steps).device
    device: list[int] = []
    host: list[int] = []
    live: list[int] = []
    for step in steps:
        device.append(step.device)
        host.append(step.host)
        live.append(step.tensors)
    return MemoryTrace(device, host, live, static)


def rounded_peak_bound(trace: MemoryTrace, granularity: int) -> int:
    """The most an allocator that rounds every allocation up to a multiple of
    ``granularity`` bytes can hold at once for ``trace``'s schedule: each instruction's
    device bytes plus ``granularity - 1`` for every tensor live after it (a live storage is
    at most that much larger than its bytes; views share a storage, so counting tensors
    over-counts, never under). Rounding only: CUDA's caching allocator also hands out large
    blocks unsplit, which ``outcore.plan.allocator_rounding.caching_allocator_bound`` counts."""
    if granularity <= 1:
        return trace.peak
    pad = granularity - 1
    return max((d + pad * n for d, n in zip(trace.device, trace.live_tensors, strict=True)),
               default=trace.static)


def predicted_peak(graph: Graph, schedule: Schedule,
                   workspace: Callable[[int], int] | None = None) -> int:
    """Peak device bytes of ``schedule`` under the rule above."""
    return memory_curve(graph, schedule, workspace).peak

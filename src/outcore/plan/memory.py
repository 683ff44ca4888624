"""The one memory-accounting rule for a Schedule (plain Python).

Both the predicted peak of a plan and the simulator's per-step memory use this rule, and the
executor's tracker measures the same quantity on real tensors:

* at the start, the storages of every static tensor (parameters, buffers, inputs, tangents)
  are resident;
* ``Compute`` makes its outputs resident; a storage is allocated when its first tensor
  becomes resident while the storage is not; the sample after a Compute includes every
  output (they all exist when the op returns), including a recompute's duplicates of
  outputs that are still resident (made, then dropped at once), plus the op's variant
  workspace, if any;
* ``Prefetch`` allocates the storage at issue time (its bytes are reserved while the copy
  runs); ``Wait(h2d)`` makes the tensor usable;
* ``Free`` drops one tensor; the storage is released when none of its tensors is resident
  (and, for a prefetched storage, no prefetch of it is pending);
* ``Offload`` and ``Wait(d2h)`` do not change device memory; host memory grows on Offload.

``memory_curve`` returns the device bytes after each instruction (the peak of a Compute's
transient workspace is included in that instruction's sample).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from outcore.graph.ir import STATIC_KINDS, Graph
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait


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
    if workspace is None and schedule.variants:
        chosen = schedule.variants

        def workspace(op_id: int) -> int:
            return graph.ops[op_id].variant_workspace(chosen.get(op_id, ""))

    tensors = graph.tensors
    resident_count: dict[int, int] = {}  # storage -> resident tensors of it
    resident: set[int] = set()
    live = 0
    for t in tensors:
        if t.kind in STATIC_KINDS:
            resident.add(t.id)
            if resident_count.get(t.storage, 0) == 0:
                live += tensors[t.storage].nbytes
            resident_count[t.storage] = resident_count.get(t.storage, 0) + 1
    static = live
    host = 0
    device_curve: list[int] = []
    host_curve: list[int] = []
    live_curve: list[int] = []

    def make_resident(tid: int) -> int:
        nonlocal live
        if tid in resident:
            return 0
        resident.add(tid)
        storage = tensors[tid].storage
        count = resident_count.get(storage, 0)
        resident_count[storage] = count + 1
        if count == 0:
            live += tensors[storage].nbytes
            return tensors[storage].nbytes
        return 0

    for ins in schedule.instructions:
        extra = 0
        if isinstance(ins, Compute):
            for out in graph.ops[ins.op].outputs:
                if out in resident and not tensors[out].is_view:
                    extra += tensors[out].nbytes  # a recompute's duplicate, dropped at once
                make_resident(out)
            if workspace is not None:
                extra += workspace(ins.op)
        elif isinstance(ins, Prefetch):
            make_resident(ins.tensor)
        elif isinstance(ins, Free):
            if ins.tensor in resident:
                resident.discard(ins.tensor)
                storage = tensors[ins.tensor].storage
                resident_count[storage] -= 1
                if resident_count[storage] == 0:
                    live -= tensors[storage].nbytes
        elif isinstance(ins, Offload):
            host += tensors[tensors[ins.tensor].storage].nbytes
        elif isinstance(ins, Wait):
            pass
        device_curve.append(live + extra)
        host_curve.append(host)
        live_curve.append(len(resident))
    return MemoryTrace(device_curve, host_curve, live_curve, static)


def predicted_peak(graph: Graph, schedule: Schedule,
                   workspace: Callable[[int], int] | None = None) -> int:
    """Peak device bytes of ``schedule`` under the rule above."""
    return memory_curve(graph, schedule, workspace).peak

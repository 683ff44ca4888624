"""Verify a Schedule against its Graph before anything runs it (plain Python).

A schedule is rejected, with the index of the first offending instruction, when:

* an op reads a tensor that is not resident (never produced, already freed, offloaded and
  not brought back, or prefetched without a Wait);
* an op is recomputed before it ever ran, or without its inputs resident (same check);
* a tensor is freed while it is not resident, or while a copy of it is in flight
  (an Offload without its Wait(d2h), or a Prefetch without its Wait(h2d));
* a Prefetch names a tensor with no completed host copy, or one already resident, or one
  whose storage is still held by a resident view (two copies would be on the device);
* an Offload names a non-resident tensor or a view; a Wait names no copy in flight;
* at the end, a tensor in ``keep_at_end`` is not resident or a copy is still in flight.
"""

from __future__ import annotations

from outcore.errors import ScheduleError
from outcore.graph.ir import STATIC_KINDS, Graph
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait


def verify(graph: Graph, schedule: Schedule) -> None:
    """Raise ScheduleError naming the first broken rule; return None when the schedule is sound."""
    names = [t.name for t in graph.tensors]
    resident = {t.id for t in graph.tensors if t.kind in STATIC_KINDS}
    d2h_in_flight: set[int] = set()
    h2d_in_flight: set[int] = set()
    on_host: set[int] = set()
    ran: set[int] = set()
    held: dict[int, int] = {}  # storage -> resident tensors of it

    def hold(t: int, delta: int) -> None:
        storage = graph.tensors[t].storage
        held[storage] = held.get(storage, 0) + delta

    for t in resident:
        hold(t, +1)
    n_tensors, n_ops = len(graph.tensors), len(graph.ops)
    for i, ins in enumerate(schedule.instructions):
        if isinstance(ins, Compute):
            if not 0 <= ins.op < n_ops:
                raise ScheduleError(f"Compute of unknown op {ins.op}", i)
            op = graph.ops[ins.op]
            if ins.recompute and ins.op not in ran:
                raise ScheduleError(f"recompute of {op.name!r} before it ever ran", i)
            for tid in op.inputs:
                if tid in h2d_in_flight:
                    raise ScheduleError(f"{op.name!r} reads {names[tid]!r} while its prefetch is "
                                        "in flight (missing Wait h2d)", i)
                if tid not in resident:
                    what = "recomputed" if ins.recompute else "run"
                    raise ScheduleError(f"{op.name!r} is {what} but its input {names[tid]!r} "
                                        "is not resident (used before produced or after freed)", i)
            for out in op.outputs:
                if out not in resident:
                    resident.add(out)
                    hold(out, +1)
            ran.add(ins.op)
            continue
        tid = ins.tensor
        if not 0 <= tid < n_tensors:
            raise ScheduleError(f"{type(ins).__name__} of unknown tensor {tid}", i)
        name = names[tid]
        if isinstance(ins, Free):
            if tid in d2h_in_flight:
                raise ScheduleError(f"{name!r} is freed while its offload is in flight "
                                    "(missing Wait d2h)", i)
            if tid in h2d_in_flight:
                raise ScheduleError(f"{name!r} is freed while its prefetch is in flight", i)
            if tid not in resident:
                raise ScheduleError(f"{name!r} is freed but is not resident", i)
            resident.discard(tid)
            hold(tid, -1)
        elif isinstance(ins, Offload):
            if graph.tensors[tid].is_view:
                raise ScheduleError(f"offload of view {name!r}: offload its base instead", i)
            if tid not in resident:
                raise ScheduleError(f"offload of {name!r}, which is not resident", i)
            d2h_in_flight.add(tid)
        elif isinstance(ins, Prefetch):
            if tid not in on_host:
                raise ScheduleError(f"prefetch of {name!r}, which has no completed host copy", i)
            if tid in resident or tid in h2d_in_flight:
                raise ScheduleError(f"prefetch of {name!r}, which is already on the device", i)
            if held.get(graph.tensors[tid].storage, 0):
                raise ScheduleError(f"prefetch of {name!r} while a view of it still holds the "
                                    "old copy: free every view before prefetching", i)
            h2d_in_flight.add(tid)
        elif isinstance(ins, Wait):
            flight = d2h_in_flight if ins.direction == "d2h" else h2d_in_flight
            if ins.direction not in ("d2h", "h2d"):
                raise ScheduleError(f"Wait with unknown direction {ins.direction!r}", i)
            if tid not in flight:
                raise ScheduleError(f"Wait {ins.direction} on {name!r} with no copy in flight", i)
            flight.discard(tid)
            if ins.direction == "d2h":
                on_host.add(tid)
            else:
                resident.add(tid)
                hold(tid, +1)
        else:
            raise ScheduleError(f"unknown instruction {ins!r}", i)
    for tid in schedule.keep_at_end:
        if tid not in resident:
            raise ScheduleError(f"step output {names[tid]!r} is not resident at the end")
    if d2h_in_flight or h2d_in_flight:
        left = sorted(d2h_in_flight | h2d_in_flight)
        raise ScheduleError(f"copies still in flight at the end: {[names[t] for t in left]}")

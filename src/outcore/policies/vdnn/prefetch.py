"""vDNN's prefetch rule (MICRO'16 Sec. III-B, Fig. 10) on an ATen-level graph (plain Python).

The paper's ``findPrefetchLayer(m)``, called before layer m's backward computation, searches
the layers below m (m-1, m-2, ...) for the closest one whose input X was offloaded and is not
prefetched yet, and gives up at the first CONV layer it meets that is not such a layer. At most
one prefetch is launched per layer, and the compute stream synchronises with it before the
next layer's backward starts.

Mapping onto outcore's graph:

* a backward "layer" is a backward op that is not a view (views launch no kernel); the
  search runs before each of them, in execution order;
* the layer an offloaded tensor belongs to is its *first backward reader* (of its storage):
  layer n's X is first read by layer n's backward. Tensors first read by the same op (a
  pool's input and its indices) form one prefetch unit, launched together;
* "layers below m down to the first CONV" are the backward ops after m up to and including
  the first backward CONV op after m; the closest layer is the unit with the earliest
  first reader in that window;
* a unit the search never reaches (first read before any layer looks for it, e.g. the last
  layer's own X) is fetched on demand, right before its first reader, as vDNN must.

``sync_waits`` then moves the Wait of every window prefetch to just before the next Compute
after the op that launched it (the paper's per-layer synchronisation); a Wait needed
earlier (the reader comes first) stays where it is.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from outcore.graph.ir import Graph, OpCategory, Phase
from outcore.plan.schedule import Compute, Instruction, Prefetch, Schedule, Wait


@dataclass(frozen=True)
class PrefetchPoints:
    """Where each offloaded tensor comes back.

    ``window``: tensor -> the backward op before which its prefetch is launched (Fig. 10).
    ``demand``: tensor -> its first backward reader, for tensors fetched on demand.
    """

    window: dict[int, int]
    demand: dict[int, int]

    def prefetch_at(self) -> dict[int, int]:
        """Both maps in one, as ``Plan.prefetch_at`` takes them."""
        return {**self.demand, **self.window}


def first_readers(graph: Graph, backward: Sequence[int], tensors: Iterable[int]) -> dict[int, int]:
    """Tensor (a base) -> position in ``backward`` of the first op reading its storage."""
    wanted = set(tensors)
    first: dict[int, int] = {}
    for pos, oid in enumerate(backward):
        for tid in graph.ops[oid].inputs:
            storage = graph.tensors[tid].storage
            if storage in wanted and storage not in first:
                first[storage] = pos
    return first


def prefetch_points(graph: Graph, order: Sequence[int], offloaded: Iterable[int]) -> PrefetchPoints:
    """Fig. 10's choices for every offloaded tensor (see the module docstring)."""
    backward = [o for o in order if graph.ops[o].phase is not Phase.FORWARD]
    first = first_readers(graph, backward, offloaded)
    pending = sorted((pos, tid) for tid, pos in first.items())
    convs = [p for p, o in enumerate(backward) if graph.ops[o].category is OpCategory.CONV]
    window: dict[int, int] = {}
    demand: dict[int, int] = {}
    k = 0
    for pos, oid in enumerate(backward):
        if graph.ops[oid].category is OpCategory.VIEW:
            continue
        while k < len(pending) and pending[k][0] <= pos:  # its reader came first: on demand
            demand[pending[k][1]] = backward[pending[k][0]]
            k += 1
        if k == len(pending):
            break
        nxt = bisect.bisect_right(convs, pos)
        end = convs[nxt] if nxt < len(convs) else len(backward) - 1
        unit = pending[k][0]
        if unit > end:
            continue  # a CONV layer closes the window before the closest offloaded layer
        while k < len(pending) and pending[k][0] == unit:
            window[pending[k][1]] = oid
            k += 1
    for reader, tid in pending[k:]:
        demand[tid] = backward[reader]
    return PrefetchPoints(window, demand)


def sync_waits(schedule: Schedule, window: Mapping[int, int]) -> list[Instruction]:
    """``schedule``'s instructions with each window prefetch's Wait(h2d) moved to just before
    the next Compute after the op that launched it (see the module docstring)."""
    moved = set(window)
    out: list[Instruction] = []
    armed: list[int] = []  # prefetched, waiting for the launching op's Compute
    due: list[int] = []  # launching op has run: wait before the next Compute
    done: set[int] = set()
    for ins in schedule.instructions:
        if isinstance(ins, Wait) and ins.direction == "h2d" and ins.tensor in moved:
            if ins.tensor not in done:  # the reader comes before the planned sync point
                done.add(ins.tensor)
                armed = [t for t in armed if t != ins.tensor]
                due = [t for t in due if t != ins.tensor]
                out.append(ins)
            continue
        if isinstance(ins, Compute):
            for tid in due:
                out.append(Wait(tid, "h2d"))
                done.add(tid)
            out.append(ins)
            due, armed = armed, []
            continue
        if isinstance(ins, Prefetch) and ins.tensor in moved:
            armed.append(ins.tensor)
        out.append(ins)
    return out

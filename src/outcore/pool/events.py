"""Block lifetimes of a Schedule, by the memory rule of ``outcore.plan.memory``.

``blocks_from_schedule`` reads the rule's replay (``outcore.plan.residency.residency_steps``,
which ``memory_curve`` samples too; steps are instruction indices): static storages
(parameters, buffers, inputs, tangents) are resident from step 0; a storage is allocated at
the instruction that makes its first tensor resident (a ``Compute`` of one of its tensors, or
a ``Prefetch``); it is released by the ``Free`` that drops its last resident tensor, so its
block ends at the step before that ``Free``; a storage resident at the end lives to the last
step. A storage that is released and allocated again (offload then prefetch, drop then
recompute) gives one block per residency. Two transients live for their instruction only: a
recompute's duplicate of an output that is still resident (made, then dropped at once), and
the workspace of the op's chosen variant (``workspace(op_id)``, by default read from
``schedule.variants`` as ``memory_curve`` does; pass ``lambda op: 0`` to leave workspace out).
Hence, at every step, the bytes of the live blocks equal ``memory_curve(graph, schedule)``'s
device sample (tested). Zero-byte storages give no block. Block ids follow allocation order.

Mobility, by Dymem's Alg. 3 on the block's residency:

* ``static``: a static storage;
* ``movable``: a residency that is offloaded or that a ``Prefetch`` created (it stays one
  step and goes to the host), or one read by exactly one op, which is the next compute;
* ``reclaimed``: otherwise, if its base is produced by an FC (matmul), loss/softmax or
  dropout op (Alg. 3 line 2);
* ``temporary``: every other residency (several readers, or not read by the next op), and
  the transients.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from outcore.graph.ir import STATIC_KINDS, Graph, OpCategory
from outcore.plan.residency import NONE, TRANSIENT, residency_steps
from outcore.plan.schedule import Compute, Offload, Prefetch, Schedule
from outcore.pool.blocks import Block

RECLAIMED_CATEGORIES = frozenset({OpCategory.MATMUL, OpCategory.LOSS, OpCategory.DROPOUT})


@dataclass
class _Residency:
    seq: int  # creation order, i.e. allocation order
    storage: int
    start: int
    prefetched: bool
    offloaded: bool = False
    readers: list[int] = field(default_factory=list)  # instruction indices of reading Computes


@dataclass
class _Transient:
    seq: int
    start: int
    size: int
    name: str


def blocks_from_schedule(graph: Graph, schedule: Schedule,
                         workspace: Callable[[int], int] | None = None) -> list[Block]:
    """One Block per storage residency and per transient of ``schedule`` (see module doc)."""
    instructions = schedule.instructions
    tensors = graph.tensors
    open_: dict[int, _Residency] = {}
    closed: list[tuple[_Residency, int]] = []
    transients: list[_Transient] = []
    computes: list[int] = []  # instruction indices of Compute instructions
    seq = 0
    for step in residency_steps(graph, schedule, workspace):
        i = max(step.at, 0)  # the static storages are resident from step 0
        ins = instructions[step.at] if step.at >= 0 else None
        op_name = ""
        if isinstance(ins, Compute):
            computes.append(i)
            op_name = graph.ops[ins.op].name
            for tid in set(graph.ops[ins.op].inputs):
                res = open_.get(tensors[tid].storage)
                if res is not None:
                    res.readers.append(i)
        elif isinstance(ins, Offload):
            res = open_.get(tensors[ins.tensor].storage)
            if res is not None:
                res.offloaded = True
        for alloc in step.allocations:
            if alloc.storage == TRANSIENT:
                name = (f"workspace:{op_name}" if alloc.tensor == NONE
                        else f"duplicate:{tensors[alloc.tensor].name}")
                transients.append(_Transient(seq, i, alloc.nbytes, name))
            else:
                open_[alloc.storage] = _Residency(seq, alloc.storage, i,
                                                  isinstance(ins, Prefetch))
            seq += 1
        if step.released != NONE:
            closed.append((open_.pop(step.released), i - 1))
    last = max(len(instructions) - 1, 0)
    closed.extend((res, last) for res in open_.values())
    return _to_blocks(graph, closed, transients, computes)


def _mobility(graph: Graph, res: _Residency, computes: list[int]) -> str:
    """Dymem's Alg. 3 for one residency (see the module doc)."""
    base = graph.tensors[res.storage]
    if base.kind in STATIC_KINDS:
        return "static"
    readers = sorted(set(res.readers))
    k = bisect_right(computes, res.start)
    next_compute = computes[k] if k < len(computes) else None
    consumed_next = len(readers) == 1 and readers[0] == next_compute
    if res.offloaded or res.prefetched or consumed_next:
        return "movable"
    if base.producer is not None and graph.ops[base.producer].category in RECLAIMED_CATEGORIES:
        return "reclaimed"
    return "temporary"


def _to_blocks(graph: Graph, closed: list[tuple[_Residency, int]],
               transients: list[_Transient], computes: list[int]) -> list[Block]:
    specs: list[tuple[int, int, int, int, int, str, str]] = []  # seq-sorted Block fields
    for res, end in closed:
        base = graph.tensors[res.storage]
        if base.nbytes == 0 or end < res.start:  # end < start: a static storage freed at once
            continue
        specs.append((res.start, res.seq, base.nbytes, end, res.storage,
                      _mobility(graph, res, computes), base.name))
    specs.extend((tr.start, tr.seq, tr.size, tr.start, -1, "temporary", tr.name)
                 for tr in transients)
    specs.sort()
    return [Block(id=k, size=size, start=start, end=end, mobility=mobility, name=name,
                  storage=storage)
            for k, (start, _, size, end, storage, mobility, name) in enumerate(specs)]

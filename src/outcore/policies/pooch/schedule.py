"""Build the Schedule of a keep / swap / recompute classification with explicit copy timing.

Used by PoocH and Dymem. ``outcore.plan.lower`` cannot express two things these papers need:

* a **recompute chain**: PoocH drops a feature map and re-makes it from the nearest kept
  tensors, re-running the dropped forward intermediates in between (§3.2, "we would need
  recomputation recursively"); ``lower`` keeps such intermediates alive instead;
* a **release without a barrier**: a swapped map is released when its copy-out has ended
  (PoocH §4.4.2: forward never waits for a copy-out; Dymem §3.2.1), not right after its last
  forward use, where ``lower`` puts ``Wait(d2h)`` and so stalls the compute stream.

Three passes, like ``lower``'s: (1) the sequence: forward ops with an ``Offload`` after each
swapped map's producer; backward ops, before each the copy-ins issued at that position
(``issue_at``), then every input brought back: a swapped map by ``Wait(h2d)`` (or a
just-in-time ``Prefetch``), anything else dropped by re-running its producer after its inputs
(recursively; a re-made intermediate that no backward op reads is dropped again right after
the op it was re-made for, a re-made feature map stays until its last use); (2) a ``Free``
after the last use of every residency (with ``Wait(d2h)`` first when the residency was copied
out); (3) each swapped map's forward ``Wait(d2h)`` + ``Free`` moved later, to the start of
position ``free_at[x]`` (never past its next definition). The result is verified by the
caller.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from outcore.graph.ir import STATIC_KINDS, Graph, Phase, TensorKind
from outcore.plan.lower import free_points
from outcore.plan.schedule import (
    Compute,
    Free,
    Instruction,
    Offload,
    Prefetch,
    Schedule,
    Wait,
)
from outcore.policies.common.timeline import RECOMPUTE, SWAP, FeatureClass, producer


class _Sequence:
    """Pass 1: instructions without frees, each tensor's definitions, position groups."""

    def __init__(self, graph: Graph, order: list[int], classes: Mapping[int, FeatureClass]) -> None:
        self.graph = graph
        self.order = order
        self.swapped = {x for x, c in classes.items() if c == SWAP}
        dropped = self.swapped | {x for x, c in classes.items() if c == RECOMPUTE}
        self.seq: list[Instruction] = []
        self.defs: dict[int, list[int]] = defaultdict(list)
        self.group_first: list[int] = []
        self.inflight: set[int] = set()
        self.resident: set[int] = set()  # tensors on the device, tracked in backward
        acts = {t.id for t in graph.activations()}
        kept_storage = {t.storage for t in graph.tensors
                        if t.kind in STATIC_KINDS or t.kind is TensorKind.OUTPUT}
        kept_storage |= acts - dropped
        self.backward_resident = {t.id for t in graph.tensors if t.storage in kept_storage and (
            t.producer is None or graph.ops[t.producer].phase is Phase.FORWARD)}
        self.activation_storages = acts
        self.transient: set[int] = set()  # dropped intermediates re-made for the current op

    def emit(self, ins: Instruction) -> None:
        self.seq.append(ins)

    def define(self, tid: int) -> None:
        self.defs[tid].append(len(self.seq))

    def run(self, issue_at: Mapping[int, int], need_order: Mapping[int, int]) -> None:
        g = self.graph
        groups: dict[int, list[int]] = defaultdict(list)
        for x, at in issue_at.items():
            groups[at].append(x)
        for j, oid in enumerate(self.order):
            self.group_first.append(len(self.seq))
            op = g.ops[oid]
            if op.phase is Phase.FORWARD:
                for out in op.outputs:
                    self.define(out)
                self.emit(Compute(oid))
                for out in op.outputs:
                    if out in self.swapped:
                        self.emit(Offload(out))
                continue
            if j == 0 or g.ops[self.order[j - 1]].phase is Phase.FORWARD:
                self.resident = set(self.backward_resident)
            for x in sorted(groups.get(j, ()), key=lambda x: (need_order.get(x, 0), x)):
                if x not in self.resident and x not in self.inflight:
                    self.define(x)
                    self.emit(Prefetch(x))
                    self.inflight.add(x)
            for tid in op.inputs:
                self._ensure(tid)
            self._compute(oid, recompute=False)
            self.resident -= self.transient  # re-made again if a later op needs them
            self.transient.clear()
        self.group_first.append(len(self.seq))

    def _compute(self, oid: int, recompute: bool) -> None:
        for out in self.graph.ops[oid].outputs:
            if out not in self.resident:
                self.define(out)
                self.resident.add(out)
        self.emit(Compute(oid, recompute=recompute))

    def _ensure(self, tid: int) -> None:
        if tid in self.resident:
            return
        if tid in self.swapped:
            if tid not in self.inflight:
                self.define(tid)
                self.emit(Prefetch(tid))
            self.inflight.discard(tid)
            self.emit(Wait(tid, "h2d"))
            self.resident.add(tid)
            return
        op = self.graph.ops[producer(self.graph, tid)]
        for u in op.inputs:
            self._ensure(u)
        for out in op.outputs:  # a prefetch of another output still in flight must land first
            if out in self.inflight:
                self.inflight.discard(out)
                self.emit(Wait(out, "h2d"))
                self.resident.add(out)
        self._compute(op.id, recompute=True)
        for out in op.outputs:
            if self.graph.tensors[out].storage not in self.activation_storages:
                self.transient.add(out)


def build_schedule(graph: Graph, order: list[int], classes: Mapping[int, FeatureClass],
                   free_at: Mapping[int, int], issue_at: Mapping[int, int],
                   need_at: Mapping[int, int] | None = None, policy: str = "") -> Schedule:
    """The Schedule of ``classes`` (feature map -> keep / swap / recompute; others kept):
    swapped maps released before position ``free_at[x]`` and copied back at
    ``issue_at[x]`` (positions in ``order``, forward first)."""
    fwd = [o for o in order if graph.ops[o].phase is Phase.FORWARD]
    order = fwd + [o for o in order if graph.ops[o].phase is not Phase.FORWARD]
    sq = _Sequence(graph, order, classes)
    sq.run(issue_at, need_at or {})
    keep = list(graph.outputs)
    frees = free_points(graph, sq.seq, sq.defs, keep)
    moved = _deferrals(sq, frees, free_at)
    out: list[Instruction] = []
    for i, ins in enumerate(sq.seq):
        for tid in moved.get(("before", i), ()):
            out += [Wait(tid, "d2h"), Free(tid)]
        out.append(ins)
        for tid, copied in frees.get(i, ()):
            if ("skip", i, tid) in moved:
                continue
            if copied:
                out.append(Wait(tid, "d2h"))
            out.append(Free(tid))
    for tid in moved.get(("before", len(sq.seq)), ()):
        out += [Wait(tid, "d2h"), Free(tid)]
    return Schedule(instructions=out, keep_at_end=keep, sub_batches=1, policy=policy)


def _deferrals(sq: _Sequence, frees: Mapping[int, list[tuple[int, bool]]],
               free_at: Mapping[int, int]) -> dict:
    """Where each swapped map's forward release moves (see the module docstring)."""
    moved: dict = defaultdict(list)
    for i, items in frees.items():
        for tid, copied in items:
            if not copied or tid not in free_at:
                continue
            target = sq.group_first[min(free_at[tid], len(sq.group_first) - 1)]
            later = [d for d in sq.defs[tid] if d > i]
            if later:
                target = min(target, later[0])
            if target > i + 1:
                moved[("before", target)].append(tid)
                moved[("skip", i, tid)] = True
    return moved

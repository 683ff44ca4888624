"""moDNN Algorithm 1: data transfer scheduling and CONV algorithm selection (DATE'18 §IV-B).

The scheduler simulates the step task by task in topological order (forward then backward)
on one compute stream (StrmC) and the copy engines (StrmD), with virtual allocations in the
data region's linked list (``SegmentList``), and writes the outcore Schedule as it goes:

1. **Prepare** (lines 3-8): allocate t's inputs that are not on the device and its outputs.
   On failure, find an offloading scheme (a run of contiguous segments, each free or
   evictable) with the least delay to t, evict it and allocate; if none exists, defragment:
   evict everything and reload t's inputs. Inputs not on the device are loaded (Prefetch +
   Wait), in-flight prefetches are waited for; the delay is added to the current time.
2. **Algorithm** (lines 9-14): for a task with candidates, the maximum of eq. (5),
   ``T_base - T_alg - T_off,alg - T_pre,alg(s)``: T_off is the delay of the scheme that makes
   room for the workspace (0 when it fits), T_pre the prefetch time of s (the nearest later
   task that needs prefetched data) pushed after t because the workspace takes its room.
3. **Prefetch** (lines 15-27): for s = t+1, ...: stop when s's data could not be held
   (line 16, see below); skip tasks whose inputs are all on the device; if eq. (4)
   ``T + T_alg(t) + sum T_trans(d) > EST(s)`` holds, allocate (offloading if needed) and start
   the prefetches now, else stop.
4. **Run** t (line 28), free its workspace and every block read for the last time (29-31).

Evictability (the paper's criteria): a block cannot be offloaded or freed when (a) the next
task uses it (here: t's own inputs and outputs) or (b) it has not been used since it was
made or prefetched. Weights (SW) are never in the list. A block whose host copy is valid
is just freed ("it does not need to be offloaded again"). An eviction copies the block out
on the D2H engine (added retroactively right after its producer when that engine was idle,
Fig. 3b), waits for that copy, then frees it.

Choices where the paper is silent ("details are omitted"):

* **line 16** predicts s's allocation by bytes: s's inputs and outputs plus the blocks this
  loop already prefetched for tasks before s that are still alive at s must fit in the data
  region (everything else could be offloaded then); fragmentation is not predicted;
* **prefetch evictions** never touch a block used before s (or by s);
* **EST(s)** adds the baseline times of the tasks between t and s to t's finish time;
* the search for s's prefetch bytes in eq. (5) looks ``SEARCH_AHEAD`` tasks ahead;
* ties between schemes go to the smaller delay, then fewer bytes copied out, then the
  lower address; ties in eq. (5) to the smaller workspace;
* views: a block is moved with all its views, which are re-made (a free re-run of the view
  op) once it is back; a block viewed by a non-view op is pinned (never moved).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import STATIC_KINDS, Graph, OpCategory, Phase
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Wait
from outcore.policies.modnn.batch import reserved_storages
from outcore.policies.modnn.memory import SegmentList
from outcore.policies.modnn.state import (
    DEAD,
    DEV,
    HOST,
    INFLIGHT,
    NONE,
    Block,
    Engine,
    ModnnStats,
    Slots,
)
from outcore.units import format_bytes
from outcore.variants.registry import FRAMEWORK
from outcore.variants.select import Candidate

SEARCH_AHEAD = 64


def producer(graph: Graph, tid: int) -> int:
    """The op that makes ``tid``; only graph inputs have none, and those are never data."""
    op = graph.tensors[tid].producer
    assert op is not None, f"{graph.tensors[tid].name!r} is a graph input"
    return op


class ModnnScheduler:
    """Runs Algorithm 1 over ``graph`` for a data region of ``capacity`` bytes."""

    def __init__(self, graph: Graph, cost: Any, capacity: int,
                 cands: Mapping[int, tuple[Candidate, ...]], reserved: int = 0) -> None:
        self.graph = graph
        self.reserved_bytes = reserved
        self.cost = cost
        self.cands = cands
        ops = graph.ops
        self.order = ([o.id for o in ops if o.phase is Phase.FORWARD]
                      + [o.id for o in ops if o.phase is not Phase.FORWARD])
        self.n = len(self.order)
        self.mem = SegmentList(capacity)
        self.slots = Slots(self.n)
        self.stats = ModnnStats()
        self.T = 0.0
        self.d2h = Engine()
        self.h2d = self.d2h if cost.copy_engines < 2 else Engine()
        self.variants: dict[int, str] = {}
        self.first_eviction: dict[int, int] = {}  # block -> position of the task that evicted it
        self._current = 0
        self.resident: set[int] = {t.id for t in graph.tensors if t.kind in STATIC_KINDS}
        self.tbase = [float(cost.op_time(ops[o])) for o in self.order]
        self.blocks = self._make_blocks()
        self.inputs_of = [self._data_storages(ops[o].inputs) for o in self.order]
        self.outputs_of = [[s for s in self._data_storages(ops[o].outputs)
                            if graph.tensors[s].producer == o] for o in self.order]
        self.dies: list[list[int]] = [[] for _ in range(self.n)]
        for b in self.blocks.values():
            self.dies[b.last].append(b.sid)
        self.bandwidth = 1e9 / max(cost.transfer_time(10**9, "h2d"), 1e-12)

    # ---- set-up -----------------------------------------------------------------------------
    def _reserved(self) -> set[int]:
        if not hasattr(self, "_reserved_cache"):
            self._reserved_cache = reserved_storages(self.graph)
        return self._reserved_cache

    def _data_storages(self, tids: list[int]) -> list[int]:
        reserved = self._reserved()
        out: list[int] = []
        for tid in tids:
            s = self.graph.tensors[tid].storage
            if s not in reserved and s not in out:
                out.append(s)
        return out

    def _make_blocks(self) -> dict[int, Block]:
        g = self.graph
        pos = {o: i for i, o in enumerate(self.order)}
        reserved = self._reserved()
        uses: dict[int, set[int]] = {}
        pinned: set[int] = set()
        for t in g.tensors:
            if t.storage in reserved:
                continue
            uses.setdefault(t.storage, set()).update(pos[c] for c in t.consumers)
            if t.is_view and g.ops[producer(g, t.id)].category is not OpCategory.VIEW:
                pinned.add(t.storage)
        blocks = {}
        for sid, used in uses.items():
            base = g.tensors[sid]
            ordered = sorted(used)
            last = ordered[-1] if ordered else pos[producer(g, sid)]
            blocks[sid] = Block(sid, base.nbytes, ordered, last, sid in pinned)
        return blocks

    # ---- the algorithm ----------------------------------------------------------------------
    def run(self) -> ModnnStats:
        """Schedule every task; the instructions are in ``self.slots``."""
        for i in range(self.n):
            self._current = i
            self._prepare(i)
            op = self.graph.ops[self.order[i]]
            talg = self._choose_algorithm(i)
            self._prefetch_ahead(i, talg)
            self.slots.end_time[2 * i] = self.T
            self.slots.compute[i] = Compute(op.id)
            self.T += talg
            self.slots.end_time[2 * i + 1] = self.T
            self._after(i)
        self.stats.finish_time = max(self.T, self.d2h.free, self.h2d.free)
        return self.stats

    def _prepare(self, i: int) -> None:
        """Algorithm 1 lines 3-8."""
        needed = self._closure(i)
        outs = [s for s in self.outputs_of[i] if self.blocks[s].where == NONE]
        guarded = set(needed) | set(outs)

        def protect(o: int) -> bool:
            return o in guarded or not self.blocks[o].used

        want = [s for s in needed if self.blocks[s].where == HOST] + outs
        placed = all(self._place(s, self.blocks[s].size, protect) for s in want)
        if not placed:
            self._defragment(i, needed, outs)
        for s in outs:
            b = self.blocks[s]
            b.where, b.used, b.arrival_slot = DEV, False, 2 * i + 1
        for s in needed:
            b = self.blocks[s]
            if b.where == HOST:
                self._issue_prefetch(b, i)
                self.stats.loads_on_demand += 1
            if b.where == INFLIGHT:
                self._wait_prefetch(b, i)
        for tid in self.graph.ops[self.order[i]].inputs:
            self._ensure(tid, i)

    def _closure(self, i: int) -> list[int]:
        """Storages task i reads, including the bases of views it must re-make."""
        result = list(self.inputs_of[i])
        stack = [t for t in self.graph.ops[self.order[i]].inputs if t not in self.resident]
        seen: set[int] = set()
        while stack:
            tid = stack.pop()
            if tid in seen:
                continue
            seen.add(tid)
            t = self.graph.tensors[tid]
            if t.storage in self.blocks and t.storage not in result:
                result.append(t.storage)
            if t.is_view:
                view_op = self.graph.ops[producer(self.graph, tid)]
                stack += [u for u in view_op.inputs if u not in self.resident]
        return result

    def _defragment(self, i: int, needed: list[int], outs: list[int]) -> None:
        """No offloading scheme exists: offload everything, then place t's data afresh."""
        self.stats.defrags += 1
        for s in outs + [s for s in needed if self.blocks[s].where == HOST]:
            if s in self.mem:
                self.mem.free(s)  # t's tentative allocations hold no data yet
        for owner in self.mem.owners():
            if owner >= 0 and not self.blocks[owner].pinned:
                self._evict(owner, i)
        for s in needed + outs:
            size = self.blocks[s].size
            if size == 0 or s in self.mem:
                continue
            if self.mem.allocate(s, size) is None:
                op = self.graph.ops[self.order[i]]
                stuck = sum(self.blocks[o].size for o in self.mem.owners() if o >= 0)
                budget = self.mem.capacity + self.reserved_bytes
                raise InfeasibleBudgetError(
                    "modnn", budget, budget + size,
                    f"Task {op.name!r} cannot place its data even after offloading everything: "
                    f"{format_bytes(stuck)} is held by blocks that cannot move (their views are "
                    "made by non-view ops). Raise the budget.")

    def _choose_algorithm(self, i: int) -> float:
        """Algorithm 1 lines 9-14: eq. (5); returns T_alg(t)."""
        oid = self.order[i]
        rows = self.cands.get(oid)
        if not rows:
            return self.tbase[i]
        guarded = set(self._closure(i)) | set(self.outputs_of[i])

        def protect(o: int) -> bool:
            return o in guarded or not self.blocks[o].used

        base = min(rows, key=lambda c: (c.workspace_bytes, c.time_s))
        largest = self.mem.largest_free()
        s_bytes = self._next_prefetch_bytes(i)

        def delayed(ws: int) -> float:
            return max(0, s_bytes - max(0, largest - ws)) / self.bandwidth

        best: tuple[float, int, Candidate, Any] | None = None
        for c in rows:
            scheme, t_off = None, 0.0
            if c.workspace_bytes > largest:
                found = self._best_scheme(c.workspace_bytes, protect)
                if found is None:
                    continue
                scheme, t_off = found[1], found[0][0]
            extra_delay = delayed(c.workspace_bytes) - delayed(base.workspace_bytes)
            gain = base.time_s - c.time_s - t_off - extra_delay
            key = (gain, -c.workspace_bytes)
            if best is None or key > (best[0], -best[2].workspace_bytes):
                best = (gain, c.workspace_bytes, c, scheme)
        assert best is not None, "the baseline algorithm needs no workspace and always fits"
        _, ws, chosen, scheme = best
        if scheme is not None:
            self.stats.workspace_evictions += 1
            for owner in scheme.owners:
                self._evict(owner, i)
        if ws > 0:
            placed = self.mem.allocate(-1 - oid, ws)
            assert placed is not None, "the scheme was chosen to hold the workspace"
        if chosen.variant != FRAMEWORK:
            self.variants[oid] = chosen.variant
        return chosen.time_s

    def _next_prefetch_bytes(self, i: int) -> int:
        """Bytes the nearest later task with data on the host would prefetch (eq. 5's s)."""
        for s in range(i + 1, min(self.n, i + 1 + SEARCH_AHEAD)):
            missing = [self.blocks[b].size for b in self.inputs_of[s]
                       if self.blocks[b].where == HOST]
            if missing:
                return sum(missing)
        return 0

    def _prefetch_ahead(self, i: int, talg: float) -> None:
        """Algorithm 1 lines 15-27 (see the module docstring for line 16 and EST)."""
        host_time = sum(self._transfer(b.size) for b in self.blocks.values() if b.where == HOST)
        if host_time == 0:
            return
        cap = self.mem.capacity
        t_end = self.T + talg
        est = t_end
        guarded = set(self._closure(i)) | set(self.outputs_of[i])
        ahead: dict[int, int] = {}  # blocks prefetched in this loop -> size
        for s in range(i + 1, self.n):
            if est - t_end >= host_time:
                return  # eq. (4) cannot hold for s or any later task
            data = set(self.inputs_of[s]) | set(self.outputs_of[s])
            alive = {b for b in ahead if self.blocks[b].last >= s}
            if sum(self.blocks[b].size for b in data | alive) > cap:
                return  # line 16: s would need defragmentation
            missing = [b for b in self.inputs_of[s] if self.blocks[b].where == HOST]
            if missing:
                trans = sum(self._transfer(self.blocks[b].size) for b in missing)
                if not t_end + trans > est:
                    return  # eq. (4) does not hold: prefetching for s can start later
                if not self._prefetch_for(i, s, missing, guarded, ahead):
                    return
            est += self.tbase[s]

    def _prefetch_for(self, i: int, s: int, missing: list[int], guarded: set[int],
                      ahead: dict[int, int]) -> bool:
        def protect(o: int) -> bool:
            b = self.blocks[o]
            return o in guarded or not b.used or b.next_use(i + 1) <= s

        for sid in missing:
            b = self.blocks[sid]
            if not self._place(sid, b.size, protect):
                return False
            self._issue_prefetch(b, i)
            ahead[sid] = b.size
        return True

    def _after(self, i: int) -> None:
        """Free the workspace; free every block read for the last time (lines 29-31)."""
        oid = self.order[i]
        if -1 - oid in self.mem:
            self.mem.free(-1 - oid)
        op = self.graph.ops[oid]
        for tid in op.outputs:
            self.resident.add(tid)
            s = self.graph.tensors[tid].storage
            if s in self.blocks:
                self.blocks[s].tensors.add(tid)
        for s in self.inputs_of[i]:
            self.blocks[s].used = True
        for s in self.dies[i]:
            b = self.blocks[s]
            for tid in sorted(b.tensors):
                self.slots.add(2 * i + 1, Free(tid))
                self.resident.discard(tid)
            b.tensors.clear()
            if s in self.mem:
                self.mem.free(s)
            b.where = DEAD

    # ---- moving data ------------------------------------------------------------------------
    def _transfer(self, nbytes: int) -> float:
        return float(self.cost.transfer_time(nbytes, "d2h")) if nbytes > 0 else 0.0

    def _slot_time(self, slot: int, now_slot: int) -> float:
        return self.T if slot >= now_slot else self.slots.end_time[slot]

    def _offload_plan(self, b: Block, now_slot: int, free: float,
                      last: int) -> tuple[int, float, float]:
        """(slot, start, end) of b's offload queued after a D2H engine at (free, last)."""
        slot = max(b.arrival_slot, last)
        start = max(self._slot_time(slot, now_slot), free)
        return slot, start, start + self._transfer(b.size)

    def _best_scheme(self, size: int, protect: Callable[[int], bool]):
        """The offloading scheme with the least (delay, bytes copied, address), or None."""
        now_slot = 2 * self._current
        best = None
        for sc in self.mem.schemes(size, lambda o: o >= 0 and not self.blocks[o].pinned
                                   and not protect(o)):
            free, last, ready, copied = self.d2h.free, self.d2h.last_slot, self.T, 0
            for o in sc.owners:
                b = self.blocks[o]
                if b.where == INFLIGHT:
                    ready = max(ready, b.ready)
                if not b.host:
                    last, _, free = self._offload_plan(b, now_slot, free, last)
                    ready = max(ready, free)
                    copied += b.size
            key = (ready - self.T, copied, sc.start)
            if best is None or key < best[0]:
                best = (key, sc)
        return best

    def _place(self, sid: int, size: int, protect: Callable[[int], bool]) -> bool:
        """Allocate ``size`` bytes for block ``sid``, offloading a scheme if needed."""
        if size == 0 or sid in self.mem:
            return True
        if self.mem.allocate(sid, size) is not None:
            return True
        found = self._best_scheme(size, protect)
        if found is None:
            return False
        for owner in found[1].owners:
            self._evict(owner, self._current)
        return self.mem.allocate(sid, size) is not None

    def _evict(self, sid: int, i: int) -> None:
        """Copy ``sid`` out if the host has no copy, wait for it, free all its tensors."""
        b = self.blocks[sid]
        now = 2 * i
        if b.where == INFLIGHT:
            self._wait_prefetch(b, i)
        if not b.host:
            slot, _, end = self._offload_plan(b, now, self.d2h.free, self.d2h.last_slot)
            self.slots.add(slot, Offload(sid))
            self.d2h.free, self.d2h.last_slot = end, slot
            b.host, b.host_end = True, end
            self.stats.offloads += 1
            self.stats.offloaded_bytes += b.size
            self.slots.add(now, Wait(sid, "d2h"))
            self._stall_until(end)
        for tid in sorted(b.tensors):
            self.slots.add(now, Free(tid))
            self.resident.discard(tid)
        b.tensors.clear()
        self.mem.free(sid)
        b.where = HOST
        self.stats.evictions += 1
        self.first_eviction.setdefault(sid, i)

    def _issue_prefetch(self, b: Block, i: int) -> None:
        start = max(self.T, self.h2d.free, b.host_end)
        b.ready = start + self._transfer(b.size)
        self.h2d.free, self.h2d.last_slot = b.ready, 2 * i
        self.slots.add(2 * i, Prefetch(b.sid))
        b.where, b.used = INFLIGHT, False
        b.tensors.add(b.sid)
        self.resident.add(b.sid)
        self.stats.prefetches += 1
        self.stats.prefetched_bytes += b.size

    def _wait_prefetch(self, b: Block, i: int) -> None:
        self.slots.add(2 * i, Wait(b.sid, "h2d"))
        self._stall_until(b.ready)
        b.where = DEV

    def _stall_until(self, when: float) -> None:
        if when > self.T:
            self.stats.transfer_delay += when - self.T
            self.T = when

    def _ensure(self, tid: int, i: int) -> None:
        """Make tensor ``tid`` resident: re-make a view of a block that came back."""
        if tid in self.resident:
            return
        t = self.graph.tensors[tid]
        if not t.is_view or t.producer is None:
            # seen on Inductor's joint graph (``outcore.compiled``) at low budgets, whose op
            # order has a read before its producer (Graph.validate refuses it): this
            # scheduler cannot plan it; refused as a budget it cannot meet, so a portfolio
            # goes on with its other candidates
            budget = self.mem.capacity + self.reserved_bytes
            raise InfeasibleBudgetError(
                "modnn", budget, budget + 1,
                f"modnn lost {t.name!r} before task {i} reads it (an op order it cannot "
                "schedule); use another policy.")
        op = self.graph.ops[t.producer]
        for u in op.inputs:
            self._ensure(u, i)
        self.slots.add(2 * i, Compute(op.id, recompute=True))
        self.T += float(self.cost.op_time(op))
        for out in op.outputs:
            if out not in self.resident:
                self.resident.add(out)
                s = self.graph.tensors[out].storage
                if s in self.blocks:
                    self.blocks[s].tensors.add(out)

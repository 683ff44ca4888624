"""SuperNeurons' unified tensor pool: offload and prefetch with an LRU tensor cache (plain Python).

The second pass of a SuperNeurons schedule. It walks the Compute/Free sequence of
``superneurons.sequence`` (where every checkpoint tensor stays on the device) and decides,
against the budget, when the offloadable checkpoint tensors leave and come back:

* **Tensor cache** (Sec. 3.3.2, Alg. 2). Offloadable tensors on the device sit in an LRU
  list, front = most recently used. A layer locks the tensors it reads and writes. When an
  allocation (an op's outputs, a prefetch) does not fit the budget, ``LRU.out`` offloads the
  least recently used unlocked tensors until it fits (Offload, Wait d2h, Free; a tensor whose
  host copy already exists is just freed, after its prefetch lands if one is in flight). A
  read of a tensor on the device moves it to the front (hit); a read of an offloaded one
  brings it back (miss: Prefetch + Wait h2d). So data moves only when device memory is
  insufficient; with no budget nothing moves.
* **Eager offloading** (``tensor_cache=False``, Sec. 3.3.1, what Fig. 10b and Table 3's "without
  Tensor Cache" measure): every offloadable tensor is copied to the host as soon as it is
  made, and freed once its forward readers are done and the next forward CONV layer has run
  ("overlap with the forward computations starting from the current CONV layer to the next
  one"). Those made after the last forward CONV layer stay cached.
* **Prefetch** (Sec. 3.3.1): before each backward CONV op, the offloaded tensors that the
  ops up to the next backward CONV op read are prefetched ("fetches the required tensors for
  the previous CONV layer"), nearest first, while they fit: under the budget after evicting
  unlocked tensors; without a budget, under the peak of the same pass with on-demand
  prefetches only, at every step until the tensor is read (the paper prefetches to overlap
  copies and reports peaks equal to the largest layer: a prefetch must not raise the peak).
  Their Wait is placed before the first reader. Anything else comes back on demand.

Memory is tracked with exactly ``outcore.plan.memory``'s rule, without workspace (the
convolution workspace is chosen afterwards from what is left, Sec. 3.5). A step that cannot
fit even after evicting every unlocked tensor raises ``NoRoom``.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

from outcore.graph.ir import STATIC_KINDS, Graph, Op, OpCategory, Phase
from outcore.plan.schedule import Compute, Free, Instruction, Offload, Prefetch, Wait


class NoRoom(Exception):
    """A step needs more device memory than the budget leaves after every possible eviction."""

    def __init__(self, wanted: int, what: str) -> None:
        self.wanted = wanted
        self.what = what
        super().__init__(f"{what} needs {wanted} bytes")


@dataclass
class UtpStats:
    """What the tensor pool did: copies, their bytes, cache hits and misses."""

    offloads: int = 0
    offload_bytes: int = 0
    prefetches: int = 0
    prefetch_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class LruCache:
    """Alg. 2's list of tensors (storage ids): front = most recently used."""

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, storage: int) -> bool:
        return storage in self._order

    def __len__(self) -> int:
        return len(self._order)

    def insert_front(self, storage: int) -> None:
        """``LRU.in``: a tensor (new or brought back) becomes the most recently used."""
        self._order[storage] = None
        self._order.move_to_end(storage, last=False)

    def place_to_front(self, storage: int) -> None:
        """A hit: the tensor becomes the most recently used."""
        self._order.move_to_end(storage, last=False)

    def remove(self, storage: int) -> None:
        self._order.pop(storage, None)

    def unlocked_from_tail(self, locked: Callable[[int], bool]) -> Iterable[int]:
        """Tensors from the least recently used on, skipping locked ones (``LRU.out``'s order)."""
        return (s for s in reversed(self._order) if not locked(s))

    def order(self) -> list[int]:
        """Front (most recent) to tail."""
        return list(self._order)


class _Device:
    """Residency and live bytes under ``outcore.plan.memory``'s rule (workspace excluded)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.resident: set[int] = set()
        self.members: dict[int, set[int]] = defaultdict(set)  # storage -> resident tensors
        self.live = 0
        for t in graph.tensors:
            if t.kind in STATIC_KINDS:
                self.add(t.id)

    def add(self, tid: int) -> None:
        if tid in self.resident:
            return
        storage = self.graph.tensors[tid].storage
        if not self.members[storage]:
            self.live += self.graph.tensors[storage].nbytes
        self.members[storage].add(tid)
        self.resident.add(tid)

    def drop(self, tid: int) -> bool:
        """Free ``tid``; True when its storage was released."""
        storage = self.graph.tensors[tid].storage
        self.resident.discard(tid)
        self.members[storage].discard(tid)
        if not self.members[storage]:
            self.live -= self.graph.tensors[storage].nbytes
            return True
        return False

    def on_device(self, storage: int) -> bool:
        return bool(self.members[storage])

    def only_base(self, storage: int) -> bool:
        return self.members[storage] == {storage}

    def compute_bytes(self, op: Op) -> int:
        """Bytes a Compute of ``op`` adds at its sample: new storages and recompute duplicates."""
        fresh: set[int] = set()
        extra = 0
        for out in op.outputs:
            t = self.graph.tensors[out]
            if out in self.resident:
                extra += 0 if t.is_view else t.nbytes
            elif not self.members[t.storage]:
                fresh.add(t.storage)
        return extra + sum(self.graph.tensors[s].nbytes for s in fresh)


def first_reads_in(steps: Sequence[int], storages: Sequence[int], among: Container[int],
                   i: int, end: int) -> list[tuple[int, int]]:
    """``(first, s)`` for every ``s`` of ``among`` read at a step of ``(i, end]``, ``first``
    its first read there, sorted by ``(first, s)``. ``steps[n]`` / ``storages[n]`` are the
    read events ``(step, storage)`` in ``(step, storage)`` order. The same list as sorting
    each ``s`` of ``among`` by its next read after ``i`` (kept when at most ``end``), in time
    linear in the window's events: the prefetch window (``_Pool.window_prefetch``) once
    scanned every evicted tensor at every backward CONV, quadratic on SuperNeurons'
    2,500-unit ResNet."""
    lo = bisect.bisect_right(steps, i)
    hi = bisect.bisect_right(steps, end, lo)
    seen: set[int] = set()
    wanted: list[tuple[int, int]] = []
    for at, s in zip(steps[lo:hi], storages[lo:hi], strict=True):
        if s in among and s not in seen:
            seen.add(s)
            wanted.append((at, s))
    return wanted


class _Pool:
    """One pass of the tensor pool over a Compute/Free sequence."""

    def __init__(self, graph: Graph, seq: Sequence[Instruction], offloadable: set[int],
                 budget: int | None, cache: bool) -> None:
        self.graph = graph
        self.seq = seq
        self.offloadable = offloadable
        self.budget = budget
        self.cache = cache
        self.dev = _Device(graph)
        self.lru = LruCache()
        self.on_host: set[int] = set()
        self.d2h: set[int] = set()
        self.h2d: set[int] = set()
        self.evicted: set[int] = set()
        self.pending_release: dict[int, int] = {}  # storage -> release after this index
        self.out: list[Instruction] = []
        self.stats = UtpStats()
        self.samples: dict[int, int] = {}  # sequence index of a Compute -> its memory sample
        self.curve: dict[int, int] | None = None  # the on-demand pass's samples (no budget)
        self.ceiling = 0
        self.extra: dict[int, int] = defaultdict(int)  # bytes booked by early prefetches
        self._index_sequence()

    # -- static look-ahead -------------------------------------------------------------------
    def _index_sequence(self) -> None:
        g = self.graph
        # every (step, storage) read of an offloadable storage, by step then storage
        self.read_steps: list[int] = []
        self.read_storages: list[int] = []
        forward_convs: list[int] = []
        self.backward_convs: list[int] = []
        self.last_forward_read: dict[int, int] = {}
        self.boundary = len(self.seq)
        for i, ins in enumerate(self.seq):
            if not isinstance(ins, Compute):
                continue
            op = g.ops[ins.op]
            forward = op.phase is Phase.FORWARD and not ins.recompute
            if not forward and self.boundary == len(self.seq):
                self.boundary = i
            if op.category is OpCategory.CONV and not ins.recompute:
                (forward_convs if forward else self.backward_convs).append(i)
            for s in sorted({g.tensors[t].storage for t in op.inputs} & self.offloadable):
                self.read_steps.append(i)
                self.read_storages.append(s)
                if forward:
                    self.last_forward_read[s] = i
        self.forward_convs = forward_convs

    def _release_index(self, storage: int, made_at: int) -> int:
        nxt = bisect.bisect_right(self.forward_convs, made_at)
        conv = self.forward_convs[nxt] if nxt < len(self.forward_convs) else len(self.seq)
        return max(self.last_forward_read.get(storage, made_at), conv)

    # -- evictions ---------------------------------------------------------------------------
    def _locked(self, locked: set[int]) -> Callable[[int], bool]:
        return lambda s: (s in locked or not self.dev.on_device(s) or not self.dev.only_base(s))

    def _fits(self, need: int) -> bool:
        return self.budget is None or self.dev.live + need <= self.budget

    def try_room(self, need: int, locked: set[int]) -> bool:
        """Evict LRU tensors until ``need`` more bytes fit; False (and no eviction) if they
        cannot."""
        if self.budget is None or self._fits(need):
            return True
        victims, freed = [], 0
        for s in self.lru.unlocked_from_tail(self._locked(locked)):
            victims.append(s)
            freed += self.graph.tensors[s].nbytes
            if self.dev.live - freed + need <= self.budget:
                for v in victims:
                    self._evict(v)
                return True
        return False

    def room(self, need: int, locked: set[int], what: str) -> None:
        if not self.try_room(need, locked):
            evictable = sum(self.graph.tensors[s].nbytes
                            for s in self.lru.unlocked_from_tail(self._locked(locked)))
            raise NoRoom(self.dev.live - evictable + need, what)

    def _evict(self, s: int) -> None:
        if s in self.h2d:  # prefetched too early: let the copy land, keep the host copy
            self.out.append(Wait(s, "h2d"))
            self.h2d.discard(s)
        elif s in self.d2h:
            self._finish_offload(s)
        else:
            self._offload(s)
        self.out.append(Free(s))
        self.dev.drop(s)
        self.lru.remove(s)
        self.evicted.add(s)
        self.stats.evictions += 1

    def _offload(self, s: int) -> None:
        if s in self.on_host:
            return
        self.out.append(Offload(s))
        self.stats.offloads += 1
        self.stats.offload_bytes += self.graph.tensors[s].nbytes
        self.d2h.add(s)
        self._finish_offload(s)

    def _finish_offload(self, s: int) -> None:
        self.out.append(Wait(s, "d2h"))
        self.d2h.discard(s)
        self.on_host.add(s)
        self.pending_release.pop(s, None)

    # -- bringing tensors back ---------------------------------------------------------------
    def _prefetch(self, s: int) -> None:
        self.out.append(Prefetch(s))
        self.stats.prefetches += 1
        self.stats.prefetch_bytes += self.graph.tensors[s].nbytes
        self.dev.add(s)
        self.evicted.discard(s)
        self.h2d.add(s)
        self.lru.insert_front(s)

    def bring(self, s: int, locked: set[int], what: str) -> None:
        """Alg. 2's ``Check``: a hit moves ``s`` to the front, a miss prefetches it."""
        if s in self.h2d:
            self.out.append(Wait(s, "h2d"))
            self.h2d.discard(s)
            self.lru.place_to_front(s)
            self.stats.hits += 1
        elif s in self.evicted:
            self.room(self.graph.tensors[s].nbytes, locked, what)
            self._prefetch(s)
            self.out.append(Wait(s, "h2d"))
            self.h2d.discard(s)
            self.stats.misses += 1
        elif s in self.lru:
            self.lru.place_to_front(s)
            self.stats.hits += 1

    def window_prefetch(self, i: int, locked: set[int], need: int) -> None:
        nxt = bisect.bisect_right(self.backward_convs, i)
        end = self.backward_convs[nxt] if nxt < len(self.backward_convs) else len(self.seq)
        wanted = first_reads_in(self.read_steps, self.read_storages, self.evicted, i, end)
        for first, s in wanted:
            size = self.graph.tensors[s].nbytes
            if self.budget is None:
                if not self._under_ceiling(i, first, size):
                    break
            elif not self.try_room(size + need, locked | {s}):
                break
            self._prefetch(s)
            locked = locked | {s}

    def _under_ceiling(self, i: int, first: int, size: int) -> bool:
        """Without a budget: would ``size`` more bytes from step ``i`` to ``first`` stay under
        the peak of the on-demand pass? If so, book them."""
        if self.curve is None:
            return False
        steps = [k for k in range(i, first) if k in self.curve]
        if any(self.curve[k] + self.extra[k] + size > self.ceiling for k in steps):
            return False
        for k in steps:
            self.extra[k] += size
        return True

    # -- the pass ----------------------------------------------------------------------------
    def run(self) -> list[Instruction]:
        g = self.graph
        for i, ins in enumerate(self.seq):
            if i == self.boundary:
                for s in list(self.pending_release):
                    self._finish_offload(s)  # made after the last CONV: stays cached
            if isinstance(ins, Free):
                self._free(ins.tensor)
                continue
            assert isinstance(ins, Compute)
            op = g.ops[ins.op]
            if i < self.boundary:
                for s, after in list(self.pending_release.items()):
                    if after < i and self.dev.only_base(s):
                        self._finish_offload(s)
                        self._release(s)
            ins_storages = list(dict.fromkeys(g.tensors[t].storage for t in op.inputs))
            locked = set(ins_storages) | {g.tensors[t].storage for t in op.outputs}
            for s in ins_storages:
                self.bring(s, locked, f"reading inputs of {op.name!r}")
            need = self.dev.compute_bytes(op)
            if op.category is OpCategory.CONV and i >= self.boundary and not ins.recompute:
                self.window_prefetch(i, locked, need)
            self.room(need, locked, f"the outputs of {op.name!r}")
            self.samples[i] = self.dev.live + need
            self.out.append(ins)
            self._made(i, op, ins.recompute)
        for s in sorted(self.h2d):
            self.out += [Wait(s, "h2d"), Free(s)]
        for s in sorted(self.d2h):
            self.out.append(Wait(s, "d2h"))
        return self.out

    def _made(self, i: int, op: Op, recompute: bool) -> None:
        for out in op.outputs:
            fresh = out not in self.dev.resident
            self.dev.add(out)
            if out in self.offloadable and fresh and out not in self.lru:
                self.lru.insert_front(out)
                if not self.cache and i < self.boundary and not recompute:
                    self.out.append(Offload(out))
                    self.stats.offloads += 1
                    self.stats.offload_bytes += self.graph.tensors[out].nbytes
                    self.d2h.add(out)
                    self.pending_release[out] = self._release_index(out, i)

    def _release(self, s: int) -> None:
        self.out.append(Free(s))
        self.dev.drop(s)
        self.lru.remove(s)
        self.evicted.add(s)

    def _free(self, tid: int) -> None:
        s = self.graph.tensors[tid].storage
        if tid == s and s in self.evicted:
            self.evicted.discard(s)  # dead while on the host: nothing on the device to free
            return
        if s in self.h2d:
            self.out.append(Wait(s, "h2d"))
            self.h2d.discard(s)
        releases = self.dev.members[s] == {tid}
        if releases and s in self.d2h:
            self._finish_offload(s)
        self.out.append(Free(tid))
        if self.dev.drop(tid):
            self.lru.remove(s)


def apply_pool(graph: Graph, seq: Sequence[Instruction], offloadable: set[int],
               budget: int | None, cache: bool = True) -> tuple[list[Instruction], UtpStats]:
    """Insert the tensor pool's Offload / Prefetch / Wait / Free (module docstring).

    Raises NoRoom when a step cannot fit ``budget``.
    """
    pool = _Pool(graph, seq, offloadable, budget, cache)
    if budget is None:  # first an on-demand pass, to know the peak prefetches must not raise
        pool.run()
        curve = pool.samples
        pool = _Pool(graph, seq, offloadable, budget, cache)
        pool.curve, pool.ceiling = curve, max(curve.values(), default=0)
    return pool.run(), pool.stats

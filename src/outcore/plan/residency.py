"""THE replay of a Schedule: one state machine, walked by every consumer of the memory rule.

``Replay(graph, schedule)`` yields, per instruction, a ``Step``: what became resident, what
was dropped and released, the device and host bytes after it, and the rule it broke, if any
(a ``outcore.plan.rules.Violation`` naming the instruction and the tensor). The verifier
drains it and raises the first violation; ``memory_curve`` sums it; the simulator adds times
to it; codegen reads its releases; the pool's blocks and the planners' resident spans
(``resident_spans``) are derived from it. Nothing else walks a schedule's residency.

The memory rule (written here only):

* before the first instruction, every static tensor (parameters, buffers, inputs,
  tangents) is resident, except those of ``schedule.host_static``: these are in host memory
  (counted in the host bytes, with a completed host copy) and come to the device by
  ``Prefetch`` only (``outcore.plan.weights``);
* a storage is allocated when its first tensor becomes resident while the storage is not,
  and released when its last resident tensor is dropped;
* ``Compute`` makes its outputs resident, in ``op.outputs`` order. An output that is
  already resident and is not a view (a recompute's duplicate) exists during the
  instruction only (made, then dropped at once), and so does the workspace of the op's
  variant (``workspace(op_id)``; by default read from ``schedule.variants``) and the op's
  kernel temporaries (``op.temporaries``, measured by the allocator; left out only with
  ``no_workspace``, which counts tensors alone). A random op that the schedule recomputes
  saves the generator's state at its first Compute and replays it at each recompute: the
  state (``graph.meta[RNG_STATE_BYTES]`` bytes, set by the measurement for a device whose
  allocator holds it; 0, i.e. nothing, when absent) is held from that first Compute through
  its last recompute, and each recompute also holds a copy of the current state during the
  instruction (the executor's ``replay_rng``). Both are transient bytes of the steps they
  span (not storages; left out under ``no_workspace`` too). A base output
  that is not resident while a view of its storage is (recomputed after its base was freed
  and a view kept) rejoins that storage, and the kernel's fresh output exists during the
  instruction only (a TRANSIENT allocation naming a tensor of ``made_resident``: a rebase);
* ``Prefetch`` makes its tensor resident at issue (the storage is reserved while the copy
  runs); ``Wait(h2d)`` makes it usable;
* ``Free`` drops one tensor (a tensor that is not resident is ignored, and is a violation);
* ``Offload`` adds the storage's bytes to the host; ``Wait`` changes no bytes.

The schedule's rules (each broken one is a ``Violation``, worded in ``outcore.plan.rules``):

* a Compute names a known op; a recompute follows a first run of the op; every input is
  resident and usable (not a base whose prefetch has not been waited for); random ops run
  first in the order they were traced (eager's program order: each draws from the
  generator where eager's draws, so dropout masks are eager's);
* a Free names a resident tensor, not while a prefetch of its storage is in flight, and not
  while an offload of its storage is in flight when it is that storage's base or its last
  resident tensor;
* Offload and Prefetch name base tensors only (a view moves with its base); an Offload names
  a resident, usable tensor with no earlier offload still unwaited; a Prefetch names a
  tensor that is not on the device (nor held by a resident view of it) and has a completed
  (waited) host copy;
* a Wait names a copy in flight in its direction (``"d2h"`` or ``"h2d"``);
* at the end (``Replay.end()``), no copy is in flight and every ``keep_at_end`` tensor is
  resident and usable, or, for one of ``schedule.host_outputs``, its storage has a completed
  host copy.

After a violation the replay goes on with the instruction's memory effect (or none, where
it has none to have); consumers that need a sound schedule stop at the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from outcore.graph.ir import STATIC_KINDS, Graph
from outcore.plan import rules
from outcore.plan.rules import Violation
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait

#: ``Allocation.storage`` of a transient (a recompute's duplicate, an op's workspace, or the
#: saved RNG states held for recomputes).
TRANSIENT = -1
#: ``graph.meta`` key: bytes of one saved generator state in the device allocator that runs
#: the step (``outcore.cost.measure_temporaries`` sets it; 0 or absent: not counted).
RNG_STATE_BYTES = "rng_state_bytes"
#: "no tensor / no storage": ``Allocation.tensor`` of a workspace, ``Step.released`` and
#: ``Step.dropped`` when the instruction releases / drops nothing.
NONE = -1

Workspace = Callable[[int], int]


class Allocation(NamedTuple):
    """Bytes an instruction allocates.

    ``storage >= 0``: that storage becomes resident (``tensor`` is the tensor that made it
    so; ``nbytes`` its storage's bytes, possibly 0). ``storage == TRANSIENT``: bytes that live
    during the instruction only: ``tensor`` is the recompute's duplicated output, or ``NONE``
    for the op's workspace (and kernel temporaries) or for the saved RNG states held at this
    instruction (module doc); ``nbytes > 0`` (empty transients are not listed).
    """

    storage: int
    nbytes: int
    tensor: int


class Step(NamedTuple):
    """What the replay does at instruction ``at`` (-1: the state before the first).

    Invariants, with ``prev`` the step before (for ``at == -1``: nothing resident, no host bytes):

    * ``device - transient == prev.device - prev.transient + (bytes of the storages
      allocated) - (bytes of the released storage)``, and ``transient`` is the bytes of the
      TRANSIENT allocations;
    * ``tensors == prev.tensors + len(made_resident) - (dropped != NONE)``;
    * every allocated storage is the storage of a tensor in ``made_resident``; ``released``
      is NONE or the storage of ``dropped``; a step allocates nothing it releases;
    * ``host >= prev.host``;
    * ``broken`` is None on a sound instruction, else the first rule it breaks.
    """

    at: int  # the instruction index; -1: the state before the first
    allocations: tuple[Allocation, ...]  # in the order the rule makes them
    released: int  # the storage this instruction releases, or NONE
    made_resident: tuple[int, ...]  # tensors that became resident, in order
    dropped: int  # the tensor this instruction dropped (a Free of a resident one), or NONE
    device: int  # device bytes after the instruction, transients included
    transient: int  # bytes that live during this instruction only
    host: int  # host bytes after the instruction
    tensors: int  # resident tensors after the instruction
    broken: Violation | None = None  # the rule this instruction breaks, if any


def default_workspace(graph: Graph, schedule: Schedule) -> Workspace | None:
    """The chosen variants' workspace (``schedule.variants``), or None when none is chosen."""
    if not schedule.variants:
        return None
    chosen = schedule.variants
    return lambda op: graph.ops[op].variant_workspace(chosen.get(op, ""))


def no_workspace(op: int) -> int:
    """A ``workspace`` that leaves workspace and kernel temporaries out (tensors only)."""
    return 0


_NO_ALLOCATIONS: tuple[Allocation, ...] = ()
_NO_TENSORS: tuple[int, ...] = ()
#: ``Step(*fields)`` (or ``Allocation``'s) without NamedTuple's argument binding: one Step per
#: instruction is the hot path of ``simulate`` and ``memory_curve`` (this halves its cost).
_tuple_new = tuple.__new__
_NOT = -1  # "no copy in flight" in Replay.pending / Replay.unwaited


class Replay:
    """The state machine of one pass over ``schedule`` (module doc). Iterate it once for the
    Steps (the first is the static state, ``at == -1``); then ``end()`` checks the end.

    ``workspace(op_id)`` gives the transient bytes of an op's chosen variant; None reads it
    from ``schedule.variants`` (``default_workspace``); ``no_workspace`` leaves it out, and
    the ops' kernel temporaries too (every other ``workspace`` gets them added).
    """

    def __init__(self, graph: Graph, schedule: Schedule,
                 workspace: Workspace | None = None) -> None:
        self.graph = graph
        self.schedule = schedule
        self.workspace = default_workspace(graph, schedule) if workspace is None else workspace
        #: per op: the kernel temporaries a Compute holds (none under ``no_workspace``)
        self.temporaries = ([0] * len(graph.ops) if workspace is no_workspace
                            else [op.temporaries for op in graph.ops])
        #: bytes of one saved RNG state, and per recomputed random op the index of its last
        #: recompute (module doc); the states held now sum to ``rng_held``
        self.rng_bytes = 0 if workspace is no_workspace else rng_state_bytes(graph)
        self.rng_last = last_random_recomputes(graph, schedule) if self.rng_bytes else {}
        self.rng_held = 0
        n = len(graph.tensors)
        self.storage_of = [t.storage for t in graph.tensors]
        self.storage_bytes = [graph.tensors[s].nbytes for s in self.storage_of]
        self.count = [0] * n  # per storage id: its resident tensors
        self.resident = [False] * n  # allocated on the device (a pending prefetch included)
        self.pending = [_NOT] * n  # per storage: the index of its Prefetch not yet waited for
        self.unwaited = [_NOT] * n  # per storage: the index of its Offload not yet waited for
        self.on_host = [False] * n  # per storage: a completed (waited) host copy exists
        self.freed_at: dict[int, int] = {}
        self.ran = [False] * len(graph.ops)
        self.last_random = -1  # the latest-traced random op run so far (its first Compute)
        self.live = 0  # bytes of the resident storages
        self.n_resident = 0
        self.host = 0

    # -- the memory rule ------------------------------------------------------------------
    def _make_resident(self, tid: int, made: list[Allocation]) -> None:
        """Make the non-resident ``tid`` resident; append its storage's allocation, if any."""
        self.resident[tid] = True
        self.n_resident += 1
        storage = self.storage_of[tid]
        self.count[storage] += 1
        if self.count[storage] == 1:
            self.live += self.storage_bytes[tid]
            made.append(_tuple_new(Allocation, (storage, self.storage_bytes[tid], tid)))

    def _drop(self, tid: int) -> int:
        """Drop the resident ``tid``; the storage it releases, or NONE."""
        self.resident[tid] = False
        self.n_resident -= 1
        storage = self.storage_of[tid]
        self.count[storage] -= 1
        if self.count[storage]:
            return NONE
        self.live -= self.storage_bytes[tid]
        return storage

    def usable(self, tid: int) -> bool:
        """Resident and readable (not a base whose prefetch has not been waited for)."""
        return self.resident[tid] and not (tid == self.storage_of[tid]
                                           and self.pending[tid] != _NOT)

    def resident_tensors(self) -> list[int]:
        """The tensors resident now (a pending prefetch included), by id."""
        return [tid for tid, here in enumerate(self.resident) if here]

    def __iter__(self) -> Iterator[Step]:
        graph = self.graph
        made: list[Allocation] = []
        held = set(self.schedule.host_static)
        static = tuple(t.id for t in graph.tensors if t.kind in STATIC_KINDS and t.id not in held)
        for tid in static:
            self._make_resident(tid, made)
        broken = self._hold_on_host(held)
        yield Step(-1, tuple(made), NONE, static, NONE, self.live, 0, self.host,
                   self.n_resident, broken)
        # One branch per instruction kind (the rule's bullets in the module doc): this runs
        # once per instruction on every memory_curve and simulate call.
        for i, ins in enumerate(self.schedule.instructions):
            if isinstance(ins, Compute):
                yield self._compute(i, ins)
            elif isinstance(ins, Free):
                yield self._free(i, ins.tensor)
            else:
                yield self._copy(i, ins)

    def _hold_on_host(self, held: set[int]) -> Violation | None:
        """Put the ``host_static`` tensors in host memory (a completed host copy each)."""
        broken = None
        for tid in sorted(held):
            t = self.graph.tensors[tid] if 0 <= tid < len(self.graph.tensors) else None
            if t is None or t.is_view or t.kind not in STATIC_KINDS:
                if broken is None:
                    name, kind = (t.name, str(t.kind)) if t is not None else (str(tid), "unknown")
                    broken = Violation(-1, tid, rules.host_static_not_static(name, kind))
                continue
            self.on_host[tid] = True
            self.host += t.nbytes
        return broken

    def _step(self, i: int, broken: Violation | None = None,
              allocations: tuple[Allocation, ...] = _NO_ALLOCATIONS, released: int = NONE,
              entered: tuple[int, ...] = _NO_TENSORS, dropped: int = NONE,
              transient: int = 0) -> Step:
        if self.rng_held:  # saved RNG states, held across this instruction
            allocations = (*allocations, _tuple_new(Allocation, (TRANSIENT, self.rng_held,
                                                                 NONE)))
            transient += self.rng_held
        return _tuple_new(Step, (i, allocations, released, entered, dropped,
                                 self.live + transient, transient, self.host,
                                 self.n_resident, broken))

    def _compute(self, i: int, ins: Compute) -> Step:
        graph = self.graph
        if not 0 <= ins.op < len(graph.ops):
            return self._step(i, Violation(i, NONE, rules.unknown_op(ins.op)))
        op = graph.ops[ins.op]
        broken = None
        if ins.recompute and not self.ran[ins.op]:
            broken = Violation(i, NONE, rules.recompute_before_run(op.name))
        elif op.random and not ins.recompute:
            if ins.op < self.last_random:
                broken = Violation(i, NONE, rules.random_out_of_order(
                    op.name, graph.ops[self.last_random].name))
            self.last_random = max(self.last_random, ins.op)
        resident, pending, storage_of = self.resident, self.pending, self.storage_of
        for tid in op.inputs:  # usable: resident, and not a base with a pending prefetch
            if broken is None and (not resident[tid] or (pending[tid] != _NOT
                                                         and storage_of[tid] == tid)):
                broken = self._absent_input(i, op.name, ins.recompute, tid)
        self.ran[ins.op] = True
        made: list[Allocation] = []
        new: list[int] = []
        transient = 0
        tensors = graph.tensors
        for out in op.outputs:
            if not resident[out]:
                new.append(out)
                if storage_of[out] == out and self.count[out] and tensors[out].nbytes:
                    # re-made while a view of its old storage is resident: the kernel's new
                    # storage lives during the instruction, then the output is rebound to
                    # the resident one (a rebase)
                    made.append(Allocation(TRANSIENT, tensors[out].nbytes, out))
                    transient += tensors[out].nbytes
                self._make_resident(out, made)
            elif not tensors[out].is_view and tensors[out].nbytes:  # a recompute's duplicate
                made.append(Allocation(TRANSIENT, tensors[out].nbytes, out))
                transient += tensors[out].nbytes
        extra = self.temporaries[ins.op]
        if self.workspace is not None:
            extra += self.workspace(ins.op)
        if extra:
            made.append(Allocation(TRANSIENT, extra, NONE))
            transient += extra
        if self.rng_last:
            transient += self._rng(i, ins, made)
        return _tuple_new(Step, (i, tuple(made), NONE, tuple(new), NONE, self.live + transient,
                                 transient, self.host, self.n_resident, broken))

    def _rng(self, i: int, ins: Compute, made: list[Allocation]) -> int:
        """The saved RNG states held during Compute ``i`` (module doc), appended to ``made``;
        their bytes. The state of a recomputed random op is saved at its first Compute and
        dropped after its last recompute, which also holds a copy of the current state."""
        last = self.rng_last.get(ins.op)
        if last is not None and not ins.recompute and i < last:
            self.rng_held += self.rng_bytes  # saved before the kernel runs
        held = self.rng_held + (self.rng_bytes if last is not None and ins.recompute else 0)
        if last == i:
            self.rng_held -= self.rng_bytes
        if held:
            made.append(_tuple_new(Allocation, (TRANSIENT, held, NONE)))
        return held

    def _absent_input(self, i: int, op: str, recompute: bool, tid: int) -> Violation:
        name = self.graph.tensors[tid].name
        if self.resident[tid]:  # a base whose prefetch is in flight
            return Violation(i, tid, rules.reads_pending_prefetch(op, name, self.pending[tid]))
        return Violation(i, tid, rules.reads_absent(op, recompute, name, self._why(tid)))

    def _why(self, tid: int) -> str:
        storage = self.storage_of[tid]
        base = self.graph.tensors[storage].name if self.on_host[storage] else None
        produced = self.graph.tensors[tid].producer is not None
        return rules.why_absent(self.freed_at.get(tid), base, produced)

    def _free(self, i: int, tid: int) -> Step:
        tensors = self.graph.tensors
        if not 0 <= tid < len(tensors):
            return self._step(i, Violation(i, tid, rules.unknown_tensor("Free", tid)))
        storage = self.storage_of[tid]
        name, base = tensors[tid].name, tensors[storage].name
        resident = self.resident[tid]
        broken = None
        releases = tid == storage or (resident and self.count[storage] == 1)
        if releases and self.unwaited[storage] != _NOT:
            broken = Violation(i, tid, rules.free_during_offload(name, base,
                                                                 self.unwaited[storage]))
        elif self.pending[storage] != _NOT:
            broken = Violation(i, tid, rules.free_during_prefetch(name, base,
                                                                  self.pending[storage]))
        elif not resident:
            broken = Violation(i, tid, rules.free_absent(name, self._why(tid)))
        if not resident:
            return self._step(i, broken)
        self.freed_at[tid] = i
        released = self._drop(tid)
        return self._step(i, broken, released=released, dropped=tid)

    def _copy(self, i: int, ins: object) -> Step:
        """Offload, Prefetch or Wait (or an unknown instruction)."""
        if not isinstance(ins, (Offload, Prefetch, Wait)):
            return self._step(i, Violation(i, NONE, rules.unknown_instruction(ins)))
        tensors = self.graph.tensors
        tid = ins.tensor
        kind = type(ins).__name__
        if not 0 <= tid < len(tensors):
            return self._step(i, Violation(i, tid, rules.unknown_tensor(kind, tid)))
        if isinstance(ins, Wait):
            return self._wait(i, ins)
        if tensors[tid].is_view:
            base = tensors[self.storage_of[tid]].name
            return self._step(i, Violation(i, tid, rules.move_of_view(kind, tensors[tid].name,
                                                                      base)))
        if isinstance(ins, Offload):
            return self._offload(i, tid)
        return self._prefetch(i, tid)

    def _offload(self, i: int, tid: int) -> Step:
        name = self.graph.tensors[tid].name
        broken = None
        if not self.usable(tid):
            why = (f"its prefetch (instruction {self.pending[tid]}) has not been waited for"
                   if self.resident[tid] else self._why(tid))
            broken = Violation(i, tid, rules.offload_absent(name, why))
        elif self.unwaited[tid] != _NOT:
            broken = Violation(i, tid, rules.offload_twice(name, self.unwaited[tid]))
        self.unwaited[tid] = i
        self.host += self.storage_bytes[tid]
        return self._step(i, broken)

    def _prefetch(self, i: int, tid: int) -> Step:
        name = self.graph.tensors[tid].name
        if self.resident[tid] or self.pending[tid] != _NOT:
            return self._step(i, Violation(i, tid, rules.prefetch_resident(name)))
        broken = None
        if self.count[tid]:
            broken = Violation(i, tid, rules.prefetch_under_view(name))
        elif not self.on_host[tid]:
            broken = Violation(i, tid, rules.prefetch_without_host_copy(name))
        made: list[Allocation] = []
        self._make_resident(tid, made)
        self.pending[tid] = i
        return self._step(i, broken, tuple(made), entered=(tid,))

    def _wait(self, i: int, ins: Wait) -> Step:
        tid = ins.tensor
        if ins.direction not in ("d2h", "h2d"):
            return self._step(i, Violation(i, tid, rules.bad_direction(ins.direction)))
        flight = self.unwaited if ins.direction == "d2h" else self.pending
        if flight[tid] == _NOT:
            name = self.graph.tensors[tid].name
            return self._step(i, Violation(i, tid, rules.wait_not_in_flight(ins.direction,
                                                                             name)))
        flight[tid] = _NOT
        if ins.direction == "d2h":
            self.on_host[tid] = True
        return self._step(i)

    def end(self) -> Violation | None:
        """The end-of-step rule the replayed schedule breaks, if any (call after iterating)."""
        tensors = self.graph.tensors
        in_flight = [s for s in range(len(tensors))
                     if self.pending[s] != _NOT or self.unwaited[s] != _NOT]
        if in_flight:
            return Violation(None, in_flight[0],
                             rules.in_flight_at_end([tensors[s].name for s in in_flight]))
        on_host = set(self.schedule.host_outputs)
        for tid in self.schedule.keep_at_end:
            if not 0 <= tid < len(tensors):
                return Violation(None, tid, rules.unknown_tensor("keep_at_end", tid))
            if tid in on_host:
                if not self.on_host[self.storage_of[tid]]:
                    return Violation(None, tid, rules.not_on_host_at_end(tensors[tid].name))
            elif not self.usable(tid):
                return Violation(None, tid, rules.absent_at_end(tensors[tid].name))
        return None


def rng_state_bytes(graph: Graph) -> int:
    """Bytes of one saved RNG state in the allocator that runs ``graph``'s step
    (``graph.meta[RNG_STATE_BYTES]``; 0 when the measurement did not set it)."""
    return int(graph.meta.get(RNG_STATE_BYTES, 0) or 0)


def last_random_recomputes(graph: Graph, schedule: Schedule) -> dict[int, int]:
    """Random op -> the index of its last recompute in ``schedule``, for every random op the
    schedule recomputes (each saves its RNG state at its first run; module doc)."""
    last: dict[int, int] = {}
    ops = graph.ops
    for i, ins in enumerate(schedule.instructions):
        if isinstance(ins, Compute) and ins.recompute and 0 <= ins.op < len(ops) \
                and ops[ins.op].random:
            last[ins.op] = i
    return last


def residency_steps(graph: Graph, schedule: Schedule,
                    workspace: Workspace | None = None) -> Iterator[Step]:
    """The Steps of ``Replay(graph, schedule, workspace)`` (module doc): one for the state
    before the first instruction (``at == -1``: the static tensors), then one per instruction.
    Violations ride on the steps (``Step.broken``); nothing here raises."""
    return iter(Replay(graph, schedule, workspace))


def checked_steps(graph: Graph, schedule: Schedule,
                  workspace: Workspace | None = None) -> Iterator[Step]:
    """The Steps of the replay, raising ``ScheduleError`` at the first broken rule (the end's
    rules are checked after the last Step)."""
    replay = Replay(graph, schedule, workspace)
    for step in replay:
        if step.broken is not None:
            raise step.broken.error()
        yield step
    broken = replay.end()
    if broken is not None:
        raise broken.error()


def resident_spans(graph: Graph, schedule: Schedule) -> dict[int, list[tuple[int, int]]]:
    """Base tensor -> [(first index resident, index of its Free or len(schedule))] per
    residency of that tensor, in schedule order, from the replay. Static tensors' initial
    residency is left out. A span ends at the base's own Free, even when a view of it keeps
    the storage resident longer."""
    tensors = graph.tensors
    spans: dict[int, list[tuple[int, int]]] = {}
    open_at: dict[int, int] = {}
    for step in residency_steps(graph, schedule, no_workspace):
        if step.at < 0:
            continue
        for tid in step.made_resident:
            if not tensors[tid].is_view:
                open_at[tid] = step.at
        if step.dropped in open_at:
            spans.setdefault(step.dropped, []).append((open_at.pop(step.dropped), step.at))
    end = len(schedule)
    for tid, start in open_at.items():
        spans.setdefault(tid, []).append((start, end))
    return spans

"""THE memory rule of a Schedule, as one replay: what each instruction allocates and releases.

Every consumer of the rule (``memory_curve``, the pool's block lifetimes, the simulator's
``Lifetime`` list, outcore-auto's resident spans) is derived from ``residency_steps``; the
rule is written here only:

* before the first instruction, every static tensor (parameters, buffers, inputs,
  tangents) is resident;
* a storage is allocated when its first tensor becomes resident while the storage is not,
  and released when its last resident tensor is dropped;
* ``Compute`` makes its outputs resident, in ``op.outputs`` order. An output that is
  already resident and is not a view (a recompute's duplicate) exists during the
  instruction only (made, then dropped at once), and so does the workspace of the op's
  variant (``workspace(op_id)``; by default read from ``schedule.variants``);
* ``Prefetch`` makes its tensor resident (the storage is reserved while the copy runs);
* ``Free`` drops one tensor (a tensor that is not resident is ignored);
* ``Offload`` adds the storage's bytes to the host; ``Wait`` changes nothing.

The schedule is assumed verified (``outcore.plan.verify``); nothing here raises on a bad one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from outcore.graph.ir import STATIC_KINDS, Graph
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule

#: ``Allocation.storage`` of a transient (a recompute's duplicate or an op's workspace).
TRANSIENT = -1
#: "no tensor / no storage": ``Allocation.tensor`` of a workspace, ``Step.released`` and
#: ``Step.dropped`` when the instruction releases / drops nothing.
NONE = -1

Workspace = Callable[[int], int]


class Allocation(NamedTuple):
    """Bytes an instruction allocates.

    ``storage >= 0``: that storage becomes resident (``tensor`` is the tensor that made it
    so; ``nbytes`` its storage's bytes, possibly 0). ``storage == TRANSIENT``: bytes that live
    during the instruction only: ``tensor`` is the recompute's duplicated output, or ``NONE``
    for the op's workspace; ``nbytes > 0`` (empty transients are not listed).
    """

    storage: int
    nbytes: int
    tensor: int


class Step(NamedTuple):
    """What the memory rule does at instruction ``at`` (-1: the state before the first).

    Invariants, with ``prev`` the step before (for ``at == -1``: nothing resident, no host bytes):

    * ``device - transient == prev.device - prev.transient + (bytes of the storages
      allocated) - (bytes of the released storage)``, and ``transient`` is the bytes of the
      TRANSIENT allocations;
    * ``tensors == prev.tensors + len(made_resident) - (dropped != NONE)``;
    * every allocated storage is the storage of a tensor in ``made_resident``; ``released``
      is NONE or the storage of ``dropped``; a step allocates nothing it releases;
    * ``host >= prev.host``.
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


def default_workspace(graph: Graph, schedule: Schedule) -> Workspace | None:
    """The chosen variants' workspace (``schedule.variants``), or None when none is chosen."""
    if not schedule.variants:
        return None
    chosen = schedule.variants
    return lambda op: graph.ops[op].variant_workspace(chosen.get(op, ""))


def no_workspace(op: int) -> int:
    """A ``workspace`` that leaves workspace out."""
    return 0


_NO_ALLOCATIONS: tuple[Allocation, ...] = ()
_NO_TENSORS: tuple[int, ...] = ()
#: ``Step(*fields)`` (or ``Allocation``'s) without NamedTuple's argument binding: one Step per
#: instruction is the hot path of ``simulate`` and ``memory_curve`` (this halves its cost).
_tuple_new = tuple.__new__


def residency_steps(graph: Graph, schedule: Schedule,
                    workspace: Workspace | None = None) -> Iterator[Step]:
    """Replay ``schedule`` under the memory rule (module doc): one ``Step`` for the state
    before the first instruction (``at == -1``: the static tensors), then one per instruction.

    ``workspace(op_id)`` gives the transient bytes of an op's chosen variant; None reads it
    from ``schedule.variants`` (``default_workspace``); ``no_workspace`` leaves it out.
    """
    if workspace is None:
        workspace = default_workspace(graph, schedule)
    tensors = graph.tensors
    storage_of = [t.storage for t in tensors]
    storage_bytes = [tensors[s].nbytes for s in storage_of]  # per tensor: its storage's bytes
    count = [0] * len(tensors)  # per storage id: its resident tensors
    resident = [False] * len(tensors)
    live = 0  # bytes of the resident storages
    n_resident = 0

    def make_resident(tid: int, made: list[Allocation]) -> None:
        """Make the non-resident ``tid`` resident; append its storage's allocation, if any."""
        nonlocal live, n_resident
        resident[tid] = True
        n_resident += 1
        storage = storage_of[tid]
        count[storage] += 1
        if count[storage] == 1:
            live += storage_bytes[tid]
            made.append(_tuple_new(Allocation, (storage, storage_bytes[tid], tid)))

    # One loop, one branch per instruction kind (the rule's bullets in the module doc): this
    # runs once per instruction on every memory_curve and simulate call.
    static = tuple(t.id for t in tensors if t.kind in STATIC_KINDS)
    made: list[Allocation] = []
    for tid in static:
        make_resident(tid, made)
    yield Step(-1, tuple(made), NONE, static, NONE, live, 0, 0, n_resident)
    host = 0
    for i, ins in enumerate(schedule.instructions):
        allocations, released, entered, dropped = _NO_ALLOCATIONS, NONE, _NO_TENSORS, NONE
        transient = 0
        if isinstance(ins, Compute):
            made, new = [], []
            for out in graph.ops[ins.op].outputs:
                if not resident[out]:
                    new.append(out)
                    make_resident(out, made)
                elif not tensors[out].is_view and tensors[out].nbytes:  # a recompute's duplicate
                    made.append(Allocation(TRANSIENT, tensors[out].nbytes, out))
                    transient += tensors[out].nbytes
            extra = workspace(ins.op) if workspace is not None else 0
            if extra:
                made.append(Allocation(TRANSIENT, extra, NONE))
                transient += extra
            allocations, entered = tuple(made), tuple(new)
        elif isinstance(ins, Free):
            dropped = ins.tensor
            if resident[dropped]:
                resident[dropped] = False
                n_resident -= 1
                storage = storage_of[dropped]
                count[storage] -= 1
                if count[storage] == 0:
                    live -= storage_bytes[dropped]
                    released = storage
            else:
                dropped = NONE
        elif isinstance(ins, Prefetch):
            if not resident[ins.tensor]:
                made = []
                make_resident(ins.tensor, made)
                allocations, entered = tuple(made), (ins.tensor,)
        elif isinstance(ins, Offload):
            host += storage_bytes[ins.tensor]
        yield _tuple_new(Step, (i, allocations, released, entered, dropped, live + transient,
                                transient, host, n_resident))

"""The state moDNN's scheduler keeps while it simulates one training step (plain Python).

* ``Block``: one data block of the TDFG (an outcore storage that is not in SW) and where it
  is: not made yet, on the device, being prefetched, only on the host, or dead.
* ``Engine``: one copy engine (StrmD). Copies run first in, first out; ``last_slot`` is the
  slot of the latest copy queued on it, so a copy added later is never placed before it.
* ``Slots``: the instruction stream as numbered slots. Task i owns slot ``2i`` (everything
  issued before its Compute: waits, loads, evictions, prefetches), then its Compute, then
  slot ``2i + 1`` (frees after it). An offload can be added to an earlier slot
  (retroactively, Fig. 3b: the copy ran on StrmD while earlier tasks computed); since it is
  never placed before the engine's ``last_slot``, the engines stay FIFO in stream order,
  exactly as the simulator runs them. ``end_time[s]`` is when the compute stream leaves
  slot ``s`` (the issue time of an instruction appended to it).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from enum import StrEnum

from outcore.plan.schedule import Compute, Instruction


class BlockState(StrEnum):
    """Where a data block is: not made yet, on the device, being copied, on the host only,
    or dead (no use left)."""

    NONE = "none"
    DEV = "dev"
    INFLIGHT = "inflight"
    HOST = "host"
    DEAD = "dead"


NONE, DEV, INFLIGHT, HOST, DEAD = (BlockState.NONE, BlockState.DEV, BlockState.INFLIGHT,
                                   BlockState.HOST, BlockState.DEAD)
NEVER = 1 << 62


@dataclass
class Block:
    """A data block (storage). ``uses`` are the positions of the tasks that read it."""

    sid: int
    size: int
    uses: list[int]
    last: int  # position of its last use (its producer's if nobody reads it)
    pinned: bool  # a view of it is made by a non-view op: never moved, freed at last use
    where: BlockState = NONE
    host: bool = False  # the host holds a valid copy
    host_end: float = 0.0  # when that copy lands
    ready: float = 0.0  # when an in-flight prefetch lands
    used: bool = False  # read since it was made or last prefetched (criterion (b))
    arrival_slot: int = -1  # slot where it became resident
    tensors: set[int] = field(default_factory=set)  # its resident tensors (base and views)

    def next_use(self, pos: int) -> int:
        """Position of its first use at or after ``pos`` (NEVER if none)."""
        k = bisect.bisect_left(self.uses, pos)
        return self.uses[k] if k < len(self.uses) else NEVER


@dataclass
class Engine:
    """A FIFO copy engine: busy until ``free``; its latest copy sits in ``last_slot``."""

    free: float = 0.0
    last_slot: int = -1


class Slots:
    """The instruction stream as slots (see the module docstring)."""

    def __init__(self, tasks: int) -> None:
        self.pre: list[list[Instruction]] = [[] for _ in range(tasks)]
        self.post: list[list[Instruction]] = [[] for _ in range(tasks)]
        self.compute: list[Compute | None] = [None] * tasks
        self.end_time = [0.0] * (2 * tasks)

    def add(self, slot: int, ins: Instruction) -> None:
        (self.post if slot % 2 else self.pre)[slot // 2].append(ins)

    def instructions(self) -> list[Instruction]:
        out: list[Instruction] = []
        for pre, comp, post in zip(self.pre, self.compute, self.post, strict=True):
            out += pre
            if comp is not None:
                out.append(comp)
            out += post
        return out


@dataclass
class ModnnStats:
    """What the scheduler did: copies, defragmentations, the simulated finish time."""

    offloaded_bytes: int = 0
    prefetched_bytes: int = 0
    offloads: int = 0
    prefetches: int = 0
    loads_on_demand: int = 0
    evictions: int = 0
    defrags: int = 0
    workspace_evictions: int = 0
    finish_time: float = 0.0
    transfer_delay: float = 0.0  # compute-stream time spent waiting on copies

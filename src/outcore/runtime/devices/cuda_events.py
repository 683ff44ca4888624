"""Event bookkeeping of the CUDA device, written against an event protocol so that it runs
(and is tested) without a GPU.

A CUDA event is a marker in a stream: ``query()`` is True once the stream has run past it,
``synchronize()`` blocks the host until then, and ``start.elapsed_time(end)`` gives the
milliseconds between two completed timing events. ``torch.cuda.Event`` has exactly these
methods; the tests use a fake with a fake clock.

Two ledgers:

* ``CopyLedger`` turns the events around each copy into busy seconds per direction, and the
  events around each Wait into *exposed* seconds: a Wait records ``before`` on the compute
  stream, makes the compute stream wait on the copy, then records ``after``. Nothing runs
  on the compute stream between the two markers except that wait, so ``after - before`` is
  exactly the time the compute stream stood idle for the copy (0 when the copy had already
  finished when the compute stream got there).
* ``SlotLedger`` holds host slots that were given up while a copy may still touch them:
  a slot goes back to its pool only when *every* event recorded after a copy touching it
  has completed (``reclaim``), never earlier, whatever order the events complete in.

Both only fold completed work: an event whose ``query()`` is False is left for later, so
the ledgers never block unless asked to (``reclaim(block=True)``).

``SlotReuse`` is the CUDA device's policy for host slots on top of a ``HostPool``: take a
slot from the room the pool has (after freeing retired slots whose copies completed); when
none fits and slots are still waiting for copies, block on those copies and try again;
only then grow the pool (pinning more memory costs milliseconds and host memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from outcore.runtime.devices.host_pool import HostPool, HostSlot
from outcore.runtime.devices.stats import DirectionStats, TransferStats

Direction = Literal["d2h", "h2d"]


class Event(Protocol):
    """What the ledgers need of a CUDA event (``torch.cuda.Event`` satisfies it)."""

    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any) -> float: ...  # ms to end_event, as torch


@dataclass(eq=False)
class CopyRecord:
    """One asynchronous copy: timing events recorded on its copy stream around it."""

    direction: Direction
    nbytes: int
    start: Event
    end: Event

    def seconds(self) -> float | None:
        """Duration once the copy completed, else None (events on one stream complete in
        order, so ``end`` done implies ``start`` done)."""
        return self.start.elapsed_time(self.end) / 1e3 if self.end.query() else None


@dataclass(eq=False)
class WaitRecord:
    """One Wait: events recorded on the compute stream just before and after it."""

    direction: Direction
    before: Event
    after: Event

    def seconds(self) -> float | None:
        """Seconds the compute stream stood still in this Wait, once it is past it."""
        return self.before.elapsed_time(self.after) / 1e3 if self.after.query() else None


#: A Wait that stalled the compute stream for at most this long is not counted as blocking
#: (two back-to-back events on an idle stream are a few microseconds apart).
STALL_FLOOR_S = 2e-6


class CopyLedger:
    """Per-direction totals of completed copies and Waits (see the module docstring)."""

    def __init__(self) -> None:
        self._copies: list[CopyRecord] = []
        self._waits: list[WaitRecord] = []
        self._totals: dict[str, DirectionStats] = {}
        self.reset()

    def copied(self, record: CopyRecord) -> None:
        self._copies.append(record)

    def waited(self, record: WaitRecord) -> None:
        self._waits.append(record)

    @property
    def pending(self) -> int:
        """Copies and Waits not yet folded (their events have not completed)."""
        return len(self._copies) + len(self._waits)

    def fold(self) -> None:
        """Move every completed copy and Wait into the totals; keep the others."""
        keep_copies = []
        for copy in self._copies:
            seconds = copy.seconds()
            if seconds is None:
                keep_copies.append(copy)
                continue
            old = self._totals[copy.direction]
            self._totals[copy.direction] = DirectionStats(
                bytes=old.bytes + copy.nbytes, copies=old.copies + 1, failed=old.failed,
                busy_s=old.busy_s + seconds, blocked_s=old.blocked_s,
                blocking_waits=old.blocking_waits, late_s=old.late_s)
        self._copies = keep_copies
        keep_waits = []
        for wait in self._waits:
            seconds = wait.seconds()
            if seconds is None:
                keep_waits.append(wait)
                continue
            if seconds > STALL_FLOOR_S:
                old = self._totals[wait.direction]
                self._totals[wait.direction] = DirectionStats(
                    bytes=old.bytes, copies=old.copies, failed=old.failed, busy_s=old.busy_s,
                    blocked_s=old.blocked_s + seconds,
                    blocking_waits=old.blocking_waits + 1, late_s=old.late_s)
        self._waits = keep_waits

    def snapshot(self) -> TransferStats:
        """Totals of what has completed so far (folds first)."""
        self.fold()
        return TransferStats(self._totals["d2h"], self._totals["h2d"])

    def reset(self) -> None:
        """Zero the totals; copies and Waits still in flight are dropped from the count."""
        self._copies, self._waits = [], []
        self._totals = {"d2h": DirectionStats(), "h2d": DirectionStats()}


S = TypeVar("S")


class SlotLedger(Generic[S]):
    """Host slots waiting for the copies that touch them; see the module docstring."""

    def __init__(self, free: Callable[[S], None]) -> None:
        self._free = free
        self._retired: list[tuple[S, tuple[Event, ...]]] = []

    def retire(self, slot: S, events: Sequence[Event]) -> None:
        """Give ``slot`` up once every event in ``events`` has completed."""
        self._retired.append((slot, tuple(events)))

    def __len__(self) -> int:
        return len(self._retired)

    def reclaim(self, block: bool) -> int:
        """Free the retired slots whose events all completed (with ``block``, wait for all
        of them first); returns how many were freed."""
        keep: list[tuple[S, tuple[Event, ...]]] = []
        freed = 0
        for slot, events in self._retired:
            if block:
                for event in events:
                    event.synchronize()
            if all(event.query() for event in events):
                self._free(slot)
                freed += 1
            else:
                keep.append((slot, events))
        self._retired = keep
        return freed


class SlotReuse:
    """Host slots from ``pool``, reused only once the copies touching them completed."""

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool
        self.waiting: SlotLedger[HostSlot] = SlotLedger(pool.free)

    def take(self, nbytes: int) -> HostSlot:
        """A slot of ``nbytes``: see the module docstring for the order of preference."""
        self.waiting.reclaim(block=False)
        slot = self.pool.try_alloc(nbytes)
        if slot is None and len(self.waiting):
            self.waiting.reclaim(block=True)
            slot = self.pool.try_alloc(nbytes)
        return slot if slot is not None else self.pool.alloc(nbytes)

    def give_back(self, slot: HostSlot, events: Sequence[Event]) -> None:
        """``slot`` is free once every event in ``events`` (the copies touching it) completed."""
        self.waiting.retire(slot, events)

    def drain(self) -> None:
        """Wait for every copy still touching a slot and free those slots."""
        self.waiting.reclaim(block=True)

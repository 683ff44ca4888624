"""The CUDA device's event bookkeeping, run with fake events on a fake clock (no GPU).

A fake event completes when the clock reaches its time; ``synchronize`` advances the clock
to it (the host blocking until the GPU gets there). Copies on one stream complete in order,
so a copy's start event never completes after its end event.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from outcore.runtime.devices.cuda_events import (
    STALL_FLOOR_S,
    CopyLedger,
    CopyRecord,
    SlotLedger,
    SlotReuse,
    WaitRecord,
)
from outcore.runtime.devices.host_pool import HostPool


class Clock:
    def __init__(self) -> None:
        self.now = 0.0


class FakeEvent:
    """Completes at ``at`` seconds of ``clock``; ``elapsed_time`` in milliseconds as torch."""

    def __init__(self, clock: Clock, at: float) -> None:
        self.clock = clock
        self.at = at
        self.synchronized = 0

    def query(self) -> bool:
        return self.clock.now >= self.at

    def synchronize(self) -> None:
        self.synchronized += 1
        self.clock.now = max(self.clock.now, self.at)

    def elapsed_time(self, end_event: Any) -> float:
        if not (self.query() and end_event.query()):
            raise RuntimeError("elapsed_time on an event that has not completed")
        return (end_event.at - self.at) * 1e3


def test_slots_come_back_only_when_every_copy_touching_them_completed() -> None:
    clock = Clock()
    freed: list[str] = []
    ledger: SlotLedger[str] = SlotLedger(freed.append)
    # slot a: offloaded (done at 1) then prefetched twice (done at 3 and 2: out of order)
    ledger.retire("a", [FakeEvent(clock, 1.0), FakeEvent(clock, 3.0), FakeEvent(clock, 2.0)])
    ledger.retire("b", [FakeEvent(clock, 1.5)])
    assert ledger.reclaim(block=False) == 0 and freed == []
    clock.now = 2.5  # b's copy and two of a's are done, a's last reader is not
    assert ledger.reclaim(block=False) == 1 and freed == ["b"] and len(ledger) == 1
    clock.now = 3.0
    assert ledger.reclaim(block=False) == 1 and freed == ["b", "a"] and len(ledger) == 0


def test_blocking_reclaim_waits_for_every_event_and_frees_all() -> None:
    clock = Clock()
    freed: list[int] = []
    ledger: SlotLedger[int] = SlotLedger(freed.append)
    events = [FakeEvent(clock, t) for t in (4.0, 9.0)]
    ledger.retire(7, events)
    assert ledger.reclaim(block=True) == 1 and freed == [7]
    assert clock.now == 9.0 and all(e.synchronized == 1 for e in events)


def test_copy_ledger_folds_only_completed_copies_and_measures_busy_time() -> None:
    clock = Clock()
    ledger = CopyLedger()
    ledger.copied(CopyRecord("d2h", 100, FakeEvent(clock, 0.0), FakeEvent(clock, 0.25)))
    ledger.copied(CopyRecord("d2h", 50, FakeEvent(clock, 0.25), FakeEvent(clock, 1.0)))
    ledger.copied(CopyRecord("h2d", 10, FakeEvent(clock, 0.5), FakeEvent(clock, 0.75)))
    clock.now = 0.8
    stats = ledger.snapshot()
    assert (stats.d2h.bytes, stats.d2h.copies) == (100, 1)
    assert stats.d2h.busy_s == pytest.approx(0.25)
    assert (stats.h2d.bytes, stats.h2d.copies) == (10, 1)
    assert ledger.pending == 1
    clock.now = 1.0
    stats = ledger.snapshot()
    assert (stats.d2h.bytes, stats.d2h.copies) == (150, 2)
    assert stats.d2h.busy_s == pytest.approx(1.0) and ledger.pending == 0


def test_waits_count_the_compute_stream_stall_and_ignore_instant_ones() -> None:
    clock = Clock()
    ledger = CopyLedger()
    # a Wait at 1.0 for a copy ending at 1.5: the compute stream stood 0.5 s
    ledger.waited(WaitRecord("h2d", FakeEvent(clock, 1.0), FakeEvent(clock, 1.5)))
    # a Wait for a copy already done: the two markers are back to back
    ledger.waited(WaitRecord("h2d", FakeEvent(clock, 2.0), FakeEvent(clock, 2.0 + 1e-7)))
    ledger.waited(WaitRecord("d2h", FakeEvent(clock, 3.0), FakeEvent(clock, 3.2)))
    clock.now = 2.5
    stats = ledger.snapshot()
    assert stats.h2d.blocked_s == pytest.approx(0.5) and stats.h2d.blocking_waits == 1
    assert stats.d2h.blocked_s == 0.0 and ledger.pending == 1
    clock.now = 4.0
    stats = ledger.snapshot()
    assert stats.d2h.blocked_s == pytest.approx(0.2) and stats.exposed_s == pytest.approx(0.7)
    assert STALL_FLOOR_S > 1e-7, "the instant Wait above must fall under the floor"


def test_reset_drops_totals_and_in_flight_records() -> None:
    clock = Clock()
    ledger = CopyLedger()
    ledger.copied(CopyRecord("d2h", 8, FakeEvent(clock, 0.0), FakeEvent(clock, 1.0)))
    clock.now = 1.0
    assert ledger.snapshot().d2h.bytes == 8
    ledger.copied(CopyRecord("d2h", 8, FakeEvent(clock, 1.0), FakeEvent(clock, 5.0)))
    ledger.reset()
    clock.now = 6.0
    assert ledger.snapshot().d2h.bytes == 0 and ledger.pending == 0


def _reuse(segment: int) -> tuple[SlotReuse, list[int]]:
    made: list[int] = []

    def allocate(n: int) -> torch.Tensor:
        made.append(n)
        return torch.zeros(n, dtype=torch.uint8)

    return SlotReuse(HostPool(segment, allocate, alignment=64)), made


def _span(slot) -> tuple[int, int, int]:
    return slot.segment, slot.offset, slot.offset + slot.view.numel()


def _overlap(a, b) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def test_a_slot_whose_copy_is_in_flight_is_never_handed_out() -> None:
    clock = Clock()
    reuse, made = _reuse(4096)
    first = reuse.take(1024)
    reuse.give_back(first, [FakeEvent(clock, 5.0)])  # its copy ends at t=5
    second = reuse.take(1024)  # room elsewhere: no blocking, no growth
    assert not _overlap(_span(first), _span(second)) and clock.now == 0.0 and made == [4096]
    clock.now = 5.0  # the copy is done: its range comes back and is reused
    reuse.give_back(second, [FakeEvent(clock, 5.0)])
    third = reuse.take(4096)
    assert _span(third) == (0, 0, 4096) and made == [4096]


def test_when_full_it_waits_for_the_copies_instead_of_growing() -> None:
    clock = Clock()
    reuse, made = _reuse(4096)
    slots = [reuse.take(2048), reuse.take(2048)]
    events = [FakeEvent(clock, 3.0), FakeEvent(clock, 7.0)]
    for slot, event in zip(slots, events, strict=True):
        reuse.give_back(slot, [event])
    again = reuse.take(2048)
    assert made == [4096], "must not pin more while retired slots can come back"
    assert clock.now == 7.0 and all(e.synchronized == 1 for e in events)
    assert again.segment == 0


def test_it_grows_only_when_nothing_is_waiting() -> None:
    clock = Clock()
    reuse, made = _reuse(4096)
    reuse.take(4096)  # held, not given back
    reuse.take(100)
    assert made == [4096, 8192] and clock.now == 0.0
    held = reuse.take(64)
    reuse.give_back(held, [FakeEvent(clock, 2.0)])
    reuse.drain()
    assert clock.now == 2.0 and len(reuse.waiting) == 0

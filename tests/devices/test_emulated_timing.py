"""Copy timing (lower bounds only) and the races a slowed copy engine must expose."""

from __future__ import annotations

import time

import pytest
import torch

from outcore.runtime.devices.copy_engine import chunk_bounds

KB = 1000


def _late(t0: float, dev, direction: str, nbytes: int) -> bool:
    """Whether the caller reached this point only after the copy started at ``t0`` read
    its last chunk: then the race below cannot be observed, whatever the device does."""
    last = chunk_bounds(nbytes, dev.link(direction).min_chunk())[-1][0]
    return time.perf_counter() - t0 >= dev.link(direction).arrival(last)


def test_a_copy_takes_at_least_its_modelled_time(make_emulated) -> None:
    dev = make_emulated(bw=1e6, latency_s=0.005, slowdown=2.0)
    x = torch.ones(10_000)  # 40 KB: (5 ms + 40 ms) * 2
    expected = (0.005 + 40 * KB / 1e6) * 2.0
    assert dev.link("d2h").seconds(40 * KB) == pytest.approx(expected)
    t0 = time.perf_counter()
    dev.start_offload(1, x)
    dev.wait_offload(1)
    assert time.perf_counter() - t0 >= expected
    stats = dev.stats()
    assert stats.d2h.bytes == 40 * KB and stats.d2h.copies == 1
    assert stats.d2h.busy_s >= expected
    assert stats.h2d.copies == 0


def test_copies_in_one_direction_run_one_after_another(make_emulated) -> None:
    dev = make_emulated(bw=1e6)
    t0 = time.perf_counter()
    dev.start_offload(1, torch.ones(5000))  # 20 KB: 20 ms
    dev.start_offload(2, torch.ones(5000))
    dev.wait_offload(2)
    assert time.perf_counter() - t0 >= 0.040, "the second copy must queue behind the first"
    blocked = dev.stats().d2h.blocked_s
    dev.wait_offload(1)  # FIFO: already complete, so this does not block
    assert dev.stats().d2h.blocked_s == blocked


def test_a_prefetch_starts_after_its_offload_completes(make_emulated) -> None:
    dev = make_emulated(bw=1e6)
    x = torch.arange(5000, dtype=torch.float32)  # 20 KB each way
    t0 = time.perf_counter()
    dev.start_offload(1, x)
    back = dev.start_prefetch(1, "x")
    dev.wait_prefetch(1)
    assert time.perf_counter() - t0 >= 0.040
    assert torch.equal(back, x)
    stats = dev.stats()
    assert stats.h2d.blocked_s > 0 and stats.exposed_s == stats.h2d.blocked_s


@pytest.mark.parametrize("dtype, is_poison", [
    (torch.float32, torch.isnan),
    (torch.float16, torch.isnan),
    (torch.int64, lambda t: t == torch.iinfo(torch.int64).min),
    (torch.uint8, lambda t: t == 255),
])
def test_release_before_wait_offload_corrupts_the_host_copy(make_emulated, dtype,
                                                            is_poison) -> None:
    dev = make_emulated(bw=1e6, slowdown=4.0)  # 16 KB: about 65 ms
    x = torch.arange(8192 if dtype != torch.uint8 else 16384).to(dtype) % 100
    nbytes = x.untyped_storage().nbytes()
    t0 = time.perf_counter()
    dev.start_offload(1, x)
    dev.release(1, x, last_alias=True)  # the missing Wait: memory "reused" mid-copy
    if _late(t0, dev, "d2h", nbytes):
        pytest.skip("the test thread was descheduled for the whole copy")
    dev.wait_offload(1)
    back = dev.start_prefetch(1, "x")
    dev.wait_prefetch(1)
    assert is_poison(back).any(), "the race left no trace in the host copy"
    assert is_poison(back[-16:]).all(), "the last chunk is read after the release"
    assert dev.stats().releases_during_copy == 1


def test_release_before_wait_flips_bools(make_emulated) -> None:
    dev = make_emulated(bw=1e6, slowdown=4.0)
    x = torch.arange(16384) % 3 == 0
    ref = x.clone()
    t0 = time.perf_counter()
    dev.start_offload(1, x)
    dev.release(1, x, last_alias=True)
    if _late(t0, dev, "d2h", x.untyped_storage().nbytes()):
        pytest.skip("the test thread was descheduled for the whole copy")
    dev.wait_offload(1)
    back = dev.start_prefetch(1, "mask")
    dev.wait_prefetch(1)
    assert torch.equal(back[-16:], ~ref[-16:])


def test_release_through_a_view_of_the_storage_also_races(make_emulated) -> None:
    dev = make_emulated(bw=1e6, slowdown=4.0)
    base = torch.ones(4096)
    view = base[10:20]
    t0 = time.perf_counter()
    dev.start_offload(1, base)
    dev.release(2, view, last_alias=True)  # the last alias of base's storage is a view
    if _late(t0, dev, "d2h", base.untyped_storage().nbytes()):
        pytest.skip("the test thread was descheduled for the whole copy")
    dev.wait_offload(1)
    back = dev.start_prefetch(1, "base")
    dev.wait_prefetch(1)
    assert torch.isnan(back[-16:]).all()


def test_waiting_before_release_keeps_the_host_copy_intact(make_emulated) -> None:
    dev = make_emulated(bw=1e6, slowdown=4.0)
    x = torch.randn(4096)
    ref = x.clone()
    dev.start_offload(1, x)
    dev.release(1, x, last_alias=False)  # another alias is still resident: no reuse
    dev.wait_offload(1)
    dev.release(1, x, last_alias=True)  # after the Wait: safe, nothing is overwritten
    assert torch.equal(x, ref)
    back = dev.start_prefetch(1, "x")
    dev.wait_prefetch(1)
    assert torch.equal(back, ref)
    assert dev.stats().releases_during_copy == 0


def test_without_poison_a_release_leaves_memory_alone(make_emulated) -> None:
    dev = make_emulated(bw=1e6, slowdown=4.0, poison_on_release=False)
    x = torch.randn(4096)
    ref = x.clone()
    dev.start_offload(1, x)
    dev.release(1, x, last_alias=True)
    dev.wait_offload(1)
    assert torch.equal(x, ref)
    assert dev.stats().releases_during_copy == 0


def test_reading_a_prefetch_before_its_wait_sees_poison(make_emulated) -> None:
    dev = make_emulated(bw=1e6, slowdown=4.0)
    x = torch.randn(4096)
    t0 = time.perf_counter()
    dev.start_offload(1, x)
    back = dev.start_prefetch(1, "x")  # queued behind a 65 ms offload, then 65 ms itself
    early = back.clone()
    if time.perf_counter() - t0 >= dev.link("d2h").seconds(x.untyped_storage().nbytes()):
        pytest.skip("the test thread was descheduled for the whole offload")
    assert torch.isnan(early).all(), "an unfilled prefetch buffer must not look valid"
    dev.wait_prefetch(1)
    assert torch.equal(back, x)


def test_blocked_time_counts_only_real_waits(make_emulated) -> None:
    dev = make_emulated(bw=1e6)
    dev.start_offload(1, torch.ones(5000))  # 20 ms
    dev.wait_offload(1)
    first = dev.stats().d2h.blocked_s
    assert first > 0
    dev.wait_offload(1)
    assert dev.stats().d2h.blocked_s == first
    dev.reset_stats()
    assert dev.stats().d2h.bytes == 0 and dev.stats().d2h.blocked_s == 0


def test_the_link_timeline_starts_a_copy_at_its_submission_not_at_the_thread_wake_up(
        make_emulated) -> None:
    dev = make_emulated(bw=1e6, latency_s=0.001)
    dev.start_offload(1, torch.ones(2500))  # 10 KB: 11 ms
    job = dev._host[1].job
    dev.wait_offload(1)
    # an idle engine: the copy starts when it was submitted, however late the thread woke
    assert job.started == job.submitted
    assert job.deadline == pytest.approx(job.started + 0.011)
    assert job.finished >= job.deadline
    dev.start_offload(2, torch.ones(2500))
    dev.start_offload(3, torch.ones(2500))
    second, third = dev._host[2].job, dev._host[3].job
    dev.wait_offload(3)
    # queued: the third starts exactly at the second's deadline (no wake-up delay piles up)
    assert third.started == second.deadline


def test_blocking_waits_and_their_lateness_are_counted_per_direction(make_emulated) -> None:
    dev = make_emulated(bw=1e6)
    dev.start_offload(1, torch.ones(2500))  # 10 ms
    before = dev.stats()
    dev.wait_offload(1)  # blocks
    dev.start_offload(2, torch.ones(10))
    dev._host[2].job.done.wait()
    dev.wait_offload(2)  # the copy had ended: not a blocking wait
    step = dev.stats() - before
    assert step.d2h.blocking_waits == 1 and step.h2d.blocking_waits == 0
    assert 0 <= step.d2h.late_s <= step.d2h.blocked_s
    assert step.d2h.copies == 2 and step.d2h.bytes == 10_040

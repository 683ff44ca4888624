"""The copy engine alone: time model, chunking, ordering, failures, abort."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from outcore.errors import OutcoreError
from outcore.runtime.devices.copy_engine import (
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    MIN_CHUNKS,
    CopyEngine,
    CopyError,
    CopyJob,
    LinkModel,
    chunk_bounds,
)


def _job(tid: int, src: torch.Tensor, dst: torch.Tensor, **kw) -> CopyJob:
    return CopyJob(tid, f"t{tid}", "d2h", src.numel(), source=lambda: src, dest=lambda: dst,
                   **kw)


@pytest.fixture
def engines():
    made: list[CopyEngine] = []

    def make(bandwidth: float = 1e9, **kw) -> CopyEngine:
        engine = CopyEngine("d2h", LinkModel(bandwidth, **kw), on_done=None)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


@pytest.mark.parametrize("link, nbytes, seconds", [
    (LinkModel(1e9), 10**9, 1.0),
    (LinkModel(2e6, latency_s=0.5), 10**6, 1.0),
    (LinkModel(1e6, latency_s=0.25, slowdown=4.0), 250_000, 2.0),
    (LinkModel(math.inf, latency_s=0.01), 10**12, 0.01),
    (LinkModel(1e6), 0, 0.0),
])
def test_link_model_seconds(link: LinkModel, nbytes: int, seconds: float) -> None:
    assert link.seconds(nbytes) == pytest.approx(seconds)
    assert link.arrival(0) == pytest.approx(link.latency_s * link.slowdown)


@pytest.mark.parametrize("kw, field", [
    ({"bandwidth": 0}, "bandwidth"), ({"bandwidth": -1}, "bandwidth"),
    ({"bandwidth": math.nan}, "bandwidth"), ({"bandwidth": 1, "latency_s": -1}, "latency_s"),
    ({"bandwidth": 1, "slowdown": 0}, "slowdown"), ({"bandwidth": 1, "slowdown": math.inf},
                                                    "slowdown"),
])
def test_link_model_rejects_impossible_values(kw, field) -> None:
    with pytest.raises(ValueError, match=field):
        LinkModel(**kw)


@given(st.integers(min_value=0, max_value=64 * MAX_CHUNK_BYTES),
       st.sampled_from([MIN_CHUNK_BYTES, 50_000, 4 * MAX_CHUNK_BYTES]))
def test_chunks_tile_the_range(nbytes: int, min_chunk: int) -> None:
    chunks = chunk_bounds(nbytes, min_chunk)
    if nbytes == 0:
        assert chunks == []
        return
    assert [a for a, _ in chunks] == [0] + [b for _, b in chunks[:-1]]
    assert chunks[-1][1] == nbytes
    sizes = [b - a for a, b in chunks]
    assert all(0 < s <= max(min_chunk, MAX_CHUNK_BYTES) for s in sizes)
    assert all(s >= min_chunk for s in sizes[:-1]), "only the last chunk may be short"
    if nbytes >= MIN_CHUNKS * max(min_chunk, MAX_CHUNK_BYTES):
        assert len(chunks) >= MIN_CHUNKS
    if nbytes >= MIN_CHUNKS * min_chunk:
        assert len(chunks) >= MIN_CHUNKS


@pytest.mark.parametrize("link, floor", [
    (LinkModel(1e6), MIN_CHUNK_BYTES),                 # slow: the byte floor
    (LinkModel(1e9), 500_000),                         # 0.5 ms at 1 GB/s
    (LinkModel(1e9, slowdown=10.0), 50_000),           # slowed engine: finer chunks
    (LinkModel(math.inf), 2**62),                      # instant: one chunk
])
def test_chunk_floor_follows_the_link(link: LinkModel, floor: int) -> None:
    assert link.min_chunk() == floor


def test_jobs_run_in_order_and_copy_the_bytes(engines) -> None:
    engine = engines(bandwidth=1e6)
    srcs = [torch.randint(0, 256, (4000 + i,), dtype=torch.uint8) for i in range(3)]
    dsts = [torch.zeros_like(s) for s in srcs]
    jobs = [_job(i, s, d) for i, (s, d) in enumerate(zip(srcs, dsts, strict=True))]
    for job in jobs:
        engine.submit(job)
    jobs[-1].done.wait()
    assert all(j.done.is_set() for j in jobs)
    assert all(torch.equal(s, d) for s, d in zip(srcs, dsts, strict=True))
    for earlier, later in itertools.pairwise(jobs):
        assert later.started >= earlier.deadline  # the link's timeline: FIFO, no overlap
    for job in jobs:
        assert job.started >= job.submitted
        assert job.deadline - job.started == pytest.approx(engine.link.seconds(job.nbytes))
        assert job.finished >= job.deadline
        assert job.source is None and job.dest is None, "references dropped when done"


def test_failing_source_is_reported_to_the_waiter(engines) -> None:
    engine = engines()

    def broken() -> torch.Tensor:
        raise RuntimeError("storage lost")

    job = CopyJob(9, "act", "d2h", 16, source=broken, dest=lambda: torch.zeros(16))
    engine.submit(job)
    job.done.wait()
    with pytest.raises(CopyError, match=r"d2h copy of 'act' \(tensor 9\) failed: storage lost"):
        job.check()
    # the engine survives a failed job
    ok = _job(10, torch.ones(8, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8))
    engine.submit(ok)
    ok.done.wait()
    ok.check()


def test_short_buffers_are_an_error_not_a_partial_copy(engines) -> None:
    engine = engines()
    job = CopyJob(1, "", "d2h", 100, source=lambda: torch.zeros(10, dtype=torch.uint8),
                  dest=lambda: torch.zeros(100, dtype=torch.uint8))
    engine.submit(job)
    job.done.wait()
    with pytest.raises(CopyError, match="tensor 1"):
        job.check()


def test_a_job_after_a_failed_job_fails(engines) -> None:
    engine = engines()
    first = CopyJob(1, "a", "d2h", 4, source=lambda: 1 / 0, dest=lambda: torch.zeros(4))
    second = _job(2, torch.ones(4, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8),
                  after=first)
    engine.submit(first)
    engine.submit(second)
    second.done.wait()
    with pytest.raises(CopyError, match="depends on failed"):
        second.check()


def test_close_aborts_running_and_queued_jobs(engines) -> None:
    engine = engines(bandwidth=1e3)  # 10 KB: 10 s each
    jobs = [_job(i, torch.ones(10_000, dtype=torch.uint8),
                 torch.zeros(10_000, dtype=torch.uint8)) for i in range(3)]
    for job in jobs:
        engine.submit(job)
    engine.close()
    assert not engine.running
    for job in jobs:
        assert job.done.wait(5.0), "a waiter must never block forever after close"
        with pytest.raises(CopyError, match="closed"):  # aborted, not completed
            job.check()
    with pytest.raises(OutcoreError, match="closed"):
        engine.submit(_job(4, torch.ones(1, dtype=torch.uint8),
                           torch.zeros(1, dtype=torch.uint8)))

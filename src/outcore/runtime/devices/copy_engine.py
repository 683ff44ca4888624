"""An emulated copy engine: one thread that moves bytes at a link's bandwidth, FIFO.

A ``CopyEngine`` stands for one direction of a host link (device->host or host->device).
Jobs run one after the other in submission order, like copies queued on one CUDA stream.
A job of ``n`` bytes occupies the engine for ``LinkModel.seconds(n)`` =
``(latency_s + n / bandwidth) * slowdown`` seconds of monotonic time.

Invariants:

* The engine keeps the link's own timeline, not its thread's: a job starts at
  ``max(submitted, the previous job's deadline, the deadline of the job it comes after)``
  and its ``deadline`` is that start plus ``LinkModel.seconds(n)``, however late the
  engine thread woke up. A thread's wake-up delays (0.05 to 0.2 ms each, measured) do not
  pile up from job to job as they would if each job started when the thread got to it;
  they show only as the small gap between a job's deadline and its ``finished``, which a
  DMA engine signalling an event would not have either.

* The data is moved progressively: the job is cut into chunks (``chunk_bounds``, at least
  ``MIN_CHUNKS`` when they can be ``MIN_CHUNK_SECONDS`` long) and chunk ``[a, b)`` is read
  at ``start + LinkModel.arrival(a)``. Whatever the source holds at that moment is what
  the destination gets, so a source overwritten mid-transfer yields a torn copy (this is
  what makes a free-before-wait race visible).
* Bytes are moved with a plain ``memmove`` (ctypes, GIL released), never with a torch op:
  a torch copy on the engine thread would start an OpenMP team of its own there, whose
  spinning workers take cores from the compute thread and slow it (2x to 3x was measured
  on 2 cores), which a GPU's copy engine never does.
* A job is never reported done before its deadline: waits loop on ``time.perf_counter``
  until the deadline has passed, sleeping on a ``threading.Event`` (no busy-waiting).
* A job may name another job (``after``) that must complete first, like a stream waiting
  on an event; if that job failed, this one fails too.
* When a job finishes (well or not) it drops its references to the source and destination
  *before* signalling ``done``, so a waiter that frees the source afterwards really frees it.
* ``close()`` aborts: the running job and every queued job fail with ``CopyError``, so no
  waiter blocks forever. A closed engine refuses new jobs.
"""

from __future__ import annotations

import ctypes
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from outcore.errors import OutcoreError

Direction = Literal["d2h", "h2d"]

#: A chunk is at most this long unless ``min_chunk`` says otherwise (progressive reads).
MAX_CHUNK_BYTES = 1 << 20
#: Smallest chunk worth a separate deadline (below this, Python overhead dominates).
MIN_CHUNK_BYTES = 4096
#: Nor is a chunk shorter than this many seconds of transfer (thread wake-ups cost ~0.1 ms).
MIN_CHUNK_SECONDS = 5e-4
#: A transfer is cut into at least this many chunks when the two floors above allow.
MIN_CHUNKS = 16


class CopyError(OutcoreError):
    """A copy between host and device failed; raised on the thread that waits for it.

    Attributes:
        tid: the graph tensor id whose copy failed.
        direction: "d2h" or "h2d".
    """

    def __init__(self, tid: int, name: str, direction: str, reason: str) -> None:
        self.tid = tid
        self.direction = direction
        label = f"{name!r} (tensor {tid})" if name else f"tensor {tid}"
        super().__init__(
            f"{direction} copy of {label} failed: {reason}. The copy did not complete, so "
            "its destination must not be used; see the chained exception for the cause."
        )


@dataclass(frozen=True)
class LinkModel:
    """Time model of one link direction: ``seconds(n) = (latency_s + n / bandwidth) * slowdown``.

    ``bandwidth`` is in bytes per second and may be ``math.inf`` (copies take only the
    latency). ``slowdown`` > 1 slows the engine on purpose, to expose races.
    """

    bandwidth: float
    latency_s: float = 0.0
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {self.bandwidth}")
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"latency_s must be a finite number >= 0, got {self.latency_s}")
        if not (self.slowdown > 0 and math.isfinite(self.slowdown)):
            raise ValueError(f"slowdown must be a finite number > 0, got {self.slowdown}")

    def arrival(self, offset: int) -> float:
        """Seconds after the start at which byte ``offset`` crosses the link."""
        return (self.latency_s + offset / self.bandwidth) * self.slowdown

    def seconds(self, nbytes: int) -> float:
        """Seconds a copy of ``nbytes`` occupies the engine."""
        return self.arrival(nbytes)

    def min_chunk(self) -> int:
        """The chunk floor for this link: ``MIN_CHUNK_BYTES``, or the bytes that cross in
        ``MIN_CHUNK_SECONDS`` if more (an infinitely fast link copies in one chunk)."""
        rate = self.bandwidth / self.slowdown
        if not math.isfinite(rate) or rate * MIN_CHUNK_SECONDS >= 2**62:
            return 2**62
        return max(MIN_CHUNK_BYTES, int(rate * MIN_CHUNK_SECONDS))


def chunk_bounds(nbytes: int, min_chunk: int = MIN_CHUNK_BYTES) -> list[tuple[int, int]]:
    """Cut ``[0, nbytes)`` into contiguous chunks: ``nbytes / MIN_CHUNKS`` long, capped at
    ``MAX_CHUNK_BYTES``, but never shorter than ``min_chunk``. Empty for 0 bytes."""
    if nbytes <= 0:
        return []
    size = max(min_chunk, min(math.ceil(nbytes / MIN_CHUNKS), MAX_CHUNK_BYTES), 1)
    return [(a, min(a + size, nbytes)) for a in range(0, nbytes, size)]


ByteSource = Callable[[], torch.Tensor]


@dataclass(eq=False)
class CopyJob:
    """One copy of ``nbytes`` bytes from ``source()`` to ``dest()`` (flat uint8 tensors).

    ``source`` and ``dest`` are called on the engine thread when the job starts (so host
    buffers are allocated there, outside any dispatch mode of the caller). ``reads`` is an
    identity of the storage read (used by the device to detect a release during the copy).
    Times are ``time.perf_counter`` values: ``started`` and ``deadline`` on the link's
    timeline (see the module docstring), ``finished`` when the engine thread ended the job
    (>= ``deadline``); ``error`` is set when the job failed.
    """

    tid: int
    name: str
    direction: Direction
    nbytes: int
    source: ByteSource | None
    dest: ByteSource | None
    after: CopyJob | None = None
    reads: int | None = None
    submitted: float = 0.0
    started: float = 0.0
    deadline: float = 0.0
    finished: float = 0.0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        """Raise ``CopyError`` (chained to the cause) if the job failed."""
        if self.error is not None:
            reason = self.error.args[0] if self.error.args else type(self.error).__name__
            raise CopyError(self.tid, self.name, self.direction, str(reason)) from self.error


class _Aborted(Exception):
    """Internal: the engine was closed while a job ran or waited."""


class CopyEngine:
    """One copy-engine thread for one direction; the thread starts on the first submit.

    ``on_done(job)`` is called on the engine thread after each job ends (successful or not),
    before ``job.done`` is set; it must be quick and thread-safe.
    """

    def __init__(self, direction: Direction, link: LinkModel,
                 on_done: Callable[[CopyJob], None] | None = None) -> None:
        self.direction = direction
        self.link = link
        self._on_done = on_done
        self._queue: queue.SimpleQueue[CopyJob | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._free_at = 0.0  # the link timeline: when the last job's transfer ends

    # -- caller side -------------------------------------------------------------------------
    def submit(self, job: CopyJob) -> None:
        """Queue ``job`` behind every job submitted before it; returns at once."""
        if self._stop.is_set():
            raise OutcoreError(
                f"the {self.direction} copy engine is closed; create a new device to copy "
                f"tensor {job.tid}"
            )
        job.submitted = time.perf_counter()
        self._ensure_thread()
        self._queue.put(job)

    @property
    def running(self) -> bool:
        """Whether the engine thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout: float | None = 10.0) -> None:
        """Abort the running and queued jobs (they fail with CopyError) and stop the thread."""
        self._stop.set()
        self._queue.put(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name=f"outcore-copy-{self.direction}", daemon=True)
                self._thread.start()

    # -- engine thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                if self._stop.is_set():
                    self._drain()
                    return
                continue
            self._run(job)

    def _drain(self) -> None:
        """Fail the jobs still queued after close()."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._finish(job, _Aborted("the device was closed before the copy started"))

    def _run(self, job: CopyJob) -> None:
        error: BaseException | None = None
        try:
            if self._stop.is_set():
                raise _Aborted("the device was closed before the copy started")
            if job.after is not None:
                job.after.done.wait()
                if job.after.error is not None:
                    raise OutcoreError(
                        f"the {job.after.direction} copy it depends on failed") from job.after.error
            self._transfer(job)
        except Exception as exc:  # noqa: BLE001 - reported to the waiting thread
            error = exc
        self._finish(job, error)

    def _transfer(self, job: CopyJob) -> None:
        assert job.source is not None and job.dest is not None
        src = job.source()
        dst = job.dest()
        if src.numel() < job.nbytes or dst.numel() < job.nbytes:
            raise OutcoreError(
                f"copy of {job.nbytes} bytes between buffers of {src.numel()} and "
                f"{dst.numel()} bytes")
        flat = all(t.is_contiguous() and t.dtype == torch.uint8 for t in (src, dst))
        if not flat:
            raise OutcoreError("copy buffers must be flat contiguous uint8 tensors")
        src_ptr, dst_ptr = src.data_ptr(), dst.data_ptr()
        start = max(job.submitted, self._free_at,
                    job.after.deadline if job.after is not None else 0.0)
        job.started = start
        link = self.link  # one model for the whole job, even if the link is changed meanwhile
        job.deadline = self._free_at = start + link.seconds(job.nbytes)
        for a, b in chunk_bounds(job.nbytes, link.min_chunk()):
            self._wait_until(start + link.arrival(a))
            ctypes.memmove(dst_ptr + a, src_ptr + a, b - a)
        self._wait_until(job.deadline)

    def _wait_until(self, deadline: float) -> None:
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            if self._stop.wait(left):
                raise _Aborted("the device was closed during the copy")

    def _finish(self, job: CopyJob, error: BaseException | None) -> None:
        job.source = None  # drop the storages before anyone is told the copy is over
        job.dest = None
        job.finished = time.perf_counter()
        if job.started == 0.0:
            job.started = job.finished
        if error is not None:  # keep the traceback text, drop the frames' tensors
            traceback.clear_frames(error.__traceback__)
        job.error = error
        if self._on_done is not None:
            try:
                self._on_done(job)
            except Exception as exc:  # noqa: BLE001 - never leave a waiter hanging
                job.error = job.error or exc
        job.done.set()

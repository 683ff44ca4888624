"""Keep HiGHS's stray C-level prints off the user's stdout.

Some HiGHS builds print debugging lines such as
``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();`` with C's
``printf`` during a MILP solve, whatever ``output_flag`` says. They reach file descriptor 1
directly, so ``contextlib.redirect_stdout`` cannot catch them (``outcore explain`` showed
them in its table).

``highs_quiet()`` points fd 1 at a temporary file for the duration of the block and then
restores it, writing back every captured line that is not HiGHS's (``HIGHS_PREFIXES``), so
output of other code that ran meanwhile is delayed, never lost.

Thread safety: fd 1 is process-wide, so the redirect is reference-counted under a lock:
the first thread to enter redirects, the last to leave flushes C's and Python's buffers
and restores; nested and concurrent blocks share one redirect. When fd 1 cannot be
duplicated (no stdout, e.g. a daemon), the block runs unchanged.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

#: Lines that start with one of these are HiGHS's debugging prints and are dropped.
HIGHS_PREFIXES: tuple[bytes, ...] = (b"HighsMipSolverData::", b"Highs")

def _flush_c() -> None:
    """Flush C's stdio buffers (HiGHS's printf output may sit there until exit)."""
    with contextlib.suppress(OSError, AttributeError):  # no C library (not on Linux/macOS)
        ctypes.CDLL(None).fflush(None)


def _flush_python() -> None:
    for stream in (sys.stdout, sys.__stdout__):
        with contextlib.suppress(OSError, ValueError):  # closed or detached stream
            if stream is not None:
                stream.flush()


class _Redirect:
    """The one process-wide redirect of fd 1, shared by every thread inside a block."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.saved: int | None = None
        self.sink: IO[bytes] | None = None

    def enter(self) -> None:
        with self.lock:
            self.depth += 1
            if self.depth > 1:
                return
            try:
                saved = os.dup(1)
            except OSError:
                return
            _flush_python()
            _flush_c()
            sink = tempfile.TemporaryFile()  # noqa: SIM115  (closed in leave)
            os.dup2(sink.fileno(), 1)
            self.saved, self.sink = saved, sink

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth > 0 or self.saved is None or self.sink is None:
                return
            _flush_python()
            _flush_c()
            os.dup2(self.saved, 1)
            os.close(self.saved)
            sink, self.saved, self.sink = self.sink, None, None
            sink.seek(0)
            kept = [line for line in sink.read().splitlines(keepends=True)
                    if not line.lstrip().startswith(HIGHS_PREFIXES)]
            sink.close()
            data = b"".join(kept)
            while data:
                data = data[os.write(1, data):]


_REDIRECT = _Redirect()


@contextmanager
def highs_quiet() -> Iterator[None]:
    """Run the block with HiGHS's C-level prints dropped (see the module doc)."""
    _REDIRECT.enter()
    try:
        yield
    finally:
        _REDIRECT.leave()

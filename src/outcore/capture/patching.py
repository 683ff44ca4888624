"""A process-wide patch that capture contexts share, with what each thread's context saw.

Capture replaces some of torch's functions while it traces (``checkpoints``: the checkpoint
entry points; ``rebound``: ``nn.Module.__setattr__``). Such a patch is global, but only the
capturing thread's calls may change behaviour, and contexts nest and overlap across threads.

``SharedPatch(install, restore)``: ``opened(seen)`` installs the patch when the first context
opens on any thread and restores it when the last one closes (also on an exception), under
one lock; ``seen`` (what the context collects) is pushed on this thread's stack while open,
and ``current()`` returns that stack: empty on threads with no open context, where the
patched functions must behave as torch's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class SharedPatch(Generic[T]):
    """A counted global patch with a thread-local stack of open contexts (module doc)."""

    def __init__(self, install: Callable[[], Any], restore: Callable[[], Any]) -> None:
        self._install, self._restore = install, restore
        self._lock = threading.Lock()
        self._active = 0  # contexts open on any thread: installed while above 0
        self._local = threading.local()  # .open: this thread's stack

    def current(self) -> list[T]:
        """This thread's open contexts' collections, innermost last (empty: not capturing)."""
        stack: list[T] = getattr(self._local, "open", [])
        return stack

    @contextlib.contextmanager
    def opened(self, seen: T) -> Iterator[T]:
        """The patch installed while open; ``seen`` on this thread's stack."""
        with self._lock:
            if self._active == 0:
                self._install()
            self._active += 1
        if not hasattr(self._local, "open"):
            self._local.open = []
        self._local.open.append(seen)
        try:
            yield seen
        finally:
            self._local.open.pop()
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._restore()

"""Progress on long steps (capture, each policy's planning, simulation, reproduction).

Off by default in library code; the ``outcore`` command and ``make demo`` turn it on with
``configure(True)`` unless ``--json`` is given, and it stays off whenever stderr is not a
terminal (a pipe, CI, a file). While on, ``task("capturing resnet152")`` shows a rich
spinner with the elapsed time on stderr; a step that took more than a second leaves one line
saying how long it took. Tasks nest (planning inside a compile shows below the capture).

    >>> from outcore import progress
    >>> with progress.task("planning"):   # does nothing unless configured and on a terminal
    ...     pass
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

LONG = 1.0  # seconds: a finished step longer than this leaves a line

_state: dict[str, Any] = {"enabled": False, "progress": None, "depth": 0}


def configure(enabled: bool) -> bool:
    """Turn progress on (only where stderr is a terminal) or off; returns whether it is on."""
    _state["enabled"] = bool(enabled) and sys.stderr.isatty()
    return _state["enabled"]


def enabled() -> bool:
    """True when ``task`` draws anything."""
    return bool(_state["enabled"])


@contextlib.contextmanager
def task(description: str) -> Iterator[None]:
    """Show ``description`` with a spinner while the block runs (when enabled)."""
    if not _state["enabled"]:
        yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    outer = _state["progress"] is None
    if outer:
        console = Console(stderr=True)
        _state["progress"] = Progress(SpinnerColumn(),
                                      TextColumn("{task.description}", markup=False),
                                      TimeElapsedColumn(), console=console, transient=True)
        _state["progress"].start()
    bar = _state["progress"]
    ident = bar.add_task("  " * _state["depth"] + description, total=None)
    _state["depth"] += 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _state["depth"] -= 1
        bar.remove_task(ident)
        took = time.perf_counter() - start
        if took > LONG:
            bar.console.print(f"[dim]{description}: {took:.1f} s[/dim]")
        if outer:
            bar.stop()
            _state["progress"] = None

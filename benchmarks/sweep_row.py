"""One row of an architecture sweep (``hf_architectures.py``, ``timm_architectures.py``,
``torchvision_architectures.py``): build the model's corpus ``Case``, run one step through
outcore against eager with the real-model corpus's harness, and say how it went.

``row(cells, make_case, policy, timeout)`` returns ``(status, markdown row)``; ``status`` is
``"ok"``, ``"fail"`` (outcore's failure: an exception, a difference from eager, over the
timeout) or ``"skip"`` (``make_case`` raised ``Skip``: eager cannot train it, or it is not
small; or building it took longer than the timeout). The timeout is ``SIGALRM``'s, so a row
runs in the main thread; ``Timeout`` is a ``BaseException`` so that the builders' own
``except Exception`` never swallows it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))

from corpus import Case
from harness import check, in_core_peak


class Skip(Exception):
    """The architecture is not a row of the sweep (the message says why)."""


class Timeout(BaseException):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Timeout


def row(cells: str, make_case: Callable[[], Case], policy: str,
        timeout: int) -> tuple[str, str]:
    """``(status, row)``: ``cells`` (``"| name | ... |"``) followed by the ops and the result."""
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        try:
            case = make_case()
        except Timeout:
            return "skip", f"{cells} - | skip (eager over {timeout} s) |"
        except Skip as why:
            return "skip", f"{cells} - | skip ({why}) |"
        ops, _, budget = in_core_peak(case)
        outcome = check(case, policy, budget)
    except Timeout:
        return "fail", f"{cells} - | FAIL: over {timeout} s |"
    except Exception as exc:  # noqa: BLE001 - a failure of outcore is the row's result
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return "fail", f"{cells} - | FAIL: {text} |"
    finally:
        signal.alarm(0)
    if outcome.ok:
        return "ok", f"{cells} {ops} | ok ({time.perf_counter() - start:.1f} s) |"
    return "fail", f"{cells} {ops} | FAIL: {'; '.join(outcome.problems)[:200]} |"


def eager_or_skip(build: Callable[[], Case | None], none_means: str) -> Callable[[], Case]:
    """``build`` as ``row``'s ``make_case``: where it raises (eager cannot train the model at
    the sizes tried) or returns None (``none_means``: why, e.g. over the parameter cap), the
    row is a skip."""
    def make() -> Case:
        try:
            case = build()
        except Exception as exc:  # eager fails: not outcore's row
            raise Skip(f"eager: {type(exc).__name__}") from exc
        if case is None:
            raise Skip(none_means)
        return case
    return make


def arguments(doc: str | None, what: str, max_parameters: int | None = None,
              timeout: int = 300) -> argparse.ArgumentParser:
    """The options every sweep takes: ``--only`` (``what``, comma-separated), ``--policy``,
    ``--timeout`` (seconds per row) and, with a default cap, ``--max-parameters``."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--only", default="", help=f"{what}, comma-separated")
    parser.add_argument("--policy", default="outcore-auto")
    parser.add_argument("--timeout", type=int, default=timeout, help="seconds per row")
    if max_parameters is not None:
        parser.add_argument("--max-parameters", type=int, default=max_parameters)
    return parser


def run_all(rows: Iterable[tuple[str, Callable[[], Case]]], policy: str, timeout: int,
            skipped: str = "") -> None:
    """Print each row (``row``) as it finishes, then the counts (``skipped``: what a skip
    means, appended to them); exit with status 1 if any row failed."""
    counts = {"ok": 0, "fail": 0, "skip": 0}
    for cells, make_case in rows:
        status, line = row(cells, make_case, policy, timeout)
        counts[status] += 1
        print(line, flush=True)
    print(f"\n{counts['ok']} ok, {counts['fail']} failed, {counts['skip']} skipped{skipped}")
    sys.exit(1 if counts["fail"] else 0)

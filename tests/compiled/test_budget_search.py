"""benchmarks/vs_pytorch.py's budget search (``InductorMatcher._closer``) on a made-up,
non-monotone map from budget to measured peak: no compile runs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import vs_pytorch  # a benchmarks/ module, not a package


def _matcher(measured: dict[int, int], ceiling: int) -> vs_pytorch.InductorMatcher:
    """A matcher whose compile at budget b measures ``measured[b]`` (step peak)."""
    m = object.__new__(vs_pytorch.InductorMatcher)
    m.match, m.ceiling, m.tried = 1, ceiling, {}
    calls: list[int] = []

    def compiled(budget: int):
        calls.append(budget)
        return (None, (0, measured[budget]), f"budget {budget}"), None

    m._compiled = compiled  # type: ignore[method-assign]
    m.calls = calls  # type: ignore[attr-defined]
    return m


def test_a_raise_that_measures_above_is_bisected_back() -> None:
    # fits at 650 (550); 650 + 50 of slack = 700 measures above; 675 and 687 fit closer
    measured = {700: 640, 675: 580, 687: 590}
    m = _matcher(measured, ceiling=1000)
    fit = ((None, (0, 550), "budget 650"), None)
    (_, both, note), _ = m._closer(600, (fit, 650), closer=3)
    assert m.calls == [700, 675, 687]
    assert both[1] == 590 and note == "budget 687"


def test_a_lower_peak_at_a_higher_budget_is_not_taken() -> None:
    measured = {700: 520, 780: 590}  # non-monotone: 700 measures below the fit at 650
    m = _matcher(measured, ceiling=1000)
    fit = ((None, (0, 550), "budget 650"), None)
    (_, both, note), _ = m._closer(600, (fit, 650), closer=2)
    assert m.calls == [700, 780]
    assert both[1] == 590 and note == "budget 780"


def test_within_two_percent_no_compile_is_tried() -> None:
    m = _matcher({}, ceiling=1000)
    fit = ((None, (0, 595), "budget 650"), None)
    (_, both, _), _ = m._closer(600, (fit, 650), closer=3)
    assert m.calls == [] and both[1] == 595


def test_a_few_bytes_over_lower_the_budget_by_two_percent() -> None:
    """A try a few bytes above the target is lowered by 2% of the target, not by the bytes:
    the next try is a different plan (helper 23b: quick GPT-2 measured 1.5 KiB over)."""
    measured = {700: 601, 688: 560, 699: 590}  # 699 = 700 - the 1-byte excess: never tried
    m = _matcher(measured, ceiling=1000)
    m.top = ((None, (0, 900), "unbounded"), None)
    m.floor, m.held, m.gap = 500, 0, -100
    (_, both, note), _ = m.at(600, closer=0)  # first budget: 600 + 0 - (-100) = 700
    assert m.calls == [700, 688]  # 700 - max(1, 600 // 50 = 12)
    assert both[1] == 560 and note == "budget 688"

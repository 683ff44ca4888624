"""The short version of ``benchmarks/stress.py`` (issue 19, point 5): random budgets per
re-plan, a copy engine of random speed per step, gradients against eager, no leak, no
thread left behind."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from stress import StressReport, check_leaks, run_stress


def test_leak_check_fails_on_growth():
    grown = StressReport(tensors=(10, 11), tensor_bytes=(100, 100), rss_mb=(1.0, 1.0))
    assert check_leaks(grown, 8.0) == ["live tensors grew from 10 to 11"]
    assert check_leaks(StressReport(tensors=(10, 10), tensor_bytes=(100, 100)), 8.0) == []


def test_short_stress():
    report = run_stress(40, seed=1, replan=5, check=4, warmup=10)
    assert report.steps == 40 and report.replans == 8 and report.checked == 10
    assert len(set(report.budgets)) > 1
    assert check_leaks(report, rss_slack_mb=64.0) == []

"""Calibrating what a Wait costs on the emulated device."""

from __future__ import annotations

import math

import pytest

from outcore.runtime.devices.calibrate import calibrate_waits


def test_calibration_reports_finite_non_negative_seconds_per_sample() -> None:
    cal = calibrate_waits(latency_s=1e-4, copy_seconds=5e-4, samples=3)
    assert cal.samples == 3
    assert math.isfinite(cal.wake) and cal.wake >= 0
    assert math.isfinite(cal.wait) and cal.wait >= 0


@pytest.mark.parametrize("kw, word", [({"samples": 0}, "samples"),
                                      ({"copy_seconds": 0.0}, "copy_seconds")])
def test_calibration_refuses_bad_arguments(kw: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        calibrate_waits(**kw)

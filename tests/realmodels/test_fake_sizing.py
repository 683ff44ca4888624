"""Fake-tensor sizing of real models (the small version of benchmarks/realmodel_fake_sizing.py):
captured without allocating, planned under a budget below the in-core peak, simulated on
h100 and a100 with the simulated peak equal to the planned one and within the budget."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from realmodel_fake_sizing import MODELS, size


@pytest.mark.parametrize("name", ["resnet50 b64", "llama-1B s2048", "olmoe-1B-7B bf16 b4 s2048"])
def test_fake_sizing_small(name):
    for row in size(name, small=True):
        assert row["peak"] == row["sim_peak"] <= row["budget"] < row["in_core"]
        assert row["step_s"] > 0
    assert name in MODELS

"""Relative speeds: lookup rules, and a real profile round trip through JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch

from outcore.errors import ProfileError
from outcore.variants.meta import CONV, CONV_BACKWARD
from outcore.variants.profile import conv_cases, measure_case, profile, save_json
from outcore.variants.speeds import SpeedTable, load_table, meta_key, relative_speed

A = (((1, 2, 8, 8), "float32"), ((3, 2, 3, 3), "float32"), None, [1, 1], [1, 1], [1, 1],
     False, [0, 0], 1)
B = (((1, 2, 16, 16), "float32"), ((3, 2, 3, 3), "float32"), None, [1, 1], [1, 1], [1, 1],
     False, [0, 0], 1)


def test_meta_key_ignores_strides_and_torch_prefix():
    with_strides = ((((1, 2, 8, 8)), "torch.float32", (128, 64, 8, 1)), *A[1:])
    assert meta_key(CONV, A) == meta_key(CONV, with_strides)
    assert meta_key(CONV, A) != meta_key(CONV, B)


def test_lookup_exact_then_geomean_then_one():
    table = SpeedTable()
    table.add(CONV, "fft", meta_key(CONV, A), 2.0)
    table.add(CONV, "fft", meta_key(CONV, B), 8.0)
    assert relative_speed(CONV, "fft", A, table=table) == 2.0
    other = (((4, 2, 8, 8), "float32"), *A[1:])
    assert relative_speed(CONV, "fft", other, table=table) == pytest.approx(math.sqrt(16.0))
    assert relative_speed(CONV, "im2col", A, table=table) == 1.0
    assert relative_speed(CONV, "framework", A, table=table) == 1.0


def test_bad_tables_raise_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="entries"):
        SpeedTable.from_json("{}")
    with pytest.raises(ProfileError, match="relative_speed"):
        SpeedTable.from_json(json.dumps({"entries": [{"target": CONV, "variant": "fft",
                                                      "arg_meta": list(A)}]}))
    with pytest.raises(ProfileError, match="positive"):
        SpeedTable().add(CONV, "fft", "k", -1.0)
    with pytest.raises(ProfileError, match="no variant profile"):
        load_table(tmp_path / "missing.json")


def test_profile_measures_every_variant_and_round_trips(tmp_path):
    cases = conv_cases("tiny", 1, 2, 6, 6, 3, 3)
    data = profile(cases, repeats=2)
    entries = data["entries"]
    assert [(e["target"], e["variant"]) for e in entries] == [
        (t, v) for t in (CONV, CONV_BACKWARD) for v in ("framework", "im2col", "fft")]
    for e in entries:
        assert e["workspace_bytes"] == e["formula_bytes"]
        assert e["time_s"] > 0 and len(e["times_s"]) == 2
        assert e["max_abs_error"] < 1e-4
        assert (e["relative_speed"] == 1.0) == (e["variant"] == "framework")
    path = tmp_path / "p.json"
    save_json(data, path)
    table = load_table(path)
    fft = next(e for e in entries if e["target"] == CONV and e["variant"] == "fft")
    assert relative_speed(CONV, "fft", fft["arg_meta"], table=table) == fft["relative_speed"]


def test_measure_case_restricts_to_supported_variants():
    (fwd, _) = conv_cases("tiny", 1, 2, 6, 6, 3, 3, dtype=torch.float64)
    names = [m.variant for m in measure_case(fwd, variants=["fft", "winograd"], repeats=1)]
    assert names == ["framework", "fft"]

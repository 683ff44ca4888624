"""Measured per-op profiles: JSON round trip, graph keying, use as a cost model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from outcore.cost.host_costs import HostCosts
from outcore.cost.measured import MeasuredProfile, graph_digest
from outcore.errors import ProfileError
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.sim import simulate

from sim_helpers import chain3

X, A0, A1, A2, G2, G1, G0 = range(7)


def profile() -> MeasuredProfile:
    return MeasuredProfile.for_graph(chain3(), [0.5, 1.0, 1.5, 2.0, 2.5, 3.0], device="test",
                                     repeats=3).with_link(100.0, 50.0, latency=0.25)


def test_host_costs_survive_the_json_round_trip() -> None:
    p = profile().with_link(100.0, 50.0, host_costs=HostCosts(free=1e-6, wake=4e-4))
    loaded = MeasuredProfile.from_json(p.to_json())
    assert loaded.host_costs == HostCosts(free=1e-6, wake=4e-4) and loaded == p


def test_json_round_trip(tmp_path: Path) -> None:
    p = profile()
    assert MeasuredProfile.from_json(p.to_json()) == p
    p.save(tmp_path / "prof.json")
    loaded = MeasuredProfile.load(tmp_path / "prof.json")
    assert loaded == p and loaded.op_digest == graph_digest(chain3())


def test_prices_ops_and_copies() -> None:
    p = profile().bind(chain3())
    assert [p.op_time(o) for o in chain3().ops] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert p.transfer_time(200, "h2d") == pytest.approx(0.25 + 2.0)
    assert p.transfer_time(200, "d2h") == pytest.approx(0.25 + 4.0)
    assert p.transfer_time(0, "d2h") == 0 and p.workspace(chain3().ops[0]) == 0


def test_replaces_the_analytic_model_in_the_simulator() -> None:
    sched = Schedule([
        Compute(0), Offload(A0), Compute(1), Compute(2), Wait(A0, "d2h"), Free(A0),
        Compute(3), Free(A2), Prefetch(A0), Compute(4), Free(G2), Free(A1), Wait(A0, "h2d"),
        Compute(5),
    ], keep_at_end=[G0])
    result = simulate(chain3(), sched, profile())
    # d2h of a0 (200 B) takes 4.25 s from t=0.5; forward ends at 3 -> stall to 4.75;
    # b2 [4.75, 6.75]; h2d 2.25 s [6.75, 9.0]; b1 ends 9.25 -> no stall; b0 ends 12.25
    assert result.step_time == pytest.approx(12.25)
    assert result.exposed_transfer_time == pytest.approx(1.75)


def test_a_mismatched_graph_is_refused() -> None:
    other = chain3()
    other.name = "another"
    with pytest.raises(ProfileError, match="measure_ops"):
        profile().bind(other)
    renamed_ops = chain3()
    renamed_ops.ops[2].target = "test.something_else"
    with pytest.raises(ProfileError, match="chain3"):
        profile().bind(renamed_ops)


def test_copies_need_a_link() -> None:
    bare = MeasuredProfile.for_graph(chain3(), [1.0] * 6)
    with pytest.raises(ProfileError, match="with_link"):
        bare.transfer_time(10, "h2d")


@pytest.mark.parametrize("change, field", [
    ({"op_seconds": [1.0] * 5}, "op_seconds"),
    ({"op_seconds": [1.0] * 5 + [-1.0]}, "op_seconds[5]"),
    ({"op_seconds": [1.0] * 5 + [float("inf")]}, "op_seconds[5]"),
    ({"h2d_bandwidth": -2.0}, "h2d_bandwidth"),
    ({"copy_engines": 0}, "copy_engines"),
    ({"op_count": -1}, "op_count"),
    ({"surprise": 1}, "surprise"),
    ({"host_costs": {"wake": -1.0}}, "wake"),
    ({"host_costs": {"sleep": 1.0}}, "sleep"),
])
def test_bad_documents_name_the_field(change: dict, field: str) -> None:
    doc = json.loads(profile().to_json())
    doc.update(change)
    with pytest.raises(ProfileError, match=f"'{field}'".replace("[", r"\[").replace("]", r"\]")):
        MeasuredProfile.from_json(json.dumps(doc))


@pytest.mark.parametrize("missing", ["graph_name", "op_count", "op_seconds", "format"])
def test_missing_fields_are_named(missing: str) -> None:
    doc = json.loads(profile().to_json())
    del doc[missing]
    with pytest.raises(ProfileError, match=f"'{missing}'"):
        MeasuredProfile.from_json(json.dumps(doc))

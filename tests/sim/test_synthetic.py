"""Synthetic residual graphs and schedules, and invariants of the simulator over them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.graph.ir import Phase
from outcore.plan.schedule import Offload
from outcore.plan.verify import verify
from outcore.sim import simulate
from outcore.sim.synthetic import keep_all_schedule, offload_all_schedule, residual_chain

from sim_helpers import TableCost


def test_residual_chain_shape() -> None:
    graph = residual_chain(5)
    assert sum(op.phase is Phase.FORWARD for op in graph.ops) == 4 * 5 + 1
    assert sum(op.phase is Phase.BACKWARD for op in graph.ops) == 4 * 5 + 1
    # every unit's relu output and every unit's output (the next unit's input, or the loss
    # input) are read in backward; the first unit's input is the graph input
    assert len(graph.activations()) == 2 * 5
    with pytest.raises(ValueError):
        residual_chain(0)


def test_schedules_verify() -> None:
    graph = residual_chain(6)
    verify(graph, keep_all_schedule(graph))
    verify(graph, offload_all_schedule(graph, window=3))


def test_offload_all_moves_every_saved_activation_and_lowers_the_peak() -> None:
    graph = residual_chain(8, activation_bytes=1000, param_bytes=10)
    model = AnalyticCostModel(get_profile("v100-pcie"))
    keep = simulate(graph, keep_all_schedule(graph), model)
    off = simulate(graph, offload_all_schedule(graph), model)
    saved = sum(t.nbytes for t in graph.activations())
    assert off.bytes_d2h == off.bytes_h2d == saved == off.host_peak_bytes
    assert off.peak_bytes < keep.peak_bytes
    assert keep.exposed_transfer_time == 0


@settings(max_examples=25, deadline=None)
@given(units=st.integers(1, 6), window=st.integers(0, 4), engines=st.integers(1, 2),
       bw=st.floats(1e2, 1e5), seed=st.integers(0, 1000))
def test_time_invariants(units: int, window: int, engines: int, bw: float, seed: int) -> None:
    graph = residual_chain(units, activation_bytes=1000, param_bytes=10)
    times = {op.name: ((seed * 7919 + i * 104729) % 97 + 1) / 10 for i, op in enumerate(graph.ops)}
    schedule = offload_all_schedule(graph, window=window)
    cost = TableCost(times, d2h=bw, h2d=2 * bw, engines=engines)
    result = simulate(graph, schedule, cost)
    assert result.compute_time == pytest.approx(sum(times.values()))
    assert result.step_time == pytest.approx(result.compute_time + result.exposed_transfer_time)
    assert result.exposed_transfer_time >= result.stall_time - 1e-9
    assert 0 <= result.overlapped_transfer_time <= min(
        result.compute_time, result.d2h_busy_time + result.h2d_busy_time) + 1e-9
    assert result.d2h_busy_time == pytest.approx(result.bytes_d2h / bw)
    # every copy starts after it was issued and ends within the step
    for i, ins in enumerate(schedule):
        assert result.start[i] >= result.issue[i] - 1e-12
        assert result.end[i] <= result.step_time + 1e-9
        if isinstance(ins, Offload):
            assert result.stream[i] == "d2h"
    # infinitely fast copies: the same time as keeping everything
    fast = simulate(graph, schedule, TableCost(times, d2h=1e30, h2d=1e30, engines=engines))
    keep = simulate(graph, keep_all_schedule(graph), TableCost(times))
    assert fast.step_time == pytest.approx(keep.step_time)

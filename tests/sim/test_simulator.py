"""The simulator on hand-made graphs whose times and bytes are known."""

from __future__ import annotations

import pytest

from outcore.cost.host_costs import HostCosts
from outcore.errors import ProfileError
from outcore.plan.memory import memory_curve
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.sim import Lifetime, simulate

from sim_helpers import TableCost, chain3

# chain3 tensor ids: x=0 a0=1 a1=2 a2=3 g2=4 g1=5 g0=6; op ids f0..f2 = 0..2, b2, b1, b0 = 3..5
X, A0, A1, A2, G2, G1, G0 = range(7)
F0, F1, F2, B2, B1, B0 = range(6)


def keep_schedule() -> Schedule:
    return Schedule([
        Compute(F0), Compute(F1), Compute(F2), Compute(B2), Free(A2),
        Compute(B1), Free(G2), Free(A1), Compute(B0), Free(G1), Free(A0),
    ], keep_at_end=[G0])


def offload_schedule(wait_d2h_after: int = F2) -> Schedule:
    """Offload a0 after f0; wait for it after op ``wait_d2h_after``; prefetch it after b2."""
    head = [Compute(F0), Offload(A0), Compute(F1)]
    if wait_d2h_after == F1:
        head += [Wait(A0, "d2h"), Free(A0), Compute(F2)]
    else:
        head += [Compute(F2), Wait(A0, "d2h"), Free(A0)]
    tail = [Compute(B2), Free(A2), Prefetch(A0), Compute(B1), Free(G2), Free(A1),
            Wait(A0, "h2d"), Compute(B0), Free(G1), Free(A0)]
    return Schedule([*head, *tail], keep_at_end=[G0])


def test_keep_all_chain_time_is_the_sum_of_op_times_and_nothing_is_exposed() -> None:
    graph = chain3()
    times = {"f0": 1.0, "f1": 2.0, "f2": 3.0, "b2": 0.5, "b1": 0.25, "b0": 4.0}
    result = simulate(graph, keep_schedule(), TableCost(times))
    assert result.step_time == pytest.approx(sum(times.values()))
    assert result.compute_time == pytest.approx(result.step_time)
    assert result.exposed_transfer_time == 0 and result.overlapped_transfer_time == 0
    assert result.bytes_d2h == result.bytes_h2d == 0
    # x + a0 + a1 + a2 resident after f2, then b2 adds g2
    assert result.peak_bytes == 100 + 200 + 300 + 400 + 10
    assert result.start[:3] == [0.0, 1.0, 3.0] and result.end[2] == 6.0


def test_offload_longer_than_remaining_forward_exposes_exactly_the_difference() -> None:
    graph = chain3()
    # a0 is 200 bytes: 5 s at 40 B/s d2h; it starts when f0 ends (t=1). The forward left
    # after that is f1 + f2 = 2 s, so the wait after f2 stalls 5 - 2 = 3 s. H2D is fast.
    cost = TableCost({}, d2h=40.0, h2d=2000.0)
    result = simulate(graph, offload_schedule(), cost)
    assert result.start[1] == pytest.approx(1.0) and result.end[1] == pytest.approx(6.0)
    assert result.exposed_transfer_time == pytest.approx(5.0 - 2.0)
    assert result.stall_time == pytest.approx(3.0)
    assert result.step_time == pytest.approx(6 * 1.0 + 3.0)
    # the offload overlapped f1 and f2 entirely; the prefetch (0.1 s) overlapped b1
    assert result.overlapped_transfer_time == pytest.approx(2.0 + 0.1)
    assert result.bytes_d2h == result.bytes_h2d == 200


def test_offload_hidden_by_compute_exposes_nothing() -> None:
    graph = chain3()
    cost = TableCost({"f1": 3.0, "f2": 3.0, "b1": 2.0}, d2h=100.0, h2d=100.0)  # 2 s each way
    result = simulate(graph, offload_schedule(), cost)
    assert result.exposed_transfer_time == pytest.approx(0.0)
    assert result.step_time == pytest.approx(result.compute_time) == pytest.approx(11.0)
    assert result.overlapped_transfer_time == pytest.approx(4.0)
    assert result.d2h_busy_time == pytest.approx(2.0) and result.h2d_busy_time == pytest.approx(2.0)


def test_offload_frees_memory_the_prefetch_takes_back() -> None:
    graph = chain3()
    keep = simulate(graph, keep_schedule(), TableCost({}))
    off = simulate(graph, offload_schedule(wait_d2h_after=F1), TableCost({}, d2h=1e9, h2d=1e9))
    # with a0 gone before f2 the peak is x + a1 + a2 + g2 at b2; the prefetch of a0 comes
    # after a2 is freed: x + a1 + g2 + a0 = 610 < 810
    assert keep.peak_bytes == 1010
    assert off.peak_bytes == 100 + 300 + 400 + 10
    assert off.host_peak_bytes == 200
    assert off.peak_bytes == memory_curve(graph, offload_schedule(wait_d2h_after=F1)).peak


def test_one_copy_engine_serialises_offload_and_prefetch() -> None:
    graph = chain3()
    sched = Schedule([
        Compute(F0), Offload(A0), Compute(F1), Offload(A1), Compute(F2), Wait(A0, "d2h"),
        Free(A0), Compute(B2), Prefetch(A0), Wait(A0, "h2d"), Compute(B1), Compute(B0),
        Wait(A1, "d2h"),
    ], keep_at_end=[G0])
    # 100 B/s both ways: a0 d2h [1, 3], a1 d2h [3, 6]; the prefetch of a0 is issued at t=4
    split = simulate(graph, sched, TableCost({}, d2h=100.0, h2d=100.0, engines=2))
    shared = simulate(graph, sched, TableCost({}, d2h=100.0, h2d=100.0, engines=1))
    assert split.start[3] == pytest.approx(3.0) and split.end[3] == pytest.approx(6.0)
    assert split.start[8] == pytest.approx(4.0)  # its own engine is free
    assert shared.start[8] == pytest.approx(6.0)  # behind a1's offload on the shared engine
    assert split.step_time == pytest.approx(8.0) and shared.step_time == pytest.approx(10.0)
    assert shared.exposed_transfer_time == pytest.approx(10.0 - 6.0)


def test_recompute_runs_on_the_compute_stream_again() -> None:
    graph = chain3()
    sched = Schedule([
        Compute(F0), Compute(F1), Free(A0), Compute(F2), Compute(B2), Free(A2),
        Compute(B1), Free(G2), Free(A1), Compute(F0, recompute=True), Compute(B0),
    ], keep_at_end=[G0])
    result = simulate(graph, sched, TableCost({"f0": 7.0}))
    assert result.compute_time == pytest.approx(7 + 1 + 1 + 1 + 1 + 7 + 1)
    assert result.kind[9] == "recompute" and result.steps == [0, 1, 3, 4, 6, 9, 10]


def test_workspace_and_variants_reach_the_memory_curve() -> None:
    graph = chain3()
    cost = TableCost({}, workspace={"f2": 5000})
    result = simulate(graph, keep_schedule(), cost)
    assert result.peak_bytes == 100 + 200 + 300 + 400 + 5000
    assert result.memory[2] == 6000 and result.memory[3] == 1010


def test_sub_batches_repeat_the_pass() -> None:
    graph = chain3()
    sched = offload_schedule()
    sched.sub_batches = 3
    cost = TableCost({}, d2h=40.0, h2d=2000.0)
    one = simulate(graph, offload_schedule(), cost)
    three = simulate(graph, sched, cost)
    assert three.step_time == pytest.approx(3 * one.step_time)
    assert three.pass_time == pytest.approx(one.step_time)
    assert three.bytes_d2h == 3 * one.bytes_d2h
    assert three.peak_bytes == one.peak_bytes


def test_average_memory_is_weighted_by_time() -> None:
    graph = chain3()
    times = {"f0": 1.0, "f1": 1.0, "f2": 2.0, "b2": 0.0, "b1": 0.0, "b0": 0.0}
    result = simulate(graph, keep_schedule(), TableCost(times))
    # 300 B during f0, 600 during f1, 1000 during f2; the backward takes no time
    assert result.average_bytes == pytest.approx((300 * 1 + 600 * 1 + 1000 * 2) / 4)


def test_breakdown_sums_to_the_step_time() -> None:
    graph = chain3()
    result = simulate(graph, offload_schedule(), TableCost({"f1": 1.5}, d2h=40.0, h2d=150.0))
    parts = result.breakdown()
    assert sum(parts.values()) == pytest.approx(result.step_time)
    assert parts["exposed_transfer"] == pytest.approx(result.step_time - result.compute_time)
    assert "step" in result.summary() and result.to_dict()["peak_bytes"] == result.peak_bytes


def test_placement_receives_every_residency() -> None:
    graph = chain3()
    seen = {}

    def place(g, s, lifetimes):
        seen["lifetimes"] = lifetimes
        return "placed"

    result = simulate(graph, offload_schedule(), TableCost({}), placement=place)
    assert result.placement == "placed"
    a0 = sorted((lt for lt in seen["lifetimes"] if lt.storage == A0), key=lambda lt: lt.start)
    # offload_schedule: Free(a0) at 5, Prefetch(a0) at 8, last Free(a0) at 15
    assert a0 == [Lifetime(A0, 200, 0, 5), Lifetime(A0, 200, 8, 15)]
    x = [lt for lt in seen["lifetimes"] if lt.storage == X]
    assert x == [Lifetime(X, 100, -1, len(offload_schedule()))]

    class Pool:
        def place(self, g, s, lifetimes):
            return len(lifetimes)

    assert simulate(graph, offload_schedule(), TableCost({}), placement=Pool()).placement == 8


def test_blocking_waits_pay_the_wake_and_hidden_ones_the_check() -> None:
    graph = chain3()
    blocking = TableCost({}, d2h=40.0, h2d=2000.0)  # the d2h wait stalls 3 s (see above)
    blocking.host_costs = HostCosts(wake=0.5, wait=0.125)
    result = simulate(graph, offload_schedule(), blocking)
    # the d2h wait blocks (3 s stall + 0.5 s wake); the h2d copy (0.1 s) ended during b1,
    # so its wait only checks (0.125 s)
    assert result.step_time == pytest.approx(6 * 1.0 + 3.0 + 0.5 + 0.125)
    assert result.stall_time == pytest.approx(3.0)
    assert result.exposed_transfer_time == pytest.approx(3.0)
    assert result.host_time == pytest.approx(0.625)
    hidden = TableCost({"f1": 3.0, "f2": 3.0, "b1": 2.0}, d2h=100.0, h2d=100.0)
    hidden.host_costs = HostCosts(wake=0.5)
    assert simulate(graph, offload_schedule(), hidden).step_time == pytest.approx(11.0)


def test_host_costs_of_frees_and_copy_issues_delay_the_stream_and_the_copies() -> None:
    graph = chain3()
    cost = TableCost({}, d2h=40.0, h2d=2000.0)  # a0 = 200 B: 5 s d2h, 0.1 s h2d
    cost.host_costs = HostCosts(free=0.25, offload=0.5, prefetch=0.125, prefetch_per_byte=0.001)
    result = simulate(graph, offload_schedule(), cost)
    # the offload is issued after f0 (t=1) and takes 0.5 s to issue: its copy runs 1.5..6.5
    assert result.start[1] == pytest.approx(1.5) and result.end[1] == pytest.approx(6.5)
    # forward: f0, issue, f1, f2 end at 3.5; the wait stalls to 6.5; then 6 frees and the
    # prefetch issue (0.125 + 0.2 s) are host time
    frees = sum(1 for k in result.kind if k == "free")
    assert frees == 6
    assert result.host_time == pytest.approx(0.5 + 6 * 0.25 + 0.125 + 0.2)
    assert result.stall_time == pytest.approx(3.0)
    assert result.step_time == pytest.approx(6 * 1.0 + 3.0 + result.host_time)
    assert result.step_time == pytest.approx(
        result.compute_time + result.host_time + result.exposed_transfer_time)
    assert result.breakdown()["host"] == pytest.approx(result.host_time)
    assert sum(result.breakdown().values()) == pytest.approx(result.step_time)


@pytest.mark.parametrize("field", ["free", "offload", "prefetch", "prefetch_per_byte", "wait",
                                   "wake"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1", True])
def test_host_costs_refuse_a_bad_field_by_name(field: str, bad: object) -> None:
    with pytest.raises(ProfileError, match=repr(field)):
        HostCosts(**{field: bad})


def test_a_cost_model_with_something_else_as_host_costs_is_refused() -> None:
    cost = TableCost({})
    cost.host_costs = {"free": 1.0}
    with pytest.raises(ProfileError, match="HostCosts"):
        simulate(chain3(), keep_schedule(), cost)

"""Bad schedules are refused with ScheduleError naming the instruction, by the one replay of
the schedule the simulator times (verify=True and verify=False check alike)."""

from __future__ import annotations

import pytest

from outcore.errors import ProfileError, ScheduleError
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.sim import simulate

from sim_helpers import ACT, GRAD, INPUT, B, F, TableCost, chain3, make_graph

X, A0, A1, A2, G2, G1, G0 = range(7)
F0, F1, F2, B2, B1, B0 = range(6)
TAIL = [Compute(B2), Compute(B1), Compute(B0)]

CASES = {
    "wait on a copy never started": (
        [Compute(F0), Wait(A0, "d2h"), Compute(F1), Compute(F2), *TAIL], 1, "not in flight"),
    "wait h2d without prefetch": (
        [Compute(F0), Compute(F1), Wait(A0, "h2d"), Compute(F2), *TAIL], 2, "Prefetch"),
    "compute reads a freed input": (
        [Compute(F0), Free(A0), Compute(F1), Compute(F2), *TAIL], 2, "freed at instruction 1"),
    "compute before its input exists": (
        [Compute(F1), Compute(F0), Compute(F2), *TAIL], 0, "producer has not run"),
    "compute reads a prefetch not waited for": (
        [Compute(F0), Offload(A0), Compute(F1), Wait(A0, "d2h"), Free(A0), Compute(F2),
         Prefetch(A0), Compute(B2), Compute(B1), Compute(B0), Wait(A0, "h2d")],
        9, "Wait('a0', 'h2d')"),
    "compute reads an offloaded tensor never prefetched": (
        [Compute(F0), Offload(A0), Compute(F1), Wait(A0, "d2h"), Free(A0), Compute(F2), *TAIL],
        8, "Prefetch('a0') and Wait('a0', 'h2d')"),
    "free while offloading": (
        [Compute(F0), Offload(A0), Compute(F1), Free(A0), Compute(F2), *TAIL],
        3, "Wait('a0', 'd2h')"),
    "double free": (
        [Compute(F0), Compute(F1), Free(A0), Free(A0), Compute(F2), *TAIL], 3, "not on the device"),
    "prefetch never offloaded": (
        [Compute(F0), Compute(F1), Free(A0), Prefetch(A0), Compute(F2), *TAIL], 3, "host copy"),
    "prefetch of a resident tensor": (
        [Compute(F0), Offload(A0), Wait(A0, "d2h"), Prefetch(A0), Compute(F1), Compute(F2), *TAIL],
        3, "already on the device"),
    "offload of a freed tensor": (
        [Compute(F0), Compute(F1), Free(A0), Offload(A0), Compute(F2), *TAIL],
        3, "not on the device"),
    "recompute before it ran": (
        [Compute(F0, recompute=True), Compute(F1), Compute(F2), *TAIL], 0, "before it ever ran"),
}


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_schedule_is_refused_with_its_index(case: str, verify: bool) -> None:
    instructions, index, fragment = CASES[case]
    with pytest.raises(ScheduleError) as info:
        simulate(chain3(), Schedule(instructions, keep_at_end=[G0]), TableCost({}), verify=verify)
    assert info.value.index == index
    assert fragment in str(info.value)  # one wording (outcore.plan.rules), whoever checks


def test_copy_still_in_flight_at_the_end_is_refused() -> None:
    sched = Schedule([Compute(F0), Offload(A0), Compute(F1), Compute(F2), *TAIL], keep_at_end=[G0])
    with pytest.raises(ScheduleError, match="still in flight"):
        simulate(chain3(), sched, TableCost({}), verify=False)


def test_missing_output_at_the_end_is_refused() -> None:
    sched = Schedule([Compute(F0), Compute(F1), Compute(F2), *TAIL, Free(G0)], keep_at_end=[G0])
    with pytest.raises(ScheduleError, match="'g0'"):
        simulate(chain3(), sched, TableCost({}), verify=False)


def test_offload_of_a_view_names_its_base() -> None:
    graph = make_graph(
        [("x", 64, INPUT), ("a", 64, ACT), ("v", 0, ACT), ("g", 8, GRAD)],
        [("f", F, ["x"], ["a"]), ("view", F, ["a"], ["v"]), ("b", B, ["v"], ["g"])],
        outputs=["g"], views={"v": "a"})
    sched = Schedule([Compute(0), Compute(1), Offload(2), Compute(2)], keep_at_end=[3])
    with pytest.raises(ScheduleError, match="base 'a'") as info:
        simulate(graph, sched, TableCost({}), verify=False)
    assert info.value.index == 2


def test_a_free_of_a_view_keeps_the_storage_until_the_last_alias() -> None:
    graph = make_graph(
        [("x", 64, INPUT), ("a", 64, ACT), ("v", 0, ACT), ("g", 8, GRAD)],
        [("f", F, ["x"], ["a"]), ("view", F, ["a"], ["v"]), ("b", B, ["v"], ["g"])],
        outputs=["g"], views={"v": "a"})
    sched = Schedule([Compute(0), Compute(1), Free(1), Compute(2), Free(2)], keep_at_end=[3])
    result = simulate(graph, sched, TableCost({}))
    assert result.memory == [128, 128, 128, 136, 72]


def test_cost_model_giving_a_negative_time_is_a_profile_error() -> None:
    sched = Schedule([Compute(F0), Compute(F1), Compute(F2), *TAIL], keep_at_end=[G0])
    with pytest.raises(ProfileError, match="'f1'"):
        simulate(chain3(), sched, TableCost({"f1": -1.0}))

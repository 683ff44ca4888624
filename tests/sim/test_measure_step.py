"""Profiling a schedule inside real steps: per-op seconds and host costs."""

from __future__ import annotations

import math

import pytest
import torch

from outcore.cost.host_costs import HostCosts
from outcore.cost.measure_step import profile_from_steps, profile_step
from outcore.errors import ProfileError
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.runtime.devices.calibrate import WaitCalibration
from outcore.runtime.devices.stats import DirectionStats, TransferStats
from outcore.runtime.executor import StepResult

from sim_helpers import chain3

X, A0, A1, A2, G2, G1, G0 = range(7)
F0, F1, F2, B2, B1, B0 = range(6)

# a0 (200 B) and a1 (300 B) offloaded and prefetched; f1 recomputed once in backward
SCHEDULE = Schedule([
    Compute(F0), Offload(A0), Compute(F1), Offload(A1), Compute(F2),       # 0-4
    Wait(A0, "d2h"), Free(A0), Wait(A1, "d2h"), Free(A1),                 # 5-8
    Compute(B2), Free(A2), Prefetch(A0), Wait(A0, "h2d"), Compute(F1, recompute=True),  # 9-13
    Prefetch(A1), Wait(A1, "h2d"), Compute(B1), Free(G2), Compute(B0),    # 14-18
], keep_at_end=[G0])
N = len(SCHEDULE.instructions)


def step(scale: float, blocking: int = 0, late: float = 0.0) -> StepResult:
    """Instruction i takes (i + 1) ms * scale, except the two prefetches: 0.3 ms + 1 us/B."""
    seconds = [(i + 1) * 1e-3 * scale for i in range(N)]
    seconds[11] = 3e-4 + 200 * 1e-6
    seconds[14] = 3e-4 + 300 * 1e-6
    transfers = TransferStats(DirectionStats(blocking_waits=blocking, late_s=late * blocking),
                              DirectionStats())
    return StepResult(loss=torch.zeros(()), peak_bytes=0, instruction_seconds=seconds,
                      transfers=transfers)


def test_op_times_are_medians_over_steps_averaged_over_executions() -> None:
    steps = [step(1.0), step(3.0), step(2.0)]  # median scale 2
    profile = profile_from_steps(chain3(), SCHEDULE, steps)
    ms = 2e-3
    # f1 runs at instructions 2 and 13: the mean of (3 ms, 14 ms) * 2
    assert profile.op_seconds[F1] == pytest.approx((3 + 14) / 2 * ms)
    assert profile.op_seconds[F0] == pytest.approx(1 * ms)
    assert profile.op_seconds[B0] == pytest.approx(19 * ms)
    assert profile.repeats == 3


def test_host_costs_are_means_and_a_non_negative_fit_for_prefetches() -> None:
    costs = profile_from_steps(chain3(), SCHEDULE, [step(1.0)]).host_costs
    ms = 1e-3
    assert costs.free == pytest.approx((7 + 9 + 11 + 18) / 4 * ms)
    assert costs.offload == pytest.approx((2 + 4) / 2 * ms)
    assert costs.prefetch == pytest.approx(3e-4)
    assert costs.prefetch_per_byte == pytest.approx(1e-6)
    assert costs.wait == 0 and costs.wake == 0  # no blocking wait, no calibration


def test_wake_is_the_mean_lateness_of_blocking_waits_else_the_calibration() -> None:
    cal = WaitCalibration(wake=5e-4, wait=2e-6, samples=3)
    blocked = profile_from_steps(chain3(), SCHEDULE, [step(1.0, 2, 1e-4), step(1.0, 1, 4e-4)],
                                 waits=cal).host_costs
    assert blocked.wake == pytest.approx((2 * 1e-4 + 4e-4) / 3)
    assert blocked.wait == pytest.approx(2e-6)
    unblocked = profile_from_steps(chain3(), SCHEDULE, [step(1.0)], waits=cal).host_costs
    assert unblocked == HostCosts(free=unblocked.free, offload=unblocked.offload,
                                  prefetch=unblocked.prefetch,
                                  prefetch_per_byte=unblocked.prefetch_per_byte,
                                  wait=2e-6, wake=5e-4)


def test_untimed_steps_no_steps_and_unrun_ops_are_refused() -> None:
    with pytest.raises(ProfileError, match="timed=True"):
        profile_from_steps(chain3(), SCHEDULE, [])
    untimed = StepResult(loss=torch.zeros(()), peak_bytes=0)
    with pytest.raises(ProfileError, match="timed=True"):
        profile_from_steps(chain3(), SCHEDULE, [untimed])
    partial = Schedule(SCHEDULE.instructions[:5])
    short = StepResult(loss=torch.zeros(()), peak_bytes=0, instruction_seconds=[1e-3] * 5)
    with pytest.raises(ProfileError, match="never runs"):
        profile_from_steps(chain3(), partial, [short])


def test_a_real_step_profile_prices_the_schedule_it_came_from() -> None:
    from outcore.capture import capture
    from outcore.plan.lower import lower
    from outcore.policies import baseline
    from outcore.runtime.devices import EmulatedDevice
    from outcore.runtime.executor import Executor
    from outcore.sim import simulate

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    batch = (torch.randn(32, 16), torch.randint(0, 4, (32,)))
    graph = capture(net, torch.nn.functional.cross_entropy, batch)
    schedule = lower(graph, baseline.offload_all(graph))
    with EmulatedDevice(None, 50e6, 50e6, latency_s=1e-4) as device:
        executor = Executor(graph, schedule, device)
        timed = executor.run(batch, apply=False, timed=True)
        profile = profile_step(executor, batch, repeats=3)
    assert len(timed.instruction_seconds) == len(schedule.instructions)
    assert sum(timed.instruction_seconds) <= timed.seconds
    assert [oid for oid, _ in timed.op_seconds] == [
        i.op for i in schedule.instructions if isinstance(i, Compute)]
    assert timed.transfers is not None
    assert timed.transfers.d2h.copies == sum(isinstance(i, Offload) for i in schedule)
    assert profile.op_count == len(graph.ops) and profile.repeats == 3
    assert profile.device == "cpu-emulated"
    costs = profile.host_costs
    assert costs.free > 0 and costs.offload > 0 and costs.prefetch + costs.prefetch_per_byte > 0
    assert all(math.isfinite(t) and t > 0 for t in profile.op_seconds)
    sim = simulate(graph, schedule, profile.with_link(50e6, latency=1e-4))
    assert sim.host_time > 0 and sim.bytes_d2h == timed.transfers.d2h.bytes

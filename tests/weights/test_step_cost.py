"""The host side, modelled: profile fields, ``step_seconds``, and the simulator's host timeline
(a host step starts when its gradient has landed, overlapped with the rest of backward)."""

import dataclasses
import math

import pytest

from outcore.cost.profiles import HardwareProfile, get_profile, profiles
from outcore.errors import ProfileError
from outcore.plan.lower import lower
from outcore.plan.schedule import Offload
from outcore.plan.weights import WeightPlacement, gradients, parameters
from outcore.planned import cost_model_for
from outcore.policies import baseline
from outcore.sim.host_steps import HostSteps, timeline
from outcore.sim.simulator import simulate
from outcore.weights.spec import ADAM_UPDATE_BYTES as ADAM_BYTES
from outcore.weights.step_cost import HOST_EFFICIENCY, host_steps, step_seconds


def test_every_catalogue_profile_gives_the_host_side_with_its_source():
    for p in profiles().values():
        assert p.host_adam_rate > 0 and p.host_memory_bandwidth > 0, p.name
        assert any(s.startswith("host side:") for s in p.sources), p.name
        back = HardwareProfile.from_dict(p.to_dict())
        assert back.host_adam_rate == pytest.approx(p.host_adam_rate)
        assert back.host_memory_bandwidth == pytest.approx(p.host_memory_bandwidth)
    doc = get_profile("h100").to_dict() | {"host_adam_mparams": -1}
    with pytest.raises(ProfileError, match="host_adam_mparams"):
        HardwareProfile.from_dict(doc)


def test_step_seconds_prices_host_and_device_from_the_profile():
    a100 = get_profile("a100-40gb")
    device_s, host_s = step_seconds({"device": 10**9, "host": [10**8, 10**8]}, a100)
    assert host_s == pytest.approx(2e8 / a100.host_adam_rate)
    assert device_s == pytest.approx(1e9 * ADAM_BYTES / (0.8 * a100.memory_bandwidth))
    assert step_seconds({}, a100) == (0.0, 0.0)
    cast = step_seconds({"host": 10**8}, a100, master_cast_bytes=2)[1]
    assert cast > step_seconds({"host": 10**8}, a100)[1]
    bare = dataclasses.replace(a100, host_adam_rate=None)
    assert step_seconds({"host": 10**6}, bare)[1] == pytest.approx(
        1e6 * ADAM_BYTES / (HOST_EFFICIENCY * a100.host_memory_bandwidth))
    with pytest.raises(ProfileError, match="host_adam_mparams"):
        step_seconds({"host": 1}, dataclasses.replace(bare, host_memory_bandwidth=None))
    with pytest.raises(ProfileError, match="placement"):
        step_seconds({"gpu": 1}, a100)


def test_this_cpu_measures_its_adam_rate():
    from outcore.cost.measure_host import measure_adam_rate

    rate, impl = measure_adam_rate(numel=1 << 16, repeats=2)
    assert rate > 0 and math.isfinite(rate) and impl in ("fused", "foreach")


def _schedule(graph, held):
    return lower(graph, baseline.liveness(graph), weights=held)


def test_host_steps_start_when_their_gradient_lands_and_overlap_backward(gpt):
    _, _, graph = gpt
    cost = cost_model_for("a100-40gb", graph)
    slow = dataclasses.replace(cost.profile, host_adam_rate=2e6)  # visible host steps
    schedule = _schedule(graph, WeightPlacement.of(graph, parameters(graph)))
    plain = simulate(graph, schedule, cost)
    overlapped = simulate(graph, schedule, cost, optimizer=host_steps(graph, schedule, slow))
    barrier = simulate(graph, schedule, cost,
                       optimizer=host_steps(graph, schedule, slow, barrier=True))
    line = overlapped.optimizer
    total = line.host_busy
    assert total == pytest.approx(sum(host_steps(graph, schedule, slow).host.values()))
    # every host step starts after its gradient's d2h copy ended, and they overlap backward
    offload_end = {ins.tensor: overlapped.end[i] for i, ins in enumerate(schedule.instructions)
                   if isinstance(ins, Offload)}
    for g, (start, _) in line.steps.items():
        assert start >= offload_end[graph.tensors[g].storage]
    assert min(s for s, _ in line.steps.values()) < plain.pass_time
    assert plain.step_time < overlapped.step_time < barrier.step_time
    assert barrier.step_time >= plain.pass_time + total
    for r in (overlapped, barrier):
        assert r.compute_time + r.host_time + r.exposed_transfer_time + r.optimizer_time \
            == pytest.approx(r.step_time)


def test_device_held_and_zero_offload_style_steps(gpt):
    _, _, graph = gpt
    cost = cost_model_for("a100-40gb", graph)
    keep = _schedule(graph, WeightPlacement())
    work = host_steps(graph, keep, cost)
    assert not work.host and work.device_seconds > 0
    r = simulate(graph, keep, cost, optimizer=work)
    assert r.step_time == pytest.approx(max(r.pass_time, r.optimizer.device_end))
    # ZeRO-Offload: weights stay, gradients go; updated weights come back h2d
    sent = WeightPlacement(frozenset(), frozenset(gradients(graph).values()))
    zero = _schedule(graph, sent)
    work = host_steps(graph, zero, cost)
    weights = sum(graph.tensors[p].nbytes for p in parameters(graph).values())
    assert sum(work.h2d.values()) == weights and not work.wait_for
    r = simulate(graph, zero, cost, optimizer=work)
    assert r.optimizer.h2d_bytes == weights
    assert r.bytes_h2d == simulate(graph, zero, cost).bytes_h2d + weights


def test_the_cpu_timeline_rules():
    """One CPU, landing order, a held parameter's step after its last prefetch, the
    barrier after the compute stream and the last gradient, updated weights h2d after."""
    work = HostSteps(host={1: 1.0, 2: 1.0, 3: 1.0}, wait_for={2: 20}, h2d={3: 100},
                     device_seconds=0.5)
    line = timeline(work, compute_end=4.0, pass_end=4.5, landed={1: 1.0, 2: 1.5, 3: 2.0},
                    prefetched={20: 3.0}, h2d_free=4.5, h2d_time=lambda n: n / 100)
    assert line.steps == {1: (1.0, 2.0), 3: (2.0, 3.0), 2: (3.0, 4.0)}
    assert line.device_end == 4.5 and line.h2d_end == 5.5 and line.end == 5.5
    barrier = timeline(dataclasses.replace(work, barrier=True, barrier_seconds=0.25),
                       compute_end=4.0, pass_end=4.5, landed={1: 1.0, 2: 1.5, 3: 2.0},
                       prefetched={20: 3.0}, h2d_free=4.5, h2d_time=lambda n: n / 100)
    assert min(s for s, _ in barrier.steps.values()) == 4.25 and barrier.host_end == 7.25
    with pytest.raises(ProfileError):
        HostSteps(host={1: -1.0})


def test_ranks_on_one_host_share_its_cpu():
    from outcore.cost.interconnects import HOSTS, default_host

    dgx1 = HOSTS["dgx1-v100"]
    v100 = get_profile("v100-pcie")
    assert dgx1.host_side(v100, 1).host_adam_rate == dgx1.host_adam_rate
    assert dgx1.host_side(v100, 8).host_adam_rate == pytest.approx(dgx1.host_adam_rate / 8)
    assert dgx1.host_side(v100, 16).host_adam_rate == pytest.approx(dgx1.host_adam_rate / 8)
    a100 = get_profile("a100-40gb")  # a host without its own figures: the GPU profile's
    assert default_host("a100-40gb").host_side(a100, 2).host_memory_bandwidth == \
        pytest.approx(a100.host_memory_bandwidth / 2)
    with pytest.raises(ProfileError, match="host_adam_rate"):
        dataclasses.replace(dgx1, host_adam_rate=0.0)


def test_no_profile_is_refused_with_the_way_out():
    with pytest.raises(ProfileError, match="get_profile"):
        step_seconds({"host": 1}, None)

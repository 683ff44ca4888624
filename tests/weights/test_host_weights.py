"""Parameters held in host memory and gradients sent there, in the one Schedule.

Oracle (gradients bit-equal eager's), prediction (measured peak == predicted peak on the
emulated device), races (the copy engine slowed on purpose changes nothing; a schedule
that reads a parameter before its copy lands is caught) and the replay's rules.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from weights_helpers import eager_grads, make_gpt, token_loss

from outcore.capture import capture
from outcore.errors import OutcoreError, ScheduleError
from outcore.graph.ir import TensorKind
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve, predicted_peak
from outcore.plan.schedule import Offload, Prefetch, Schedule, Wait
from outcore.plan.verify import verify
from outcore.plan.weights import WeightPlacement, parameters
from outcore.policies import baseline
from outcore.policies.auto import segment_plan
from outcore.runtime.devices import EmulatedDevice
from outcore.runtime.executor import Executor

FAST = 2e9  # bytes/s


def all_weights(graph):
    return WeightPlacement.of(graph, parameters(graph))


def param_bytes(graph):
    return sum(t.nbytes for t in graph.tensors if t.kind is TensorKind.PARAMETER)


def run(graph, schedule, model, batch, slowdown=1.0, seed=11, check=True):
    model.zero_grad()
    torch.manual_seed(seed)
    with EmulatedDevice(None, FAST, FAST, slowdown=slowdown) as dev:
        result = Executor(graph, schedule, dev, check=check).run(batch)
        stats = dev.stats()
    return result, stats


def same_grads(model, ref):
    return all(torch.equal(p.grad, q.grad)
               for p, q in zip(model.parameters(), ref.parameters(), strict=True))


def test_held_parameters_start_on_host_and_leave_the_device(gpt):
    _, _, graph = gpt
    weights = all_weights(graph)
    plain = memory_curve(graph, lower(graph, baseline.liveness(graph)))
    held = lower(graph, baseline.liveness(graph), weights=weights)
    verify(graph, held)
    trace = memory_curve(graph, held)
    assert plain.static - trace.static == param_bytes(graph)
    assert trace.peak < plain.peak
    # every parameter comes in once per phase that reads it; every gradient goes out once
    prefetched = [i.tensor for i in held if isinstance(i, Prefetch)]
    assert set(prefetched) == set(weights.params)
    assert held.count(Offload) == len(weights.grads) == len(weights.params)
    assert trace.host[-1] == param_bytes(graph) + sum(
        graph.tensors[graph.tensors[g].storage].nbytes for g in weights.grads)


@pytest.mark.parametrize("policy", ["liveness", "offload_all", "checkpoint"])
def test_measured_peak_equals_predicted_and_grads_equal_eager(policy):
    model, batch = make_gpt(dropout=0.1)
    graph = capture(model, token_loss, batch)
    if policy == "checkpoint":
        plan = segment_plan(graph, keep=[])
    else:
        plan = getattr(baseline, policy)(graph)
    schedule = lower(graph, plan, weights=all_weights(graph))
    ref, loss = eager_grads(model, batch)
    result, stats = run(graph, schedule, model, batch)
    assert torch.equal(result.loss, loss)
    assert same_grads(model, ref), policy
    assert result.peak_bytes == predicted_peak(graph, schedule)
    assert stats.releases_during_copy == 0
    assert stats.h2d.bytes >= param_bytes(graph)


def test_slowed_copy_engine_changes_nothing(gpt):
    model, batch, graph = gpt
    schedule = lower(graph, baseline.liveness(graph), weights=all_weights(graph))
    ref, loss = eager_grads(model, batch)
    for slowdown in (1.0, 200.0):
        result, stats = run(graph, schedule, model, batch, slowdown=slowdown)
        assert torch.equal(result.loss, loss)
        assert same_grads(model, ref), slowdown
        assert result.peak_bytes == predicted_peak(graph, schedule)
        assert stats.releases_during_copy == 0


def drop_h2d_waits(schedule: Schedule) -> Schedule:
    kept = [i for i in schedule.instructions
            if not (isinstance(i, Wait) and i.direction == "h2d")]
    return Schedule(kept, keep_at_end=schedule.keep_at_end, policy="broken: no h2d waits",
                    host_static=schedule.host_static, host_outputs=schedule.host_outputs)


def test_reading_a_parameter_before_its_copy_lands_is_caught(gpt):
    """Break the waits on purpose: the verifier refuses it, and run anyway with a slowed
    engine the step reads poison (the test of the race test)."""
    model, batch, graph = gpt
    schedule = drop_h2d_waits(lower(graph, baseline.liveness(graph),
                                    weights=all_weights(graph)))
    with pytest.raises(ScheduleError, match="prefetch"):
        verify(graph, schedule)
    ref, loss = eager_grads(model, batch)
    result, _ = run(graph, schedule, model, batch, slowdown=500.0, check=False)
    assert not (torch.equal(result.loss, loss) and same_grads(model, ref))


def test_gradients_never_sent_are_refused_at_the_end(gpt):
    _, _, graph = gpt
    schedule = lower(graph, baseline.liveness(graph))
    grads = sorted(all_weights(graph).grads)
    broken = Schedule(schedule.instructions, keep_at_end=schedule.keep_at_end,
                      host_outputs=grads[:1])
    with pytest.raises(ScheduleError, match="host copy"):
        verify(graph, broken)


def test_only_parameters_can_be_held(gpt):
    _, _, graph = gpt
    schedule = lower(graph, baseline.liveness(graph))
    act = graph.activations()[0].id
    with pytest.raises(ScheduleError, match="host_static"):
        verify(graph, Schedule(schedule.instructions, keep_at_end=schedule.keep_at_end,
                               host_static=[act]))
    with pytest.raises(ScheduleError, match="only parameters"):
        lower(graph, baseline.liveness(graph), weights=WeightPlacement(frozenset([act])))
    with pytest.raises(ScheduleError, match="no parameter called"):
        WeightPlacement.of(graph, ["nope.weight"])


def test_schedule_json_keeps_the_host_lists(gpt):
    _, _, graph = gpt
    schedule = lower(graph, baseline.liveness(graph), weights=all_weights(graph))
    back = Schedule.from_json(schedule.to_json())
    assert back.host_static == schedule.host_static
    assert back.host_outputs == schedule.host_outputs
    assert predicted_peak(graph, back) == predicted_peak(graph, schedule)


def test_simulator_accounts_the_same_bytes(gpt):
    from outcore.planned import cost_model_for
    from outcore.sim.simulator import simulate

    _, _, graph = gpt
    schedule = lower(graph, baseline.liveness(graph), weights=all_weights(graph))
    sim = simulate(graph, schedule, cost_model_for("a100-40gb", graph))
    assert sim.peak_bytes == predicted_peak(graph, schedule)
    plain = simulate(graph, lower(graph, baseline.liveness(graph)),
                     cost_model_for("a100-40gb", graph))
    assert sim.step_time >= plain.step_time  # the weights cross the link
    assert sim.host_peak_bytes >= param_bytes(graph)


def test_a_device_without_host_weights_is_refused_before_running(gpt):
    from outcore.runtime.host_weights import check_host_weights

    with pytest.raises(OutcoreError, match="cpu-emulated"):
        check_host_weights(object())

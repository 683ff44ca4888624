"""Host memory of a plan: known before the step, bounded by host_budget, preferred by auto."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
import outcore
import outcore.api
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.host import HostBudgetError, host_limit
from outcore.plan.schedule import Offload

from models import make


@pytest.fixture(scope="module")
def vgg():
    model, loss_fn, batch = make("vgg")
    graph = outcore.capture(model, loss_fn, batch)
    return model, loss_fn, batch, graph


def test_host_peak_is_the_sum_of_offloads_and_the_simulators(vgg) -> None:
    *_, graph = vgg
    planned = outcore.api.plan(graph, None, policy="offload-all")
    offloads = [i.tensor for i in planned.schedule.instructions if isinstance(i, Offload)]
    assert offloads, "offload-all must offload"
    assert len(planned.host_sizes) == len(offloads)
    assert planned.host_peak == sum(planned.host_sizes) > 0
    assert planned.host_peak == planned.simulation.host_peak_bytes
    storages = {t.id: t for t in graph.tensors}
    assert all(size == storages[tid].nbytes or storages[tid].is_view
               for size, tid in zip(planned.host_sizes, offloads, strict=True))


def test_default_host_budget_is_the_machine_limit_for_a_real_graph_and_none_for_fake(vgg):
    model, loss_fn, batch, graph = vgg
    assert outcore.api.plan(graph, None, policy="liveness").host_budget == host_limit().bytes
    fake = outcore.capture(copy.deepcopy(model), loss_fn, batch, fake=True)
    assert outcore.api.plan(fake, None, policy="liveness").host_budget is None
    assert outcore.api.plan(graph, None, policy="liveness", host_budget=None).host_budget is None


def test_a_plan_over_the_host_budget_is_refused_naming_host_memory(vgg) -> None:
    *_, graph = vgg
    need = outcore.api.plan(graph, None, policy="offload-all").host_peak
    fits = outcore.api.plan(graph, None, policy="offload-all", host_budget=need)
    assert fits.host_peak == need == fits.host_budget
    with pytest.raises(HostBudgetError, match=r"^host memory: .*offloads \d+ bytes") as info:
        outcore.api.plan(graph, None, policy="offload-all", host_budget=need - 1)
    assert isinstance(info.value, InfeasibleBudgetError)
    assert (info.value.budget, info.value.required) == (need - 1, need)


def test_auto_prefers_a_plan_that_fits_the_host_budget(vgg) -> None:
    *_, graph = vgg
    budget = int(reference_peaks(graph).liveness * 0.8)
    free = outcore.api.plan(graph, budget, policy="auto", host_budget=None)
    assert free.host_peak > 0, "without a host limit, auto offloads here"
    bounded = outcore.api.plan(graph, budget, policy="auto", host_budget=0)
    assert bounded.host_peak == 0 and bounded.predicted_peak <= budget
    assert bounded.plan.policy.startswith("outcore-auto")


def test_compile_plans_within_the_host_budget_and_trains_like_eager(vgg) -> None:
    model, loss_fn, batch, graph = vgg
    reference = copy.deepcopy(model)
    budget = int(reference_peaks(graph).liveness * 0.8)
    trainer = outcore.compile(model, loss_fn, batch, budget=budget, device="cpu-emulated",
                              host_budget="0B")
    try:
        loss = trainer.step(*batch)
    finally:
        trainer.close()
    assert trainer.planned.host_peak == 0 and trainer.planned.host_budget == 0
    expected = loss_fn(reference(batch[0]), batch[1])
    expected.backward()
    assert torch.equal(loss, expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_the_host_peak_known_before_the_step_is_what_the_step_holds(vgg) -> None:
    """Measured on the emulated device: the most host bytes its host copies held during a
    step equals PlannedStep.host_peak, for plans that offload all or part."""
    from outcore.runtime.devices import EmulatedDevice
    from outcore.runtime.executor import Executor

    _, _, batch, graph = vgg
    budget = int(reference_peaks(graph).liveness * 0.6)
    for planned in (outcore.api.plan(graph, None, policy="offload-all"),
                    outcore.api.plan(graph, budget, policy="auto", host_budget=None)):
        assert planned.host_peak > 0
        held: list[int] = []
        with EmulatedDevice(None, 2e9, 2e9) as device:
            offload = device.start_offload

            def recording(tid, t, name="", offload=offload, device=device, held=held):
                offload(tid, t, name)
                held.append(device.host_bytes())
            device.start_offload = recording  # type: ignore[method-assign]
            Executor(planned.graph, planned.schedule, device).run(batch, apply=False)
        assert max(held) == planned.host_peak, planned.plan.policy
        assert device.host_bytes() == 0, "the step's host copies are dropped at its end"

"""The cpu-emulated link scaled to the model it runs (``outcore.runtime.link_calibration``).

A Trainer on ``device="cpu-emulated"`` whose link was scaled from a GPU profile times its
first ``STEPS`` steps and sets the link to that GPU's bandwidth times (the compute the cost
model prices for the step) / (the compute measured here); before them, / (the compute this
CPU's analytic profile prices). The gradients stay eager's; a link given in bytes/s is never
touched; the link only changes between steps."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.cost.profiles import get_profile
from outcore.errors import OutcoreError
from outcore.graph.bounds import reference_peaks
from outcore.planned import cost_model_for
from outcore.policies.auto import compute_floor
from outcore.runtime import link_calibration
from outcore.runtime.devices.emulated import EmulatedDevice
from outcore.runtime.devices.factory import make_device
from outcore.runtime.link_calibration import (
    STEPS,
    LinkCalibration,
    first_run_seconds,
    graph_link,
)
from outcore.trainer import Trainer


def test_graph_link_keeps_the_gpus_copy_share_of_compute() -> None:
    profile = get_profile("v100-pcie")
    d2h, h2d = graph_link("v100-pcie", modelled=0.040, measured=0.200)
    assert d2h == pytest.approx(profile.bandwidth("d2h") * 0.2)
    assert h2d == pytest.approx(profile.bandwidth("h2d") * 0.2)
    # a copy of n bytes then takes the share of the measured compute it takes of the modelled
    n = 1 << 26
    assert (n / d2h) / 0.200 == pytest.approx((n / profile.bandwidth("d2h")) / 0.040)


@pytest.mark.parametrize("modelled, measured", [(0.0, 1.0), (1.0, 0.0), (1.0, math.inf),
                                                (-1.0, 1.0), (math.nan, 1.0)])
def test_graph_link_refuses_times_that_are_not_positive_and_finite(modelled: float,
                                                                  measured: float) -> None:
    with pytest.raises(ValueError, match="finite number > 0"):
        graph_link("v100-pcie", modelled, measured)


def test_first_run_seconds_leaves_recomputes_out() -> None:
    # op 3 runs twice (a recompute): only its first run is the step's compute
    assert first_run_seconds([(1, 0.5), (3, 0.25), (2, 1.0), (3, 4.0)]) == 1.75
    assert first_run_seconds([]) == 0.0


def test_make_device_marks_only_a_link_scaled_from_a_gpu() -> None:
    with make_device("cpu-emulated", gpu="v100-nvlink") as scaled:
        assert scaled.emulates == "v100-nvlink" and LinkCalibration.applies(scaled)
    with make_device("cpu-emulated") as default:
        assert default.emulates == "v100-pcie"
    with make_device("cpu-emulated", bandwidth=5e6) as given:
        assert given.emulates is None and not LinkCalibration.applies(given)
    assert not LinkCalibration.applies(make_device("cpu"))


def test_set_bandwidth_only_between_steps() -> None:
    with EmulatedDevice(None, 1e6, 1e6, slowdown=1.0) as device:
        device.tracker = outcore.runtime.tracker.MemoryTracker()
        device.set_bandwidth(2e6, 3e6)
        assert (device.link("d2h").bandwidth, device.link("h2d").bandwidth) == (2e6, 3e6)
        device.start_offload(0, torch.zeros(1 << 16))  # 256 KiB at 2 MB/s: ~0.13 s
        with pytest.raises(OutcoreError, match="in flight"):
            device.set_bandwidth(1e9, 1e9)
        assert device.link("d2h").bandwidth == 2e6  # refused whole
        device.synchronize()
        device.set_bandwidth(1e9, 1e9)
        assert device.link("h2d").bandwidth == 1e9
        with pytest.raises(ValueError, match="bandwidth must be > 0"):
            device.set_bandwidth(0.0, 1e9)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256),
                                  nn.Tanh(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(1024, 64, generator=gen), torch.randint(0, 8, (1024,), generator=gen)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The compute each timed step measured (``first_run_seconds``), in order."""
    times: list[float] = []
    real = link_calibration.first_run_seconds

    def spy(op_seconds):  # type: ignore[no-untyped-def]
        times.append(real(op_seconds))
        return times[-1]

    monkeypatch.setattr(link_calibration, "first_run_seconds", spy)
    return times


def _with_eager() -> tuple[nn.Module, nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A model, a copy of it with eager PyTorch's gradients of ``_batch()``, the batch."""
    model = Net()
    eager = copy.deepcopy(model)
    batch = _batch()
    F.cross_entropy(eager(batch[0]), batch[1]).backward()
    return model, eager, batch


def _steps_like_eager(trainer, model, eager, batch, seen, steps: int) -> None:  # type: ignore[no-untyped-def]
    """``steps`` steps, each with eager's gradients; only the first ``STEPS`` timed."""
    for step in range(steps):
        model.zero_grad()
        trainer.step(*batch)
        for p, q in zip(model.parameters(), eager.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        assert len(seen) == min(step + 1, STEPS)


def _budget(model: nn.Module) -> int:
    peaks = reference_peaks(outcore.capture(model, F.cross_entropy, _batch()))
    return int(0.8 * peaks.liveness)


def test_the_trainer_sets_the_link_from_its_first_steps_and_keeps_eagers_gradients(
        seen: list[float]) -> None:
    model, eager, (x, y) = _with_eager()
    trainer = outcore.compile(model, F.cross_entropy, (x, y), budget=_budget(model),
                              device="cpu-emulated", cache=False)
    try:
        assert trainer.planned.counts()["offload"] > 0  # the link carries copies
        graph = trainer.planned.graph
        modelled = compute_floor(graph, cost_model_for("v100-pcie"))
        # before any step: from this CPU's analytic profile
        estimate = graph_link("v100-pcie", modelled, compute_floor(graph, cost_model_for(
            "this-cpu", graph)))
        assert trainer.stats.link_bandwidth == pytest.approx(estimate)
        assert trainer.device.link("h2d").bandwidth == pytest.approx(estimate[1])
        _steps_like_eager(trainer, model, eager, (x, y), seen, STEPS + 2)
        want = graph_link("v100-pcie", modelled, min(seen))
        assert trainer.stats.link_bandwidth == pytest.approx(want)
        link = trainer.device.link
        assert (link("d2h").bandwidth, link("h2d").bandwidth) == pytest.approx(want)
        assert want != pytest.approx(estimate)  # the measured compute, not the estimate
    finally:
        trainer.close()


def test_a_link_given_in_bytes_per_second_is_left_alone() -> None:
    model = Net()
    x, y = _batch()
    device = make_device("cpu-emulated", capacity=_budget(model), bandwidth=7e8)
    trainer = Trainer(model, F.cross_entropy, (x, y), device=device, budget=_budget(model),
                      device_kind="cpu-emulated", cache=False)
    try:
        for _ in range(STEPS + 1):
            trainer.step(x, y)
        assert trainer.stats.link_bandwidth is None
        assert device.link("d2h").bandwidth == device.link("h2d").bandwidth == 7e8
    finally:
        trainer.close()


class _Recorder:
    """A stand-in device: what ``LinkCalibration`` set on it."""

    emulates = "v100-pcie"

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, str | None]] = []

    def set_bandwidth(self, d2h: float, h2d: float, emulates: str | None = None) -> None:
        self.calls.append((d2h, h2d, emulates))
        if emulates is not None:
            self.emulates = emulates


def _graph(rows: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(rows, 64, generator=gen), torch.randint(0, 8, (rows,), generator=gen)
    return outcore.capture(Net(), F.cross_entropy, data)


def test_a_step_of_another_graph_is_compared_with_its_own_compute_only() -> None:
    small, large = _graph(16), _graph(2048)
    device = _Recorder()
    link = LinkCalibration(device, lambda g: "v100-pcie")
    link.observe([(0, 0.001)], small)
    got = link.observe([(0, 0.5)], large)
    modelled = compute_floor(large, cost_model_for("v100-pcie"))
    # the large graph's link from its own 0.5 s, never from the small graph's 1 ms
    assert got == pytest.approx(graph_link("v100-pcie", modelled, 0.5))
    again = link.observe([(0, 0.25)], large)  # the same graph: the least of its timings
    assert again == pytest.approx(graph_link("v100-pcie", modelled, 0.25))
    assert link.observe([], large) == again  # a step that timed no compute keeps the link
    assert len(device.calls) == 3


def test_the_link_is_labelled_with_the_profile_the_plan_was_made_with() -> None:
    device = _Recorder()
    link = LinkCalibration(device, lambda g: "a100-40gb")
    graph = _graph(64)
    got = link.estimate(graph)
    assert got == pytest.approx(graph_link("a100-40gb", compute_floor(
        graph, cost_model_for("a100-40gb")), compute_floor(graph, cost_model_for("this-cpu"))))
    assert device.emulates == "a100-40gb" and device.calls[-1][2] == "a100-40gb"


def test_the_compute_is_priced_with_the_kernels_the_schedule_chose() -> None:
    conv = nn.Sequential(nn.Conv2d(3, 16, 5), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 12 * 12, 4))
    gen = torch.Generator().manual_seed(0)
    graph = outcore.capture(conv, F.cross_entropy, (torch.randn(8, 3, 16, 16, generator=gen),
                                                    torch.randint(0, 4, (8,), generator=gen)))
    cost = cost_model_for("v100-pcie")
    offered = [(op.id, name) for op in graph.ops for name in op.variant_options]
    assert offered, "no op of this graph offers a variant"
    bound = cost.bind(graph)
    op, variant = next((o, v) for o, v in offered if bound.op_time(
        dataclasses.replace(graph.ops[o], variant=v)) != bound.op_time(graph.ops[o]))
    plain = compute_floor(graph, cost)
    chosen = compute_floor(graph, cost, {op: variant})
    delta = bound.op_time(dataclasses.replace(graph.ops[op], variant=variant)) - bound.op_time(
        graph.ops[op])
    assert chosen == pytest.approx(plain + delta) and chosen != plain


def test_a_planned_trainer_scales_its_link_for_the_gpu_its_device_emulates(
        seen: list[float]) -> None:
    from outcore.planned_trainer import PlannedTrainer

    model, eager, (x, y) = _with_eager()
    budget = _budget(model)
    planned = outcore.plan(outcore.capture(model, F.cross_entropy, (x, y)), budget,
                           gpu="v100-nvlink", cache=False)
    assert planned.counts()["offload"] > 0
    device = make_device("cpu-emulated", capacity=budget, gpu="v100-nvlink")
    with PlannedTrainer(model, planned, device, budget) as trainer:
        assert trainer.stats.link_bandwidth is not None  # the estimate
        _steps_like_eager(trainer, model, eager, (x, y), seen, STEPS + 1)
        modelled = compute_floor(planned.graph, cost_model_for("v100-nvlink"))
        want = graph_link("v100-nvlink", modelled, min(seen))
        assert trainer.stats.link_bandwidth == pytest.approx(want)
        assert (device.link("d2h").bandwidth, device.link("h2d").bandwidth) == \
            pytest.approx(want)
        assert device.emulates == "v100-nvlink"


def test_a_shared_link_keeps_its_share_when_scaled() -> None:
    device = _Recorder()
    device.link_share = (0.5, 0.25)  # type: ignore[attr-defined]
    link = LinkCalibration(device, lambda g: "v100-pcie")
    graph = _graph(64)
    got = link.observe([(0, 0.2)], graph)
    whole = graph_link("v100-pcie", compute_floor(graph, cost_model_for("v100-pcie")), 0.2)
    assert got == pytest.approx((whole[0] * 0.5, whole[1] * 0.25))


def test_a_link_that_cannot_change_now_is_kept_and_the_step_goes_on() -> None:
    class Busy(_Recorder):
        def set_bandwidth(self, d2h: float, h2d: float, emulates: str | None = None) -> None:
            raise OutcoreError("1 copies are in flight")

    link = LinkCalibration(Busy(), lambda g: "v100-pcie")
    assert link.observe([(0, 0.2)], _graph(64)) is None  # nothing set before, nothing now
    assert link.bandwidth is None and link.steps == 1

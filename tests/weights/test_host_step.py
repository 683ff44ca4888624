"""The optimizer step where the plan put it, overlapped with backward, and mixed precision.

Oracle: ``trainer.train_step`` against the same scheme run eagerly (``loss.backward();
clip_grad_norm_; optimizer.step(); zero_grad`` or, with bf16 weights and fp32 masters,
``outcore.weights.mixed.eager_step``): bit-exact, since the same CPU kernels run. Races: the
copy engine slowed on purpose, the host steps' event log shows no gradient read before its
d2h landed, no held weight updated before its last h2d landed, and no next-step prefetch
before the update ended; a trigger broken on purpose is caught.
"""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_finetune import batches, weight_bytes
from weights_helpers import make_gpt, token_loss

from outcore.errors import OutcoreError, ScheduleError
from outcore.weights import compile as compile_weights
from outcore.weights.host_step import HostStepper
from outcore.weights.mixed import MasterWeights, eager_step

FAST = 2e9


def setup(dtype=torch.float32, lr=3e-3):
    """(model, example batch, its eager twin, master, twin's master, opt, twin's opt)."""
    model, example = make_gpt()
    model = model.to(dtype)
    ref = copy.deepcopy(model)
    if dtype == torch.float32:
        master = ref_master = None
        params, ref_params = model.parameters(), ref.parameters()
    else:
        master, ref_master = MasterWeights(model), MasterWeights(ref)
        params, ref_params = master.parameters(), ref_master.parameters()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref_params, lr=lr, weight_decay=0.1)
    return model, example, ref, master, ref_master, opt, ref_opt


def eager(ref, ref_master, ref_opt, x, y, clip):
    loss = token_loss(ref(x), y)
    if ref_master is not None:
        eager_step(ref, ref_master, ref_opt, loss, clip=clip)
        return loss.detach()
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(list(ref.parameters()), clip)
    ref_opt.step()
    ref_opt.zero_grad()
    return loss.detach()


def train(dtype, *, steps, clip=None, budget_factor=1.0, slowdown=1.0, record=False):
    model, example, ref, master, ref_master, opt, ref_opt = setup(dtype)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 5, 0.5)
    budget = int(budget_factor * weight_bytes(model))
    with compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                         bandwidth=FAST, slowdown=slowdown, master=master,
                         clip_grad_norm=clip) as trainer:
        trainer.stepper.record = record
        for i, (x, y) in enumerate(batches(steps)):
            loss = trainer.train_step(x, y)
            sched.step()
            assert torch.equal(loss, eager(ref, ref_master, ref_opt, x, y, clip)), f"step {i}"
            ref_sched.step()
            assert trainer.measured_peak == trainer.predicted_peak, f"step {i}"
        stats = trainer.device.stats()
    assert stats.releases_during_copy == 0
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name
    if master is not None:
        for name, m in master.masters.items():
            assert torch.equal(m, ref_master.masters[name]), name
    assert all(p.grad is None for p in model.parameters())
    return trainer, opt, ref_opt


def same_state(opt, ref_opt):
    a, b = opt.state_dict(), ref_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k, st in a["state"].items():
        for key, value in st.items():
            assert torch.equal(value, b["state"][k][key]), (k, key)


def test_mixed_precision_twenty_steps_with_scheduler_and_clipping_equal_eager():
    """bf16 weights on the device, fp32 masters and AdamW state on the host: 20 steps with
    StepLR and clipping (a barrier: every step after backward) equal the eager scheme."""
    trainer, opt, ref_opt = train(torch.bfloat16, steps=20, clip=0.5)
    assert trainer.held()
    same_state(opt, ref_opt)
    assert all(m.dtype == torch.float32 for g in opt.param_groups for m in g["params"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_overlapped_host_steps_with_a_slowed_copy_engine_equal_eager(dtype):
    """No clipping: held parameters are stepped as their gradients land, while backward
    goes on; a 100x slower copy engine changes no bit, and the event log shows the order."""
    trainer, opt, ref_opt = train(dtype, steps=4, slowdown=100.0, record=True)
    same_state(opt, ref_opt)
    stepped = set(trainer.stepper.grad_of)
    assert stepped and stepped == set(trainer.held())
    check_order(trainer.stepper, steps=4)


def test_part_held_part_on_device_equal_eager():
    """A budget where only some parameters are held: those step on the worker during
    backward, the rest after the planned step; mixed precision, 4 steps."""
    trainer, opt, ref_opt = train(torch.bfloat16, steps=4, budget_factor=1.0)
    held = trainer.held()
    assert 0 < len(held) < len(list(trainer.model.parameters()))
    same_state(opt, ref_opt)


def check_order(stepper, steps):
    """Per held parameter and step: its host step starts after its gradient's last d2h
    landed and after its last h2d of the step landed; the next step's first prefetch of it
    starts after the host step ended."""
    events = stepper.events
    by_name = {}
    for seq, kind, name in events:
        by_name.setdefault(name, []).append((seq, kind))
    for name in stepper.grad_of:
        log = by_name[name]
        starts = [s for s, k in log if k == "step-start"]
        ends = [s for s, k in log if k == "step-end"]
        assert len(starts) == len(ends) == steps, name
        prev_end = -1
        for start, end in zip(starts, ends, strict=True):
            window = [(s, k) for s, k in log if prev_end < s < start]
            assert any(k == "d2h" for _, k in window), f"{name}: stepped before its grad landed"
            h2d_starts = [s for s, k in window if k == "h2d-start"]
            h2d_waits = [s for s, k in window if k == "h2d"]
            assert h2d_starts and prev_end < min(h2d_starts), f"{name}: prefetched mid-update"
            assert len(h2d_starts) == len(h2d_waits), f"{name}: stepped mid-prefetch"
            prev_end = end


class _EarlyStepper(HostStepper):
    """Broken on purpose: starts a parameter's host step as soon as backward has made its
    gradient, before the gradient's d2h copy has landed in host memory."""

    def ready(self, tid, value):
        super().ready(tid, value)
        if self.overlap:
            name = next(n for n, g in self.grad_of.items() if g == tid)
            self._submit(name)


def test_a_host_step_started_before_its_gradient_lands_is_caught():
    model, example, *_ = setup()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with compile_weights(model, token_loss, example, optimizer=opt,
                         budget=weight_bytes(model), bandwidth=FAST, slowdown=100.0) as trainer:
        broken = _EarlyStepper(trainer.graph, trainer.choice.schedule,
                               dict(model.named_parameters()), opt)
        broken.device = trainer.device
        trainer.stepper.start = broken.start  # the executor's hooks go to the broken one
        trainer.executor.grad_hook = broken
        trainer.stepper = broken
        x, y = batches(1)[0]
        with pytest.raises(ScheduleError, match="completed host copy"):
            trainer.train_step(x, y)


def test_train_step_needs_cleared_gradients_and_step_refuses_masters():
    model, example, _, master, _, opt, _ = setup(torch.bfloat16)
    with compile_weights(model, token_loss, example, optimizer=opt,
                         budget=weight_bytes(model), bandwidth=FAST, master=master) as trainer:
        x, y = batches(1)[0]
        with pytest.raises(OutcoreError, match="train_step"):
            trainer.step(x, y)
        next(master.parameters()).grad = torch.zeros_like(next(master.parameters()))
        with pytest.raises(OutcoreError, match="zero_grad"):
            trainer.train_step(x, y)


def test_grad_scaler_train_step_equals_eager():
    model, example, ref, _, _, opt, ref_opt = setup(lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with compile_weights(model, token_loss, example, optimizer=opt, budget=weight_bytes(model),
                         bandwidth=FAST, clip_grad_norm=1.0) as trainer:
        for x, y in batches(3, seed=9):
            loss = trainer.train_step(x, y, scaler=scaler)
            ref_loss = token_loss(ref(x), y)
            ref_scaler.scale(ref_loss).backward()
            ref_scaler.unscale_(ref_opt)
            torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 1.0)
            ref_scaler.step(ref_opt)
            ref_scaler.update()
            ref_opt.zero_grad()
            assert torch.equal(loss, ref_loss.detach())
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)
    assert scaler.get_scale() == ref_scaler.get_scale()

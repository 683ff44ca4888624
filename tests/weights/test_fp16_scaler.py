"""fp16 weights, fp32 host masters and a GradScaler: 20 steps on cpu-emulated equal the
eager scheme bit for bit, including steps the scaler skips because a gradient overflowed.

The eager scheme (what users run with fp16 weights and fp32 masters): ``scaler.scale(loss)
.backward()`` in fp16; gradients widened into the masters; ``scaler.unscale_`` on the
masters' optimizer; clipping over the masters' gradients; ``scaler.step`` (skipped when a
gradient is inf/NaN); ``scaler.update``; the masters cast back into the fp16 weights.
The scale is made to overflow on purpose: it starts at 2**15 and doubles every 3 clean
steps, and 2**16 is inf in fp16 (the loss's seed, in eager's backward as in outcore's),
so every gradient is inf and the scaler skips the step and halves the scale.
"""

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_finetune import batches, weight_bytes
from weights_helpers import make_gpt, token_loss

from outcore.weights import compile as compile_weights
from outcore.weights.mixed import MasterWeights

FAST = 2e9
CLIP = 0.5


def scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=2.0**15, growth_interval=3)


def eager_scaled_step(model, master, opt, sc, x, y) -> torch.Tensor:
    loss = token_loss(model(x), y)
    sc.scale(loss).backward()
    for name, p in master.params.items():
        master.set_grad(name, p.grad)
        p.grad = None
    sc.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(list(master.parameters()), CLIP)
    sc.step(opt)
    sc.update()
    opt.zero_grad()
    for name in master.params:
        master.publish(name)
    return loss.detach()


def test_fp16_masters_and_grad_scaler_twenty_steps_equal_eager_with_skipped_steps():
    model, example = make_gpt()
    model = model.half()
    ref = copy.deepcopy(model)
    master, ref_master = MasterWeights(model), MasterWeights(ref)
    opt = torch.optim.AdamW(master.parameters(), lr=3e-3, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref_master.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 5, 0.5)
    sc, ref_sc = scaler(), scaler()
    skipped = 0
    # fp16 weight + grad + fp32 master + two fp32 moments = 8x the fp16 weights: 4x this
    budget = 2 * weight_bytes(model)
    with compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                         bandwidth=FAST, master=master, clip_grad_norm=CLIP) as trainer:
        assert trainer.held()
        for i, (x, y) in enumerate(batches(20)):
            before = sc.get_scale()
            loss = trainer.train_step(x, y, scaler=sc)
            sched.step()
            ref_loss = eager_scaled_step(ref, ref_master, ref_opt, ref_sc, x, y)
            ref_sched.step()
            assert torch.equal(loss, ref_loss), f"step {i}"
            assert sc.get_scale() == ref_sc.get_scale(), f"step {i}"
            assert trainer.measured_peak == trainer.predicted_peak, f"step {i}"
            skipped += sc.get_scale() < before  # only an inf/NaN gradient lowers the scale
    assert skipped >= 2, "the scale must have overflowed fp16 (skipped steps) at least twice"
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert p.dtype == torch.float16 and torch.equal(p, q), name
        assert torch.equal(master.masters[name], ref_master.masters[name]), name
    a, b = opt.state_dict(), ref_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for k, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["state"][k][key]), (k, key)

"""Issue 21 point 7: random ops under sub-batches draw eager's random numbers for the same
seed (rows of one full-batch draw): the loss, the masks (hence the gradients) and the
generator's state after the step equal eager PyTorch's. Where that would raise the step's
peak (or the op does not draw row by row) the step draws per sub-batch and says so: a
SubBatchWarning, ``explain().notes`` and ``trainer.stats.notes``."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.errors import SubBatchWarning
from outcore.graph.batch_dims import follow, random_scales
from outcore.graph.bounds import reference_peaks
from outcore.runtime.executor import Executor
from outcore.runtime.sub_batch_rng import EXACT, exact_op
from outcore.runtime.subbatch import run_sub_batches, split_batch


class DropPath(nn.Module):
    """Stochastic depth as timm writes it: one Bernoulli draw per sample."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = x.new_empty((x.shape[0], 1)).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class Noise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.1 * torch.randn_like(x) + 0.05 * torch.rand_like(x)


def narrow_dropout_net(kind: str) -> nn.Module:
    """The random op sits on a narrow layer, so drawing it for the full batch costs no peak."""
    torch.manual_seed(0)
    random = {"dropout": nn.Dropout(0.5), "drop_path": DropPath(0.3), "noise": Noise()}[kind]
    return nn.Sequential(nn.Linear(64, 16), random, nn.Linear(16, 512), nn.ReLU(),
                         nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))


def wide_dropout_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 512),
                         nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, 4))


BATCH = (torch.randn(512, 64, generator=torch.Generator().manual_seed(1)),
         torch.randint(0, 4, (512,), generator=torch.Generator().manual_seed(2)))


def compiled(model: nn.Module, frac: float, **how):
    graph = outcore.capture(model, F.cross_entropy, BATCH)
    budget = int(reference_peaks(graph).layer_lower_bound * frac)
    with pytest.warns(SubBatchWarning):
        return outcore.compile(model, F.cross_entropy, BATCH, budget=budget,
                               device="cpu-emulated", **how)


def eager_step(model: nn.Module, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    loss = F.cross_entropy(model(BATCH[0]), BATCH[1])
    loss.backward()
    return loss.detach(), torch.get_rng_state()


@pytest.mark.parametrize("kind", ["dropout", "drop_path", "noise"])
@pytest.mark.parametrize("how,frac", [({"allow_sub_batches": True}, 0.9),
                                      ({"allow_sub_batches": True}, 0.7),
                                      ({"policy": "modnn"}, 0.8)])
def test_sub_batches_draw_eagers_random_numbers(kind, how, frac):
    model = narrow_dropout_net(kind)
    reference = copy.deepcopy(model)
    trainer = compiled(model, frac, **how)
    assert trainer.stats.sub_batches > 1
    assert "same masks as eager" in trainer.stats.notes[-1]
    assert trainer.explain().notes == trainer.stats.notes
    for seed in (11, 12):  # two steps: the second starts from where the first left off
        torch.manual_seed(seed)
        loss = trainer.step(*BATCH)
        state = torch.get_rng_state()
        expected, eager_state = eager_step(reference, seed)
        torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
        assert torch.equal(state, eager_state), "the generator ends where eager's does"
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=n)
    assert trainer.stats.measured_peak == trainer.stats.predicted_peak


def test_where_eagers_draws_do_not_fit_the_step_says_so():
    model = wide_dropout_net()
    trainer = compiled(model, 0.9, allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    note = trainer.stats.notes[-1]
    assert "draw per sub-batch" in note and "differ from eager" in note
    assert trainer.explain().notes == trainer.stats.notes
    trainer.step(*BATCH)
    assert trainer.stats.measured_peak == trainer.stats.predicted_peak


def test_a_recomputed_dropout_replays_eagers_rows():
    """An executor built by hand for one sub-batch, under a policy that recomputes the
    dropout in backward: the recompute replays the same rows of the same full draw."""
    model = narrow_dropout_net("dropout")
    reference = copy.deepcopy(model)
    parts = 4
    full = outcore.capture(model, F.cross_entropy, BATCH)
    sub = outcore.capture(model, F.cross_entropy, split_batch(BATCH, parts)[0])
    sub.meta["batch_dims"] = [0, 0]
    sub.meta["random_scales"] = random_scales(full, follow(full, sub, parts))
    planned = outcore.plan(sub, None, policy="recompute-cheap", simulate=False)
    recomputed = {ins.op for ins in planned.schedule.instructions
                  if type(ins).__name__ == "Compute" and ins.recompute}
    assert any(sub.ops[o].random for o in recomputed), "the plan must recompute the dropout"
    executor = Executor(planned.graph, planned.schedule)
    torch.manual_seed(5)
    result = run_sub_batches(executor, BATCH, parts)
    expected, _ = eager_step(reference, 5)
    torch.testing.assert_close(result.loss, expected, rtol=1e-6, atol=0)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_only_row_by_row_random_ops_are_drawn_for_the_full_batch():
    assert exact_op("aten.native_dropout.default") and exact_op("aten.bernoulli.p")
    assert exact_op("aten.rand_like.default") and exact_op("aten.randn.default")
    for target in ("aten.randperm.default", "aten.multinomial.default",
                   "aten._scaled_dot_product_flash_attention_for_cpu.default",
                   "aten.native_dropout_backward.default"):
        assert not exact_op(target), target
    assert all(isinstance(k, str) for k in EXACT)


class LaidOutDropout(nn.Module):
    """Dropout on an input whose memory order is not its dimension order: a batch-first
    view of a time-major tensor (an RNN's output: memory (time, batch, feature)), or a
    channels-last image batch."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layout = layout
        self.a = nn.Linear(64, 4 * 8)
        self.drop = nn.Dropout(0.5)
        self.b = nn.Sequential(nn.Linear(4 * 8, 512), nn.ReLU(), nn.Linear(512, 512),
                               nn.ReLU(), nn.Linear(512, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.layout == "time-major":
            h = h.view(x.shape[0], 4, 8).transpose(0, 1).contiguous().transpose(0, 1)
        else:
            h = h.view(x.shape[0], 8, 2, 2).contiguous(memory_format=torch.channels_last)
        return self.b(self.drop(h).flatten(1))


@pytest.mark.parametrize("layout", ["time-major", "channels-last"])
def test_a_random_op_on_another_layout_draws_eagers_masks(layout):
    # time-major failed: the full-batch draw was made on a contiguous (batch-first) copy,
    # dropout fills its mask in memory order, so the rows were another mask than eager's
    # (torch.cat keeps channels-last, which passed before)
    model = LaidOutDropout(layout)
    reference = copy.deepcopy(model)
    trainer = compiled(model, 0.9, allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    assert "same masks as eager" in trainer.stats.notes[-1]
    torch.manual_seed(3)
    loss = trainer.step(*BATCH)
    expected, _ = eager_step(reference, 3)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=n)

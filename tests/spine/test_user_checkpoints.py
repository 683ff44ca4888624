"""A model's own ``torch.utils.checkpoint`` calls (``outcore.capture.checkpoints``): traced as
plain calls, every variant, with eager's values and gradients and no region traced twice;
torch's checkpoint untouched outside the capture."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

import outcore
from outcore.capture import capture
from outcore.capture.checkpoints import plain_checkpoints

#: how the model calls checkpoint: a ``use_reentrant`` value, or None for not given (torch
#: 2.13 then takes the reentrant variant, with a warning)
VARIANTS = [True, False, None]


class Block(nn.Module):
    def __init__(self, checkpointed: bool, reentrant: bool | None, dropout: float = 0.0):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.dropout = nn.Dropout(dropout)
        self.checkpointed, self.reentrant = checkpointed, reentrant

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.dropout(torch.relu(self.a(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.checkpointed:
            return self.body(x)
        kwargs = {} if self.reentrant is None else {"use_reentrant": self.reentrant}
        return torch_checkpoint.checkpoint(self.body, x, **kwargs)


def net(checkpointed: bool, reentrant: bool | None, dropout: float = 0.0,
        first_checkpointed: bool = False) -> nn.Module:
    torch.manual_seed(0)
    first = Block(first_checkpointed, reentrant) if first_checkpointed else nn.Linear(8, 16)
    stem = nn.Sequential(nn.Linear(8, 16), first) if first_checkpointed else first
    return nn.Sequential(stem, Block(checkpointed, reentrant, dropout),
                         Block(checkpointed, reentrant, dropout), nn.Linear(16, 3))


BATCH = (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 2, 1, 0]))


def eager_grads(model: nn.Module, seed: int) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # use_reentrant not given
        loss = F.cross_entropy(model(BATCH[0]), BATCH[1])
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_the_patched_names_exist_in_this_torch():
    assert isinstance(torch_checkpoint.CheckpointFunction, type)
    assert callable(torch_checkpoint._checkpoint_without_reentrant_generator)


@pytest.mark.parametrize("reentrant", VARIANTS)
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_checkpointed_models_train_as_eager(reentrant, dropout):
    model = net(True, reentrant, dropout)
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, F.cross_entropy, BATCH, budget=None, device="cpu")
    for seed in (3, 4):
        torch.manual_seed(seed)
        loss = trainer.step(*BATCH)
        expected, grads = eager_grads(reference, seed)
        assert torch.equal(loss, expected)
        for p, g in zip(model.parameters(), grads, strict=True):
            assert torch.equal(p.grad, g)
    assert trainer.planned.graph.meta["user_checkpoints"] is True


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_no_region_is_traced_twice(reentrant):
    plain = capture(net(False, reentrant), F.cross_entropy, BATCH)
    checkpointed = capture(net(True, reentrant), F.cross_entropy, BATCH)
    assert len(checkpointed.ops) == len(plain.ops)
    assert "user_checkpoints" not in plain.meta


def test_reentrant_without_grad_inputs_leaves_its_parameters_without_grad_as_eager():
    # eager's reentrant checkpoint on the raw batch: no input requires grad, so the outputs do
    # not, and the parameters inside get no gradient (PyTorch warns); the step does the same
    model = net(False, True, first_checkpointed=True)
    model[0][0].requires_grad_(False)  # the block's input then requires no grad
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, F.cross_entropy, BATCH, budget=None, device="cpu")
    trainer.step(*BATCH)
    _, grads = eager_grads(reference, 0)
    inside = {id(p) for p in model[0][1].parameters()}
    for p, g in zip(model.parameters(), grads, strict=True):
        assert (p.grad is None) == (g is None)
        if id(p) in inside:
            assert p.grad is None
        elif g is not None:
            assert torch.equal(p.grad, g)


def test_checkpoint_outside_the_capture_is_torchs_own():
    calls = []

    def body(x):
        calls.append(1)
        return torch.tanh(x).sum()

    with plain_checkpoints():
        pass
    for reentrant in (True, False):
        calls.clear()
        x = torch.randn(3, requires_grad=True)
        torch_checkpoint.checkpoint(body, x, use_reentrant=reentrant).backward()
        assert len(calls) == 2, "the forward, then the recompute in backward"
    assert "apply" not in torch_checkpoint.CheckpointFunction.__dict__


def test_a_failed_capture_restores_torchs_checkpoint():
    with pytest.raises(RuntimeError), plain_checkpoints():
        raise RuntimeError("the trace failed")
    assert torch_checkpoint._checkpoint_without_reentrant_generator.__module__ == (
        "torch.utils.checkpoint")
    assert "apply" not in torch_checkpoint.CheckpointFunction.__dict__


def _eager_calls(reentrant: bool) -> int:
    calls = []

    def body(x):
        calls.append(1)
        return torch.tanh(x).sum()

    torch_checkpoint.checkpoint(body, torch.randn(3, requires_grad=True),
                                use_reentrant=reentrant).backward()
    return len(calls)


def test_other_threads_keep_torchs_checkpoint_while_a_capture_is_open():
    import threading

    seen: list[int] = []
    with plain_checkpoints():
        worker = threading.Thread(
            target=lambda: seen.extend(_eager_calls(r) for r in (True, False)))
        worker.start()
        worker.join()
    assert seen == [2, 2], "another thread's eager checkpoint must recompute as torch's does"


def test_overlapping_captures_on_two_threads_restore_torchs_checkpoint():
    import threading

    entered, main_left = threading.Event(), threading.Event()

    def other() -> None:
        with plain_checkpoints():
            entered.set()
            main_left.wait()

    first = plain_checkpoints()
    first.__enter__()
    worker = threading.Thread(target=other)
    worker.start()
    entered.wait()
    first.__exit__(None, None, None)  # A leaves while B is still open
    main_left.set()
    worker.join()
    assert "apply" not in torch_checkpoint.CheckpointFunction.__dict__
    assert _eager_calls(True) == _eager_calls(False) == 2


class Region(nn.Module):
    """A checkpointed region with a configurable call: context_fn, output shape, flags."""

    def __init__(self, reentrant: bool, out: str = "tensor", **kwargs):
        super().__init__()
        self.stem, self.a, self.head = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 3)
        self.reentrant, self.out, self.kwargs = reentrant, out, kwargs

    def body(self, u):
        y = torch.tanh(self.a(u))
        return {"tensor": y, "dict": {"y": y}, "list": [y], "nested": (y, (y * 2,))}[self.out]

    def forward(self, x):
        out = torch_checkpoint.checkpoint(self.body, self.stem(x), use_reentrant=self.reentrant,
                                          **self.kwargs)
        if self.out == "dict":
            out = out["y"]
        elif self.out == "list":
            out = out[0]
        elif self.out == "nested":
            out = out[0] + out[1][0]
        return self.head(out.float())


def _as_eager(model: nn.Module) -> None:
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, F.cross_entropy, BATCH, budget=None, device="cpu")
    torch.manual_seed(3)
    loss = trainer.step(*BATCH)
    expected, grads = eager_grads(reference, 3)
    assert torch.equal(loss, expected)
    for p, g in zip(model.parameters(), grads, strict=True):
        assert (p.grad is None) == (g is None)
        if g is not None:
            assert torch.equal(p.grad, g)


def test_a_context_fns_forward_context_applies_as_in_eager():
    def bf16():
        return (torch.autocast("cpu", dtype=torch.bfloat16),
                torch.autocast("cpu", dtype=torch.bfloat16))

    _as_eager(Region(False, context_fn=bf16))


def test_selective_checkpointing_contexts_train_as_eager():
    def policy(ctx, op, *args, **kwargs):
        return (torch_checkpoint.CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.addmm.default
                else torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE)

    _as_eager(Region(False, context_fn=lambda: (
        torch_checkpoint.create_selective_checkpoint_contexts(policy))))


def test_an_invalid_determinism_check_is_refused_as_in_eager():
    with pytest.raises(Exception, match="determinism_check"):
        capture(Region(False, determinism_check="bogus"), F.cross_entropy, BATCH)


@pytest.mark.parametrize("out", ["dict", "list", "nested"])
def test_reentrant_outputs_carry_gradients_only_where_eager_does(out):
    # eager's autograd.Function tracks a tensor or a tuple's own tensors: nothing else
    _as_eager(Region(True, out=out))


def test_reentrant_without_grad_inputs_warns_as_eager():
    model = net(False, True, first_checkpointed=True)
    model[0][0].requires_grad_(False)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        capture(model, F.cross_entropy, BATCH)


class Normed(nn.Module):
    """A BatchNorm inside the checkpointed region, or before it (``inside=False``)."""

    def __init__(self, inside: bool):
        super().__init__()
        self.a, self.bn, self.head = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 3)
        self.inside = inside

    def forward(self, x):
        if self.inside:
            region, h = (lambda u: torch.relu(self.bn(self.a(u)))), x
        else:
            region, h = torch.tanh, self.bn(self.a(x))
        return self.head(torch_checkpoint.checkpoint(region, h, use_reentrant=False))


def test_batchnorm_in_a_checkpointed_model_is_announced_and_updated_once():
    from outcore.errors import CheckpointWarning

    model = Normed(inside=True)
    with pytest.warns(CheckpointWarning, match="running statistics"):
        trainer = outcore.compile(model, F.cross_entropy, BATCH, budget=None, device="cpu")
    trainer.step(*BATCH)
    assert int(model.bn.num_batches_tracked) == 1, "once a step, as without checkpointing"


def test_preserve_rng_state_false_is_announced():
    from outcore.errors import CheckpointWarning

    with pytest.warns(CheckpointWarning, match="preserve_rng_state=False"):
        capture(Region(False, preserve_rng_state=False), F.cross_entropy, BATCH)


def test_composable_checkpoint_is_traced_as_a_plain_call():
    from torch.distributed._composable import checkpoint as composable

    plain = capture(net(False, False), F.cross_entropy, BATCH)
    model = net(False, False)
    composable(model[1])
    composable(model[2])
    checkpointed = capture(model, F.cross_entropy, BATCH)
    assert len(checkpointed.ops) == len(plain.ops)
    assert checkpointed.meta["user_checkpoints"] is True


def test_batchnorm_outside_every_region_is_not_announced():
    from outcore.errors import CheckpointWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        graph = capture(Normed(inside=False), F.cross_entropy, BATCH)
    assert graph.meta["user_checkpoints"] is True

"""Hooks on a leaf's gradient are called as eager's backward calls them, or refused.

Found in session 31: a tensor hook on a batch tensor (``x.register_hook``) was skipped
silently by ``outcore.compile``'s Trainer, and a parameter's hook by the weights trainer
and the ``PlannedTrainer`` (only the Trainer refused parameter hooks): ``.grad`` differed
from eager's with no word. Now the commit calls a leaf's tensor hooks and its
post-accumulate-grad hooks (``outcore.runtime.leaf_hooks``) where the trainer commits the
gradients in one place, and the others refuse them (``outcore.capture.hooks``). The class
tested: every kind of leaf hook (tensor hook on a parameter, on a tied parameter, on a
batch tensor; several hooks on one leaf; post-accumulate), under policies that keep,
offload and recompute, over accumulated steps and sub-batches, on every trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from exact import assert_grads_equal
from torch import nn

import outcore
from outcore.errors import OutcoreError, SubBatchWarning, UnsupportedModelError
from outcore.graph.bounds import reference_peaks
from outcore.planned_trainer import PlannedTrainer


class _Tied(nn.Module):
    """An embedding tied to the output head, between them a block used twice."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 40, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.block(self.emb(x))))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return _Tied()


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def _batches(n: int, size: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 40, (size, 6), generator=g),
             torch.randint(0, 40, (size, 6), generator=g)) for _ in range(n)]


def _scale_in_place(g: torch.Tensor) -> None:
    g.mul_(3.0)


class _Calls:
    """Hooks that change the gradient (a non-linear clamp, an in-place scale, a replaced
    tensor) and count their calls and the gradients they were given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, torch.Tensor]] = []

    def add(self, model: nn.Module) -> None:
        self._hook(model.emb.weight, "emb", lambda g: g.clamp(-1e-3, 1e-3))
        self._hook(model.block[0].weight, "w0", _scale_in_place)
        self._hook(model.block[0].weight, "w0'", lambda g: g + 1.0)  # after the one above
        self._hook(model.block[0].bias, "b0", lambda g: None)

    def _hook(self, p: torch.Tensor, name: str,
              fn: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
        def hook(g: torch.Tensor) -> torch.Tensor | None:
            self.seen.append((name, g.clone()))
            return fn(g)
        p.register_hook(hook)


def _eager(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    loss = _loss(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach()


def _assert_same_calls(ours: _Calls, eager: _Calls) -> None:
    """Each hook called as often as in eager, with the same gradients (bit for bit); the
    order of calls within one leaf is registration order in both."""
    def by_hook(calls: _Calls) -> dict[str, list[torch.Tensor]]:
        out: dict[str, list[torch.Tensor]] = {}
        for name, g in calls.seen:
            out.setdefault(name, []).append(g)
        return out
    a, b = by_hook(ours), by_hook(eager)
    assert sorted(a) == sorted(b) == ["b0", "emb", "w0", "w0'"]
    for name in a:
        assert len(a[name]) == len(b[name]), name
        for x, y in zip(a[name], b[name], strict=True):
            assert torch.equal(x, y), name


@pytest.mark.parametrize("policy", ["keep-all", "offload-all", "outcore-checkpoint"])
def test_parameter_hooks_change_grad_as_in_eager(policy: str) -> None:
    """Three accumulated steps: the hooks see eager's gradients (a tied weight's summed
    over its two uses, once per step) and ``.grad`` is eager's bit for bit."""
    model, ref = _model(), _model()
    ours, eager = _Calls(), _Calls()
    ours.add(model)
    eager.add(ref)
    batches = _batches(3)
    budget = None if policy == "keep-all" else "40KB"
    with outcore.compile(model, _loss, batches[0], budget=budget,
                         device="cpu-emulated", policy=policy) as trainer:
        for x, y in batches:
            loss = trainer.step(x, y)
            assert torch.equal(loss, _eager(ref, (x, y)))
            assert_grads_equal(model, ref)
    _assert_same_calls(ours, eager)
    assert len(ours.seen) == 3 * 4


def test_optimizer_in_backward_by_post_accumulate_hooks() -> None:
    """The "optimizer in backward" recipe: an optimizer per parameter stepped in its
    post-accumulate-grad hook, ``.grad`` cleared there. The parameters after three steps
    are eager's, bit for bit, and each hook ran once per step."""
    def wire(model: nn.Module) -> list[int]:
        calls = [0]
        optimizers = {p: torch.optim.SGD([p], lr=0.1, momentum=0.9)
                      for p in model.parameters()}

        def step(p: torch.Tensor) -> None:
            calls[0] += 1
            optimizers[p].step()
            optimizers[p].zero_grad()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(step)
        return calls

    model, ref = _model(), _model()
    ours, eager = wire(model), wire(ref)
    batches = _batches(3)
    with outcore.compile(model, _loss, batches[0], budget="40KB",
                         device="cpu-emulated", policy="offload-all") as trainer:
        for x, y in batches:
            assert torch.equal(trainer.step(x, y), _eager(ref, (x, y)))
            for p, q in zip(model.parameters(), ref.parameters(), strict=True):
                assert torch.equal(p, q)
                assert p.grad is None and q.grad is None
    assert ours == eager == [3 * 3]  # three parameters: the tied weight is one


def test_a_batch_tensor_hook_is_called() -> None:
    """A batch tensor that requires grad and carries a hook: ``x.grad`` is the hooked
    gradient, as eager's (was: the hook skipped, ``x.grad`` three times smaller)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    ref = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    ref.load_state_dict(net.state_dict())
    x = torch.randn(4, 8, requires_grad=True)
    y = torch.randn(4, 1)
    x_ref = x.detach().clone().requires_grad_(True)
    for t in (x, x_ref):
        t.register_hook(lambda g: g * 3)
    with outcore.compile(net, F.mse_loss, (x, y), budget=None, device="cpu-emulated") as tr:
        tr.step(x, y)
    F.mse_loss(ref(x_ref), y).backward()
    assert x.grad is not None and torch.equal(x.grad, x_ref.grad)
    assert_grads_equal(net, ref)


def test_hooks_run_once_per_step_on_the_sum_of_sub_batches() -> None:
    """A step split into sub-batches calls a clamp hook once, on the whole batch's
    gradient (clamping each sub-batch's would differ), as eager's one backward does."""
    model, ref = _model(), _model()
    ours, eager = _Calls(), _Calls()
    ours.add(model)
    eager.add(ref)
    batch = _batches(1, size=16)[0]
    graph = outcore.capture(_model(), _loss, batch)
    budget = int(reference_peaks(graph).layer_lower_bound * 0.7)
    with pytest.warns(SubBatchWarning):
        trainer = outcore.compile(model, _loss, batch, budget=budget,
                                  device="cpu-emulated", allow_sub_batches=True)
    with trainer:
        assert trainer.stats.sub_batches > 1
        trainer.step(*batch)
    _eager(ref, batch)
    assert sorted(n for n, _ in ours.seen) == sorted(n for n, _ in eager.seen)
    assert len(ours.seen) == 4
    for (name, g), (_, h) in zip(sorted(ours.seen, key=lambda c: c[0]),
                                 sorted(eager.seen, key=lambda c: c[0]), strict=True):
        torch.testing.assert_close(g, h, msg=name)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("kind", ["shape", "dtype", "raises"])
def test_a_bad_hook_leaves_grad_as_it_was(kind: str) -> None:
    """A hook returning a gradient of another shape or dtype is refused as autograd
    refuses it; one that raises raises; either way no ``.grad`` and no buffer was written."""
    model = _model()
    batch = _batches(1)[0]

    def hook(g: torch.Tensor) -> torch.Tensor:
        if kind == "raises":
            raise ValueError("the user's hook failed")
        return g[:1] if kind == "shape" else g.double()
    model.block[0].weight.register_hook(hook)
    with outcore.compile(model, _loss, batch, budget=None,
                         device="cpu-emulated") as trainer:
        error = ValueError if kind == "raises" else OutcoreError
        what = {"raises": "user's hook", "shape": "the size", "dtype": "the dtype"}[kind]
        with pytest.raises(error, match=what):
            trainer.step(*batch)
    assert all(p.grad is None for p in model.parameters())


def test_a_planned_trainer_calls_the_hooks_and_refuses_module_backward_hooks() -> None:
    model, ref = _model(), _model()
    ours, eager = _Calls(), _Calls()
    batches = _batches(2)
    with outcore.compile(model, _loss, batches[0], budget=None,
                         device="cpu-emulated") as trainer:
        trainer.step(*batches[0])
        planned = trainer.planned
    _eager(ref, batches[0])
    ours.add(model)
    eager.add(ref)
    with PlannedTrainer(model, planned, trainer.device, None) as fixed:
        fixed.step(*batches[1])
        _eager(ref, batches[1])
        assert_grads_equal(model, ref)
        _assert_same_calls(ours, eager)
        handle = model.block[0].register_full_backward_hook(lambda m, gi, go: None)
        with pytest.raises(UnsupportedModelError, match=r"module 'block\.0': a backward hook"):
            fixed.step(*batches[1])
        handle.remove()
    assert_grads_equal(model, ref)  # the refused step wrote nothing


def test_the_weights_trainer_refuses_leaf_hooks_instead_of_skipping_them() -> None:
    """Was: run, the hook skipped (``.grad`` not eager's)."""
    model = _model()
    batch = _batches(1)[0]
    model.block[0].weight.register_hook(lambda g: g * 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = outcore.compile(model, _loss, batch, optimizer=opt, budget="10MB",
                              device="cpu-emulated")
    with pytest.raises(UnsupportedModelError, match=r"parameter 'block\.0\.weight' carries a hook"):
        trainer.step(*batch)
    assert all(p.grad is None for p in model.parameters())


@contextlib.contextmanager
def _one_rank_group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_data_parallel_refuses_leaf_hooks_instead_of_skipping_them() -> None:
    model = _model()
    batch = _batches(1)[0]
    with _one_rank_group():
        trainer = outcore.compile(model, _loss, batch, budget=None,
                                  device="cpu-emulated", distributed=True)
        with trainer:
            trainer.step(*batch)
            model.emb.weight.register_post_accumulate_grad_hook(lambda p: None)
            before = model.emb.weight.grad.clone()
            with pytest.raises(UnsupportedModelError, match=r"parameter 'emb\.weight'.*all-reduce"):
                trainer.step(*batch)
            assert torch.equal(model.emb.weight.grad, before)

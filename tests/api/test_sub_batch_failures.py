"""Issue 21 point 6: a sub-batched step that fails part-way (a label out of range inside the
loss of one sub-batch, an exception in any op of any sub-batch) leaves every ``.grad`` and
buffer exactly as it was before the step, whether ``.grad`` was None or already held earlier
steps' gradients; the next good step then matches eager PyTorch."""

import copy
import functools
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.graph.bounds import reference_peaks

CLASSES = 4


class Boom(RuntimeError):
    pass


def mlp() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(16, 256), nn.ReLU()]
    for _ in range(2):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, CLASSES))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(256, 16, generator=g), torch.randint(0, CLASSES, (256,), generator=g)


@functools.cache
def trainer_for(how: str):
    model = mlp()
    x, y = batch()
    graph = outcore.capture(model, F.cross_entropy, (x, y))
    budget = int(reference_peaks(graph).layer_lower_bound * 0.9)
    kwargs = {"policy": "modnn"} if how == "modnn" else {"allow_sub_batches": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = outcore.compile(model, F.cross_entropy, (x, y), budget=budget, device="cpu",
                                  **kwargs)
    assert trainer.stats.sub_batches >= 2
    return model, trainer


def grads(model: nn.Module) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def assert_unchanged(model: nn.Module, before: list[torch.Tensor | None]) -> None:
    for (name, p), b in zip(model.named_parameters(), before, strict=True):
        if b is None:
            assert p.grad is None, f"{name}.grad was written by a failed step"
        else:
            assert p.grad is not None and torch.equal(p.grad, b), f"{name}.grad changed"


def prepare(model: nn.Module, populated: bool) -> None:
    model.zero_grad(set_to_none=True)
    if populated:  # accumulation across steps: an earlier step's gradients are in .grad
        for p in model.parameters():
            p.grad = torch.full_like(p, 0.25)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(how=st.sampled_from(["auto", "modnn"]), which=st.integers(0, 255),
       populated=st.booleans())
def test_a_label_out_of_range_in_any_sub_batch_changes_no_grad(how, which, populated):
    model, trainer = trainer_for(how)
    x, y = batch()
    y = y.clone()
    y[which] = CLASSES + 3  # fails inside the loss of the sub-batch holding sample `which`
    prepare(model, populated)
    before = grads(model)
    with pytest.raises((IndexError, RuntimeError)):
        F.cross_entropy(mlp()(x), y)  # eager fails too
    with pytest.raises((IndexError, RuntimeError)):
        trainer.step(x, y)
    assert_unchanged(model, before)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(how=st.sampled_from(["auto", "modnn"]), data=st.data(), populated=st.booleans())
def test_an_exception_in_any_op_of_any_sub_batch_changes_no_grad(how, data, populated):
    model, trainer = trainer_for(how)
    executor = trainer.executor
    namespace = executor.generated.fn.__globals__
    ops = sorted(k for k in namespace if k.startswith("f") and k[1:].isdigit())
    name = data.draw(st.sampled_from(ops), label="op")
    fail_at = data.draw(st.integers(0, trainer.stats.sub_batches - 1), label="sub-batch")
    real, calls = namespace[name], []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == fail_at + 1:  # its (fail_at+1)-th call: sub-batch fail_at or earlier
            raise Boom(f"{name} fails in sub-batch {fail_at}")
        return real(*args, **kwargs)

    prepare(model, populated)
    before = grads(model)
    namespace[name] = failing
    try:
        with pytest.raises(Boom):
            trainer.step(*batch())
    finally:
        namespace[name] = real
    assert_unchanged(model, before)


@pytest.mark.parametrize("how", ["auto", "modnn"])
def test_after_a_failed_step_the_next_step_matches_eager(how):
    model, trainer = trainer_for(how)
    x, y = batch()
    prepare(model, populated=True)
    bad = y.clone()
    bad[-1] = CLASSES  # the last label out of range: the last sub-batch fails in the loss
    with pytest.raises((IndexError, RuntimeError)):
        trainer.step(x, bad)
    reference = copy.deepcopy(model)  # deepcopy leaves .grad out
    prepare(reference, populated=True)
    trainer.step(x, y)
    F.cross_entropy(reference(x), y).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)

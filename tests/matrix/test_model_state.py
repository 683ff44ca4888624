"""Capture and compile leave nothing of their own in the user's model (issue 21 item 1):
every parameter, buffer, attribute, hook and ``training`` flag is compared before and after,
on a module registered under three names plus a tied weight, and on captures that fail
part-way (in the forward, and in the loss after the forward ran)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from matrix_models import SharedEmbedding
from torch import nn

import outcore
from outcore.errors import OutcoreError

_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks", "_forward_hooks_with_kwargs",
               "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


def snapshot(model: nn.Module) -> dict[str, Any]:
    """Everything a user could observe: objects, types, values, grads, flags, hooks."""
    state: dict[str, Any] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        state[f"{name}:class"] = type(mod)
        state[f"{name}:training"] = mod.training
        state[f"{name}:attrs"] = sorted(mod.__dict__)
        for key in _HOOK_DICTS:
            state[f"{name}:{key}"] = dict(getattr(mod, key, {}))
        state[f"{name}:children"] = [(n, id(c)) for n, c in mod._modules.items()]
        for pname, p in mod._parameters.items():
            state[f"{name}.{pname}"] = _tensor(p)
        for bname, b in mod._buffers.items():
            state[f"{name}.{bname}:buffer"] = _tensor(b)
    return state


def _tensor(t: torch.Tensor | None) -> Any:
    if t is None:
        return None
    grad = None if t.grad is None else (type(t.grad), t.grad.detach().clone())
    return (id(t), type(t), t.requires_grad, t.detach().clone(), t.stride(), grad,
            dict(getattr(t, "_backward_hooks", None) or {}))


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before.keys() == after.keys()
    for key, old in before.items():
        new = after[key]
        if isinstance(old, tuple):
            assert isinstance(new, tuple) and len(new) == len(old), key
            for a, b in zip(old, new, strict=True):
                if isinstance(a, torch.Tensor):
                    assert torch.equal(a, b), key
                elif isinstance(a, tuple) and a and isinstance(a[-1], torch.Tensor):
                    assert a[0] is b[0] and torch.equal(a[1], b[1]), key
                else:
                    assert a == b, key
        else:
            assert old == new, key


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randint(0, 50, (8, 12)), torch.randint(0, 50, (8,))


def test_compile_and_step_leave_an_aliased_model_as_it_was_but_for_grad() -> None:
    torch.manual_seed(0)
    model = SharedEmbedding()
    model.mix.register_forward_hook(lambda m, i, o: None)
    model.decoder_embed.eval()  # one name of the shared module in eval: flags are per module
    before = snapshot(model)
    ids, y = batch()
    with outcore.compile(model, F.cross_entropy, (ids, y), budget=None, device="cpu") as tr:
        assert_same(before, snapshot(model))  # compile alone changes nothing
        tr.step(ids, y)
    for p in model.parameters():
        p.grad = None
    assert_same(before, snapshot(model))
    model(ids).sum().backward()  # still an ordinary eager model
    assert model.shared.weight.grad is not None


class FailsMidForward(SharedEmbedding):
    """Runs the shared embedding (through two of its names), then fails."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.encoder.embed_tokens(ids) + self.decoder_embed(ids)
        raise RuntimeError(f"user code failed after {tuple(h.shape)}")


def test_a_capture_that_fails_in_the_forward_leaves_the_model_as_it_was() -> None:
    model = FailsMidForward()
    before = snapshot(model)
    with pytest.raises((OutcoreError, RuntimeError), match="user code failed"):
        outcore.compile(model, F.cross_entropy, batch(), budget=None, device="cpu")
    assert_same(before, snapshot(model))
    with pytest.raises(RuntimeError, match="user code failed"):
        model(batch()[0])  # the user's own forward, with the user's own tensors


def test_a_capture_that_fails_in_the_loss_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model = SharedEmbedding()
    model.train()
    model.mix.eval()
    before = snapshot(model)

    def bad_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y) + out.numpy().sum()  # cannot be traced

    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises, nothing may change
        outcore.compile(model, bad_loss, batch(), budget=None, device="cpu")
    assert_same(before, snapshot(model))
    ids, _ = batch()
    assert torch.isfinite(model(ids)).all()

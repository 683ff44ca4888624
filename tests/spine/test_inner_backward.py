"""A custom autograd.Function whose backward runs a backward of its own (reversible layers).

Found in session 31 by the causal-LM sweep (Reformer): its ``_ReversibleFunction``
recomputes each layer in backward and calls ``.backward()`` on it, so the layers'
parameters get their gradients by accumulation into ``.grad``. Tracing that left traced
``FunctionalTensor`` objects in the live parameters' ``.grad`` (the model damaged for eager
training after the refused capture), and the refusal blamed "a tensor held outside the
model"; with ``.grad`` already set, a functionalization assert. Now the capture keeps
``.grad`` and names the ``backward()`` call (``outcore.capture.inner_backward``). The class
tested: backward-in-backward on parameters (refused, ``.grad`` kept, set or not), on local
leaves only and through ``torch.autograd.grad`` (both captured, bit for bit), and a
Function reading a parameter kept on ``ctx`` (refused, saying how to pass it).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from exact import train_against_eager
from torch import nn

import outcore
from outcore.errors import CaptureError


class _Reversible(torch.autograd.Function):
    """Reformer's pattern: the layer's gradients by ``.backward()`` inside the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x.detach())
        ctx.layer = layer
        return x + layer(x)

    @staticmethod
    def backward(ctx, gy: torch.Tensor) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            (x + ctx.layer(x)).backward(gy)
        return x.grad, None


class _LocalLeaves(torch.autograd.Function):
    """``.backward()`` inside the backward on a parameter-free function: local leaves only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, gy: torch.Tensor) -> torch.Tensor | None:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            (x * torch.sigmoid(x)).backward(gy)
        return x.grad


class _ByGrad(torch.autograd.Function):
    """The layer recomputed in backward and differentiated with ``torch.autograd.grad``,
    its weight an input of ``apply`` (what the refusal advises)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        return x + torch.tanh(x @ weight.t())

    @staticmethod
    def backward(ctx, gy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            x, w = x.detach().requires_grad_(True), weight.detach().requires_grad_(True)
            gx, gw = torch.autograd.grad(x + torch.tanh(x @ w.t()), (x, w), gy)
        return gx, gw


class _ReadsCtxWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:  # type: ignore[override]
        ctx.layer = layer
        return x @ layer.weight.detach().t()

    @staticmethod
    def backward(ctx, gy: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return gy @ ctx.layer.weight, None


class _Net(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.emb = nn.Linear(8, 8)
        self.layer = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
        self.lin = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        if self.how == "reversible":
            h = _Reversible.apply(h, self.layer)
        elif self.how == "local":
            h = _LocalLeaves.apply(self.layer(h))
        elif self.how == "by-grad":
            h = _ByGrad.apply(self.layer(h), self.lin.weight)
        else:
            h = _ReadsCtxWeight.apply(self.layer(h), self.lin)
        return self.head(h)


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


@pytest.mark.parametrize("grads", ["none", "set"])
def test_reversible_layers_are_refused_and_grad_kept(grads: str) -> None:
    torch.manual_seed(0)
    model = _Net("reversible")
    if grads == "set":
        F.mse_loss(model(_batch()[0]), _batch()[1]).backward()
    before = {n: (p.grad, None if p.grad is None else p.grad.clone())
              for n, p in model.named_parameters()}
    with pytest.raises(CaptureError, match=r"backward of its own \(backward\(\) called at "
                       r".*test_inner_backward.py:\d+ in backward.*Reformer"):
        outcore.compile(model, F.mse_loss, _batch(), budget=None, device="cpu-emulated")
    for name, p in model.named_parameters():
        grad, value = before[name]
        assert p.grad is grad, name  # was: a FunctionalTensor where it had been None
        if value is not None:
            assert torch.equal(p.grad, value), name


@pytest.mark.parametrize("how", ["local", "by-grad"])
def test_a_backward_within_backward_that_sets_no_parameter_grad_trains_as_eager(
        how: str) -> None:
    torch.manual_seed(0)
    train_against_eager(_Net(how), F.mse_loss, [_batch(1), _batch(2)], budget=None,
                        device="cpu-emulated")


def test_a_parameter_read_through_ctx_is_refused_with_the_way_out() -> None:
    torch.manual_seed(0)
    model = _Net("ctx")
    with pytest.raises(CaptureError, match=r"lin\.weight.*Function\.apply as an input"):
        outcore.compile(model, F.mse_loss, _batch(), budget=None, device="cpu-emulated")
    assert all(p.grad is None for p in model.parameters())
    reference = copy.deepcopy(model)  # eager trains it; the read gives lin no gradient
    F.mse_loss(reference(_batch()[0]), _batch()[1]).backward()
    assert reference.lin.weight.grad is None


def test_another_threads_backward_is_not_the_steps() -> None:
    """``torch.autograd.backward`` is watched only in the capturing thread: a backward a
    data loader or a logger runs elsewhere meanwhile neither counts nor changes the error."""
    import threading

    from outcore.capture.inner_backward import watching

    def elsewhere() -> None:
        w = torch.ones(3, requires_grad=True)
        (w * 2).sum().backward()

    with pytest.raises(ValueError, match="the step's own error"), watching([]):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        raise ValueError("the step's own error")

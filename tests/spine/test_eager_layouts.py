"""Traced layouts are eager's where torch's Meta kernels lay an elementwise output out after
another operand (``outcore.capture.eager_meta.LAYOUT_FROM``): every entry against the eager
kernel on mixed layouts, and a step whose gradient reaches such an op transposed (as in
Qwen3-Next's gated delta net) bit-equal to eager (it was a rounding off: the bias gradient's
sum ran over another layout)."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from exact import assert_grads_equal
from torch import nn
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode

import outcore
from outcore.capture.eager_meta import LAYOUT_FROM
from outcore.capture.traced_as_eager import traced_as_eager

aten = torch.ops.aten
SHAPE = (2, 6, 4, 5)

#: each op of LAYOUT_FROM, called on tensors ``a``, ``b`` of SHAPE (values in (0.1, 0.9))
CALLS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "softplus_backward.default": lambda a, b: aten.softplus_backward(a, b, 1.0, 20.0),
    "hardtanh_backward.default": lambda a, b: aten.hardtanh_backward(a, b, 0.2, 0.7),
    "elu_backward.default": lambda a, b: aten.elu_backward(a, 1.0, 1.0, 1.0, False, b),
    "hardswish_backward.default": aten.hardswish_backward,
    "hardsigmoid_backward.default": aten.hardsigmoid_backward,
    "logit_backward.default": lambda a, b: aten.logit_backward(a, b, None),
    "copysign.Tensor": lambda a, b: aten.copysign(a, b - 0.5),
    "mse_loss_backward.default": lambda a, b: aten.mse_loss_backward(a, b, b * 0.3, 0),
    "smooth_l1_loss_backward.default":
        lambda a, b: aten.smooth_l1_loss_backward(a, b, b * 0.3, 0, 1.0),
    "huber_loss_backward.default": lambda a, b: aten.huber_loss_backward(a, b, b * 0.3, 0, 1.0),
    "binary_cross_entropy_backward.default":
        lambda a, b: aten.binary_cross_entropy_backward(a, b, b * 0.5, None, 0),
    "_log_softmax_backward_data.default":
        lambda a, b: aten._log_softmax_backward_data(a, b, -1, torch.float32),
}

#: layouts of a SHAPE tensor: contiguous, transposed in the last two dims, channels-last,
#: and broadcast from a smaller tensor
LAYOUTS: dict[str, Callable[[], torch.Tensor]] = {
    "contiguous": lambda: torch.rand(SHAPE) * 0.8 + 0.1,
    "transposed": lambda: (torch.rand(2, 6, 5, 4) * 0.8 + 0.1).transpose(2, 3),
    "channels_last": lambda: (torch.rand(SHAPE) * 0.8 + 0.1).to(
        memory_format=torch.channels_last),
    "broadcast": lambda: (torch.rand(1, 6, 1, 5) * 0.8 + 0.1).expand(SHAPE),
}
PAIRS = [p for p in itertools.product(LAYOUTS, repeat=2) if p != ("broadcast", "broadcast")]


def _fake_strides(call: Callable[..., torch.Tensor], a: torch.Tensor,
                  b: torch.Tensor) -> tuple[int, ...]:
    with FakeTensorMode() as mode, enable_python_dispatcher():
        fa, fb = mode.from_tensor(a), mode.from_tensor(b)
        return tuple(call(fa, fb).stride())


def test_every_entry_is_exercised() -> None:
    assert set(CALLS) == set(LAYOUT_FROM)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_traced_strides_are_eagers(name: str) -> None:
    call = CALLS[name]
    differed = []
    for left, right in PAIRS:
        torch.manual_seed(0)
        a, b = LAYOUTS[left](), LAYOUTS[right]()
        eager = tuple(call(a, b).stride())
        torch_rule = _fake_strides(call, a, b)
        with traced_as_eager():
            ours = _fake_strides(call, a, b)
        assert ours == eager, (left, right)
        if torch_rule != eager:
            differed.append((left, right))
    assert differed, "torch's rule agrees with eager on every pair: the entry is not needed"


def test_rules_restored_after_capture() -> None:
    call = CALLS["softplus_backward.default"]
    a, b = LAYOUTS["transposed"](), LAYOUTS["contiguous"]()
    before = _fake_strides(call, a, b)
    with traced_as_eager():
        pass
    assert _fake_strides(call, a, b) == before != tuple(call(a, b).stride())


class GatedDecay(nn.Module):
    """Qwen3-Next's decay: ``g = -exp(A) * softplus(a + dt_bias)`` read back transposed (the
    gradient reaches ``softplus_backward`` transposed, the saved input is contiguous)."""

    def __init__(self, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)
        self.dt_bias = nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.a_log = nn.Parameter(torch.linspace(-1.0, 1.0, 4))
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = -self.a_log.exp() * self.act(self.proj(x) + self.dt_bias)  # (B, T, H)
        decay = g.transpose(1, 2).contiguous().cumsum(-1)  # (B, H, T)
        return (decay.exp() * x.transpose(1, 2)[:, :4]).sum(1)


@pytest.mark.parametrize("act", [F.softplus, F.hardtanh, F.elu, F.hardswish, F.relu6],
                         ids=["softplus", "hardtanh", "elu", "hardswish", "relu6"])
def test_transposed_gradient_step_equals_eager(act: Callable[..., torch.Tensor]) -> None:
    torch.manual_seed(0)
    model = GatedDecay(act)
    reference = copy.deepcopy(model)
    x, y = torch.randn(3, 40, 8), torch.randn(3, 40)

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, target)

    trainer = outcore.compile(model, loss_fn, (x, y), budget=None, device="cpu")
    loss = trainer.step(x, y)
    expected = loss_fn(reference(x), y)
    expected.backward()
    assert torch.equal(loss, expected.detach())
    assert_grads_equal(model, reference)

"""Every op a training step reaches through one of PyTorch's Python kernels trains as eager.

Tracing takes the Python kernels PyTorch 2.13 registers at the Autograd or
CompositeImplicitAutograd key (``OpOverload.py_kernels``) instead of eager's C++ kernels
(``outcore.capture.traced_as_eager``). ``PYTHON_KERNELS`` is that set, found by walking
``torch.ops.aten`` (a PyTorch upgrade that adds or drops one fails the first test until it
is classified here); ``REACHED`` are those the steps of ``CASES`` trace through when
``traced_as_eager`` is off (the third test), and ``UNREACHED`` the others with the reason.

Each case is a tiny float32 model on the CPU: a linear layer, then the op, its output squared
and averaged (a gradient that differs per element), the batch requiring grad too; one step
through ``outcore.compile`` against one eager step of a copy, from the same seed. Every
loss and gradient is bit for bit eager's except an LSTM's (test_traced_as_eager.py: the
decomposition sums in another order, 1e-6 relative). Without ``traced_as_eager``'s eager
kernels, ``trilinear-same-size`` computed a loss of 0.21 against eager's 0.44, ``nearest3d``
other gradients (1e-1 relative), bilinear / bicubic / linear / trilinear and
``multi_margin_loss`` were 1e-8 to 6e-7 relative apart.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._C import DispatchKey

import outcore
from outcore.capture import traced_as_eager as tae

_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)
_INTERP = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
           "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d")
#: Reached by the steps of CASES (PyTorch 2.13, the CPU).
REACHED = {
    *(f"{p}.vec" for p in _INTERP), "upsample_linear1d.vec", "upsample_bilinear2d.vec",
    "upsample_bicubic2d.vec", "upsample_trilinear3d.vec", "_upsample_bilinear2d_aa.vec",
    "_upsample_bicubic2d_aa.vec", "broadcast_tensors.default", "dropout.default",
    "hardshrink.default", "softshrink.default", "multi_margin_loss.default",
    "native_batch_norm.default", "one_hot.default", "pad_sequence.default",
    "unsafe_chunk.default", "matmul.default", "stft.center", "istft.default",
    "tensor_split.tensor_indices_or_sections", "lstm.input", "gru.input", "rnn_tanh.input",
    "rnn_relu.input", "multilabel_margin_loss_forward.default"}
#: Not reached by a training step on the CPU, and why.
UNREACHED = {
    **{f"{p}.default": "only from its .vec overload's decomposition (F.interpolate calls .vec)"
       for p in _INTERP},
    "upsample_bilinear2d.default": "as above", "upsample_bicubic2d.default": "as above",
    "_upsample_lanczos2d_aa.vec": "no public API calls it",
    "cudnn_batch_norm.default": "cuDNN only", "miopen_batch_norm.default": "MIOpen only",
    "empty.out": "out= variants are not differentiable", "matmul.out": "as above",
    **{f"{p}.data": "packed sequences are refused at capture (test_traced_as_eager.py)"
       for p in ("lstm", "gru", "rnn_tanh", "rnn_relu")},
}


def python_kernels() -> set[str]:
    """The ATen overloads with a Python kernel at the Autograd or CIA key now."""
    found = set()
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        for overload in getattr(packet, "overloads", list)():
            if any(k in getattr(packet, overload).py_kernels for k in _KEYS):
                found.add(f"{name}.{overload}")
    return found


class Wrap(nn.Module):
    """``Linear(16, prod(shape))`` viewed as ``(-1, *shape)``, then ``fn(h, inner)``."""

    def __init__(self, shape: tuple[int, ...], fn: Callable[..., torch.Tensor],
                 inner: nn.Module | None) -> None:
        super().__init__()
        self.shape, self.fn = shape, fn
        self.lin = nn.Linear(16, math.prod(shape))
        self.inner = inner if inner is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.lin(x).view(-1, *self.shape), self.inner)


def squares(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    flat = out.float().reshape(-1)
    return (flat ** 2).mean() + flat[:1].sum()


CASES: dict[str, tuple[tuple[int, ...], Callable[..., torch.Tensor],
                       Callable[[], nn.Module] | None]] = {}


def case(name: str, shape: tuple[int, ...], fn: Callable[..., torch.Tensor],
         inner: Callable[[], nn.Module] | None = None) -> None:
    CASES[name] = (shape, fn if inner else (lambda h, _: fn(h)), inner)


def _interp(**kw):
    return lambda h: F.interpolate(h, **kw)


def _hann(n: int) -> torch.Tensor:
    return torch.hann_window(n)


def _stft(h: torch.Tensor, **kw) -> torch.Tensor:
    return torch.stft(h.flatten(1), 8, window=_hann(8), return_complex=True, **kw)


def _labels() -> torch.Tensor:
    return torch.tensor([[1, 3, -1, 0, 0], [0, -1, 2, 2, 2], [4, 2, 1, -1, 0], [2, -1, 0, 0, 0]])


P2, P3 = (3, 4, 4), (2, 3, 3, 3)
case("nearest1d", (3, 9), _interp(scale_factor=0.6))
case("nearest2d", P2, _interp(size=(7, 5)))
case("nearest3d", P3, _interp(scale_factor=(1.3, 2.0, 1.7)))
case("nearest-exact1d", (3, 5), _interp(size=7, mode="nearest-exact"))
case("nearest-exact2d", P2, _interp(scale_factor=1.7, mode="nearest-exact"))
case("nearest-exact3d", P3, _interp(scale_factor=1.7, mode="nearest-exact"))
case("linear", (3, 5), _interp(scale_factor=2.5, mode="linear"))
case("bilinear", P2, _interp(size=(7, 5), mode="bilinear"))
case("bilinear-corners", P2, _interp(size=(7, 5), mode="bilinear", align_corners=True))
case("bicubic", (3, 8, 8), _interp(scale_factor=0.6, mode="bicubic"))
case("trilinear", P3, _interp(size=(4, 5, 7), mode="trilinear"))
case("trilinear-same-size", P3, _interp(scale_factor=1.3, mode="trilinear"))
case("bilinear-antialiased", (3, 8, 8), _interp(size=(3, 5), mode="bilinear", antialias=True))
case("bicubic-antialiased", P2, _interp(scale_factor=1.7, mode="bicubic", antialias=True))
case("upsample-module", P2, lambda h, m: m(h), lambda: nn.Upsample(scale_factor=2.5,
                                                                  mode="bilinear"))
case("matmul-batched", (2, 3, 4), lambda h: torch.matmul(h, h[0].transpose(-1, -2)))
case("matmul-vector", (3, 5), lambda h: torch.matmul(h[0, 0], h.transpose(1, 2)))
case("linear-3d", (3, 5), lambda h, m: m(h), lambda: nn.Linear(5, 6, bias=False))
case("attention", (3, 8), lambda h, m: m(h, h, h)[0],
     lambda: nn.MultiheadAttention(8, 2, batch_first=True))
case("batch-norm", P2, lambda h, m: m(h), lambda: nn.BatchNorm2d(3))
case("instance-norm", (3, 5), lambda h, m: m(h),
     lambda: nn.InstanceNorm1d(3, affine=True, track_running_stats=True))
case("dropout", (3, 5), lambda h: F.dropout(h, 0.3))
case("hardshrink", (3, 5), lambda h: F.hardshrink(h, 0.2))
case("softshrink", (3, 5), lambda h: F.softshrink(h, 0.2))
case("unsafe-chunk", (6, 5), lambda h: torch.cat([c * (i + 1) for i, c in
                                                  enumerate(torch.unsafe_chunk(h, 3, 1))]))
case("broadcast-tensors", (3, 5), lambda h: torch.stack(torch.broadcast_tensors(h, h[:, :1])))
case("pad-sequence", (6, 5), lambda h: nn.utils.rnn.pad_sequence(
    [h[0], h[1, :3], h[2, :1]], batch_first=True, padding_value=-1.0))
case("one-hot", (5,), lambda h: h * F.one_hot(torch.arange(h.shape[0]) % 5, 5))
case("huber", (2, 5), lambda h: F.huber_loss(h[:, 0], h[:, 1], delta=0.5))
case("stft", (1, 32), lambda h: _stft(h, hop_length=2).abs())
case("stft-two-sided", (1, 32), lambda h: torch.stft(
    h.flatten(1), 7, window=_hann(7), normalized=True, onesided=False,
    return_complex=True).abs())
case("istft", (1, 32), lambda h: torch.istft(_stft(h, hop_length=2), 8, hop_length=2,
                                             window=_hann(8), length=30))
case("multi-margin", (5,), lambda h: F.multi_margin_loss(h, torch.arange(4) % 5))
case("multi-margin-weighted", (5,), lambda h: F.multi_margin_loss(
    h, torch.arange(4) % 5, p=2, margin=0.7, weight=torch.linspace(0.5, 1.5, 5)))
case("multilabel-margin", (5,), lambda h: F.multilabel_margin_loss(h, _labels()))
case("lstm", (3, 6), lambda h, m: m(h)[0], lambda: nn.LSTM(6, 4, batch_first=True))
case("gru-dropout", (3, 6), lambda h, m: m(h)[0],
     lambda: nn.GRU(6, 4, 2, dropout=0.3, batch_first=True))
case("rnn-relu", (3, 6), lambda h, m: m(h)[0],
     lambda: nn.RNN(6, 4, nonlinearity="relu", batch_first=True))
case("rnn-tanh", (3, 6), lambda h, m: m(h)[0], lambda: nn.RNN(6, 4, batch_first=True))
#: eager's kernel reads the index tensor's values in C++: specialised on them (read with
#: ``.tolist()``, ``outcore.capture.value_shapes``); refused at capture before session 30
case("tensor-split-by-tensor", (6, 5), lambda h: torch.cat(
    torch.tensor_split(h, torch.tensor([1, 4]), 1), 1))
REFUSED: dict = {}


def _model(name: str) -> nn.Module:
    shape, fn, inner = {**CASES, **REFUSED}[name]
    torch.manual_seed(0)
    return Wrap(shape, fn, inner() if inner else None)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 16, generator=g), torch.randint(0, 5, (4,), generator=g)


def test_every_python_kernel_is_classified():
    found = python_kernels()
    assert found >= REACHED
    assert found - REACHED <= set(UNREACHED), sorted(found - REACHED - set(UNREACHED))


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_step_through_a_python_kernel_trains_as_eager(name):
    model = _model(name)
    eager = copy.deepcopy(model)
    x, y = _batch()
    x_eager = x.clone().requires_grad_()
    x.requires_grad_()
    with outcore.compile(model, squares, (x, y), device="cpu-emulated",
                         policy="offload-all") as trainer:
        torch.manual_seed(7)
        loss = trainer.step((x, y))
    torch.manual_seed(7)
    expected = squares(eager(x_eager), y)
    expected.backward()
    got = [("loss", loss.detach(), expected.detach()), ("x", x.grad, x_eager.grad)]
    got += [(n, p.grad, q.grad) for (n, p), q in
            zip(model.named_parameters(), eager.parameters(), strict=True)]
    for what, a, b in got:
        if name == "lstm":  # the decomposition (test_traced_as_eager.py): float rounding
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=what)
        else:
            assert torch.equal(a, b), (what, (a - b).abs().max().item())


def test_a_tensor_of_split_indices_is_one_guard_on_its_list():
    graph = outcore.capture(_model("tensor-split-by-tensor"), squares, _batch())
    assert [(g.reader, g.value) for g in graph.source.guards] == [("tolist", [1, 4])]


def test_the_cases_reach_every_python_kernel_listed(monkeypatch):
    """Traced without ``traced_as_eager``, the cases run every kernel of ``REACHED``."""
    hits: set[str] = set()
    ops = [tae._aten(name) for name in REACHED]
    saved = [(op, key, op.py_kernels[key]) for op in ops for key in _KEYS
             if key in op.py_kernels]

    def counting(name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def kernel(*args: object, **kwargs: object) -> object:
            hits.add(name)
            return fn(*args, **kwargs)
        return kernel

    monkeypatch.setattr(tae, "traced_as_eager", contextlib.nullcontext)
    try:
        for op, key, fn in saved:
            op.py_kernels[key] = counting(f"{op._opname}.{op._overloadname}", fn)
            op._dispatch_cache.clear()
        for name in [*CASES, *REFUSED]:
            with contextlib.suppress(outcore.CaptureError):
                outcore.capture(_model(name), squares, _batch())
    finally:
        for op, key, fn in saved:
            op.py_kernels[key] = fn
            op._dispatch_cache.clear()
    assert hits == REACHED, sorted(REACHED ^ hits)


@pytest.mark.parametrize("which", ["backend", "inductor_backend"])
@pytest.mark.parametrize("name", ["trilinear-same-size", "nearest3d", "multi-margin"])
def test_the_compile_backends_compute_eagers_interpolation(which, name):
    """torch.compile's trace meets the same Python kernels (Inductor its own table too):
    without the eager kernels trilinear-same-size's loss was 0.21 against eager's 0.44."""
    import warnings

    model = _model(name)
    eager = copy.deepcopy(model)
    x, y = _batch()
    torch._dynamo.reset()
    backend = (outcore.backend(budget=None) if which == "backend"
               else outcore.inductor_backend(budget=None, gpu="this-cpu"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # inductor_backend's rounding warning
            loss = torch.compile(lambda x, y: squares(model(x), y), backend=backend)(x, y)
        loss.backward()
    finally:
        torch._dynamo.reset()
    expected = squares(eager(x), y)
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=1e-6, atol=0.0)
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)

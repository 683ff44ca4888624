"""A traced training step computes what eager PyTorch computes, where PyTorch's Python
decompositions do not.

Tracing (``aot_export_joint_with_descriptors``, under the Python dispatcher) takes the
Python kernels PyTorch registers for some ops (``OpOverload.py_kernels`` at the Autograd or
CompositeImplicitAutograd key) instead of the C++ kernels eager runs (aot_export applies no
other decomposition table). PyTorch 2.13 has 46 such overloads; those a training step on the
CPU reaches are tested in tests/spine/test_python_kernels.py. Several compute another
training step than eager:

0. **``multilabel_margin_loss``** (``aten.multilabel_margin_loss_forward``): the
   decomposition masks the classes that are targets but not the target slots after the
   first ``-1``, which it gathers as class 0, so every sample with fewer labels than classes
   (the usual case) adds loss terms eager does not (a 4 x 5 batch: 4.56 against eager's
   1.84). It is traced as eager's own kernel and its derivative
   (``multilabel_margin_loss_backward``) while the context is open, on every device:
   bit for bit eager's.
0b. **Interpolation** (``F.interpolate`` / ``nn.Upsample``, every mode but ``area``: the
   ``upsample_*`` / ``_upsample_*`` overloads, ``.vec`` and ``.default``). Eager's CPU
   linear / bilinear / trilinear kernels copy the input when the output size equals the
   input's (``scale_factor=1.3`` on a side of 3), the decomposition resamples it (a
   trilinear step's loss 0.21 against eager's 0.44); nearest with a scale factor per
   dimension gets other gradients (4e-2 relative); bilinear, bicubic, linear and
   trilinear are otherwise 1-5e-7 relative apart. All are traced as eager's kernels and
   their derivatives (``upsample_*_backward``) on every device: bit for bit.
0c. **``multi_margin_loss``**: its decomposition rounds otherwise (1.4e-7 relative); traced
   as eager's kernel and ``multi_margin_loss_backward``.
0d. **Dropout in bfloat16 / float16 on the CPU** (``aten.dropout``, under autocast or in a
   bfloat16 model): eager's CPU composite draws a mask in the input's dtype, divides it by
   ``1 - p`` there (the scale rounded to bfloat16: 1.109375 for ``p=0.1``) and multiplies;
   the decomposition's ``native_dropout`` scales by ``1 / (1 - p)`` in float, so its
   gradient differs (5e-4 on a conv weight after one step of a small CNN under bfloat16
   autocast). Traced as eager's composite (``bernoulli``, ``div``, ``mul``; the same draws)
   on the CPU for those dtypes; float32 and other devices keep ``native_dropout`` (the CUDA
   eager kernel is ``native_dropout`` itself).

RNNs: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` are traced through the Python decompositions
of ``aten.lstm`` / ``aten.gru`` / ``aten.rnn_tanh`` / ``aten.rnn_relu`` (``.input`` and the
packed-sequence ``.data`` overloads). Two of their choices differ from eager's:

1. **Dropout between layers is dropped.** Every overload loops over layers in
   ``torch._decomp.decompositions._rnn_helper``, which sets the dropout probability to 0
   before its first layer (its condition ``num_layers < i - 1`` is never true). A traced
   step of a stacked RNN with ``dropout > 0`` has no dropout at all: the loss and the
   gradients are another model's. Eager applies ``at::dropout(layer_output, p,
   train=True)`` after every layer but the last.
2. **An LSTM fed by data that needs no gradient takes the inference kernel.**
   ``select_one_layer_lstm_function`` picks oneDNN's ``mkldnn_rnn_layer`` (called with
   ``train=False``) when the *input* does not require grad, whatever the weights do; its
   backward then needs the workspace only a training call makes, and the step fails
   ("Expected a proper Tensor ... 'workspace'"). Eager differentiates its weights.

``torch.compile`` users rarely meet either: dynamo hands RNN modules back to eager
(``torch._dynamo.config.allow_rnn`` is off). outcore's capture traces the whole step with
``aot_export_joint_with_descriptors``, so every stacked RNN with dropout, and every LSTM
reading its batch directly, met them.

``traced_as_eager()``, while a step is traced, also:

* GRUs and plain RNNs on the CPU are traced through eager's own C++ composite kernel
  (``OpOverload._op_dk(CompositeImplicitAutograd, ...)``, the path eager runs, so the
  traced graph computes eager's loss and gradients bit for bit); on other devices through
  the decomposition, as below (eager runs cuDNN's fused kernel there; tracing that kernel
  into outcore's graph has not been tried on a GPU);
* ``_rnn_helper`` is replaced by one that runs the original one layer at a time
  (``num_layers=1``, no dropout, time-major) and applies ``torch.dropout(output, p,
  train=True)`` between layers, on the same time-major layer output eager draws its mask
  on (an LSTM's C++ path on the CPU is oneDNN's, whose training call a trace cannot make:
  LSTMs always take the decomposition, and their gradients match eager's up to float
  rounding, about 1e-7 relative);
* ``select_one_layer_lstm_function`` by one that keeps the original's choice unless grad
  mode is on and any weight or state requires grad, where it takes the differentiable
  one-layer LSTM (the one the original itself takes for an input that requires grad).

* fake-tensor rules stricter than eager's kernels are widened to what eager accepts
  (``outcore.capture.eager_meta``: ``_grouped_mm`` on float32 / float16, the experts of
  Hugging Face's mixture-of-experts models).

Invariants: without dropout, out of training or with one layer, ``_rnn_helper`` is the
original unchanged; per-layer outputs and final hidden states are the original's, in its
order (per layer, then per direction). Everything is restored when the last open context
ends, also on an exception; nested or concurrent contexts patch once.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch._C import DispatchKey

_LOCK = threading.Lock()
#: RNN overloads traced through eager's C++ composite on the CPU (module doc).
_EAGER_ON_CPU = ("gru.input", "gru.data", "rnn_tanh.input", "rnn_tanh.data",
                 "rnn_relu.input", "rnn_relu.data")
#: Traced through eager's C++ composite on the CPU for bfloat16 / float16 inputs (item 0d).
_EAGER_ON_CPU_REDUCED = ("dropout.default",)
_REDUCED = (torch.bfloat16, torch.float16)
#: Interpolation overloads (item 0b of the module doc): ``.vec`` (``F.interpolate``'s entry,
#: a C++ composite in eager) and ``.default`` (eager's kernel, with its derivative).
_UPSAMPLE = tuple(f"{packet}.{overload}" for packet in (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
    "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa") for overload in ("vec", "default"))
#: Overloads traced through eager's own kernel on every device (items 0-0c of the module doc).
_EAGER_EVERYWHERE = ("multilabel_margin_loss_forward.default", *_UPSAMPLE,
                     "multi_margin_loss.default")
_KEYS = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)
#: the layer functions (``one_layer_lstm``, ...) of the RNNs traced through the
#: decomposition since ``decomposed_rnns()`` last read them (eager runs a fused kernel)
_DECOMPOSED: set[str] = set()
_ACTIVE = [0]  # contexts open now (nested or on other threads): patched while above 0
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_KERNELS: list[tuple[Any, DispatchKey, Callable[..., Any]]] = []  # (op, key, original)


def _aten(name: str) -> Any:
    """The ATen overload ``"packet.overload"`` names."""
    packet, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, packet), overload)


def _layer_by_layer(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (``_rnn_helper``) with eager's dropout between layers."""

    def helper(input: torch.Tensor, hidden: Sequence[Any], params: Sequence[Any],
               has_biases: bool, num_layers: int, dropout: float, train: bool,
               bidirectional: bool, batch_first: bool, layer_fn: Callable[..., Any]
               ) -> tuple[torch.Tensor, list[Any]]:
        _DECOMPOSED.add(str(getattr(layer_fn, "__name__", None)
                            or getattr(getattr(layer_fn, "func", None), "__name__", "rnn")))
        if not (dropout and train and num_layers > 1):
            return original(input, hidden, params, has_biases, num_layers, dropout, train,
                            bidirectional, batch_first, layer_fn)
        per_layer = 2 if bidirectional else 1  # entries of ``hidden``/``params`` per layer
        out = input.transpose(0, 1) if batch_first else input
        finals: list[Any] = []
        for layer in range(num_layers):
            own = slice(layer * per_layer, (layer + 1) * per_layer)
            out, last = original(out, list(hidden[own]), list(params[own]), has_biases, 1,
                                 0.0, train, bidirectional, False, layer_fn)
            finals.extend(last)
            if layer < num_layers - 1:
                out = torch.dropout(out, dropout, train=True)
        return (out.transpose(0, 1) if batch_first else out), finals

    return helper


def decomposed_rnns() -> list[str]:
    """The RNN kinds ("LSTM", "GRU or RNN") traced through the decomposition since the last
    call (the module doc: an LSTM always, a GRU or plain RNN off the CPU), which round
    otherwise than eager's fused kernels; the record is cleared."""
    kinds = sorted({"LSTM" if "lstm" in name else "GRU or RNN" for name in _DECOMPOSED
                    if not name.startswith("mkldnn")})  # oneDNN's inference kernel: eager's
    _DECOMPOSED.clear()
    return kinds


def rounding_note(kinds: list[str]) -> str:
    """What a step with ``decomposed_rnns()`` computes otherwise than eager."""
    return (f"the model's {' and '.join(kinds)} layers are traced through PyTorch's "
            "decomposition (eager trains them with a fused kernel a trace cannot call), so "
            "their outputs and the gradients differ from eager PyTorch's by float rounding "
            "(about 1e-7 relative in float32)")


def _differentiable_lstm(original: Callable[..., Any], one_layer_lstm: Callable[..., Any]
                         ) -> Callable[..., Any]:
    """``original`` (``select_one_layer_lstm_function``), never the inference kernel for a
    step that differentiates the LSTM's weights or initial states."""

    def select(input: torch.Tensor, hx: Sequence[torch.Tensor],
               params: Sequence[Sequence[torch.Tensor]]) -> Callable[..., Any]:
        tensors = itertools.chain([input], hx, itertools.chain.from_iterable(params))
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return one_layer_lstm
        return original(input, hx, params)

    return select


def _eager_on_cpu(op: Any, original: Callable[..., Any],
                  reduced: bool = False) -> Callable[..., Any]:
    """A Python kernel for ``op`` that runs eager's C++ composite when every tensor argument
    is on the CPU (with ``reduced``: and the first is bfloat16 or float16), else
    ``original`` (the decomposition)."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        leaves = [t for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)]
        if all(t.device.type == "cpu" for t in leaves) and (
                not reduced or (bool(leaves) and leaves[0].dtype in _REDUCED)):
            return op._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        return original(*args, **kwargs)

    return kernel


def eager_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's decomposition table (``select_decomp_table``) less the ops traced as
    eager's own kernel on every device (``_EAGER_EVERYWHERE``): Inductor applies that
    table while it traces, after the Python kernels, so the ops must leave it too; each gets
    a fallback lowering (Inductor calls eager's kernel), registered once."""
    from torch._inductor import lowering
    from torch._inductor.decomposition import select_decomp_table

    eager = set()
    for name in _EAGER_EVERYWHERE:
        op = _aten(name)
        eager.add(op)
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(),
                                                         "CompositeImplicitAutograd"):
            continue  # eager's own composite is traced: Inductor never meets the op itself
        if op not in lowering.lowerings:  # Inductor's implicit fallback refuses an op with
            # a decomposition where the environment says CI (``make_fallback``): an explicit
            # one (eager's kernel; the op never reaches lowering with Inductor's own table).
            # An op Inductor lowers itself (nearest interpolation) keeps that lowering.
            lowering.make_fallback(op, warn=False, override_decomp=True)
    return {op: fn for op, fn in select_decomp_table().items() if op not in eager}


def _patch() -> None:
    from torch._decomp import decompositions as d

    from outcore.capture import eager_meta

    eager_meta.patch()
    _ORIGINALS.update(_rnn_helper=d._rnn_helper,
                      select_one_layer_lstm_function=d.select_one_layer_lstm_function)
    d._rnn_helper = _layer_by_layer(_ORIGINALS["_rnn_helper"])
    d.select_one_layer_lstm_function = _differentiable_lstm(
        _ORIGINALS["select_one_layer_lstm_function"], d.one_layer_lstm)
    for name in (*_EAGER_ON_CPU, *_EAGER_ON_CPU_REDUCED, *_EAGER_EVERYWHERE):
        op = _aten(name)
        for key in _KEYS:
            if key in op.py_kernels:
                _KERNELS.append((op, key, op.py_kernels[key]))
                if name in _EAGER_ON_CPU or name in _EAGER_ON_CPU_REDUCED:
                    op.py_kernels[key] = _eager_on_cpu(op, op.py_kernels[key],
                                                       name in _EAGER_ON_CPU_REDUCED)
                else:  # no Python kernel: the dispatcher runs eager's C++ one
                    del op.py_kernels[key]
        op._dispatch_cache.clear()


def _restore() -> None:
    from torch._decomp import decompositions as d

    from outcore.capture import eager_meta

    eager_meta.restore()
    for name, fn in _ORIGINALS.items():
        setattr(d, name, fn)
    _ORIGINALS.clear()
    for op, key, fn in _KERNELS:
        op.py_kernels[key] = fn
        op._dispatch_cache.clear()
    _KERNELS.clear()


@contextlib.contextmanager
def traced_as_eager() -> Iterator[None]:
    """While active, traced steps compute what eager computes (module doc)."""
    with _LOCK:
        if _ACTIVE[0] == 0:
            _patch()
        _ACTIVE[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE[0] -= 1
            if _ACTIVE[0] == 0:
                _restore()

"""Stacked RNNs are traced as eager PyTorch runs them in training.

PyTorch (2.13) traces ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` through the Python
decompositions of ``aten.lstm`` / ``aten.gru`` / ``aten.rnn_tanh`` / ``aten.rnn_relu``
(``.input`` and the packed-sequence ``.data`` overloads), not through the C++ kernels eager
runs. Two of their choices differ from eager's in a training step:

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

``rnn_traced_as_eager()`` replaces both functions while a step is traced:

* ``_rnn_helper`` by one that runs the original one layer at a time (``num_layers=1``, no
  dropout, time-major) and applies ``torch.dropout(output, p, train=True)`` between
  layers, on the same time-major layer output eager draws its mask on;
* ``select_one_layer_lstm_function`` by one that keeps the original's choice unless grad
  mode is on and any weight or state requires grad, where it takes the differentiable
  one-layer LSTM (the one the original itself takes for an input that requires grad).

Invariants: without dropout, out of training or with one layer, ``_rnn_helper`` is the
original unchanged; per-layer outputs and final hidden states are the original's, in its
order (per layer, then per direction). Both are restored when the last open context ends,
also on an exception; nested or concurrent contexts patch once.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

_LOCK = threading.Lock()
_ACTIVE = [0]  # contexts open now (nested or on other threads): patched while above 0
_ORIGINALS: dict[str, Callable[..., Any]] = {}


def _layer_by_layer(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (``_rnn_helper``) with eager's dropout between layers."""

    def helper(input: torch.Tensor, hidden: Sequence[Any], params: Sequence[Any],
               has_biases: bool, num_layers: int, dropout: float, train: bool,
               bidirectional: bool, batch_first: bool, layer_fn: Callable[..., Any]
               ) -> tuple[torch.Tensor, list[Any]]:
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


@contextlib.contextmanager
def rnn_traced_as_eager() -> Iterator[None]:
    """While active, traced RNNs keep eager's dropout and LSTMs stay differentiable
    (module doc)."""
    from torch._decomp import decompositions as d

    with _LOCK:
        if _ACTIVE[0] == 0:
            _ORIGINALS.update(_rnn_helper=d._rnn_helper,
                              select_one_layer_lstm_function=d.select_one_layer_lstm_function)
            d._rnn_helper = _layer_by_layer(_ORIGINALS["_rnn_helper"])
            d.select_one_layer_lstm_function = _differentiable_lstm(
                _ORIGINALS["select_one_layer_lstm_function"], d.one_layer_lstm)
        _ACTIVE[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _ACTIVE[0] -= 1
            if _ACTIVE[0] == 0:
                for name, fn in _ORIGINALS.items():
                    setattr(d, name, fn)
                _ORIGINALS.clear()

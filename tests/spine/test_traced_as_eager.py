"""Steps whose ops PyTorch traces through Python kernels train as eager PyTorch does
(``outcore.capture.traced_as_eager``): RNNs, and the other ops with a Python kernel at the
Autograd key that a training step meets (a loss, shrinkage, interpolation).

PyTorch's decompositions of ``aten.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu``, which
tracing uses, drop the dropout between layers (a captured step of ``nn.LSTM(...,
num_layers=2, dropout=p)`` computed another model's loss), and run an LSTM whose input needs
no gradient on oneDNN's inference kernel (the step failed). The batches here need no
gradient, as a data loader's do. The class tested: every RNN kind,
both layouts, one and two directions, an LSTM with projections and a packed sequence; each
against eager with the same seed: GRUs and RNNs bit for bit (traced through eager's own C++
composite), LSTMs up to float rounding (the decomposition sums a weight's per-step
contributions in another order than eager's oneDNN kernel; a wrong dropout mask moves them
by orders of magnitude more). A packed sequence is refused
at capture with a CaptureError (its lengths make the graph's shapes data-dependent).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._C import DispatchKey
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import outcore
from outcore.capture.traced_as_eager import traced_as_eager
from outcore.errors import RoundingWarning

KINDS = {
    "lstm": lambda **kw: nn.LSTM(6, 8, **kw),
    "lstm-proj": lambda **kw: nn.LSTM(6, 8, proj_size=5, **kw),
    "gru": lambda **kw: nn.GRU(6, 8, **kw),
    "rnn-tanh": lambda **kw: nn.RNN(6, 8, **kw),
    "rnn-relu": lambda **kw: nn.RNN(6, 8, nonlinearity="relu", **kw),
}


class Tagger(nn.Module):
    """An RNN of ``layers`` layers with dropout, then a linear head on the last step."""

    def __init__(self, kind: str, layers: int, batch_first: bool, bidirectional: bool,
                 dropout: float = 0.3) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.rnn = KINDS[kind](num_layers=layers, dropout=dropout, batch_first=batch_first,
                               bidirectional=bidirectional)
        width = self.rnn.proj_size or self.rnn.hidden_size
        self.head = nn.Linear(width * (2 if bidirectional else 1), 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.rnn(x)[0]
        return self.head(out[:, -1] if self.batch_first else out[-1])


class PackedTagger(nn.Module):
    """A two-layer LSTM with dropout over a packed batch of sequences of other lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(6, 8, num_layers=2, dropout=0.3, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(x, [7, 5, 4], batch_first=True)
        out, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True)
        return self.head(out.sum(1))


def _batch(batch_first: bool, n: int = 3, steps: int = 7):
    g = torch.Generator().manual_seed(1)
    shape = (n, steps, 6) if batch_first else (steps, n, 6)
    return torch.randn(*shape, generator=g), torch.randint(0, 4, (n,), generator=g)


def _against_eager(model: nn.Module, batch, policy: str = "offload-all"):
    """One outcore step and one eager step of copies of ``model`` from the same seed."""
    eager = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with outcore.compile(model, F.cross_entropy, batch, device="cpu-emulated",
                             policy=policy) as trainer:
            torch.manual_seed(7)
            loss = trainer.step(batch)
    torch.manual_seed(7)
    expected = F.cross_entropy(eager(batch[0]), batch[1])
    expected.backward()
    # what rounds otherwise than eager is said: a RoundingWarning and a note (session 31)
    said = [str(w.message) for w in caught if w.category is RoundingWarning]
    noted = [n for n in trainer.stats.notes if "by float rounding" in n]
    if isinstance(model.rnn, nn.LSTM):
        assert said and noted and "LSTM layers" in noted[0], (said, trainer.stats.notes)
    else:
        assert not said and not noted
    if not isinstance(model.rnn, nn.LSTM):  # eager's own C++ composite: bit for bit
        assert torch.equal(loss.detach(), expected.detach())
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), name
        return
    # an LSTM takes the decomposition: eager's masks, float rounding (a time-major LSTM's
    # loss 2.4e-7 apart; another mask moves it by ~1e-3)
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=1e-6, atol=0.0)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def _dropouts(model: nn.Module, batch) -> int:
    graph = outcore.capture(model, F.cross_entropy, batch)
    return sum(1 for op in graph.ops if op.target.startswith("aten.native_dropout.default"))


#: Every kind in both layouts; two directions for the two gated kinds.
SHAPES = [(kind, batch_first, False) for kind in sorted(KINDS) for batch_first in (False, True)]
SHAPES += [("lstm", True, True), ("gru", False, True)]


@pytest.mark.parametrize("kind, batch_first, bidirectional", SHAPES)
def test_a_stacked_rnn_with_dropout_trains_as_eager(kind, batch_first, bidirectional):
    torch.manual_seed(0)
    model = Tagger(kind, 3, batch_first, bidirectional)
    batch = _batch(batch_first)
    assert _dropouts(model, batch) == 2  # between layers 1-2 and 2-3, as eager draws
    _against_eager(model, batch)


def test_a_packed_sequence_is_refused_at_capture_with_the_reason():
    torch.manual_seed(0)
    with pytest.raises(outcore.CaptureError, match="pack_padded_sequence"):
        outcore.capture(PackedTagger(), F.cross_entropy, _batch(True))


@pytest.mark.parametrize("layers, dropout, training", [(1, 0.3, True), (2, 0.0, True),
                                                       (2, 0.3, False)])
def test_no_dropout_where_eager_draws_none(layers, dropout, training):
    torch.manual_seed(0)
    model = Tagger("lstm", layers, True, False, dropout=dropout).train(training)
    assert _dropouts(model, _batch(True)) == 0


def test_an_lstm_without_dropout_reading_its_batch_trains_as_eager():
    torch.manual_seed(0)
    model = Tagger("lstm", 2, True, False, dropout=0.0)
    _against_eager(model, _batch(True))


def test_the_decompositions_are_restored_also_when_nested_or_failing():
    from torch._decomp import decompositions as d

    gru = torch.ops.aten.gru.input

    def current():
        keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
        return (d._rnn_helper, d.select_one_layer_lstm_function,
                *(gru.py_kernels[k] for k in keys))

    original = current()
    with traced_as_eager():
        patched = current()
        assert all(p is not o for p, o in zip(patched, original, strict=True))
        with traced_as_eager():
            assert current() == patched  # not wrapped twice
        assert current() == patched
    assert current() == original
    with pytest.raises(RuntimeError, match="boom"), traced_as_eager():
        raise RuntimeError("boom")
    assert current() == original


def _compiled_against_eager(which: str, model: nn.Module, loss_fn, x, y) -> None:
    """One step of ``loss_fn(model(x), y)`` compiled with outcore's backend ``which`` and
    one eager step of a copy, from the same seed: equal up to float rounding."""
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    backend = (outcore.backend(budget=None) if which == "backend"
               else outcore.inductor_backend(budget=None, gpu="this-cpu"))
    try:
        step = torch.compile(lambda x, y: loss_fn(model(x), y), backend=backend)
        torch.manual_seed(7)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # inductor_backend's rounding warning
            loss = step(x, y)
        loss.backward()
    finally:
        torch._dynamo.reset()
    torch.manual_seed(7)
    expected = loss_fn(eager(x), y)
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=1e-6, atol=0.0)
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("which", ["backend", "inductor_backend"])
def test_the_compile_backends_keep_the_dropout_where_dynamo_traces_rnns(which):
    """With ``torch._dynamo.config.allow_rnn`` on, dynamo hands the RNN to the backend,
    whose AOT trace meets the same decompositions (off, the RNN runs eagerly)."""
    torch.manual_seed(0)
    model = Tagger("gru", 3, True, False)
    with torch._dynamo.config.patch(allow_rnn=True):
        _compiled_against_eager(which, model, F.cross_entropy, *_batch(True))


def _multilabel(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Two labels per sample, the rest of the row padded with -1 (the usual layout)."""
    pad = torch.full_like(y, -1)
    return F.multilabel_margin_loss(out, torch.stack([y, (y + 1) % 5, pad, y, y], 1))


class _Head(nn.Module):
    def __init__(self, act) -> None:
        super().__init__()
        self.lin, self.act = nn.Linear(16, 5 * 16), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x).view(-1, 5, 4, 4)).mean((2, 3))


#: (model, loss) pairs whose ops carry a Python kernel at the Autograd key in PyTorch 2.13
OPS = {
    "multilabel-margin-loss": (lambda: nn.Linear(16, 5), _multilabel),
    "multi-margin-loss": (lambda: nn.Linear(16, 5), F.multi_margin_loss),
    "hardshrink": (lambda: _Head(lambda h: F.hardshrink(h, 0.2)), F.cross_entropy),
    "softshrink": (lambda: _Head(lambda h: F.softshrink(h, 0.2)), F.cross_entropy),
    "nearest": (lambda: _Head(lambda h: F.interpolate(h, scale_factor=2)), F.cross_entropy),
    "bilinear-antialiased": (lambda: _Head(lambda h: F.interpolate(
        h, size=(3, 3), mode="bilinear", antialias=True)), F.cross_entropy),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_ops_with_python_kernels_train_as_eager(name):
    """Bit for bit. (``multilabel_margin_loss``'s decomposition counted the padded target
    slots as class 0: 4.56 against eager's 1.84 on this batch; every interpolation mode
    and more ops: test_python_kernels.py.)"""
    make, loss_fn = OPS[name]
    torch.manual_seed(0)
    model = make()
    eager = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    with outcore.compile(model, loss_fn, (x, y), device="cpu-emulated",
                         policy="offload-all") as trainer:
        loss = trainer.step((x, y))
    expected = loss_fn(eager(x), y)
    expected.backward()
    assert torch.equal(loss.detach(), expected.detach())
    for (pname, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), pname


@pytest.mark.parametrize("which", ["backend", "inductor_backend"])
def test_the_compile_backends_compute_eagers_multilabel_margin_loss(which):
    """torch.compile's own backends (aot_eager, inductor) compute it as the decomposition
    does (3.46 against eager's 1.55 on a batch like this one)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 16, generator=g), torch.randint(0, 5, (4,), generator=g)
    _compiled_against_eager(which, nn.Linear(16, 5), _multilabel, x, y)

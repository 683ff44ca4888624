"""Tensors a forward stores on its modules are not left as the trace's tensors.

Found in session 31: a forward that stores a tensor on a module (``self.last =
h.detach()``, ``self.history.append(...)``, a table cached on the first call) left
``FunctionalTensor`` objects in the user's model after the capture, which raise
"Attempting to use FunctionalTensor on its own" wherever they are read afterwards: by the
user, or by the model's own next eager forward (an evaluation under ``torch.no_grad()``
reading the cache). The capture now puts such attributes back as they were
(``outcore.capture.stashed``) and says so. The class tested: a tensor attribute set, a list
appended to, a dict filled, a lazily built cache read by a later eager forward, on the
model and on a loss module.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from exact import assert_grads_equal
from torch import nn

import outcore
from outcore.errors import OutcoreWarning


class _Stashing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 1)
        self.last: torch.Tensor | None = None
        self.history: list[torch.Tensor] = [torch.zeros(())]
        self.by_name: dict[str, torch.Tensor] = {}
        self._table: torch.Tensor | None = None  # built on the first call, as rotary caches

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._table is None:
            self._table = torch.linspace(0.5, 1.5, 8)
        h = torch.tanh(self.a(x)) * self._table
        self.last = h.detach()
        self.history.append(h.mean().detach())
        self.by_name["h"] = h.detach()
        return self.b(h)


class _StashingLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: torch.Tensor | None = None

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.seen = out.detach()
        return F.mse_loss(out, y)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=g), torch.randn(4, 1, generator=g)


def _traced(value: object) -> bool:
    return type(value).__name__ in ("FunctionalTensor", "FakeTensor")


def test_stored_tensors_are_put_back_and_said() -> None:
    torch.manual_seed(0)
    model, loss = _Stashing(), _StashingLoss()
    reference = copy.deepcopy(model)
    history = model.history
    with pytest.warns(OutcoreWarning, match=r"stores tensors where they outlive the step "
                                            r"\(.*_Stashing\.last.*\): a captured step"):
        trainer = outcore.compile(model, loss, _batch(0), budget=None, device="cpu-emulated")
    with trainer:
        for seed in (1, 2):
            for p in (*model.parameters(), *reference.parameters()):
                p.grad = None
            trainer.step(*_batch(seed))
            x, y = _batch(seed)
            F.mse_loss(reference(x), y).backward()
            assert_grads_equal(model, reference)
    # as before the capture: nothing the trace made is left on the modules
    assert model.last is None and model._table is None and model.by_name == {}
    assert model.history is history and len(history) == 1 and not _traced(history[0])
    assert loss.seen is None
    # the model's own eager forward after the capture (validation) runs: it rebuilds its
    # table (was: the trace's table, "Attempting to use FunctionalTensor on its own")
    with torch.no_grad():
        expected = reference(_batch(3)[0])
        assert torch.equal(model(_batch(3)[0]), expected)
        assert torch.equal(trainer.step(*_batch(3)), F.mse_loss(expected, _batch(3)[1]))
    assert not _traced(model._table) and not _traced(model.last)


def test_a_forward_that_stores_nothing_is_not_warned() -> None:
    import warnings

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcore.compile(model, F.mse_loss, _batch(0), budget=None,
                        device="cpu-emulated").close()
    assert not [w for w in caught if "outlive the step" in str(w.message)]


def test_a_fake_models_own_fake_tensors_stay() -> None:
    """A model built under FakeTensorMode (sizing a model too large to build) holds fake
    tensors before the capture: they are its own, kept, and nothing is said."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.scale = torch.ones(8)  # plain tensor attributes (not buffers), not read
            self.pair = [torch.ones(8)]

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x)

    with FakeTensorMode():
        model = Scaled()
        batch = (torch.randn(4, 8), torch.randn(4, 8))
    scale, pair, first = model.scale, model.pair, model.pair[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = outcore.capture(model, F.mse_loss, batch)
    assert graph.meta["fake"]
    assert model.scale is scale and model.pair is pair and model.pair == [first]
    assert not [w for w in caught if "outlive the step" in str(w.message)]


def test_features_a_forward_hook_collects_are_put_back() -> None:
    """The feature-extraction pattern: a forward hook writing into a dict it closes over
    and a list named as a global. Both are left as before the capture (were: the trace's
    tensors in them), the hooks' places named, and the steps train as eager."""
    features: dict[str, torch.Tensor] = {"kept": torch.ones(1)}
    kept = features["kept"]

    def collect(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        features["tanh"] = out.detach()
        _SEEN.append(out.detach())

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    model[1].register_forward_hook(collect)
    with pytest.warns(OutcoreWarning, match=r"variable 'features' that a forward hook of "
                                            r"module '1' closes over; global '_SEEN'"):
        trainer = outcore.compile(model, F.mse_loss, _batch(0), budget=None,
                                  device="cpu-emulated")
    with trainer:
        trainer.step(*_batch(1))
    F.mse_loss(reference(_batch(1)[0]), _batch(1)[1]).backward()
    assert_grads_equal(model, reference)
    assert features == {"kept": kept} and features["kept"] is kept and _SEEN == []


_SEEN: list[torch.Tensor] = []


def test_an_lstms_weight_list_is_its_parameters_again_and_unsaid() -> None:
    """``nn.LSTM`` keeps its weights in a private list, ``_flat_weights``, which the capture
    left holding the trace's tensors (putting the parameters back bypasses the module's own
    refresh of it): every RNN model before session 31. Put back without a warning."""
    import warnings

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(8, 8, batch_first=True)
            self.head = nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0][:, -1])

    torch.manual_seed(0)
    model = Tagger()
    batch = (torch.randn(4, 5, 8), torch.randn(4, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with outcore.compile(model, F.mse_loss, batch, budget=None,
                             device="cpu-emulated") as trainer:
            trainer.step(*batch)
    assert not [w for w in caught if "outlive the step" in str(w.message)]
    names = model.rnn._flat_weights_names
    assert all(w is getattr(model.rnn, n)
               for w, n in zip(model.rnn._flat_weights, names, strict=True))


@pytest.mark.parametrize("norm", ["weight_norm", "spectral_norm"])
def test_weights_torch_recomputes_at_every_call_are_unsaid(norm: str) -> None:
    """The old-style ``nn.utils.weight_norm`` / ``spectral_norm`` set ``module.weight`` in a
    forward pre-hook at every call: put back without a warning, trained as eager."""
    import warnings

    def make() -> nn.Module:
        torch.manual_seed(0)
        wrap = getattr(nn.utils, norm)
        return nn.Sequential(wrap(nn.Linear(8, 8)), nn.Tanh(), nn.Linear(8, 1))

    model, reference = make(), make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with outcore.compile(model, F.mse_loss, _batch(0), budget=None,
                             device="cpu-emulated") as trainer:
            trainer.step(*_batch(1))
    assert not [w for w in caught if "outlive the step" in str(w.message)]
    assert not _traced(model[0].weight)
    F.mse_loss(reference(_batch(1)[0]), _batch(1)[1]).backward()
    assert_grads_equal(model, reference)

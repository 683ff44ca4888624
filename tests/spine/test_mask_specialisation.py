"""Boolean masks whose selected count sets a shape (``t[mask]``, ``t[mask] = v``, ``nonzero``,
``argwhere``, ``torch.where(mask)``, ``masked_select``) and sizes given as 0-d tensors
(``torch.arange(n)``, ``x.new_zeros(n, 4)``, ``x.view(n, -1)``, ``repeat_interleave`` by a
tensor) are specialised on their values
(``outcore.capture.value_shapes``): each form trains as eager does, bit for bit, step after
step as the values change, and a mask that stays the same is captured once.

Each of them was refused at capture before ("no shape rule"), DeBERTa's
sequence-classification loss (``(labels >= 0).nonzero()``) among them, and with it every
hand-written loss that drops padding by ``logits[labels != -100]``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from exact import train_against_eager
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.capture import capture
from outcore.capture.value_shapes import MASK_READER
from outcore.errors import CaptureError, ReplanWarning
from outcore.trainer_stats import MANY_RESPECIALISATIONS

Form = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _zeroed(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = h.clone()
    out[mask] = 0.0
    return out


def _doubled(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = h.clone()
    out[mask] = h[mask] * 2  # a value with a gradient, written through the mask
    return out


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0] > 0


#: each form, on the activation ``h`` (6 x 4) and the input ``x`` (6 x 4); masks from the
#: input change with the batch, masks from ``h`` with the weights too
FORMS: dict[str, Form] = {
    "t[mask]": lambda h, x: h[h > 0],
    "t[row mask]": lambda h, x: h[_rows(x)],
    "t[:, mask]": lambda h, x: h[:, x[0] > 0],
    "t[mask, i]": lambda h, x: h[_rows(x), 1],
    "t[mask] = 0": lambda h, x: _zeroed(h, _rows(x)),
    "t[mask] = t[mask] * 2": lambda h, x: _doubled(h, h > 0),
    "nonzero": lambda h, x: h.index_select(0, _rows(x).nonzero().squeeze(1)),
    "nonzero(as_tuple=True)": lambda h, x: h[_rows(x).nonzero(as_tuple=True)],
    "torch.nonzero of floats": lambda h, x: h[torch.nonzero(x[:, 0].clamp(min=0))[:, 0]],
    "argwhere": lambda h, x: h[torch.argwhere(_rows(x))[:, 0]],
    "torch.where(mask)": lambda h, x: h[torch.where(_rows(x))],
    "masked_select": lambda h, x: torch.masked_select(h, h > 0),
    "masked_select, broadcast": lambda h, x: torch.masked_select(h, x[:, :1] > 0),
    "Tensor.masked_select": lambda h, x: h.masked_select(_rows(x)[:, None]),
}


def _count(x: torch.Tensor) -> torch.Tensor:
    return (x[:, 0] > 0).sum()  # a 0-d tensor: how many rows are positive


def _all(x: torch.Tensor) -> torch.Tensor:
    return (x[:, 0] > -1e9).sum()  # a 0-d tensor: every row


#: sizes given as 0-d tensors, read by PyTorch's C++ (``value_shapes.SIZE_TAKERS``)
SIZES: dict[str, Form] = {
    "torch.arange(n)": lambda h, x: h[torch.arange(_count(x))],
    "torch.arange(0, n, 1)": lambda h, x: h[torch.arange(0, _count(x), 1)],
    "torch.zeros(n, 4)": lambda h, x: torch.cat([h, torch.zeros(_count(x), 4)]),
    "torch.full((n, 4), v)": lambda h, x: torch.cat([h, torch.full((_count(x), 4), 2.0)]),
    "new_zeros(n, 4)": lambda h, x: torch.cat([h, h.new_zeros(_count(x), 4)]),
    "new_full((n, 4), v)": lambda h, x: torch.cat([h, h.new_full((_count(x), 4), 3.0)]),
    "view(n, -1)": lambda h, x: h.view(_all(x), -1) * 2,
    "reshape(n, -1)": lambda h, x: h.reshape(-1, _all(x)) * 2,
    "narrow(0, 0, n)": lambda h, x: h.narrow(0, 0, _count(x)),
    "split([n, 6 - n])": lambda h, x: h.split([_count(x), 6 - _count(x)])[1] * 2,
    "t[n]": lambda h, x: h[_count(x) % 6],
    "t[n, 1:]": lambda h, x: h[_count(x) % 6, 1:],
    "t[:n]": lambda h, x: h[: _count(x)],
    "t[:, n // 2:]": lambda h, x: h[:, _count(x).clamp(max=4) // 2:],
}
#: repeats given as a tensor: their sum is the output's size (``.tolist()``, one guard)
REPEATS: dict[str, Form] = {
    "repeat_interleave(t, repeats, dim=0)": lambda h, x: torch.repeat_interleave(
        h, (x[:, 0] > 0).long() + 1, dim=0),
    "Tensor.repeat_interleave(repeats)": lambda h, x: h.repeat_interleave(
        (x.flatten() > 0).long()),
    "repeat_interleave(t, 0-d repeats, dim=1)": lambda h, x: h.repeat_interleave(
        _count(x), dim=1),
    "repeat_interleave(repeats)": lambda h, x: h[torch.repeat_interleave(
        (x[:, 0] > 0).long() + 1)],
}
SIZES.update(REPEATS)
#: outputs whose shapes follow their input's values, recorded whole (the input is the guard)
WHOLE: dict[str, Form] = {
    "torch.unique": lambda h, x: h[torch.unique(_rows(x).long() * 2)],
    "unique(return_counts=True)": lambda h, x: h[:, torch.unique(
        (x[0] > 0).long(), return_counts=True)[1] - 1],
    "unique_consecutive": lambda h, x: h[torch.unique_consecutive(
        _rows(x).long().cumsum(0))],
    "bincount": lambda h, x: h[:, torch.bincount((x[0] > 0).long()).clamp(max=3)],
}
FORMS.update(WHOLE)
FORMS.update(SIZES)

#: forms PyTorch traces with a fixed shape by itself (``index_put_`` of a scalar through a
#: mask is a ``masked_fill``): nothing to specialise
TRACED_AS_THEY_ARE = {"t[mask] = 0"}
#: forms that use their mask more than once (one guard each)
FORMS_MASKS = {"t[mask] = t[mask] * 2": 2}


class Masked(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.linear = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return self.out(h) + FORMS[self.how](h, x).sum()


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(6, 4), torch.randn(6, 4)) for _ in range(n)]


@pytest.mark.parametrize("how", list(FORMS))
def test_each_mask_form_trains_as_eager_as_the_masks_change(how: str) -> None:
    torch.manual_seed(0)
    model = Masked(how)
    batches = _batches(3)
    graph = capture(model, F.mse_loss, batches[0])
    readers = [g.reader for g in graph.source.guards]
    if how in WHOLE:
        assert readers == ["values"]  # the input's values
    elif how in REPEATS:
        assert readers == ["tolist"]  # the repeats, read in Python
    elif how in SIZES:  # each size, read in Python as int(n)
        assert readers == ["__int__"] * (2 if how == "split([n, 6 - n])" else 1)
    else:
        expected = [] if how in TRACED_AS_THEY_ARE else [MASK_READER] * FORMS_MASKS.get(how, 1)
        assert readers == expected
    train_against_eager(model, F.mse_loss, batches, budget=None, device="cpu")


@pytest.mark.parametrize("how", ["t[row mask]", "t[mask] = t[mask] * 2", "masked_select"])
def test_mask_forms_under_a_plan_that_moves_activations(how: str) -> None:
    """The guard is one more output of the graph: plans that offload or recompute the
    activations around the mask keep it and its step equal to eager's, and the measured
    peak is the predicted one."""
    torch.manual_seed(0)
    for policy in ("offload-all", "outcore-checkpoint"):
        trainer = train_against_eager(Masked(how), F.mse_loss, _batches(3), budget=None,
                                       device="cpu-emulated", policy=policy)
        assert trainer.stats.measured_peak == trainer.stats.predicted_peak


def test_positions_read_forward_and_backward_are_one_storage() -> None:
    """The recorded positions are a constant of the step that the forward's index and the
    backward's index_put both read: two get_attr nodes of one tensor. Each was its own
    storage in the graph, so the predicted peak counted the constant twice and was above the
    measured one (Longformer's sequence classifier: 960 bytes)."""
    torch.manual_seed(0)
    graph = capture(Masked("t[row mask]"), F.mse_loss, _batches(1)[0])
    constants = [t for t in graph.tensors if t.source.startswith("const:")]
    by_target: dict[str, set[int]] = {}
    for t in constants:
        by_target.setdefault(t.source, set()).add(t.storage)
    assert len(constants) > len(by_target)  # a constant read more than once
    assert all(len(storages) == 1 for storages in by_target.values())
    assert sum(t.nbytes for t in constants) == sum(
        graph.tensors[min(s)].nbytes for s in by_target.values())


def deberta_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Hugging Face DeBERTa's sequence-classification loss: the rows whose label is not
    negative, found with ``nonzero`` and gathered."""
    index = (labels >= 0).nonzero()
    kept = torch.gather(logits, 0, index.expand(index.size(0), logits.size(1)))
    return F.cross_entropy(kept, torch.gather(labels, 0, index.view(-1)))


def padded_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A hand-written loss that drops padded labels by a boolean mask."""
    keep = labels != -100
    return F.cross_entropy(logits[keep], labels[keep])


def _labelled(n: int, padded: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(n):
        labels = torch.randint(0, 3, (6,))
        if padded:
            labels[torch.randperm(6)[:2]] = -100
        out.append((torch.randn(6, 4), labels))
    return out


def test_a_mask_that_stays_the_same_is_captured_once() -> None:
    """DeBERTa's labels are never negative: its mask is the same at every step, so the step
    is captured and planned once."""
    torch.manual_seed(0)
    trainer = train_against_eager(nn.Linear(4, 3), deberta_loss, _labelled(4, padded=False),
                                   budget=None, device="cpu")
    assert trainer.stats.captures == 1 and trainer.stats.replans == 0


def test_a_changing_mask_is_captured_again_and_announced_with_the_way_out() -> None:
    torch.manual_seed(0)
    batches = _labelled(3 * MANY_RESPECIALISATIONS, padded=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = train_against_eager(nn.Linear(4, 3), padded_loss, batches, budget=None,
                                       device="cpu")
    assert trainer.stats.replans >= MANY_RESPECIALISATIONS
    (note,) = [w for w in caught if issubclass(w.category, ReplanWarning)]
    message = str(note.message)
    assert "boolean mask of shape (6,)" in message and "torch.where" in message


class WeightedCounts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        counts = torch.bincount((x[:, 0] > 0).long(), weights=x[:, 1])
        return h + counts.sum()


def test_a_shape_from_values_no_rewrite_covers_is_still_refused_with_the_way_out() -> None:
    """``bincount`` by weights makes its shape from values and depends on the weights'
    values too, which no guard of its input covers: refused as before, naming the
    fixed-shape rewrites, with the model untouched."""
    model = WeightedCounts()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CaptureError, match="no shape rule") as err:
        outcore.compile(model, F.mse_loss, _batches(1)[0], budget=None, device="cpu-emulated")
    assert "torch.where(mask, t, 0)" in str(err.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_fake_capture_of_a_mask_is_refused() -> None:
    with pytest.raises(CaptureError, match="fake=True"):
        capture(Masked("t[row mask]"), F.mse_loss, _batches(1)[0], fake=True)


def test_a_split_step_cannot_share_a_masks_positions_and_says_so() -> None:
    """The positions are a constant of the batch's shape: moDNN's sub-batches cannot share
    it, and its refusal names the specialised mask (it blamed the batch layout before)."""
    from outcore.graph.bounds import reference_peaks

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 16 * 16, 10))
    batch = (torch.rand(32, 3, 16, 16), torch.randint(0, 10, (32,)))
    budget = int(reference_peaks(capture(model, deberta_loss, batch)).layer_lower_bound * 0.7)
    with pytest.raises(outcore.InfeasibleBudgetError, match="sub-batches cannot share") as err:
        outcore.compile(model, deberta_loss, batch, budget=budget, device="cpu-emulated",
                        policy="modnn")
    assert "Pass the batch layout" not in str(err.value)
    assert all(p.grad is None for p in model.parameters())


def strict_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Drops padding by a mask, then a loss that refuses any target out of range: run with
    another batch's mask positions, the gathered targets hold padding (-100)."""
    keep = labels != -100
    return F.nll_loss(logits[keep].log_softmax(-1), labels[keep], ignore_index=-1)


def test_a_step_that_raises_on_another_batchs_values_is_captured_again() -> None:
    """The step runs before its guards are compared: with the first batch's positions, the
    second batch's padding reached nll_loss, which raised "Target -100 is out of bounds" to
    the user. Such an error now means a capture for this batch (``StaleSpecialization``)."""
    torch.manual_seed(0)
    batches = []
    for shift in range(3):  # the padding moves from batch to batch
        labels = torch.randint(0, 3, (6,))
        labels[[shift, shift + 3]] = -100
        batches.append((torch.randn(6, 4), labels))
    trainer = train_against_eager(nn.Linear(4, 3), strict_loss, batches, budget=None,
                                   device="cpu")
    assert trainer.stats.captures == 3


def test_an_error_of_the_batchs_own_values_reaches_the_user() -> None:
    """A fresh capture that raises too is the step's own error, not a specialisation."""
    torch.manual_seed(0)
    labels = torch.tensor([0, 1, -100, 2, 0, -100])
    trainer = outcore.compile(nn.Linear(4, 3), strict_loss, (torch.randn(6, 4), labels),
                              budget=None, device="cpu")
    bad = torch.tensor([0, -100, 1, 7, 0, 2])  # 7: out of range for 3 classes, in eager too
    with pytest.raises(IndexError, match="out of bounds"):
        trainer.step(torch.randn(6, 4), bad)


class _Equal(nn.Module):
    """D-FINE's loss asks ``if torch.equal(pred_corners, target_corners)``."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        a, b = x[:, 0] > 0, x[:, 1] > 0
        if self.how == "torch.equal":
            same = torch.equal(a, b)
        elif self.how == "Tensor.equal":
            same = a.equal(b)
        else:  # other shapes: False with no value read
            same = torch.equal(a, b[:-1])
        return h * 2 if same else h


@pytest.mark.parametrize("how", ["torch.equal", "Tensor.equal", "other shapes"])
def test_torch_equal_is_a_value_read(how: str) -> None:
    """``aten.equal`` returns its bool from C++ (D-FINE and DEIMv2 were refused at capture:
    ``DataDependentOutputException``); it is read as ``bool((a == b).all())``, a guard,
    and trains as eager over batches where it holds and where it does not."""
    torch.manual_seed(0)
    same = torch.randn(6, 4)
    same[:, 1] = same[:, 0]
    batches = [(same, torch.randn(6, 4)), (torch.randn(6, 4), torch.randn(6, 4)),
               (same * 2, torch.randn(6, 4))]
    model = _Equal(how)
    readers = [g.reader for g in capture(model, F.mse_loss, batches[0]).source.guards]
    assert readers == ([] if how == "other shapes" else ["__bool__"])
    train_against_eager(model, F.mse_loss, batches, budget=None, device="cpu")

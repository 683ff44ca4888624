"""``F.ctc_loss`` (``nn.CTCLoss``, the loss of Wav2Vec2's, HuBERT's and every CTC head) trains
as eager, bit for bit: its kernel is sized while a step is traced
(``outcore.capture.eager_meta``), its tensor lengths are read with ``.tolist()`` as eager's
``ctc_loss`` reads them, and its reduction is ATen's (``value_shapes.ctc_loss_as_eager``).

Before session 30 every such step was refused at capture: fake tensors carry no shape rule for
``aten._ctc_loss`` (its saved ``log_alpha`` is as wide as the longest target).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from exact import train_against_eager
from torch import nn
from torch.nn import functional as F

from outcore.capture import capture

CLASSES = 6
STEPS = 12
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Acoustic(nn.Module):
    """(batch, time, features) -> log-probabilities (time, batch, classes), as CTC wants."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).log_softmax(-1).transpose(0, 1)


def _lists(lp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.ctc_loss(lp, y, [lp.shape[0]] * lp.shape[1], [y.shape[1]] * lp.shape[1])


def _tensors(reduction: str) -> Loss:
    def loss(lp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        batch = lp.shape[1]
        out = F.ctc_loss(lp, y, torch.full((batch,), lp.shape[0], dtype=torch.long),
                         (y > 0).sum(-1), reduction=reduction)
        return out.sum() if reduction == "none" else out
    return loss


def _wav2vec(lp: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Hugging Face Wav2Vec2ForCTC's loss: padded labels (-100) masked out and concatenated."""
    mask = labels >= 0
    lengths = torch.full((lp.shape[1],), lp.shape[0], dtype=torch.long)
    return F.ctc_loss(lp, labels.masked_select(mask), lengths, mask.sum(-1), blank=0,
                      reduction="mean", zero_infinity=True)


def _module(lp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    lengths = torch.full((lp.shape[1],), lp.shape[0], dtype=torch.long)
    return nn.CTCLoss(reduction="sum")(lp, y, lengths, torch.full_like(lengths, y.shape[1]))


def _too_long(lp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A target no alignment fits (longer than the input): infinite, zeroed."""
    batch = lp.shape[1]
    return F.ctc_loss(lp[:2], y, [2] * batch, [y.shape[1]] * batch, zero_infinity=True)


def _unbatched(lp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.ctc_loss(lp[:, 0], y[0], [lp.shape[0]], [y.shape[1]])


FORMS: dict[str, Loss] = {
    "lengths as lists": _lists,
    "tensor lengths, mean": _tensors("mean"),
    "tensor lengths, sum": _tensors("sum"),
    "tensor lengths, none": _tensors("none"),
    "Wav2Vec2's masked labels": _wav2vec,
    "nn.CTCLoss": _module,
    "zero_infinity": _too_long,
    "unbatched": _unbatched,
}


def _labels(n: int, padded: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(n):
        labels = torch.randint(1, CLASSES, (3, 5))
        if padded:  # a different length per row and per batch
            for row in range(3):
                labels[row, int(torch.randint(2, 6, ())):] = -100
        out.append((torch.randn(3, STEPS, 8), labels))
    return out


@pytest.mark.parametrize("form", list(FORMS))
def test_each_ctc_loss_form_trains_as_eager(form: str) -> None:
    torch.manual_seed(0)
    loss_fn = FORMS[form]
    model, padded = Acoustic(), form == "Wav2Vec2's masked labels"
    if form.startswith("tensor lengths"):  # lengths from the labels: zeros mark the end
        batches = [(x, torch.where(y > 3, 0, y)) for x, y in _labels(3, padded=False)]
    else:
        batches = _labels(3, padded)
    train_against_eager(model, loss_fn, batches, peaks=True, budget=None,
                        device="cpu-emulated")


def test_lengths_given_as_lists_need_no_specialising() -> None:
    graph = capture(Acoustic(), _lists, _labels(1, padded=False)[0])
    assert graph.source.guards == []
    alpha = [t for t in graph.tensors if t.shape == (3, STEPS, 2 * 5 + 1)]
    assert alpha  # the saved log_alpha: batch x time x (2 x longest target + 1)


def test_the_saved_alpha_is_as_wide_as_the_longest_target_padded_or_not() -> None:
    """ATen sizes ``log_alpha`` by the longest target length, also for padded (2-D)
    targets: a rule that took the padded width predicted 768 B more than the kernel
    allocated (the matrix case ctc-loss under keep-all). Each batch whose lengths differ is
    captured again, and its peak is the predicted one."""
    torch.manual_seed(0)
    loss_fn = _tensors("mean")
    batches = []
    for longest in (2, 5, 3):
        y = torch.randint(1, CLASSES, (3, 5))
        y[:, longest:] = 0  # every row as long as ``longest``: (y > 0).sum(-1)
        batches.append((torch.randn(3, STEPS, 8), y))
    graph = capture(Acoustic(), loss_fn, batches[0])
    assert [t for t in graph.tensors if t.shape == (3, STEPS, 2 * 2 + 1)]
    trainer = train_against_eager(Acoustic(), loss_fn, batches, peaks=True, budget=None,
                                  device="cpu-emulated", policy="keep-all")
    assert trainer.stats.captures == 3


def test_tensor_lengths_are_read_as_lists_and_guarded() -> None:
    """The kernel is sized by the longest target: a value."""
    graph = capture(Acoustic(), _wav2vec, _labels(1, padded=True)[0])
    readers = [g.reader for g in graph.source.guards]
    assert readers == ["mask", "tolist", "tolist"]  # the labels' mask, both lengths


def test_the_loss_is_planned_under_a_budget_as_eager() -> None:
    """The saved log_alpha is an activation a plan may move: offloaded everywhere, the step is
    still eager's."""
    torch.manual_seed(0)
    train_against_eager(Acoustic(), _wav2vec, _labels(2, padded=True), peaks=True,
                        budget=None, device="cpu-emulated", policy="offload-all")


def test_ctc_loss_is_torchs_own_outside_a_capture() -> None:
    assert F.ctc_loss.__module__ == "torch.nn.functional"

"""Numbers a step draws from NumPy's or Python's generators (``outcore.capture.host_random``):
a step that depends on them is refused at capture, naming where they are drawn; a step that
draws but does not depend on the draws (a LayerDrop probability of 0) trains as eager.

Before session 30 both kinds were captured with the first draw baked in: a NumPy LayerDrop
and a NumPy SpecAugment-like mask gave the same loss at every step, where eager's changed.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest
import torch
from exact import train_against_eager
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.capture import capture
from outcore.errors import HostRandomError

Draw = Callable[[], float]

#: how a forward draws a number in [0, 1) outside torch (each looked up at the call, as
#: a model's module-level ``np.random.random()`` is)
DRAWS: dict[str, Draw] = {
    "np.random.random()": lambda: np.random.random(),  # noqa: PLW0108
    "np.random.rand()": lambda: float(np.random.rand()),
    "np.random.uniform(0, 1)": lambda: np.random.uniform(0, 1),
    "np.random.rand(1).item()": lambda: np.random.rand(1).item(),
    "random.random()": lambda: random.random(),  # noqa: PLW0108
    "random.uniform(0, 1)": lambda: random.uniform(0, 1),
}


class LayerDrop(nn.Module):
    """Skips its middle layer when a drawn number is below ``p`` (eager LayerDrop)."""

    def __init__(self, draw: str, p: float) -> None:
        super().__init__()
        self.draw, self.p = draw, p
        self.first, self.middle, self.last = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x))
        if not (self.training and DRAWS[self.draw]() < self.p):
            h = h + torch.relu(self.middle(h))
        return self.last(h)


class SpecAugment(nn.Module):
    """Zeroes time steps chosen with NumPy, as Hugging Face's ``_compute_mask_indices``."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        if self.how == "choice":
            starts = np.random.choice(np.arange(h.shape[1] - 2), 2, replace=False)
        elif self.how == "permutation":
            starts = np.random.permutation(h.shape[1] - 2)[:2]
        else:  # a function outcore does not force: the seeds tell the worlds apart
            starts = (np.random.beta(2.0, 2.0, 2) * (h.shape[1] - 2)).astype(int)
        mask = np.zeros(h.shape[:2], dtype=bool)
        for s in starts:
            mask[:, s:s + 2] = True
        return h.masked_fill(torch.from_numpy(mask)[..., None], 0.0)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, 10, 4), torch.randn(3, 10, 4)


def _refused(model: nn.Module) -> HostRandomError:
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(HostRandomError) as err:
        outcore.compile(model, F.mse_loss, _batch(), budget=None, device="cpu")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
    return err.value


@pytest.mark.parametrize("draw", list(DRAWS))
def test_a_layerdrop_drawn_outside_torch_is_refused_naming_the_site(draw: str) -> None:
    message = str(_refused(LayerDrop(draw, p=0.1)))
    assert "test_host_random.py" in message and "layerdrop = 0.0" in message
    assert "torch.rand" in message


@pytest.mark.parametrize("how", ["choice", "permutation", "beta"])
def test_a_mask_drawn_with_numpy_is_refused(how: str) -> None:
    _refused(SpecAugment(how))


@pytest.mark.parametrize("draw", list(DRAWS))
def test_a_draw_the_step_does_not_depend_on_trains_as_eager(draw: str) -> None:
    """LayerDrop at p = 0 still draws at every layer (Wav2Vec2's adapter does): the two
    forced worlds give the same graph, so the capture stands and trains as eager."""
    torch.manual_seed(0)
    train_against_eager(LayerDrop(draw, p=0.0), F.mse_loss, [_batch() for _ in range(3)],
                        budget=None, device="cpu")


def test_an_eval_mode_forward_is_not_refused() -> None:
    """Hugging Face draws only in training mode; a frozen model in eval mode draws
    nothing."""
    model = LayerDrop("np.random.random()", p=0.5).eval()
    capture(model, F.mse_loss, _batch())


def test_the_generators_are_put_back_after_the_check() -> None:
    """The forced worlds put back every function they answered for, and leave the
    generators as the first export left them."""
    originals = (np.random.random, np.random.choice, random.random, random.shuffle)
    np.random.seed(5)
    capture(LayerDrop("np.random.random()", p=0.0), F.mse_loss, _batch())
    drawn_once = np.random.random()  # the next draw after the capture
    np.random.seed(5)
    with pytest.raises(HostRandomError):
        capture(LayerDrop("np.random.random()", p=0.5), F.mse_loss, _batch())
    assert (np.random.random, np.random.choice, random.random, random.shuffle) == originals
    np.random.seed(5)
    capture(LayerDrop("np.random.random()", p=0.0), F.mse_loss, _batch())
    assert np.random.random() == drawn_once  # the same state after the same capture


class ReadsAndDraws(LayerDrop):
    """A LayerDrop that also reads a value in Python (specialised: an eager run and a
    trace, each of which draws)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * 2 if bool((x > 0).any()) else out


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_a_specialised_step_that_draws(p: float) -> None:
    """The check's exports run outside the fake mode the first export keeps open: a
    specialised step's eager run inside it failed with torch's "convert all Tensors to
    FakeTensors" (Wav2Vec2ForCTC, which reads labels.max())."""
    torch.manual_seed(0)
    model = ReadsAndDraws("np.random.random()", p)
    if p:
        _refused(model)
        return
    train_against_eager(model, F.mse_loss, [_batch() for _ in range(2)], budget=None,
                        device="cpu")


class SeededBlocks(nn.Module):
    """Seeds NumPy in its forward, then draws (BigBird's random attention blocks): the same
    draws at every step in eager."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        np.random.seed(7)
        rows = torch.from_numpy(np.random.permutation(x.shape[1])[:4].copy())
        return self.linear(x[:, rows])


def test_draws_after_the_step_seeds_the_generator_itself_are_accepted() -> None:
    torch.manual_seed(0)
    batches = [(torch.randn(3, 10, 4), torch.randn(3, 4, 4)) for _ in range(3)]
    train_against_eager(SeededBlocks(), F.mse_loss, batches, budget=None, device="cpu")


class OwnGenerator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.generator = torch.Generator().manual_seed(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.randn(x.shape, generator=self.generator)


def test_a_torch_generator_of_the_models_own_is_refused_with_the_way_out() -> None:
    """It was refused as "reads the attribute '_opaque_obj0', a Generator, where a tensor
    constant was expected", with advice to report the node kind."""
    with pytest.raises(outcore.CaptureError, match=r"its own torch\.Generator") as err:
        outcore.compile(OwnGenerator(), F.mse_loss, _batch(), budget=None, device="cpu")
    assert "leave out generator=" in str(err.value) and "_opaque_obj" not in str(err.value)

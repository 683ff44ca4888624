"""A forward that rebinds a registered buffer (``self.buf = tensor``) trains as eager does
over several steps (``outcore.capture.rebound``): an exponential average, a running minimum
(I-BERT's ``x_min``), one in the loss module; the rebinding outcore cannot carry (another
shape: a cache sized on first use, as timm's ConViT does) is announced, with the step's
values still eager's. Before, every step read the buffer as it was before the first."""

from __future__ import annotations

import copy
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from exact import assert_grads_equal
from torch import nn

import outcore
from outcore.capture import rebound
from outcore.errors import OutcoreWarning


class Averaged(nn.Module):
    """Inputs centred on their running average, scaled by the running minimum, both
    buffers rebound each step."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.register_buffer("ema", torch.zeros(4))
        self.register_buffer("low", torch.full((), 10.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ema = self.ema * 0.5 + x.detach().mean(0) * 0.5
        self.low = torch.minimum(self.low, x.detach().min())
        return self.linear(x - self.ema) * self.low


class ReadsTheOldBuffer(nn.Module):
    """Keeps the buffer it replaces and reads both afterwards: the old tensor must keep its
    values through the forward (an in-place copy at the rebinding would change them)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.register_buffer("avg", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before = self.avg
        self.avg = before * 0.5 + x.detach().mean(0) * 0.5
        self.avg = self.avg + 1.0  # rebound twice: the last value is carried
        return self.linear(x - before) * self.avg.sum()


class CountingLoss(nn.Module):
    """A loss module whose buffer counts the steps by rebinding, and weighs the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.seen = self.seen + 1
        return F.cross_entropy(out, y) / self.seen


class SizedOnFirstUse(nn.Module):
    """A cache sized to the batch on first use (timm ConViT's ``rel_indices``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.register_buffer("cache", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cache.shape[0] != x.shape[0]:
            self.cache = torch.linspace(0.0, 1.0, x.shape[0])
        return self.linear(x) * self.cache[:, None]


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen))
            for _ in range(n)]


@pytest.mark.parametrize("build", [Averaged, ReadsTheOldBuffer, SizedOnFirstUse])
@pytest.mark.parametrize("counting", [False, True], ids=["loss fn", "loss module"])
def test_rebound_buffers_train_as_eager_step_after_step(build: type[nn.Module],
                                                        counting: bool) -> None:
    torch.manual_seed(0)
    model = build()
    reference = copy.deepcopy(model)
    loss_fn: nn.Module | object = CountingLoss() if counting else F.cross_entropy
    ref_loss = copy.deepcopy(loss_fn)
    batches = _batches(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutcoreWarning)
        trainer = outcore.compile(model, loss_fn, batches[0], budget=None, device="cpu")
    for x, y in batches:
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        loss = trainer.step(x, y)
        expected = ref_loss(reference(x), y)
        expected.backward()
        assert torch.equal(loss, expected.detach())
        assert_grads_equal(model, reference)
        if build is Averaged:  # the carried buffers hold eager's values
            assert torch.equal(model.ema, reference.ema)
            assert torch.equal(model.low, reference.low)
        if build is ReadsTheOldBuffer:
            assert torch.equal(model.avg, reference.avg)
        if counting:
            assert torch.equal(loss_fn.seen, ref_loss.seen)


def test_a_rebinding_that_cannot_be_carried_is_announced() -> None:
    model = SizedOnFirstUse()
    with pytest.warns(OutcoreWarning, match=r"buffer\(s\) cache .*another shape"):
        outcore.capture(model, F.cross_entropy, _batches(1)[0])
    assert model.cache.shape == (1,)  # the capture kept the user's buffer


def test_carried_rebinding_is_not_announced() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutcoreWarning)
        outcore.capture(Averaged(), F.cross_entropy, _batches(1)[0])


def test_setattr_is_torchs_outside_a_capture_and_on_other_threads() -> None:
    original = nn.Module.__setattr__
    model = Averaged()
    seen = []
    registered = model.ema
    with rebound.watching():
        assert nn.Module.__setattr__ is not original

        def elsewhere() -> None:  # another thread: a plain rebinding
            model.ema = torch.ones(4)
            seen.append(model.ema)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert nn.Module.__setattr__ is original
    assert seen[0] is model.ema and model.ema is not registered  # torch's plain rebinding
    model.low = torch.zeros(())
    assert float(model.low) == 0.0

"""linalg ops whose error check PyTorch traces as an ordered side effect (an effect token):
``torch.linalg.cholesky``, ``inv``, ``solve`` (the variants without ``_ex``). A step with
one failed at its first run ("an input outcore cannot bind", found by a differential fuzz in
session 18); ``outcore.capture.effect_tokens`` runs the check plainly, so the step computes
eager's values and still raises where eager raises."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore


class LinalgHead(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a = nn.Linear(16, 4)
        self.w = nn.Parameter(torch.eye(4) + 0.1 * torch.randn(4, 4))
        self.o = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.tanh(self.a(x))
        spd = self.w @ self.w.t() + torch.eye(4)
        if self.kind == "cholesky":
            low = torch.linalg.cholesky(spd)
            z = torch.linalg.solve_triangular(low, z.t(), upper=False).t()
        elif self.kind == "inv":
            z = z @ torch.linalg.inv(spd)
        elif self.kind == "solve":
            z = torch.linalg.solve(spd, z.t()).t()
        else:  # two checks in one step, and a log-determinant
            z = torch.linalg.solve(spd, (z @ torch.linalg.inv(spd)).t()).t()
            z = z + torch.linalg.slogdet(self.w)[1]
        return self.o(z)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(8, 16), torch.randint(0, 5, (8,))


@pytest.mark.parametrize("kind", ["cholesky", "inv", "solve", "two-checks"])
@pytest.mark.parametrize("policy", ["offload-all", "recompute-cheap"])
def test_a_checked_linalg_op_trains_as_eager(kind: str, policy: str) -> None:
    torch.manual_seed(0)
    model = LinalgHead(kind)
    reference = copy.deepcopy(model)
    batch = _batch()
    with outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu-emulated",
                         policy=policy) as trainer:
        loss = trainer.step(*batch)
    expected = F.cross_entropy(reference(batch[0]), batch[1])
    expected.backward()
    assert torch.equal(loss, expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_a_checked_linalg_op_trains_as_eager_through_the_backend() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = LinalgHead("two-checks")
    reference = copy.deepcopy(model)
    x, y = _batch()
    try:
        compiled = torch.compile(model, backend=outcore.backend(budget=None,
                                                                device="cpu-emulated"))
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
    finally:
        torch._dynamo.reset()
    expected = F.cross_entropy(reference(x), y)
    expected.backward()
    assert torch.equal(loss.detach(), expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


class RawCholesky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.eye(4))
        self.o = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = torch.linalg.cholesky(self.w + self.w.t())
        return self.o(x[:, :4] @ low)


def test_the_check_still_raises_where_eager_raises() -> None:
    """w + w^T not positive-definite: eager's cholesky raises, and so does the planned step
    (the check was not dropped with its token)."""
    model = RawCholesky()
    batch = _batch()
    with outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer:
        trainer.step(*batch)
        with torch.no_grad():
            model.w.copy_(-torch.eye(4))
        with pytest.raises(RuntimeError, match="positive-definite"):
            model(batch[0])
        with pytest.raises(RuntimeError, match="positive-definite"):
            trainer.step(*batch)

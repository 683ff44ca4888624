"""What users write around autograd, through outcore.compile and through the torch.compile
backend, against eager PyTorch: their own ``torch.autograd.Function`` (a straight-through
estimator, a gradient-reversal layer, a hand-written backward that is deliberately not the
true derivative), and a parameter changed in place by the forward (``nn.Embedding`` with
``max_norm`` renorms the rows it looks up, under no_grad).

Found by a differential fuzz of model shapes (session 18): through the backend a
``Function.backward``'s ops were tagged forward by aot_autograd, so lowering ran them before
their inputs existed; ``max_norm`` failed in both paths (the mutated weight's tangent was
seeded as the loss's, and its update had no buffer to go to)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.errors import CaptureError, InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Phase, TensorKind


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return g


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lam):  # type: ignore[no-untyped-def]
        ctx.lam = lam
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return -ctx.lam * g, None


class NotTheDerivative(torch.autograd.Function):
    """tanh(x @ w) with twice the true gradient: outcore must run this backward, not its own."""

    @staticmethod
    def forward(ctx, x, w):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x, w)
        return torch.tanh(x @ w)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        x, w = ctx.saved_tensors
        y = torch.tanh(x @ w)
        gy = g * (1 - y * y) * 2.0
        return gy @ w.t(), x.t() @ gy


class UserFunctions(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.a = nn.Linear(16, 32)
        self.w = nn.Parameter(torch.randn(32, 32) * 0.1)
        self.b = nn.Linear(32, 32)
        self.o = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.kind == "ste":
            h = RoundSTE.apply(h)
        elif self.kind == "grl":
            h = GradReverse.apply(torch.relu(h), 0.5) + torch.relu(h).detach() * 0
        else:
            h = NotTheDerivative.apply(h, self.w)
        return self.o(torch.tanh(self.b(torch.relu(h))))


class RenormedEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e = nn.Embedding(50, 16, max_norm=1.0, padding_idx=0)
        self.o = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.tanh(self.e(x)).mean(1))


KINDS = ["ste", "grl", "not-the-derivative"]


def _vectors() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(64, 16) * 2, torch.randint(0, 5, (64,))


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randint(0, 50, (64, 12)), torch.randint(0, 5, (64,))


def _model(make):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return make()


def _eager(model: nn.Module, batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    loss = F.cross_entropy(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach()


def _assert_same(model: nn.Module, reference: nn.Module) -> None:
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.detach(), q.detach()), f"{name} differs from eager after the step"
        if q.grad is None:  # unused by this model (``w`` outside NotTheDerivative)
            assert p.grad is None, f"{name} got a gradient eager does not give it"
        else:
            assert p.grad is not None and torch.equal(p.grad, q.grad), \
                f"gradient of {name} differs from eager"


def _trainer_step(make, batch, policy: str):  # type: ignore[no-untyped-def]
    model, reference = _model(make), _model(make)
    graph = outcore.capture(copy.deepcopy(model), F.cross_entropy, batch)
    peaks = reference_peaks(graph)
    budget = int(peaks.layer_lower_bound + 0.5 * (peaks.liveness - peaks.layer_lower_bound))
    try:
        trainer = outcore.compile(model, F.cross_entropy, batch, budget=budget,
                                  device="cpu-emulated", policy=policy)
    except InfeasibleBudgetError as exc:  # below what this policy reaches: its own lowest
        budget = exc.required
        trainer = outcore.compile(model, F.cross_entropy, batch, budget=budget,
                                  device="cpu-emulated", policy=policy)
    with trainer:
        loss = trainer.step(*batch)
        stats = trainer.stats
    assert torch.equal(loss, _eager(reference, batch))
    _assert_same(model, reference)
    assert stats.measured_peak == stats.predicted_peak <= budget


def _backend_step(make, batch):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    model, reference = _model(make), _model(make)
    be = outcore.backend(budget="1MiB", policy="offload-all", device="cpu-emulated")
    try:
        compiled = torch.compile(model, backend=be, dynamic=False)
        loss = F.cross_entropy(compiled(batch[0]), batch[1])
        loss.backward()
    finally:
        torch._dynamo.reset()
    assert torch.equal(loss.detach(), _eager(reference, batch))
    _assert_same(model, reference)
    return be


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", ["outcore-auto", "offload-all", "recompute-cheap"])
def test_a_user_function_trains_as_eager(kind: str, policy: str) -> None:
    _trainer_step(lambda: UserFunctions(kind), _vectors(), policy)


@pytest.mark.parametrize("kind", KINDS)
def test_a_user_function_trains_as_eager_through_the_backend(kind: str) -> None:
    be = _backend_step(lambda: UserFunctions(kind), _vectors())
    graph = be.graphs[0].planned.graph
    # the class: no op that reads a tangent or a gradient is a forward op
    for op in graph.ops:
        kinds = {graph.tensors[t].kind for t in op.inputs}
        if kinds & {TensorKind.TANGENT, TensorKind.GRADIENT}:
            assert op.phase is Phase.BACKWARD, f"{op.name} reads the backward's values"


@pytest.mark.parametrize("policy", ["outcore-auto", "offload-all", "recompute-cheap"])
def test_an_embedding_renormed_in_place_trains_as_eager(policy: str) -> None:
    _trainer_step(RenormedEmbedding, _tokens(), policy)


def test_an_embedding_renormed_in_place_trains_as_eager_through_the_backend() -> None:
    _backend_step(RenormedEmbedding, _tokens())


def test_the_renorm_changes_the_weight() -> None:
    """The comparison above could not fail on the weight if eager left it unchanged."""
    model = _model(RenormedEmbedding)
    before = model.e.weight.detach().clone()
    _eager(model, _tokens())
    assert not torch.equal(before, model.e.weight.detach())


def test_sparse_gradients_are_refused_with_what_to_do() -> None:
    class Sparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e = nn.Embedding(50, 16, sparse=True)
            self.o = nn.Linear(16, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.o(self.e(x).mean(1))

    with pytest.raises(CaptureError, match="sparse=False"):
        outcore.capture(_model(Sparse), F.cross_entropy, _tokens())


class NormalizesInPlace(nn.Module):
    """Standardises its batch in place (``x.sub_(...).div_(...)``), as some data pipelines
    folded into a model do: eager leaves the caller's tensor changed."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.o = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.sub_(x.mean(0)).div_(2.0)
        return self.o(torch.tanh(self.a(x)))


@pytest.mark.parametrize("policy", ["outcore-auto", "offload-all"])
def test_a_batch_changed_in_place_is_changed_as_eager(policy: str) -> None:
    model, reference = _model(NormalizesInPlace), _model(NormalizesInPlace)
    x, y = _vectors()
    ours, theirs = x.clone(), x.clone()
    with outcore.compile(model, F.cross_entropy, (x.clone(), y), budget=None,
                         device="cpu-emulated", policy=policy) as trainer:
        loss = trainer.step(ours, y)
    assert torch.equal(loss, _eager(reference, (theirs, y)))
    _assert_same(model, reference)
    assert not torch.equal(theirs, x)  # eager changed it, so the comparison can fail
    assert torch.equal(ours, theirs)

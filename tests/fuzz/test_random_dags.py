"""Fuzzing the whole path (issue 19, point 6): hypothesis builds random DAG modules (linear,
conv, norms, dropout, add, cat, split, views, transposes, matmul, softmax, in-place ops,
fan-out and joins); each is captured, planned by a policy at a random budget, run on the
CPU-emulated device whose capacity is the budget: gradients equal eager's and the measured
peak equals the predicted peak. The default run is small; ``-m slow`` runs more."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.runtime.devices import EmulatedDevice
from outcore.runtime.executor import Executor

D = 8  # feature width of every node: (batch, D)
KINDS = ("linear", "conv", "layernorm", "batchnorm", "dropout", "add", "cat", "split", "view",
         "transpose", "matmul", "softmax", "inplace")
POLICIES = [p for p in outcore.policies() if p != "modnn"]


class RandomDag(nn.Module):
    """Node 0 is the input; node i applies ``spec[i-1] = (kind, a, b)`` to earlier nodes a, b
    (fan-out: a node may be read many times); the output sums every node no one read."""

    def __init__(self, spec: list[tuple[str, int, int]]) -> None:
        super().__init__()
        self.spec = spec
        self.layers = nn.ModuleList()
        for kind, _, _ in spec:
            self.layers.append({
                "linear": nn.Linear(D, D), "conv": nn.Conv1d(1, 1, 3, padding=1),
                "layernorm": nn.LayerNorm(D), "batchnorm": nn.BatchNorm1d(D),
                "dropout": nn.Dropout(0.3), "cat": nn.Linear(2 * D, D),
            }.get(kind, nn.Identity()))
        self.w = nn.Parameter(torch.randn(D, D) / D)
        self.head = nn.Linear(D, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = [x]
        read: set[int] = set()
        for (kind, a, b), layer in zip(self.spec, self.layers, strict=True):
            u, v = nodes[a], nodes[b]
            read |= {a, b}
            if kind in ("linear", "layernorm", "batchnorm", "dropout"):
                out = layer(u)
            elif kind == "conv":
                out = layer(u.unsqueeze(1)).squeeze(1)
            elif kind == "add":
                out = u + v
            elif kind == "cat":
                out = layer(torch.cat([u, v], dim=1))
            elif kind == "split":
                lo, hi = u.split(D // 2, dim=1)
                out = torch.cat([hi * 2, lo], dim=1)
            elif kind == "view":
                out = u.view(-1, 2, D // 2).flip(1).reshape(-1, D)
            elif kind == "transpose":
                out = u.view(-1, 2, D // 2).transpose(1, 2).reshape(-1, D)
            elif kind == "matmul":
                out = u @ self.w
            elif kind == "softmax":
                out = F.softmax(u, dim=1) * v
            else:  # in-place on a fresh tensor
                out = (u * 1.5).relu_()
            nodes.append(out)
        leaves = [n for i, n in enumerate(nodes) if i not in read and i > 0] or nodes[-1:]
        return self.head(torch.stack(leaves).sum(0))


@st.composite
def dags(draw: st.DrawFn, kinds: tuple[str, ...] = KINDS) -> list[tuple[str, int, int]]:
    n = draw(st.integers(2, 9))
    spec = []
    for i in range(n):
        kind = draw(st.sampled_from(kinds))
        spec.append((kind, draw(st.integers(0, i)), draw(st.integers(0, i))))
    return spec


def check(spec: list[tuple[str, int, int]], policy: str, fraction: float, seed: int) -> None:
    torch.manual_seed(seed)
    model = RandomDag(spec)
    batch = (torch.randn(4, D), torch.randint(0, 3, (4,)))
    reference = copy.deepcopy(model)
    graph = capture(model, F.cross_entropy, batch)
    in_core = outcore.plan(graph, None, policy="keep-all", simulate=False).predicted_peak
    budget = int(in_core * fraction)
    try:
        planned = outcore.plan(graph, budget, policy=policy, simulate=False)
    except InfeasibleBudgetError:
        return  # a refusal names its bound; planning below it is not the point here
    rng = torch.get_rng_state()
    loss = F.cross_entropy(reference(batch[0]), batch[1])
    loss.backward()
    torch.set_rng_state(rng)
    with EmulatedDevice(budget, 1e9, 1e9, slowdown=2.0) as device:
        result = Executor(planned.graph, planned.schedule, device).run(batch)
    assert result.peak_bytes == planned.predicted_peak <= budget, result.peak_bytes
    assert torch.allclose(result.loss, loss.detach(), atol=1e-6), (result.loss, loss)
    assert torch.allclose(result.loss, loss.detach(), atol=1e-6)
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if q.grad is None:  # a parameter the drawn graph never reads
            assert p.grad is None or not p.grad.any(), n
            continue
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4), n


FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "derandomize": True}


@settings(max_examples=12, **FUZZ)
@given(spec=dags(), policy=st.sampled_from(POLICIES), fraction=st.floats(0.3, 1.0),
       seed=st.integers(0, 2**16))
def test_random_dags_match_eager(spec, policy, fraction, seed):
    check(spec, policy, fraction, seed)


@pytest.mark.slow
@settings(max_examples=400, **FUZZ)
@given(spec=dags(), policy=st.sampled_from(POLICIES), fraction=st.floats(0.3, 1.0),
       seed=st.integers(0, 2**16))
def test_random_dags_match_eager_long(spec, policy, fraction, seed):
    check(spec, policy, fraction, seed)


def test_regression_parameter_unused_by_the_drawn_graph():
    """Minimised: a parameter no op reads has no gradient in eager (the test compared None)."""
    check([("linear", 0, 0), ("linear", 0, 0)], "keep-all", 1.0, 0)


def test_regression_masked_output_is_not_counted():
    """Minimised: BatchNorm1d on the step's input. Its backward runs with output_mask
    [False, True, True]; the fake kernel still reported a (4, 8) input gradient, which the
    real one never allocates, so the plan predicted 128 B more than was measured (fixed in
    capture: masked outputs are not graph tensors)."""
    check([("linear", 0, 0), ("batchnorm", 0, 0)], "keep-all", 1.0, 0)

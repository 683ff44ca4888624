"""One corpus model, one training step under one policy, compared with eager PyTorch.

``check(case, policy)`` builds the model twice from one seed, runs one eager step and one step
through ``outcore.compile`` on ``cpu-emulated`` at half the model's in-core peak (``liveness``:
everything kept, freed at last use), and returns what differs: the loss, each gradient, each
buffer (BatchNorm statistics updated once), and whether the measured peak equals the
predicted one within the budget. ``policy="backend"`` runs the step through
``torch.compile(model, backend=outcore.backend(...))`` instead.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import outcore
from outcore.capture.batching import call_model, loss_of, step_loss

from corpus import Case

POLICIES = ["outcore-auto", "offload-all", "recompute-cheap", "superneurons", "pooch", "modnn",
            "backend"]


@dataclass
class Outcome:
    """What one (model, policy) pair showed; ``ok`` when nothing differs."""

    case: str
    policy: str
    budget: int = 0
    predicted: int = 0
    measured: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def in_core_peak(case: Case) -> tuple[int, int, int]:
    """(ops, in-core peak, budget): the peak with everything kept and freed at last use, and
    the budget the corpus runs at: halfway between the layer-wise lower bound (parameters,
    inputs, the largest op) and that peak. At tiny sizes parameters and gradients are most
    of the peak, so half the peak itself is below what any policy can reach."""
    from outcore.graph.bounds import reference_peaks

    model = case.build()
    graph = outcore.capture(model, case.loss_fn, case.batch())
    planned = outcore.plan(graph, None, policy="liveness", simulate=False)
    floor = reference_peaks(graph).layer_lower_bound
    peak = planned.predicted_peak
    return len(graph.ops), peak, floor + (peak - floor) // 2


def eager_step(model: nn.Module, case: Case, batch: Any) -> torch.Tensor:
    model.train()
    torch.manual_seed(7)
    loss = step_loss(model, case.loss_fn, batch)
    loss.backward()
    return loss.detach()


def tied_parameters(model: nn.Module) -> set[int]:
    """ids of parameters reachable under more than one name (tied embeddings)."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {pid for pid, count in seen.items() if count > 1}


def _same_grad(p: torch.Tensor, q: torch.Tensor, tied: bool) -> bool:
    """Bit-exact, except for a tied parameter used three times or more: the joint graph
    sums its gradient contributions in another order than eager autograd's engine does,
    which changes the float rounding of the sum (never more than a few ulps)."""
    if torch.equal(p, q):
        return True
    return tied and torch.allclose(p, q, rtol=1e-5, atol=1e-7)


def _compare(outcome: Outcome, model: nn.Module, reference: nn.Module, loss: torch.Tensor,
             expected: torch.Tensor) -> None:
    if not torch.equal(loss, expected):
        outcome.problems.append(f"loss {float(loss)} != eager {float(expected)}")
    tied = tied_parameters(model)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if (p.grad is None) != (q.grad is None):
            outcome.problems.append(f"grad of {name}: {p.grad is None} vs eager "
                                    f"{q.grad is None} for None")
        elif p.grad is not None and not _same_grad(p.grad, q.grad, id(p) in tied):
            diff = float((p.grad - q.grad).abs().max())
            outcome.problems.append(f"grad of {name} differs by {diff:.3g}")
    for (name, b), c in zip(model.named_buffers(), reference.buffers(), strict=True):
        if not torch.equal(b, c):
            outcome.problems.append(f"buffer {name} differs from eager")


def check(case: Case, policy: str, budget: int) -> Outcome:
    """One step of ``case`` under ``policy`` within ``budget`` bytes, against eager.

    A policy that cannot reach ``budget`` (InfeasibleBudgetError) is run again at the least
    budget it named; ``Outcome.budget`` records the budget the step ran at."""
    try:
        return _check(case, policy, budget)
    except outcore.InfeasibleBudgetError as err:
        return _check(case, policy, err.required)


def _check(case: Case, policy: str, budget: int) -> Outcome:
    model = case.build()
    reference = copy.deepcopy(model)
    batch = case.batch()
    expected = eager_step(reference, case, batch)
    outcome = Outcome(case.name, policy, budget)
    if policy == "backend":
        loss = _backend_step(model, case, batch, budget, outcome)
    else:
        trainer = outcore.compile(model, case.loss_fn, batch, budget=budget,
                                  device="cpu-emulated", policy=policy)
        try:
            torch.manual_seed(7)
            loss = trainer.step(batch)
        finally:
            trainer.close()
        outcome.predicted = trainer.stats.predicted_peak
        outcome.measured = trainer.stats.measured_peak
    if outcome.measured != outcome.predicted:
        outcome.problems.append(f"measured peak {outcome.measured} != predicted "
                                f"{outcome.predicted}")
    if outcome.predicted > budget:
        outcome.problems.append(f"predicted peak {outcome.predicted} > budget {budget}")
    _compare(outcome, model, reference, loss, expected)
    return outcome


def _backend_step(model: nn.Module, case: Case, batch: Any, budget: int,
                  outcome: Outcome) -> torch.Tensor:
    torch._dynamo.reset()
    be = outcore.backend(budget, device="cpu-emulated")
    compiled = torch.compile(model, backend=be, dynamic=False)
    try:
        torch.manual_seed(7)
        if case.loss_fn is None:
            loss = loss_of(call_model(compiled, batch))
        else:
            x, y = batch
            loss = case.loss_fn(call_model(compiled, x), y)
        loss.backward()
    finally:
        be.close()
        torch._dynamo.reset()
    if be.graphs:
        outcome.predicted = max(g.stats.predicted_peak for g in be.graphs)
        outcome.measured = max(g.stats.measured_peak for g in be.graphs)
    return loss.detach()

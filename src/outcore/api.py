"""The user-facing Python API: plan a captured step, or compile a model into a trainer.

    >>> import torch, outcore
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> batch = (torch.randn(4, 8), torch.tensor([0, 1, 1, 0]))
    >>> trainer = outcore.compile(net, torch.nn.functional.cross_entropy, batch,
    ...                           budget="64KiB", device="cpu")
    >>> loss = trainer.step(*batch)          # gradients are now in net's .grad
    >>> trainer.stats.measured_peak <= trainer.budget
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.policies.registry import PolicyContext, get
from outcore.units import parse_bytes

DEFAULT_GPU = "v100-pcie"
DEFAULT_POLICY = "outcore-auto"


def cost_model_for(gpu: str | None) -> Any:
    """The analytic cost model of a named hardware profile (default ``v100-pcie``).

    Operator variants are timed with the assumed GPU ratios of
    ``outcore.cost.gpu_variants`` on GPU profiles, and with this CPU's measured ratios on
    ``this-cpu``.
    """
    from outcore.cost.model import AnalyticCostModel
    from outcore.cost.profiles import get_profile
    from outcore.cost.variant_costs import ASSUMED_GPU, RECORDED

    name = gpu or DEFAULT_GPU
    variants = RECORDED if name == "this-cpu" else ASSUMED_GPU
    return AnalyticCostModel(get_profile(name), variants=variants)


def _policy_name(policy: str) -> str:
    return DEFAULT_POLICY if policy == "auto" else policy


@dataclass
class PlannedStep:
    """A graph, what a policy decided for it, and the Schedule that carries it out.

    Attributes:
        graph: the graph the schedule runs on (a sub-batch graph if ``plan.sub_batches > 1``).
        plan: per-tensor decisions and their reasons.
        schedule: the instruction list the simulator and the executor run.
        predicted_peak: device bytes at the schedule's peak (what the executor will measure).
        budget: the budget planned for, in bytes (None = unbounded).
        simulation: the simulated step on the cost model's GPU (a ``SimResult``), if any.
    """

    graph: Graph
    plan: Plan
    schedule: Schedule
    predicted_peak: int
    budget: int | None
    simulation: Any = None

    def explain(self) -> list[dict[str, Any]]:
        """Per activation: name, bytes, producer, decision and why (one dict per tensor)."""
        rows = []
        for t in self.graph.activations():
            producer = self.graph.producer_op(t.id)
            rows.append({"tensor": t.name, "bytes": t.nbytes, "producer": producer.target,
                         "category": str(producer.category),
                         "decision": str(self.plan.decision(t.id)),
                         "why": self.plan.reasons.get(t.id, "kept (not named by the policy)")})
        return rows

    def counts(self) -> dict[str, int]:
        """How many activations each decision got."""
        result = {str(d): 0 for d in Decision}
        for t in self.graph.activations():
            result[str(self.plan.decision(t.id))] += 1
        return result


def plan(graph: Graph, budget: int | str | None = None, *, policy: str = "auto",
         gpu: str | None = None, cost: Any = None,
         recapture: Callable[[int], Graph] | None = None, simulate: bool = True,
         **options: Any) -> PlannedStep:
    """Plan ``graph`` under ``budget`` with ``policy``; nothing runs.

    Args:
        graph: from ``outcore.capture`` (real or fake).
        budget: bytes, or a string such as "12GB" or "11.5GiB"; None plans without a bound.
        policy: a name from ``outcore.policies()``; "auto" is ``outcore-auto``.
        gpu: a hardware profile name for the cost model (default "v100-pcie").
        cost: a cost model to use instead of the GPU profile's analytic one.
        recapture: ``k -> Graph`` captured at batch/k, for policies that split the batch.
        simulate: also simulate the schedule on the cost model (fills ``.simulation``).
        options: policy-specific options (see each policy's docstring).

    Raises:
        InfeasibleBudgetError: the budget is below what the policy can reach, or below the
            layer-wise lower bound (the message names the bound and what to change).
        ValueError: unknown policy, or an unreadable budget.
    """
    limit = None if budget is None else parse_bytes(budget)
    name = _policy_name(policy)
    info = get(name)
    if limit is not None:
        bound = reference_peaks(graph).layer_lower_bound
        if limit < bound and recapture is None:
            raise InfeasibleBudgetError(
                name, limit, bound,
                "That is the layer-wise lower bound (parameters, inputs and the largest single "
                "op's tensors); no policy goes below it at this batch. Shrink the batch, let a "
                "sub-batching policy (modnn) split it, or raise the budget.")
    model = cost if cost is not None else cost_model_for(gpu)
    ctx = PolicyContext(budget=limit, cost=model, recapture=recapture, options=options)
    out = info.fn(graph, ctx)
    peak = predicted_peak(out.graph, out.schedule)
    if limit is not None and peak > limit:
        raise InfeasibleBudgetError(name, limit, peak, "This policy ignores budgets or cannot "
                                    "move enough; try policy='auto'.")
    result = PlannedStep(out.graph, out.plan, out.schedule, peak, limit)
    if simulate:
        from outcore.sim import simulate as run_simulation

        result.simulation = run_simulation(out.graph, out.schedule, model)
    return result


def policies() -> list[str]:
    """Every policy name ``plan``/``compile`` accept (plus "auto" for outcore-auto)."""
    from outcore.policies.registry import names

    return names()


def __getattr__(name: str) -> Any:
    """``Trainer``, ``TrainerStats`` and ``compile`` live in ``outcore.trainer`` (which imports
    this module); they are re-exported here lazily."""
    if name in ("Trainer", "TrainerStats", "compile"):
        from outcore import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

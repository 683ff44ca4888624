"""The policy registry: every policy turns (Graph, budget, CostModel) into a Plan and a
Schedule, so all of them are run, simulated and benchmarked side by side.

A policy is a callable ``policy(graph, ctx) -> PolicyOutput``. ``ctx`` carries the budget
(bytes or None), the cost model, and ``recapture(sub_batches) -> Graph`` for policies that
split the batch (moDNN); it is None when the graph cannot be re-captured (loaded from JSON).
Policies that decide dynamically (offload on allocation failure, LRU caches) build their
Schedule themselves; others return a Plan and let ``outcore.plan.lower`` build it. Either
way the Schedule must pass ``outcore.plan.verify``. A policy that cannot meet the budget
raises ``InfeasibleBudgetError`` naming itself, the budget and the least memory it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.plan import Plan
from outcore.plan.schedule import Schedule


@dataclass
class PolicyContext:
    """What a policy may use besides the graph."""

    budget: int | None = None
    cost: Any = None  # an outcore.cost.model.CostModel
    recapture: Callable[[int], Graph] | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PolicyOutput:
    """A policy's decisions and the schedule that carries them out.

    ``graph`` is the graph the schedule runs on: the input graph, or a re-captured
    sub-batch graph when ``plan.sub_batches > 1``.
    """

    plan: Plan
    schedule: Schedule
    graph: Graph


PolicyFn = Callable[[Graph, PolicyContext], PolicyOutput]


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    fn: PolicyFn
    description: str
    paper: str = ""


_REGISTRY: dict[str, PolicyInfo] = {}


def register(name: str, description: str, paper: str = "") -> Callable[[PolicyFn], PolicyFn]:
    """Decorator: make ``fn`` selectable as ``policy=name``."""

    def wrap(fn: PolicyFn) -> PolicyFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"policy {name!r} is registered twice")
        _REGISTRY[name] = PolicyInfo(name, fn, description, paper)
        return fn

    return wrap


def from_plan(fn: Callable[[Graph], Plan]) -> PolicyFn:
    """Adapt a ``graph -> Plan`` function (no budget logic) into a policy."""

    def policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
        plan = fn(graph)
        plan.budget = ctx.budget
        return PolicyOutput(plan, lower(graph, plan), graph)

    policy.__doc__ = fn.__doc__
    policy.__name__ = fn.__name__
    return policy


def get(name: str) -> PolicyInfo:
    """The policy called ``name``; ValueError lists the known names."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(names())}")
    return _REGISTRY[name]


def names() -> list[str]:
    """Every registered policy name, in registration order."""
    _load_builtin()
    return list(_REGISTRY)


def _load_builtin() -> None:
    import importlib

    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a policy module not written yet
            if exc.name != module:
                raise


#: Modules whose import registers policies. Each policy lives in its own module.
BUILTIN_MODULES = [
    "outcore.policies.baseline_registry",
    "outcore.policies.vdnn",
    "outcore.policies.superneurons",
    "outcore.policies.modnn",
    "outcore.policies.pooch",
    "outcore.policies.dymem",
    "outcore.policies.optimal.policy",
    "outcore.policies.auto",
]

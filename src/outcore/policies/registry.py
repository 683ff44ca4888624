"""The policy registry: every policy turns (Graph, budget, CostModel) into a Plan and a
Schedule, so all of them are run, simulated and benchmarked side by side.

A policy is a callable ``policy(graph, ctx) -> PolicyOutput`` (the one signature). ``ctx``
carries the budget (bytes or None), the cost model, ``recapture(sub_batches) -> Graph`` for
policies that split the batch (moDNN; None when the graph cannot be re-captured) and the
policy's typed, frozen configuration (``ctx.config_as(ItsConfig)``, built from
``ctx.options`` and validated against the config class registered with the policy:
``config_for(name, options)`` does that check before anything is captured).

Policies that decide dynamically (offload on allocation failure, LRU caches) build their
Schedule themselves; others return a Plan and let ``outcore.plan.lower`` build it. Either
way the Schedule must pass ``outcore.plan.verify``. A policy that cannot meet the budget
raises ``InfeasibleBudgetError`` naming itself, the budget and the least memory it needs;
never another error for infeasibility.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from outcore.errors import UnknownPolicyError
from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.policies.config import PolicyConfig

C = TypeVar("C", bound=PolicyConfig)


@dataclass
class PolicyContext:
    """What a policy may use besides the graph.

    ``options`` is the user's spelling; ``config`` the typed configuration (set by
    ``outcore.plan``; when None, ``config_as`` parses ``options``).
    """

    budget: int | None = None
    cost: Any = None  # an outcore.cost.model.CostModel
    recapture: Callable[[int], Graph] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    config: PolicyConfig | None = None
    host_budget: int | None = None  # bytes host copies may hold (None: no limit)
    #: the user opted into sub-batches that change the step (``allow_sub_batches=True`` or
    #: naming moDNN through ``outcore.plan``/``compile``, which warn and say so in notes):
    #: a split may then compute batch statistics per sub-batch (BatchNorm)
    split_changes_ok: bool = False

    def config_as(self, kind: type[C]) -> C:
        """This context's configuration as ``kind`` (parsing ``options`` if not set yet);
        PolicyOptionError on an unknown option or a bad value."""
        if isinstance(self.config, kind):
            return self.config
        return kind.parse(self.options)


@dataclass
class PolicyOutput:
    """A policy's result: decisions (with their reasons), the schedule that carries them
    out, and what is known of it.

    ``graph`` is the graph the schedule runs on: the input graph, or a re-captured
    sub-batch graph when ``plan.sub_batches > 1``. ``predicted_peak`` (device bytes under
    the memory rule), ``step_time`` (simulated seconds) and ``bound`` (a lower bound on the
    peak or on the step time a policy proves, e.g. an optimal planner's) are filled where
    known (``outcore.plan`` computes the peak and the simulation for every policy on its
    ``PlannedStep``, and checks a filled ``predicted_peak`` against the memory rule).
    ``notes`` are lines for ``explain`` (e.g. which portfolio candidate won).
    ``trace`` (the memory rule's ``MemoryTrace`` of ``schedule`` on ``graph``) and
    ``simulation`` (``outcore.sim.simulate``'s result on the context's cost model) are
    filled where the policy computed exactly those (outcore-auto's portfolio does for its
    winner); ``outcore.plan`` then reuses them instead of replaying the schedule again.
    Whoever fills them must not change ``graph`` or ``schedule`` afterwards.
    """

    plan: Plan
    schedule: Schedule
    graph: Graph
    predicted_peak: int | None = None
    step_time: float | None = None
    bound: float | None = None
    notes: list[str] = field(default_factory=list)
    trace: Any = None
    simulation: Any = None

    @property
    def decisions(self) -> dict[int, Decision]:
        return self.plan.decisions

    @property
    def reasons(self) -> dict[int, str]:
        return self.plan.reasons


PolicyFn = Callable[[Graph, PolicyContext], PolicyOutput]


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    fn: PolicyFn
    description: str
    paper: str = ""
    config: type[PolicyConfig] = PolicyConfig


_REGISTRY: dict[str, PolicyInfo] = {}


def register(name: str, description: str, paper: str = "",
             config: type[PolicyConfig] = PolicyConfig) -> Callable[[PolicyFn], PolicyFn]:
    """Decorator: make ``fn`` selectable as ``policy=name``, configured by ``config``."""

    def wrap(fn: PolicyFn) -> PolicyFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"policy {name!r} is registered twice")
        _REGISTRY[name] = PolicyInfo(name, fn, description, paper, config)
        return fn

    return wrap


def from_plan(fn: Callable[[Graph], Plan]) -> PolicyFn:
    """Adapt a ``graph -> Plan`` function (no budget logic, no options) into a policy."""

    def policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
        ctx.config_as(PolicyConfig)  # rejects any option
        plan = fn(graph)
        plan.budget = ctx.budget
        return PolicyOutput(plan, lower(graph, plan), graph)

    policy.__doc__ = fn.__doc__
    policy.__name__ = fn.__name__
    return policy


def get(name: str) -> PolicyInfo:
    """The policy called ``name``; UnknownPolicyError (a ValueError) lists the known names."""
    _load_builtin()
    if name not in _REGISTRY:
        raise UnknownPolicyError(name, f"one of {', '.join(names())}",
                                 "List them with `outcore policies`.")
    return _REGISTRY[name]


def names() -> list[str]:
    """Every registered policy name, in registration order."""
    _load_builtin()
    return list(_REGISTRY)


def config_for(name: str, options: Mapping[str, Any] | None = None) -> PolicyConfig:
    """The typed configuration of policy ``name`` (``"auto"`` = outcore-auto) for
    ``options`` (values may be strings, as ``--option key=value`` gives them).

    Raises UnknownPolicyError for an unknown policy, PolicyOptionError for an option the
    policy does not have (listing those it has) or a bad value (listing the valid ones); both
    are ValueErrors. Call it before capturing anything.
    """
    info = get("outcore-auto" if name == "auto" else name)
    return info.config.parse(dict(options or {}), info.name)


def _load_builtin() -> None:
    import importlib

    for module in BUILTIN_MODULES:
        importlib.import_module(module)


#: Packages whose import registers policies: one subpackage per paper, the baselines and
#: outcore's own. A new planner adds its package here.
BUILTIN_MODULES = [
    "outcore.policies.baseline",
    "outcore.policies.vdnn",
    "outcore.policies.superneurons",
    "outcore.policies.modnn",
    "outcore.policies.pooch",
    "outcore.policies.dymem",
    "outcore.policies.optimal.policy",
    "outcore.policies.auto",
]

"""What a policy that decides from a timeline needs from its context (PoocH, Dymem, moDNN).

``budget_of`` is ``ctx.budget``, else the device memory of the cost model's hardware profile;
``cost_of`` is ``ctx.cost``. Both raise an ``InvalidArgumentError`` (a ``ValueError``) naming
the policy and what to pass when the context lacks it: a missing input is a bad argument,
never an infeasible budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outcore.errors import InvalidArgumentError, InvalidBudgetError

if TYPE_CHECKING:
    from outcore.policies.registry import PolicyContext


def budget_of(ctx: PolicyContext, name: str) -> int:
    """``ctx.budget``, else the cost model's device memory (``cost.profile.memory``)."""
    if ctx.budget is not None:
        return int(ctx.budget)
    memory = getattr(getattr(ctx.cost, "profile", None), "memory", None)
    if memory is None:
        raise InvalidBudgetError(None, "a budget in bytes, or a cost model with a hardware "
                                 "profile whose memory is the budget",
                                 f"{name} schedules for a memory budget: pass budget=...")
    return int(memory)


def cost_of(ctx: PolicyContext, name: str) -> Any:
    """``ctx.cost``; ``name`` decides from op and transfer times, so it needs one."""
    if ctx.cost is None:
        raise InvalidArgumentError(None, "a cost model (ctx.cost)",
                                   f"{name} decides from op and transfer times (the paper's "
                                   "profiling step): pass cost=... or a gpu profile.")
    return ctx.cost

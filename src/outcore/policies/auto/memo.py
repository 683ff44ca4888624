"""One run of each shared planner per portfolio run (``plan_memo``, ``memoized``).

outcore-optimal warm-starts its search from outcore-checkpoint's and the greedy planner's
plans, and both are also candidates of outcore-auto's portfolio. Inside ``plan_memo()`` (the
portfolio opens one around its candidates) the first call of ``memoized(name, graph, budget,
cost, make)`` runs ``make()`` and every later call with the same name, graph, budget and cost
object returns the same result (or raises the same InfeasibleBudgetError), so each planner
runs once per ``outcore.plan`` call. Outside a ``plan_memo()`` block ``make()`` always runs.

Invariants: the memo lives only while its outermost block is open (nothing is kept between
``outcore.plan`` calls, so no stale plan is ever returned); keys hold the graph and the cost
object by identity and keep them alive, so an id is never reused within the block; callers
treat a memoized (Plan, Schedule) as read-only (the portfolio and outcore-optimal copy before
they change a plan: ``dataclasses.replace``). The memo is per context (``contextvars``), so
concurrent threads planning at once never share one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph

T = TypeVar("T")

_MEMO: ContextVar[dict[tuple[Any, ...], tuple[Any, ...]] | None] = ContextVar(
    "outcore_plan_memo", default=None)


@contextmanager
def plan_memo() -> Iterator[None]:
    """Share ``memoized`` results inside the block (nested blocks join the outermost)."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def memoized(name: str, graph: Graph, budget: int | None, cost: Any,
             make: Callable[[], T]) -> T:
    """``make()``'s result, computed once per (name, graph, budget, cost) inside a
    ``plan_memo()`` block (module doc); an InfeasibleBudgetError is remembered and raised
    again."""
    memo = _MEMO.get()
    if memo is None:
        return make()
    key = (name, id(graph), budget, id(cost))
    if key not in memo:
        try:
            memo[key] = (graph, cost, make(), None)
        except InfeasibleBudgetError as exc:
            memo[key] = (graph, cost, None, exc)
    _, _, found, error = memo[key]
    if error is not None:
        raise error
    return found  # type: ignore[no-any-return]


def shared_checkpoint(graph: Graph, budget: int | None, cost: Any) -> Any:
    """outcore-checkpoint's (Plan, Schedule) (``plan_checkpoint``), once per ``plan_memo``."""
    from outcore.policies.auto.segments import NAME, plan_checkpoint

    return memoized(NAME, graph, budget, cost, lambda: plan_checkpoint(graph, budget, cost))


def shared_greedy(graph: Graph, budget: int | None, cost: Any) -> Any:
    """The greedy planner's (Plan, Schedule) (``plan_auto``), once per ``plan_memo``."""
    from outcore.policies.auto.policy import plan_auto

    return memoized("outcore-auto greedy", graph, budget, cost,
                    lambda: plan_auto(graph, budget, cost))

"""Every placement policy behind one call, so they are benchmarked side by side.

``place(blocks, policy)`` returns a ``Placement`` for any of ``POLICIES``; ``planned`` (the
offline planner) is outcore's default. ``compare`` runs several on the same blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from outcore.pool.blocks import Block
from outcore.pool.errors import PoolError
from outcore.pool.gtbm import gtbm_placement
from outcore.pool.online import BestFitPool, HeapPool
from outcore.pool.placement import Placement, run_online
from outcore.pool.planner import planned_placement

DEFAULT_POLICY = "planned"

POLICIES: dict[str, Callable[..., Placement]] = {
    "planned": planned_placement,
    "gtbm": gtbm_placement,
    "best-fit": lambda blocks, **kw: run_online(BestFitPool(**kw), blocks),
    "heap": lambda blocks, **kw: run_online(HeapPool(**kw), blocks),
    "heap-nomerge": lambda blocks, **kw: run_online(HeapPool(coalesce=False, **kw), blocks),
}


def place(blocks: Sequence[Block], policy: str = DEFAULT_POLICY, **options: Any) -> Placement:
    """Place ``blocks`` with ``policy``; ``options`` go to that policy (e.g. ``beta`` for gtbm)."""
    if policy not in POLICIES:
        raise PoolError(f"unknown placement policy {policy!r}; use one of {', '.join(POLICIES)}")
    return POLICIES[policy](blocks, **options)


def compare(blocks: Sequence[Block], policies: Sequence[str] = tuple(POLICIES)) -> list[Placement]:
    """One Placement per policy, in the order given."""
    return [place(blocks, p) for p in policies]


def for_simulator(policy: str = DEFAULT_POLICY, **options: Any) -> Callable[..., Placement]:
    """A placement hook for ``outcore.sim.simulate(..., placement=...)``: places the
    schedule's blocks (``blocks_from_schedule``) with ``policy``; the Placement lands in
    ``SimResult.placement``."""
    if policy not in POLICIES:
        raise PoolError(f"unknown placement policy {policy!r}; use one of {', '.join(POLICIES)}")

    def hook(graph: Any, schedule: Any, lifetimes: Any = None) -> Placement:
        from outcore.pool.events import blocks_from_schedule

        return place(blocks_from_schedule(graph, schedule), policy, **options)

    return hook

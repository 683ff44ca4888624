"""Memory pools and tensor placement (plain Python, no torch).

Input: ``Block`` lifetimes (``blocks_from_schedule`` derives them from a Schedule by the
memory rule of ``outcore.plan.memory``). Policies, all returning a ``Placement``:
SuperNeurons' heap (``HeapPool``), CNMeM-like best fit (``BestFitPool``), Dymem's GTBM
(``GTBMPool``, ``gtbm_placement`` with its pool squeeze) and the offline planner
(``planned_placement``, the default). ``place``/``compare`` run any of them by name.
"""

from outcore.pool.blocks import (
    Alloc,
    Block,
    Release,
    event_stream,
    live_curve,
    lower_bound,
    round_up,
)
from outcore.pool.compare import DEFAULT_POLICY, POLICIES, compare, for_simulator, place
from outcore.pool.errors import PoolError, PoolExhausted
from outcore.pool.events import blocks_from_schedule
from outcore.pool.gtbm import GTBMPool, gtbm_placement
from outcore.pool.online import BestFitPool, HeapPool, OnlinePool
from outcore.pool.placement import (
    Placement,
    Region,
    build_placement,
    check_placement,
    measure,
    run_online,
)
from outcore.pool.planner import plan_offsets, planned_placement

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Alloc",
    "BestFitPool",
    "Block",
    "GTBMPool",
    "HeapPool",
    "OnlinePool",
    "Placement",
    "PoolError",
    "PoolExhausted",
    "Region",
    "Release",
    "blocks_from_schedule",
    "build_placement",
    "check_placement",
    "compare",
    "event_stream",
    "for_simulator",
    "gtbm_placement",
    "live_curve",
    "lower_bound",
    "measure",
    "place",
    "plan_offsets",
    "planned_placement",
    "round_up",
    "run_online",
]

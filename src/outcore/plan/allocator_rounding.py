"""Budgets that bound what CUDA's caching allocator holds, not only the tensor bytes.

The memory rule (``outcore.plan.memory``) counts each storage at its bytes. CUDA's caching
allocator (PyTorch 2.x, ``c10/cuda/CUDACachingAllocator.cpp``) counts, in
``torch.cuda.max_memory_allocated``, the size of the *block* it hands out, which can be more:

* every request is rounded up to a multiple of 512 bytes (``CUDA_BLOCK``);
* a request above 1 MiB (``CUDA_SMALL_SIZE``) is served from the large pool by the smallest
  cached free block that fits, and that block is split only when more than 1 MiB would
  remain; otherwise the whole block is handed out and counted, up to 1 MiB
  (``CUDA_LARGE_SLACK``) above the rounded request. With
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` every block is split down to 512 bytes,
  so only the rounding remains.

``caching_allocator_bound`` replays a schedule and bounds, at every instruction, each live
storage and each transient allocation (a recompute's duplicate, an op's workspace and kernel
temporaries, saved RNG states) by the largest block the allocator can count for it; storages
allocated before the step (parameters, the batch) count at their bytes, the loss seed (made
inside the step) as a block. Seen on an H200 (session 13): ``fcn`` under keep-all, 660,562 B
above the 512-byte bound alone. On ``device="cuda"`` the Trainer keeps this bound under the
budget with ``within_allocator_rounding``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph, TensorKind
from outcore.plan.residency import residency_steps
from outcore.plan.schedule import Schedule
from outcore.units import format_bytes

if TYPE_CHECKING:
    from outcore.planned import PlannedStep

#: CUDA's caching allocator rounds every block up to a multiple of this many bytes
CUDA_BLOCK = 512
#: requests above this many bytes come from the allocator's large pool
CUDA_SMALL_SIZE = 1 << 20
#: a large-pool block left unsplit exceeds the rounded request by at most this many bytes
CUDA_LARGE_SLACK = 1 << 20
#: re-plans ``within_allocator_rounding`` tries before it gives up
ROUNDING_TRIES = 4
_SETTINGS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def expandable_segments() -> bool:
    """Whether the caching allocator was configured with ``expandable_segments:True`` (read
    from ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF``, which PyTorch reads once, at
    its first CUDA allocation)."""
    for name in _SETTINGS:
        for item in os.environ.get(name, "").split(","):
            key, _, value = item.partition(":")
            if key.strip() == "expandable_segments":
                return value.strip().lower() in ("true", "1")
    return False


def block_bound(nbytes: int, expandable: bool = False) -> int:
    """The most bytes CUDA's allocator can count for a request of ``nbytes`` (module doc)."""
    if nbytes <= 0:
        return 0
    rounded = -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
    if rounded > CUDA_SMALL_SIZE and not expandable:
        return rounded + CUDA_LARGE_SLACK
    return rounded


def caching_allocator_bound(graph: Graph, schedule: Schedule,
                            expandable: bool | None = None) -> int:
    """The most ``torch.cuda.memory_allocated`` can reach during a step of ``schedule``, the
    storages held before the step counted at their bytes (module doc). Invariant: at least
    the memory rule's peak (``memory_curve(graph, schedule).peak``)."""
    grow = expandable_segments() if expandable is None else expandable
    seeds = {t.storage for t in graph.tensors if t.kind is TensorKind.TANGENT}
    live: dict[int, int] = {}
    resident = peak = 0  # resident == sum(live.values())
    for step in residency_steps(graph, schedule):
        transient = 0
        for alloc in step.allocations:
            held = alloc.nbytes if step.at < 0 and alloc.storage not in seeds \
                else block_bound(alloc.nbytes, grow)
            if alloc.storage >= 0:
                resident += held - live.get(alloc.storage, 0)
                live[alloc.storage] = held
            else:
                transient += held
        peak = max(peak, resident + transient)
        if step.released >= 0:
            resident -= live.pop(step.released, 0)
    return peak


def within_allocator_rounding(planned: PlannedStep, budget: int,
                              plan_for: Callable[[int], PlannedStep]) -> PlannedStep:
    """A plan whose peak stays within ``budget`` as CUDA's caching allocator counts it.

    The memory rule counts tensor bytes; the allocator counts blocks
    (``caching_allocator_bound``: 512-byte rounding, unsplit large blocks). When that bound
    of ``planned`` is over ``budget``, the step is planned again for the budget less the
    excess (``plan_for(smaller)``), up to ``ROUNDING_TRIES`` times; the plan that fits is
    returned with a note saying so. Invariant: the result's bound is at most ``budget``, or
    ``InfeasibleBudgetError`` says by how much it is not."""
    target = budget
    for tries in range(ROUNDING_TRIES + 1):
        bound = caching_allocator_bound(planned.graph, planned.schedule)
        if bound <= budget:
            if target != budget:
                planned.notes.append(
                    f"planned for {format_bytes(target)} so that the CUDA allocator's blocks "
                    f"({CUDA_BLOCK}-byte blocks, large blocks left unsplit; at most "
                    f"{format_bytes(bound)}) fit the budget of {format_bytes(budget)}")
            return planned
        target -= bound - budget
        if tries == ROUNDING_TRIES or target <= 0:
            break
        planned = plan_for(target)
    raise InfeasibleBudgetError(
        planned.plan.policy, budget, bound,
        f"once CUDA's allocator rounds each block up to {CUDA_BLOCK} bytes and may hand out "
        f"large blocks unsplit (up to {format_bytes(CUDA_LARGE_SLACK)} more each; "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True splits them), no plan of "
        f"{ROUNDING_TRIES} tried fits; raise the budget a little")

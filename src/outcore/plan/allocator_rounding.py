"""Budgets that bound what CUDA's caching allocator holds, not only the tensor bytes.

The memory rule (``outcore.plan.memory``) counts each storage at its bytes; CUDA's caching
allocator hands out blocks rounded up to 512 bytes, so ``torch.cuda.max_memory_allocated``
over a step can exceed the rule's peak by up to 511 B per live storage. On
``device="cuda"`` the Trainer keeps that allowance under the budget with
``within_allocator_rounding``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from outcore.errors import InfeasibleBudgetError
from outcore.plan.memory import memory_curve, rounded_peak_bound
from outcore.units import format_bytes

if TYPE_CHECKING:
    from outcore.planned import PlannedStep

#: CUDA's caching allocator rounds every block up to a multiple of this many bytes
CUDA_BLOCK = 512
#: re-plans ``within_allocator_rounding`` tries before it gives up
ROUNDING_TRIES = 4


def within_allocator_rounding(planned: PlannedStep, budget: int,
                              plan_for: Callable[[int], PlannedStep]) -> PlannedStep:
    """A plan whose peak stays within ``budget`` as CUDA's caching allocator counts it.

    The memory rule counts tensor bytes; the allocator holds blocks rounded up to
    ``CUDA_BLOCK`` bytes, up to 511 B more per live storage (``rounded_peak_bound``). When
    that bound of ``planned`` is over ``budget``, the step is planned again for the budget
    less the excess (``plan_for(smaller)``), up to ``ROUNDING_TRIES`` times; the plan that
    fits is returned with a note saying so. Invariant: the result's rounded bound is at
    most ``budget``, or ``InfeasibleBudgetError`` says by how much it is not."""
    target = budget
    for tries in range(ROUNDING_TRIES + 1):
        bound = rounded_peak_bound(memory_curve(planned.graph, planned.schedule), CUDA_BLOCK)
        if bound <= budget:
            if target != budget:
                planned.notes.append(
                    f"planned for {format_bytes(target)} so that the CUDA allocator's "
                    f"{CUDA_BLOCK}-byte blocks (at most {format_bytes(bound)}) fit the "
                    f"budget of {format_bytes(budget)}")
            return planned
        target -= bound - budget
        if tries == ROUNDING_TRIES or target <= 0:
            break
        planned = plan_for(target)
    raise InfeasibleBudgetError(
        planned.plan.policy, budget, bound,
        f"once CUDA's allocator rounds each block up to {CUDA_BLOCK} bytes, no plan of "
        f"{ROUNDING_TRIES} tried fits; raise the budget a little")

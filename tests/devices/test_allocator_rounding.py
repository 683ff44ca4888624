"""The CUDA budget keeps the caching allocator's blocks under it: 512-byte rounding and large
blocks handed out unsplit (``outcore.plan.allocator_rounding``; the Trainer applies it on
``device="cuda"``)."""

from __future__ import annotations

import math

import pytest

import outcore.api
from outcore import zoo
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.plan.allocator_rounding import (
    CUDA_BLOCK,
    CUDA_LARGE_SLACK,
    CUDA_SMALL_SIZE,
    block_bound,
    caching_allocator_bound,
    expandable_segments,
    within_allocator_rounding,
)
from outcore.plan.memory import memory_curve, rounded_peak_bound
from outcore.plan.residency import residency_steps


@pytest.fixture(scope="module")
def graph():
    work = zoo.get("transformer", 8, small=True)
    return capture(work.model, work.loss_fn, tuple(work.batch))


def _plan(graph, budget):
    return outcore.api.plan(graph, budget, policy="auto", simulate=False, recapture=None)


def _exact_rounded_peak(graph, schedule, slack: int = 0) -> int:
    """Each resident storage and each transient allocation rounded up to 512 B (``slack``
    more above 1 MiB), replayed step by step: the quantity the bound bounds."""
    live: dict[int, int] = {}
    peak = 0
    for step in residency_steps(graph, schedule):
        transient = 0
        for alloc in step.allocations:
            rounded = math.ceil(alloc.nbytes / CUDA_BLOCK) * CUDA_BLOCK
            rounded += slack if rounded > CUDA_SMALL_SIZE else 0
            if alloc.storage >= 0:
                live[alloc.storage] = rounded
            else:
                transient += rounded
        peak = max(peak, sum(live.values()) + transient)
        if step.released >= 0:
            live.pop(step.released, None)
    return peak


def test_the_bound_is_the_peak_without_rounding_and_covers_the_rounded_replay(graph):
    planned = _plan(graph, None)
    trace = memory_curve(graph, planned.schedule)
    assert rounded_peak_bound(trace, 1) == trace.peak
    bound = rounded_peak_bound(trace, CUDA_BLOCK)
    assert trace.peak < bound <= trace.peak + (CUDA_BLOCK - 1) * max(trace.live_tensors)
    assert _exact_rounded_peak(graph, planned.schedule) <= bound
    blocks = caching_allocator_bound(graph, planned.schedule, expandable=True)
    assert trace.peak < blocks <= _exact_rounded_peak(graph, planned.schedule)
    unsplit = caching_allocator_bound(graph, planned.schedule, expandable=False)
    assert blocks <= unsplit <= _exact_rounded_peak(graph, planned.schedule, CUDA_LARGE_SLACK)


def test_block_bound_rounds_and_leaves_room_for_an_unsplit_large_block():
    assert block_bound(0) == 0
    assert block_bound(1) == block_bound(512) == 512
    assert block_bound(513) == 1024
    assert block_bound(CUDA_SMALL_SIZE) == CUDA_SMALL_SIZE  # the small pool's largest
    assert block_bound(CUDA_SMALL_SIZE + 1) == CUDA_SMALL_SIZE + 512 + CUDA_LARGE_SLACK
    assert block_bound(CUDA_SMALL_SIZE + 1, expandable=True) == CUDA_SMALL_SIZE + 512


def test_expandable_segments_is_read_from_the_allocator_settings(monkeypatch):
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    assert not expandable_segments()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,expandable_segments:True")
    assert expandable_segments()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert not expandable_segments()


def test_a_tight_budget_is_planned_again_until_the_rounded_bound_fits(graph):
    peaks = reference_peaks(graph)
    budget = peaks.static + (peaks.liveness - peaks.static) * 6 // 10
    first = _plan(graph, budget)
    assert caching_allocator_bound(graph, first.schedule) > budget
    asked: list[int] = []

    def plan_for(target: int):
        asked.append(target)
        return _plan(graph, target)

    fitted = within_allocator_rounding(first, budget, plan_for)
    assert asked and all(target < budget for target in asked)
    assert caching_allocator_bound(graph, fitted.schedule) <= budget
    assert any("512-byte blocks" in note for note in fitted.notes)


def test_a_plan_that_already_fits_is_kept_as_it_is(graph):
    planned = _plan(graph, None)
    roomy = caching_allocator_bound(graph, planned.schedule)

    def never(target: int):
        raise AssertionError("no re-plan was needed")

    assert within_allocator_rounding(planned, roomy, never) is planned


def test_no_fitting_plan_is_an_infeasible_budget_saying_so(graph):
    planned = _plan(graph, None)
    trace = memory_curve(graph, planned.schedule)

    def same(target: int):
        return planned  # a planner that cannot go lower

    with pytest.raises(InfeasibleBudgetError, match="512 bytes"):
        within_allocator_rounding(planned, trace.peak, same)

"""A rank that fails (out of memory, an exception) or stops makes the others fail with a
clear error instead of hanging: ``launch`` kills the ranks and fails the test after its
deadline, so a hang cannot pass."""

from __future__ import annotations

import dp_workers
import pytest


@pytest.mark.parametrize(("how", "error"), [
    ("oom", "rank 1 failed with DeviceOutOfMemory"),
    # a batch of a new shape is captured (a smaller last batch trains): this one's width
    # makes the capture's forward fail
    ("exception", "rank 1 failed with CaptureError: could not capture"),
])
def test_failing_rank_is_named_by_the_others(how: str, error: str) -> None:
    results = dp_workers.launch(dp_workers.fail_one_rank, 2, how, 20.0, deadline=120)
    rank0, rank1 = results
    assert rank1[0] == "error" and rank1[1] in ("DeviceOutOfMemory", "CaptureError"), rank1
    assert rank0[0] == "error", f"rank 0 went on after rank 1 failed: {rank0}"
    assert rank0[1] == "DistributedError", rank0
    assert error in rank0[2], rank0[2]


def test_silent_rank_ends_the_others_by_the_timeout() -> None:
    rank0, rank1 = dp_workers.launch(dp_workers.fail_one_rank, 2, "hang", 1.0, deadline=120)
    assert rank1 == "hung"
    assert rank0[0] == "error" and rank0[1] == "DistributedError", rank0
    assert "no rank reported a failure" in rank0[2], rank0[2]


def test_a_rank_planning_past_the_group_timeout_is_waited_for() -> None:
    # the planning agreement waits through the store, not the group's 1 s collective
    # timeout: it timed out here when it was a plain all-reduce
    results = dp_workers.launch(dp_workers.slow_planner, 2, 1.0, 4.0, deadline=120)
    for rank, result in enumerate(results):
        assert isinstance(result, float), (rank, result)


def test_ranks_with_different_plans_refuse_to_start() -> None:
    results = dp_workers.launch(dp_workers.unequal_plans, 2, deadline=120)
    for rank, result in enumerate(results):
        assert result[:2] == ("error", "OutcoreError"), (rank, result)
        assert "ranks [1] planned another step than rank 0" in result[2], result[2]

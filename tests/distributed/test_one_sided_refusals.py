"""A refusal on one rank only reaches every rank at once, with nothing applied anywhere.

Before session 23 a rank whose planning or step preparation refused (its re-plan of a new
share shape over the budget, its batch check, the user's loss failing on its share) raised
alone; the other ranks went on into their next collective and raised only when it failed,
at the latest after the group's timeout (300 s by default). Now every rank enters an
agreement (``RankContext.agree``: one all-reduce of a status flag) after its planning and
after each step's checks and re-plan, before any collective of the step: the refusing rank
raises its own error, the others ``DistributedError`` naming it and its reason, and no
rank's parameters, buffers, ``.grad`` or optimizer state change. The ranks stay in step:
each case is followed by a step that trains on both, against eager PyTorch.

The ranks' group has a 20 s timeout (``refusal_workers.TIMEOUT``) and ``launch`` a deadline,
so a regression fails (its messages name a failed collective, not the agreement) instead
of hanging the run; elapsed time is not asserted.
"""

from __future__ import annotations

from typing import Any

import dp_workers
import pytest
import refusal_workers

#: case -> (the agreement point, rank 1's error type, a phrase of its message)
CASES = {
    "compile": ("the planning of the ranks' first shares", "InfeasibleBudgetError",
                "cannot fit a budget of"),
    "replan": ("the step's checks and the plan of its share", "InfeasibleBudgetError",
               "cannot fit a budget of"),
    "batch-check": ("the step's checks and the plan of its share", "UnsupportedModelError",
                    "the autocast (torch.bfloat16 on cpu; captured: none) changed"),
    "loss": ("the step's checks and the plan of its share", "CaptureError",
             "ValueError: picky_mse needs 2 samples or more, got 1"),
}


@pytest.fixture(scope="module")
def ranks() -> list[Any]:
    results = dp_workers.launch(refusal_workers.refusals, 2, deadline=300.0)
    for rank, result in enumerate(results):
        assert not (isinstance(result, tuple) and result[:1] == ("error",)), (rank, result)
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_one_rank_refuses_and_every_rank_raises(ranks: list[Any], case: str) -> None:
    where, kind, reason = CASES[case]
    rank0, rank1 = (r["refused"][case] for r in ranks)
    assert rank1["type"] == kind, rank1
    assert reason in rank1["message"], rank1["message"]
    assert rank0["type"] == "DistributedError", rank0
    assert rank0["message"].startswith(f"rank 0/2: {where} failed on another rank "
                                       f"(rank 1 failed with {kind}: "), rank0["message"]
    assert reason in rank0["message"], rank0["message"]
    assert "nothing of it was applied on any rank" in rank0["message"], rank0["message"]
    for rank, refused in enumerate((rank0, rank1)):
        assert refused["changed"] == [], (rank, refused["changed"])


def test_the_ranks_train_on_after_each_refusal(ranks: list[Any]) -> None:
    """A step after each refusal trains on both ranks: ``.grad`` is eager PyTorch's average
    of the ranks' share gradients (one pass, the framework's kernels: bit for bit); rank 0
    planned its smaller shares (2 x 8, 3 x 8), rank 1 none (it refused both)."""
    for rank, result in enumerate(ranks):
        assert result["grad_error"] == [0.0] * 4, (rank, result["grad_error"])
    assert [r["replans"] for r in ranks] == [2, 0]

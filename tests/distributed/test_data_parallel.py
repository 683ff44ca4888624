"""Data parallel on 2 ranks (spawned, gloo, CPU-emulated devices): gradients, memory, BN.

One launch runs every case (process start and torch import are paid once). Each rank
captures its half of the batch, plans it, and steps with ``distributed=True``; it reports,
per policy, its averaged gradients' largest error relative to the parameter's largest
gradient against:

* ``plan``: the same plan run on one plain CPU device for each half, averaged. Tolerance
  ``PLAN_RTOL = 1e-6``: with 2 ranks the all-reduce computes ``(a + b)`` (division by 2 is
  exact), the same sum as the reference, so most errors are exactly 0; tied weights (the
  transformer's embedding and head) get one gradient per use, which the reference sums in
  another order (an ulp or two, about 1.2e-7 relative);
* ``ddp``: eager PyTorch on each half, averaged, which is what DDP computes. Same
  tolerance for plans with the framework's kernels; plans that choose other operator
  algorithms (vDNN, moDNN, SuperNeurons pick im2col/FFT convolutions) are not bit-exact
  even on one device, and plans that split a BatchNorm model into sub-batches normalise per
  sub-batch (as on one device): both are held to ``plan`` only;
* ``whole``: eager PyTorch on the whole batch on one process. Tolerance
  ``WHOLE_RTOL = 1e-5``: float32 sums of the batch re-associated into two halves differ by
  a few ulps of the largest term per parameter (seen: 5e-7). Only for models without
  BatchNorm: with BatchNorm each rank normalises its own half, as DDP does (asserted: the
  whole-batch error is then large, the DDP one is not).

The slow test (4 ranks, every policy, all three networks) is what
``benchmarks/data_parallel.py --check`` runs.
"""

from __future__ import annotations

from typing import Any

import dp_workers
import pytest

PLAN_RTOL = 1e-6
WHOLE_RTOL = 1e-5
ALL = "*"
#: One policy of every family (the slow test and the benchmark run every registered one).
FAMILIES = ["keep-all", "offload-all", "recompute-cheap", "vdnn-dyn", "superneurons",
            "modnn", "pooch", "dymem", "outcore-auto"]
#: A cheaper subset for the two other networks: exact kernels, variants, sub-batches, auto.
SOME = ["keep-all", "offload-all", "recompute-cheap", "vdnn-dyn", "modnn", "outcore-auto"]
CASES: list[tuple[str, int, list[str]]] = [
    ("resnet18", 16, FAMILIES),  # the zoo's ResNet (BatchNorm)
    ("densenet121", 8, SOME),  # DenseNet-style (BatchNorm, concatenations)
    ("transformer", 8, SOME),  # GPT-style, no BatchNorm, tied embedding/head
]
BATCHNORM = {"resnet18", "densenet121"}


def run_cases(rank: int, world: int, cases: list[tuple[str, int, list[str]]]) -> dict[str, Any]:
    return {name: dp_workers.grads_vs_reference(rank, world, name, batch, policies, 0.5)
            for name, batch, policies in cases}


@pytest.fixture(scope="module")
def two_ranks() -> list[Any]:
    return dp_workers.launch(run_cases, 2, CASES, deadline=600)


def check_rows(results: list[Any], name: str) -> None:
    for rank, result in enumerate(results):
        assert not isinstance(result, tuple), f"rank {rank} failed: {result}"
    rows = results[0][name]
    assert len(rows) >= 6
    for policy, row in rows.items():
        where = f"{name}/{policy}"
        assert "error" not in row, f"{where}: {row.get('error')}"
        assert not row["missing"], f"{where}: no gradient for {row['missing']}"
        assert row["plan"] <= PLAN_RTOL, f"{where}: {row['plan']:.2g} off the same plan"
        per_sub_batch_bn = name in BATCHNORM and row["sub_batches"] > 1
        if row["variants"] == 0 and not per_sub_batch_bn:
            assert row["ddp"] <= PLAN_RTOL, f"{where}: {row['ddp']:.2g} off DDP's gradients"
        if name in BATCHNORM:
            assert row["whole"] > 1e-3, f"{where}: BatchNorm statistics must be per rank"
        else:
            assert row["whole"] <= WHOLE_RTOL, f"{where}: {row['whole']:.2g} off the batch"
        # the predicted peak, gradient buckets included, is what the rank measured, up to
        # what the same plan measures beyond its prediction on one device (single_excess:
        # 0 except for a single-device accounting bug outside data parallel, reported).
        # Never below: the rank captures and steps its share with a storage of its own size
        # (a share viewing the whole batch was planned as the whole batch: 98,368 B over a
        # ResNet-18 share measured with its own storage)
        assert row["single_excess"] >= 0, f"{where}: measured below the prediction"
        assert row["measured"] - row["predicted"] == row["single_excess"], where
        if row["budget"] is not None:
            assert row["predicted"] <= row["budget"], where
        if row["sub_batches"] == 1:
            assert row["buckets"] >= 1, where
            # the rank's emulated link, scaled to the model on its (timed) first step,
            # keeping its share of the host link the ranks share
            assert row["link"] is not None, f"{where}: the emulated link was not scaled"
            assert row["link_steps"] == 1, f"{where}: its one step was not timed"
            assert 0 < row["share"][0] <= 1 and 0 < row["share"][1] <= 1, where
    for rank, result in enumerate(results[1:], start=1):
        for policy, row in result[name].items():
            assert row["checksum"] == rows[policy]["checksum"], (
                f"{name}/{policy}: rank {rank}'s gradients differ from rank 0's")
    assert any(r["moved"] for r in rows.values()), f"{name}: no policy moved anything"
    exact = [p for p, r in rows.items() if r["single_excess"] == 0]
    assert len(exact) >= len(rows) - 2, f"{name}: single-device accounting off for most"
    assert any(r["bounded"] for r in rows.values()) or name == "transformer"


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_two_ranks_average_gradients(two_ranks: list[Any], name: str) -> None:
    check_rows(two_ranks, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_four_ranks_every_policy(name: str) -> None:
    batch = {"resnet18": 8, "densenet121": 8, "transformer": 8}[name]
    check_rows(dp_workers.launch(run_cases, 4, [(name, batch, [ALL])], deadline=900), name)


def test_an_input_gradient_under_sub_batches_on_two_ranks() -> None:
    """Each rank's share split into sub-batches with its images requiring grad: ``x.grad``
    is eager's on the share (DDP leaves input gradients local), and accumulates over two
    steps; the parameters' gradients are DDP's average."""
    for row in dp_workers.launch(dp_workers.input_grads_split, 2, deadline=300):
        assert row["sub_batches"] > 1
        assert max(row["input"]) <= 1e-5, row
        # the share's sum split into sub-batches (a conv weight's gradient sums 8 x 32 x 32
        # positions per sample), then averaged: float32 re-association, seen 4e-5
        assert row["ddp"] <= 1e-4, row


def test_each_rank_keeps_the_outputs_of_its_share() -> None:
    """``outputs=True`` with ``distributed=`` (it was refused): each rank's
    ``trainer.outputs`` is eager's forward on its share (DDP's local output), unbounded and
    under sub-batches, and the eager forward's after an evaluation."""
    for rows in dp_workers.launch(dp_workers.outputs_on_ranks, 2, deadline=300):
        assert rows["unbounded"]["sub_batches"] == 1 and rows["split"]["sub_batches"] > 1
        for row in rows.values():
            assert row["error"] <= 1e-5 and row["eval"], rows

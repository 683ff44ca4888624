"""Uneven shares of the last global batch (5 samples: 3 and 2 on 2 gloo ranks) against DDP,
as a matrix of models x plans (``uneven_workers``: what each cell computes and its
reference). Models: a plain ConvNet, BatchNorm (running statistics updated in forward,
compared after every step), SyncBatchNorm (float64, against eager BatchNorm on the global
batch), a tied embedding/head LM, a dict batch, a whole dict batch with the labels in it and
the loss computed by the model (``loss_fn=None``, stepped as ``step(batch)``). Plans: one
pass (offload-all), sub-batches (moDNN at a budget it meets by splitting a share of 4 into
passes; also with ``.grad`` accumulated, ``/accumulate``: the last share's step adds to the
step before's ``.grad``, and the sub-batch path all-reduces ``gradient + prior`` as DDP), moDNN with
``allow_sub_batches=False``, and one pass under ``autocast=torch.bfloat16``.

Found and fixed here (each cell fails without its fix):

* ``batch_check`` took a batch shaped like the first plan's *sub-batch* for the first
  plan's share: rank 1's last share (2 samples) matched the plan of 4 run as 2 passes of 2,
  and the step failed splitting it into passes of 1 (``BatchMismatch`` inside the loss
  weights; rank 0 then waited for the group's timeout). Every sub-batch cell;
* ``outcore.compile(..., distributed=True)`` dropped ``allow_sub_batches``, so the advice of
  SyncBatchNorm's refusal ("pass allow_sub_batches=False") changed nothing under moDNN
  (``syncbn/no-split``); and ``autocast`` (a bfloat16 step trained in float32),
  ``cache_size``, ``cache`` and ``host_budget`` (``*/autocast``: bfloat16, bit for bit DDP
  under ``torch.autocast``, with ``cache_size=0`` over two epochs);
* with sub-batches, a gradient all-reduce that failed (another rank's share failed or was
  refused) left this rank's ``.grad`` holding its own gradient, the first parameter's
  already divided by the world size, and its running statistics updated. Now the step puts
  ``.grad`` and the buffers back (``batchnorm/sub-batches/rank-1-fails``: rank 1 runs out
  of device memory in its last step, after the ranks agreed to run it).
"""

from __future__ import annotations

from typing import Any

import dp_workers
import pytest
import torch
import uneven_workers

from outcore.batch_check import check_batch
from outcore.errors import BatchMismatchError

#: passes per step of the epoch (4, 4, then 3 on rank 0 and 2 on rank 1)
PASSES = {"one-pass": [1, 1, 1], "no-split": [1, 1, 1], "sub-batches": [2, 2, 1],
          "autocast": [1] * 6}
#: A fast representative of every model and every fix (one launch: 13 s on 2 idle cores,
#: 25 s when they are shared).
DEFAULT = ["batchnorm/sub-batches", "syncbn/sub-batches", "syncbn/no-split",
           "tied/sub-batches", "dict/sub-batches", "tied/autocast",
           "tied/sub-batches/accumulate", "sum-over-batch/sub-batches",
           "own-loss/sub-batches"]
#: The rest of the matrix: the models without a fix of their own, one pass (near
#: ``test_ddp_parity``'s), moDNN without sub-batches, the other autocast and accumulation.
SLOW = ["plain/sub-batches", "syncbn/one-pass", "plain/one-pass", "batchnorm/one-pass",
        "tied/one-pass", "dict/one-pass", "plain/no-split", "batchnorm/no-split",
        "dict/no-split", "plain/autocast", "batchnorm/autocast", "dict/autocast",
        "batchnorm/sub-batches/accumulate", "dict/sub-batches/accumulate",
        "own-loss/one-pass", "own-loss/no-split", "own-loss/autocast"]


@pytest.fixture(scope="module")
def default_cells() -> list[Any]:
    return dp_workers.launch(uneven_workers.cells, 2, DEFAULT, deadline=600.0)


@pytest.fixture(scope="module")
def slow_cells() -> list[Any]:
    return dp_workers.launch(uneven_workers.cells, 2, SLOW, deadline=900.0)


def check_cell(results: list[Any], key: str) -> None:
    """Every rank trained the epoch as its reference, with the passes the cell's plan
    makes; SyncBatchNorm with sub-batches is refused instead (``check_refusal``)."""
    rows = []
    for rank, result in enumerate(results):
        assert not (isinstance(result, tuple) and result[:1] == ("error",)), (rank, result)
        row = result[key]
        assert "error" not in row, (rank, row["error"])
        assert row["mismatches"] == [], (rank, row["mismatches"])
        rows.append(row)
    if key == "syncbn/sub-batches":
        check_refusal(rows)
        return
    mode = key.split("/")[1]
    for rank, row in enumerate(rows):
        assert row["refused"] == {}, (rank, row["refused"])
        assert row["passes"] == PASSES[mode], (rank, row["passes"])
        if mode == "autocast":  # cache_size=0: the last share is planned in each epoch
            assert row["autocast"] == "torch.bfloat16" and row["replans"] == 2, (rank, row)
        else:  # the last share, planned on its first step
            assert row["autocast"] is None and row["replans"] == 1, (rank, row)


def check_refusal(rows: list[dict[str, Any]]) -> None:
    """moDNN splits SyncBatchNorm's float64 share of 4 into 4 passes, rank 0's 3 into 3 and
    rank 1's 2 into 1: both ranks refuse the last step (their all-reduces per pass would not
    match), saying what to do, before changing anything (their ``.grad`` after the second
    step, parameters and running statistics as they were)."""
    for rank, row in enumerate(rows):
        assert row["passes"] == [4, 4], (rank, row["passes"])
        refused = row["refused"]
        assert refused["step"] == 2 and refused["type"] == "OutcoreError", (rank, refused)
        assert "first share's 4" in refused["message"], refused["message"]
        assert "allow_sub_batches=False" in refused["message"], refused["message"]
        assert "drop_last=True" in refused["message"], refused["message"]
        assert refused["changed"] == [], (rank, refused["changed"])


@pytest.mark.parametrize("key", DEFAULT)
def test_uneven_last_batch_trains_as_ddp(default_cells: list[Any], key: str) -> None:
    check_cell(default_cells, key)


@pytest.mark.slow
@pytest.mark.parametrize("key", SLOW)
def test_uneven_last_batch_trains_as_ddp_rest(slow_cells: list[Any], key: str) -> None:
    check_cell(slow_cells, key)


def test_a_failed_rank_leaves_a_sub_batch_step_unapplied() -> None:
    """Rank 1's last share is planned, but its device is too small for it (it fails in its
    run, after every rank agreed to step); rank 0 ran its 2 passes and fails in the gradient
    all-reduce, naming rank 1, with its ``.grad`` (accumulated by the step before) and
    BatchNorm running statistics as they were before the step (its own launch: the group is
    broken afterwards). A share refused before it runs is ``test_one_sided_refusals``'."""
    key = "batchnorm/sub-batches/rank-1-fails"
    rank0, rank1 = (r[key] for r in dp_workers.launch(uneven_workers.cells, 2, [key],
                                                       deadline=300.0))
    assert rank1["refused"]["type"] == "DeviceOutOfMemory", rank1
    refused = rank0["refused"]
    assert refused["type"] == "DistributedError", refused
    assert "all-reduce of the accumulated gradients" in refused["message"], refused
    assert "rank 1 failed with DeviceOutOfMemory" in refused["message"], refused
    assert refused["changed"] == [], refused["changed"]
    assert rank0["passes"] == [2, 2] and rank0["mismatches"] == [], rank0


def test_a_sub_batch_shaped_batch_is_not_the_split_batch() -> None:
    """A plan captured for sub-batches of 2 (a share of 4 in 2 passes) does not run a batch
    of 2: that is another signature (the first fix of the module doc, on its own)."""
    import outcore

    model = torch.nn.Linear(3, 2)
    graph = outcore.capture(model, torch.nn.functional.cross_entropy,
                            (torch.randn(2, 3), torch.zeros(2, dtype=torch.long)))
    check_batch(graph, (torch.randn(4, 3), torch.zeros(4, dtype=torch.long)), parts=2)
    check_batch(graph, (torch.randn(2, 3), torch.zeros(2, dtype=torch.long)), parts=1)
    with pytest.raises(BatchMismatchError):
        check_batch(graph, (torch.randn(2, 3), torch.zeros(2, dtype=torch.long)), parts=2)

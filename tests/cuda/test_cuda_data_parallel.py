"""Data parallel with ``nccl`` on two GPUs (``make test-cuda`` on a machine with two or more).

Never run yet: no multi-GPU machine has been lent (the CPU/gloo path is tested in
``tests/distributed``). Skipped, with the reason, where fewer than two GPUs are visible.

Two spawned ranks, rank ``r`` on ``cuda:r`` (``LOCAL_RANK`` picks it in ``rank_context``),
``outcore.compile(..., device="cuda", distributed=True)`` (the nccl backend), the zoo's
ResNet-18 (small), one step per policy:

* plain BatchNorm: the averaged gradients equal the mean over the shards of eager CUDA
  PyTorch's gradients (what DDP computes) to ``DDP_RTOL`` (each rank's own step is bit-exact
  with eager under deterministic kernels; ``a/2 + b/2`` is exact in float32);
* ``nn.SyncBatchNorm`` (outcore's captured all-reduce, on nccl here): the gradients and
  running statistics equal eager BatchNorm on the whole batch on one GPU to ``SYNC_RTOL``
  (see ``tests/distributed/test_sync_batchnorm.py`` for why not bit-exact);
* the gradients and the gradient buckets live on the rank's own GPU, the CUDA device's
  tracked peak equals the predicted peak (buckets included), both ranks end with the same
  gradients.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "distributed"))
import dp_workers

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2,
                                reason="nccl data parallel needs two GPUs; "
                                       f"{torch.cuda.device_count()} visible")

DDP_RTOL = 1e-6
SYNC_RTOL = 5e-5
POLICIES = ["keep-all", "offload-all", "recompute-cheap", "outcore-auto"]


def nccl_rank(rank: int, world: int, sync_bn: bool) -> dict[str, Any]:
    """One step per policy on ``cuda:rank``; errors and facts per policy (module doc)."""
    import outcore

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    device = torch.device("cuda", rank)
    plain, loss_fn, full = dp_workers.workload("resnet18", 8)
    plain = plain.to(device)
    full = tuple(t.to(device) for t in full)
    if sync_bn:
        ref_model = copy.deepcopy(plain)
        loss_fn(ref_model(full[0]), full[1]).backward()
        reference = {n: p.grad for n, p in ref_model.named_parameters()}
        ref_buffers = dict(ref_model.named_buffers())
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    else:
        shards = [dp_workers._eager_grads(plain, loss_fn, dp_workers._shard(full, r, world))
                  for r in range(world)]
        reference = {n: sum(s[n] for s in shards) / world for n in shards[0]}
        model = plain
    initial = copy.deepcopy(model.state_dict())
    mine = dp_workers._shard(full, rank, world)
    rows: dict[str, Any] = {}
    for policy in POLICIES:
        model.load_state_dict(initial)
        model.zero_grad(set_to_none=True)
        with outcore.compile(model, loss_fn, mine, budget=None, device="cuda", policy=policy,
                             distributed=True, allow_sub_batches=False) as trainer:
            trainer.step(*mine)
        got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        row = {"grads": dp_workers._max_err(got, reference),
               "devices": sorted({str(g.device) for g in got.values()}),
               "buckets": len(trainer.buckets),
               "predicted": trainer.stats.predicted_peak,
               "measured": trainer.stats.measured_peak,
               "checksum": [float(g.double().sum()) for g in got.values()]}
        if sync_bn:
            row["buffers"] = max(
                (b.float() - ref_buffers[n].float()).abs().max().item()
                / max(ref_buffers[n].float().abs().max().item(), 1e-12)
                for n, b in model.named_buffers())
        rows[policy] = row
    return rows


@pytest.mark.parametrize("sync_bn", [False, True], ids=["batchnorm", "sync_batchnorm"])
def test_two_gpus_nccl(sync_bn: bool) -> None:
    results = dp_workers.launch(nccl_rank, 2, sync_bn, deadline=600)
    for rank, result in enumerate(results):
        assert not isinstance(result, tuple), f"rank {rank} failed: {result}"
        for policy, row in result.items():
            where = f"rank {rank} {policy}"
            assert row["grads"] <= (SYNC_RTOL if sync_bn else DDP_RTOL), (where, row["grads"])
            assert row["devices"] == [f"cuda:{rank}"], (where, row["devices"])
            assert row["buckets"] >= 1, where
            assert row["measured"] == row["predicted"], where
            assert row["checksum"] == results[0][policy]["checksum"], where
            if sync_bn:
                assert row["buffers"] <= 1e-5, (where, row["buffers"])

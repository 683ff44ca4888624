"""What each rank does in the SyncBatchNorm tests (started by ``dp_workers.launch``).

A zoo network with every BatchNorm converted to ``nn.SyncBatchNorm`` trains one
data-parallel step per policy on its share of the batch; its averaged gradients and its
running statistics after the step are compared with eager PyTorch on ONE process, the whole
batch, plain BatchNorm (``SyncBatchNorm on N ranks == BatchNorm on the whole batch``).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
from collections.abc import Iterator
from typing import Any

import torch
from dp_workers import _budget, _max_err, _shard, workload


def _reference(model: torch.nn.Module, loss_fn: Any,
               batch: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Gradients and buffers after one eager step of ``model`` (plain BatchNorm)."""
    m = copy.deepcopy(model)
    m.train()
    loss_fn(m(batch[0]), batch[1]).backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    return grads, {n: b.detach().clone() for n, b in m.named_buffers()}


def _buffer_err(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """Largest |got - ref| of the running statistics, relative to the largest |ref| of each
    (``num_batches_tracked`` must be equal)."""
    worst = 0.0
    for name, value in ref.items():
        if name.endswith("num_batches_tracked"):
            worst = max(worst, float((got[name] != value).any()))
            continue
        scale = max(value.abs().max().item(), 1e-12)
        worst = max(worst, (got[name] - value).abs().max().item() / scale)
    return worst


def _workload(name: str, batch: int, dtype: torch.dtype,
              options: dict[str, Any] | None) -> tuple[torch.nn.Module, Any, tuple[Any, ...]]:
    """``dp_workers.workload(name, batch)`` (or, given ``options``, the small zoo network
    built with them) with its parameters, buffers and floating-point inputs in ``dtype``."""
    if options is None:
        model, loss_fn, batch_ = workload(name, batch)
    else:
        from outcore.zoo import registry

        w = registry.get(name, batch, small=True, seed=0, **options)
        model, loss_fn, batch_ = w.model, w.loss_fn, tuple(w.batch)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in batch_)
    return model.to(dtype), loss_fn, inputs


def sync_bn_vs_whole_batch(rank: int, world: int, name: str, batch: int, policies: list[str],
                           dtype: torch.dtype = torch.float32,
                           options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per policy: this rank's gradients and running statistics after one SyncBatchNorm
    data-parallel step, against eager BatchNorm on the whole batch; the plan's collectives,
    its peak prediction against the measurement, and what the plan moved. The network and
    its batch (``_workload``) are in ``dtype``, the reference as well."""
    import outcore
    from outcore.distributed import rank_context
    from outcore.distributed.compile import capture_rank
    from outcore.plan.grad_buckets import DEFAULT_BUCKET_CAP

    plain, loss_fn, full = _workload(name, batch, dtype, options)
    grads_ref, buffers_ref = _reference(plain, loss_fn, full)
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    initial = copy.deepcopy(model.state_dict())
    mine = _shard(full, rank, world)
    graph = capture_rank(model, loss_fn, mine, rank_context(True, "cpu-emulated"))
    budget = _budget(graph, 0.5, DEFAULT_BUCKET_CAP)
    rows: dict[str, Any] = {}
    for i, policy in enumerate(outcore.policies() if policies == ["*"] else policies):
        model.load_state_dict(initial)
        model.zero_grad(set_to_none=True)
        try:
            trainer = _trainer(i == 0, model, loss_fn, mine, graph, policy, budget)
        except Exception as exc:  # noqa: BLE001 - reported per policy; the test asserts none
            rows[policy] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        issued: list[int] = []
        try:
            with _counting_all_reduces(issued), _no_gc():
                trainer.step(*mine)
        except Exception as exc:  # noqa: BLE001 - as above
            rows[policy] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        finally:
            trainer.close()
        rows[policy] = {**_row(trainer, model, grads_ref, buffers_ref), "issued": len(issued),
                        "buckets": len(trainer.buckets)}
    return rows


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """No cyclic garbage collection in the block. A collection pass during the step can
    delay the tracker's release of a storage by a few instructions (seen on SuperNeurons'
    ResNet-18 plan: a 68-byte statistics vector alive 6 instructions past its Free, with or
    without SyncBatchNorm's replay; none with collection off), which made the measured peak
    depend on when Python happened to collect. See the issue-16 report."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _counting_all_reduces(calls: list[int]) -> Iterator[None]:
    """Count every ``torch.distributed.all_reduce`` this rank issues in the block."""
    import torch.distributed as dist

    real = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    dist.all_reduce = counted
    try:
        yield
    finally:
        dist.all_reduce = real


def _trainer(first: bool, model: Any, loss_fn: Any, mine: Any, graph: Any, policy: str,
             budget: int) -> Any:
    """As ``dp_workers._trainer`` (the first policy through ``outcore.compile``), with
    sub-batches off: a sub-batch would take its statistics over part of the batch."""
    import outcore
    from outcore.distributed import data_parallel_trainer, rank_context

    timeout = datetime.timedelta(seconds=60)
    for limit in (budget, None):
        try:
            if first:
                return outcore.compile(model, loss_fn, mine, budget=limit, policy=policy,
                                       device="cpu-emulated", distributed=True,
                                       timeout=timeout, allow_sub_batches=False)
            return data_parallel_trainer(model, graph, rank_context(True, "cpu-emulated"),
                                         budget=limit, policy=policy, device="cpu-emulated",
                                         allow_sub_batches=False)
        except outcore.InfeasibleBudgetError:
            if limit is None:
                raise
    raise AssertionError("unreachable")


def _row(trainer: Any, model: torch.nn.Module, grads_ref: dict[str, torch.Tensor],
         buffers_ref: dict[str, torch.Tensor]) -> dict[str, Any]:
    from outcore.distributed.sync_bn import ALL_REDUCE_TARGET
    from outcore.plan.schedule import Compute

    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    planned = trainer.planned
    collectives = [i for i in planned.schedule.instructions if isinstance(i, Compute)
                   and planned.graph.ops[i.op].target == ALL_REDUCE_TARGET]
    counts = planned.counts()
    return {"grads": _max_err(got, grads_ref),
            "worst": max(grads_ref, key=lambda n: _max_err({n: got[n]}, {n: grads_ref[n]})),
            "buffers": _buffer_err(dict(model.named_buffers()), buffers_ref),
            "collectives": len(collectives),
            "recomputed_collectives": sum(i.recompute for i in collectives),
            "sync_bns": sum(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules()),
            "predicted": trainer.stats.predicted_peak, "measured": trainer.stats.measured_peak,
            "budget": trainer.budget,
            "moved": counts.get("offload", 0) + counts.get("recompute", 0),
            "recomputed": counts.get("recompute", 0), "sub_batches": planned.plan.sub_batches,
            "checksum": [float(g.double().sum()) for g in got.values()]}


def fail_before_sync_bn(rank: int, world: int, timeout_s: float) -> Any:
    """Rank 1 runs out of device memory at its step's first allocation, while rank 0 waits in
    the forward all-reduce of a SyncBatchNorm's statistics. Returns "no error" or raises."""
    import outcore

    torch.manual_seed(0)
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
        torch.nn.Linear(16, 2)))
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    mine = _shard((x, y), rank, world)
    trainer = outcore.compile(model, torch.nn.functional.cross_entropy, mine, budget=None,
                              device="cpu-emulated", policy="keep-all", distributed=True,
                              timeout=datetime.timedelta(seconds=timeout_s))
    if rank == 1:
        trainer.executor.capacity = 1024  # far below the step's peak: DeviceOutOfMemory
    trainer.step(*mine)
    return "no error"

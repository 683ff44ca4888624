"""Helpers of the data-parallel tests: start ranks, and what each rank does.

``launch(fn, world, args)`` starts ``world`` processes (spawn) that find each other through
torchrun's environment variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``), so
``outcore.compile(..., distributed=True)`` takes the same path as under torchrun. Each rank
returns a picklable value (written to a file), or the exception it raised as
``("error", type name, message)``; ``launch`` returns them by rank.
"""

from __future__ import annotations

import copy
import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, out: str,
           args: tuple[Any, ...]) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    try:
        result: Any = fn(rank, world, *args)
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        result = ("error", type(exc).__name__, f"{exc}\n{traceback.format_exc()}")
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    import torch.distributed as dist

    failed = isinstance(result, tuple) and result[:1] == ("error",)
    if failed:
        # A group whose peer is gone can abort (SIGABRT) in gloo's teardown at exit; the
        # result is written, so leave without running the group's destructors.
        os._exit(0)
    if dist.is_initialized():
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], world: int, *args: Any, deadline: float = 300.0) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks; their results by rank.

    Raises TimeoutError (after killing the ranks) when they have not all ended within
    ``deadline`` seconds: a hang is a failure, not a stuck test run."""
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_entry, args=(fn, world, free_port(), out, args),
                                 nprocs=world, start_method="spawn", join=False)
        end = time.monotonic() + deadline
        try:
            while not ctx.join(timeout=max(0.1, min(5.0, end - time.monotonic()))):
                if time.monotonic() > end:
                    raise TimeoutError(f"the {world} ranks did not end within {deadline} s")
        except mp.ProcessExitedException as exc:
            missing = [r for r in range(world) if not Path(out, f"rank{r}.pkl").exists()]
            if missing:  # a rank died before it could report: that is the failure
                raise RuntimeError(f"ranks {missing} died without a result: {exc}") from exc
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        return [pickle.loads(Path(out, f"rank{r}.pkl").read_bytes()) for r in range(world)]


def fail_one_rank(rank: int, world: int, how: str, timeout_s: float) -> Any:
    """Every rank builds a trainer; rank 1 then fails in its step (``how``: "oom": its
    device is too small; "exception": its batch has the wrong width, so its forward raises).
    Returns "no error" or raises (``_entry`` records the exception)."""
    import outcore

    model, loss_fn, full = workload("mlp", 8)
    mine = _shard(full, rank, world)
    trainer = outcore.compile(model, loss_fn, mine, budget=None, device="cpu-emulated",
                              policy="keep-all", distributed=True,
                              timeout=datetime.timedelta(seconds=timeout_s))
    if rank == 1 and how == "oom":
        trainer.executor.capacity = 1024  # far below the step's peak: DeviceOutOfMemory
    if rank == 1 and how == "exception":
        mine = (mine[0][:, :-1], mine[1])
    if rank == 1 and how == "hang":
        # A rank that stops without failing (stuck in the user's own code): it reports
        # nothing and keeps its connections open, so only the group's timeout ends rank 0.
        time.sleep(4 * timeout_s)
        return "hung"
    trainer.step(*mine)
    return "no error"


def slow_planner(rank: int, world: int, timeout_s: float, late_s: float) -> Any:
    """Rank 0 captures its share ``late_s`` seconds after the others (its loss function
    sleeps while it is traced, as a slower machine would), under a group timeout of
    ``timeout_s``; then every rank steps. Returns this rank's loss."""
    import outcore

    model, loss_fn, full = workload("mlp", 8)
    slept: list[bool] = []

    def late_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if rank == 0 and not slept:
            slept.append(True)
            time.sleep(late_s)
        return loss_fn(out, target)

    mine = _shard(full, rank, world)
    trainer = outcore.compile(model, late_loss, mine, budget=None, device="cpu-emulated",
                              policy="keep-all", distributed=True,
                              timeout=datetime.timedelta(seconds=timeout_s))
    return float(trainer.step(*mine))


# -- what the ranks do ---------------------------------------------------------------------
def _shard(batch: tuple[torch.Tensor, ...], rank: int, world: int) -> tuple[Any, ...]:
    return tuple(t.chunk(world)[rank] for t in batch)


def _eager_grads(model: torch.nn.Module, loss_fn: Any, batch: Any) -> dict[str, torch.Tensor]:
    m = copy.deepcopy(model)
    m.zero_grad(set_to_none=True)
    loss_fn(m(batch[0]), batch[1]).backward()
    return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def _max_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest |a - b| relative to the largest |b| of the same parameter."""
    worst = 0.0
    for name, ref in b.items():
        scale = max(ref.abs().max().item(), 1e-12)
        worst = max(worst, (a[name] - ref).abs().max().item() / scale)
    return worst


#: Small zoo networks for the gradient tests: no dropout (its masks would differ from the
#: eager reference's), DenseNet with short blocks (same topology, faster capture).
OPTIONS: dict[str, dict[str, Any]] = {"transformer": {"dropout": 0.0}, "vgg16": {"dropout": 0.0},
                                      "densenet121": {"blocks": (2, 2, 2, 2)}}


def workload(name: str, batch: int) -> tuple[torch.nn.Module, Any, tuple[Any, ...]]:
    """A small zoo network (same seed on every rank: identical models and global batch)."""
    from outcore.zoo import registry

    w = registry.get(name, batch, small=True, seed=0, **OPTIONS.get(name, {}))
    return w.model, w.loss_fn, tuple(w.batch)


def grads_vs_reference(rank: int, world: int, name: str, batch: int, policies: list[str],
                       budget_fraction: float | None,
                       bucket_cap: int = 1 << 14) -> dict[str, Any]:
    """Per policy (under ``_budget(budget_fraction)`` when the policy meets it, else
    unbounded): this rank's averaged gradients against (1) the mean of the per-shard
    eager gradients (what DDP computes) and (2) the whole batch's eager gradients; plus
    the predicted and measured peak of the step."""
    import outcore

    model, loss_fn, full = workload(name, batch)
    mine = _shard(full, rank, world)
    shards = [_eager_grads(model, loss_fn, _shard(full, r, world)) for r in range(world)]
    ddp = {n: sum(s[n] for s in shards) / world for n in shards[0]}
    whole = _eager_grads(model, loss_fn, full)
    from outcore.capture.batching import own_storage

    graph = outcore.capture(model, loss_fn, own_storage(mine))  # as compile captures a share
    budget = None
    if budget_fraction is not None:
        budget = _budget(graph, budget_fraction, bucket_cap)
    if policies == ["*"]:
        policies = outcore.policies()
    rows: dict[str, Any] = {}
    timeout = datetime.timedelta(seconds=60)
    for i, policy in enumerate(policies):
        model.zero_grad(set_to_none=True)
        trainer, bounded = _trainer(i == 0, model, loss_fn, mine, graph, policy, budget,
                                    timeout, bucket_cap)
        from outcore.runtime.executor import Executor

        one = Executor(trainer.planned.graph, trainer.planned.schedule)  # plain CPU device
        runs = [_single_device_grads(one, trainer.planned.plan.sub_batches,
                                     _shard(full, r, world)) for r in range(world)]
        same_plan = {n: sum(s[n] for s, _ in runs) / world for n in runs[0][0]}
        # What the same plan measures beyond its prediction on ONE device (0 but for plans
        # whose single-device accounting is off, a bug outside data parallel): the rank
        # must add nothing to it. Such a plan would run out of its budget: measure unbounded.
        # (The baseline runs each share with its own storage, as the rank steps it.)
        from outcore.plan.memory import predicted_peak

        single_excess = max(p for _, p in runs) - predicted_peak(trainer.planned.graph,
                                                                  trainer.planned.schedule)
        if single_excess:
            trainer.executor.capacity = None
        try:
            trainer.step(*mine)
        except Exception as exc:  # noqa: BLE001 - reported per policy; the test asserts none
            rows[policy] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        finally:
            trainer.close()
        got = {n: p.grad for n, p in model.named_parameters(remove_duplicate=False)
               if p.grad is not None}  # tied weights: under every name (one .grad)
        counts = trainer.planned.counts()
        rows[policy] = {"plan": _max_err(got, same_plan), "single_excess": single_excess,
                        "ddp": _max_err(got, ddp),
                        "whole": _max_err(got, whole), "missing": sorted(set(ddp) - set(got)),
                        "predicted": trainer.stats.predicted_peak,
                        "measured": trainer.stats.measured_peak, "bounded": bounded,
                        "budget": trainer.budget,
                        "moved": counts.get("offload", 0) + counts.get("recompute", 0),
                        "variants": len(trainer.planned.schedule.variants),
                        "buckets": len(trainer.buckets),
                        "sub_batches": trainer.planned.plan.sub_batches,
                        "link": trainer.stats.link_bandwidth,
                        "link_steps": 0 if trainer._link is None else trainer._link.steps,
                        "share": list(getattr(trainer.device, "link_share", (1.0, 1.0))),
                        "checksum": [float(g.double().sum()) for g in got.values()]}
    return rows


def _budget(graph: Any, fraction: float, bucket_cap: int) -> int:
    """``fraction`` of the way from offload-all's peak to free-at-last-use's, gradient
    buckets included: tight enough that the budget-aware policies have to move tensors."""
    import outcore
    from outcore.plan.grad_buckets import assign_buckets, peak_with_buckets

    def peak(policy: str) -> int:
        p = outcore.plan(graph, None, policy=policy, simulate=False)
        return peak_with_buckets(p.graph, p.schedule,
                                 assign_buckets(p.graph, p.schedule, bucket_cap))

    low, high = peak("offload-all"), peak("liveness")
    return int(low + fraction * (high - low))


def _single_device_grads(executor: Any, k: int,
                         batch: Any) -> tuple[dict[str, torch.Tensor], int]:
    """The gradients of ``executor``'s plan run on its (one, plain) device, nothing
    distributed (the mean over its ``k`` sub-batches), and the peak it measured."""
    from outcore.runtime.subbatch import split_batch

    results = [executor.run(sub, apply=False) for sub in split_batch(batch, k)]
    parts = [r.grads for r in results]
    params = {n.removeprefix("model."): p for n, p in
              executor.step.step_module.named_parameters(remove_duplicate=False)}
    by_param: dict[int, torch.Tensor] = {}  # tied weights: one gradient per use, summed
    for part in parts:
        for name, grad in part.items():
            key = id(params[name])
            by_param[key] = by_param[key] + grad / k if key in by_param else grad / k
    grads = {n: by_param[id(p)] for n, p in params.items() if id(p) in by_param}
    return grads, max(r.peak_bytes for r in results)


def _trainer(first: bool, model: Any, loss_fn: Any, mine: Any, graph: Any, policy: str,
             budget: int | None, timeout: datetime.timedelta,
             bucket_cap: int) -> tuple[Any, bool]:
    """This rank's trainer: through ``outcore.compile`` for the first policy (the API path),
    then from the captured graph; under ``budget`` when the policy meets it, else unbounded
    (policies that ignore budgets)."""
    import outcore
    from outcore.distributed import data_parallel_trainer, rank_context

    for limit in (budget, None):
        try:
            if first:
                return outcore.compile(model, loss_fn, mine, budget=limit, policy=policy,
                                       device="cpu-emulated", distributed=True,
                                       timeout=timeout, bucket_cap=bucket_cap), limit is not None
            ctx = rank_context(True, "cpu-emulated")
            return data_parallel_trainer(model, graph, ctx, budget=limit, policy=policy,
                                         device="cpu-emulated",
                                         bucket_cap=bucket_cap), limit is not None
        except outcore.InfeasibleBudgetError:
            if limit is None:
                raise
    raise AssertionError("unreachable")


def fsdp2_with_outcore_block(rank: int, world: int) -> dict[str, Any]:
    """An FSDP2 (``fully_shard``) model whose first block is compiled by outcore's backend
    (offload-all): its step's gradients (gathered from the shards) against the mean over
    the ranks' halves of eager PyTorch's, and the block's plan and measured peak."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import outcore

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 32), torch.nn.Tanh())
    model = torch.nn.Sequential(block, torch.nn.Linear(32, 2))
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 8), torch.randint(0, 2, (8,))
    loss_fn = torch.nn.functional.cross_entropy
    ddp = {}
    for r in range(world):
        for name, grad in _eager_grads(reference, loss_fn, _shard((x, y), r, world)).items():
            ddp[name] = ddp.get(name, 0) + grad / world
    be = outcore.backend(budget=None, device="cpu-emulated", policy="offload-all")
    model[0] = torch.compile(model[0], backend=be)
    fully_shard(model)  # parameters sharded over the ranks, gathered for the step
    sharded = all(type(p).__name__ == "DTensor" for p in model.parameters())
    mine = _shard((x, y), rank, world)
    loss_fn(model(mine[0]), mine[1]).backward()
    got = {n.replace("_orig_mod.", ""): p.grad.full_tensor()
           for n, p in model.named_parameters()}
    planned = be.graphs[0].planned
    be.close()
    return {"sharded": sharded, "err": _max_err(got, ddp), "names": sorted(got),
            "expected": sorted(ddp), "offloads": planned.counts().get("offload", 0),
            "measured": be.stats.measured_peak, "predicted": be.stats.predicted_peak}


def unequal_plans(rank: int, world: int) -> Any:
    """Rank 1 plans with another policy than rank 0: the first step must fail on every
    rank before any other collective (their collectives would not match)."""
    import outcore

    model, loss_fn, full = workload("mlp", 8)
    mine = _shard(full, rank, world)
    trainer = outcore.compile(model, loss_fn, mine, budget=None, device="cpu-emulated",
                              policy="keep-all" if rank == 0 else "offload-all",
                              distributed=True, timeout=datetime.timedelta(seconds=30))
    trainer.step(*mine)
    return "stepped"


def input_grads_split(rank: int, world: int) -> dict[str, Any]:
    """A rank's share whose images require grad, split into sub-batches (a budget below the
    share's lowest peak): the step's ``x.grad`` against eager's on the share (DDP does not
    reduce input gradients), twice (the second accumulates), and the parameters' averaged
    gradients against the mean of the shares' eager ones."""
    import warnings

    import torch.nn.functional as F
    from split_helpers import below_the_whole_batch, conv_net

    import outcore

    model = conv_net()
    g = torch.Generator().manual_seed(1)
    full = (torch.randn(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g))
    shards = [_shard(full, r, world) for r in range(world)]
    ddp = {n: sum(s[n] for s in (_eager_grads(model, F.cross_entropy, sh) for sh in shards))
           / world for n, _ in model.named_parameters()}
    reference = copy.deepcopy(model)
    x, y = (t.clone() for t in shards[rank])
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    budget = below_the_whole_batch(model, F.cross_entropy, (xs, y), "cpu-emulated")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = outcore.compile(model, F.cross_entropy, (xs, y), budget=budget,
                                  device="cpu-emulated", distributed=True,
                                  allow_sub_batches=True,
                                  timeout=datetime.timedelta(seconds=60))
    errors = []
    for _ in range(2):
        trainer.step(xs, y)
        F.cross_entropy(reference(xr), y).backward()
        errors.append(float((xs.grad - xr.grad).abs().max() / xr.grad.abs().max()))
    trainer.close()
    got = {n: p.grad / 2 for n, p in model.named_parameters()}  # two steps accumulated
    return {"sub_batches": trainer.planned.plan.sub_batches, "input": errors,
            "ddp": _max_err(got, ddp)}


def outputs_on_ranks(rank: int, world: int) -> dict[str, Any]:
    """``outcore.compile(..., distributed=True, outputs=True)``: each rank's
    ``trainer.outputs`` against eager's forward on its share, unbounded and split into
    sub-batches (a budget below the share's lowest peak), and after an evaluation."""
    import warnings

    import torch.nn.functional as F
    from split_helpers import below_the_whole_batch, conv_net

    import outcore

    model = conv_net()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    full = (torch.randn(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g))
    x, y = (t.clone() for t in _shard(full, rank, world))
    low = below_the_whole_batch(model, F.cross_entropy, (x, y), "cpu-emulated")
    rows: dict[str, Any] = {}
    for name, budget in (("unbounded", None), ("split", low)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = outcore.compile(model, F.cross_entropy, (x, y), budget=budget,
                                      device="cpu-emulated", distributed=True, outputs=True,
                                      allow_sub_batches=True,
                                      timeout=datetime.timedelta(seconds=60))
        trainer.step(x, y)
        want = reference(x).detach()
        rows[name] = {"sub_batches": trainer.planned.plan.sub_batches,
                      "error": float((trainer.outputs - want).abs().max())}
        with torch.no_grad():
            trainer.step(x, y)
        rows[name]["eval"] = torch.equal(trainer.outputs, reference(x))
        trainer.close()
    return rows

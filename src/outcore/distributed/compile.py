"""``compile_data_parallel``: capture and plan this rank's share, on the shared host link.

Called by ``outcore.compile(..., distributed=...)``. Each rank captures its own share of
the mini-batch (``example_batch`` is this rank's, as with DDP and a DistributedSampler),
plans it with a cost model whose host link is shared by the ranks
(``outcore.sim.multi_gpu.rank_cost_model``), and adds its gradient buckets to the memory
rule (``outcore.plan.grad_buckets``): the predicted peak (``trainer.stats.predicted_peak``)
includes the bucket buffers, and must stay within the budget. When the plan at the full
budget leaves no room for the buckets it is re-planned with the budget less the buckets'
bytes.

A share of another signature (a smaller last batch, an uneven split) is captured and planned
on its first step by the trainer's ``replan`` (``data_parallel_trainer``): the same policy,
budget, cost model and options, the first plan's gradient buckets
(``outcore.distributed.layout``), and sub-batches only when the first share had them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from outcore.api import PlannedStep, cost_model_for, plan
from outcore.capture import capture
from outcore.capture.batching import LossFn, own_storage
from outcore.distributed.group import DistributedError, RankContext, rank_context
from outcore.distributed.layout import tied_names
from outcore.distributed.sync_bn import traced_sync_batchnorm
from outcore.distributed.trainer import DataParallelTrainer, broadcast_state
from outcore.errors import InfeasibleBudgetError
from outcore.fixed_step import SHAPES
from outcore.graph.ir import Graph
from outcore.plan.grad_buckets import (
    DEFAULT_BUCKET_CAP,
    GradBucket,
    assign_buckets,
    peak_with_buckets,
    tied_gradients,
    total_bucket_bytes,
)
from outcore.units import parse_bytes


def compile_data_parallel(model: nn.Module, loss_fn: LossFn,
                          example_batch: Any, *, distributed: Any = True,
                          budget: int | str | None = "6GiB", device: str = "cuda",
                          gpu: str | None = None, policy: str = "auto",
                          bucket_cap: int = DEFAULT_BUCKET_CAP,
                          timeout: datetime.timedelta | None = None,
                          host: str | None = None, autocast: torch.dtype | None = None,
                          cache_size: int = SHAPES, outputs: bool = False,
                          **options: Any) -> DataParallelTrainer:
    """Capture, plan and prepare this rank's share (module doc); see ``outcore.compile``.

    ``host``: the multi-GPU host profile (``outcore.cost.profiles.HOSTS``) whose shared
    link the plan assumes; default the host of ``gpu``. ``autocast``: captured (default:
    the one in effect); ``cache_size``: share signatures kept; ``outputs``: keep what the
    model returned on this rank's share (``trainer.outputs``, as DDP's forward returns the
    local output); ``options`` go to ``plan``.
    """
    ctx = rank_context(distributed, device, timeout)
    # A report left by an earlier trainer's failed step would end the others' wait for
    # this rank's planning (``RankContext.arrive``); withdrawn before the first collective.
    ctx.clear_failure()
    _guard(ctx, "the broadcast of rank 0's parameters and buffers",
           lambda: broadcast_state(model, ctx))
    try:
        graph = capture_rank(model, loss_fn, example_batch, ctx, autocast=autocast,
                             outputs=outputs)
    except BaseException as exc:
        ctx.report_failure(exc)
        if isinstance(exc, Exception):  # the agreement data_parallel_trainer's ranks enter
            _agree_on_planning(ctx, exc)
        raise

    def recapture(parts: int) -> Graph:
        from outcore.runtime.subbatch import split_batch

        first = split_batch(_as_stepped(example_batch), parts)[0]
        return capture_rank(model, loss_fn, first, ctx, autocast=autocast, outputs=outputs)

    return data_parallel_trainer(model, graph, ctx, budget=budget, device=device, gpu=gpu,
                                 policy=policy, bucket_cap=bucket_cap, host=host,
                                 recapture=recapture, shapes=cache_size, **options)


def data_parallel_trainer(model: nn.Module, graph: Graph, ctx: RankContext, *,
                          budget: int | str | None = "6GiB", device: str = "cuda",
                          gpu: str | None = None, policy: str = "auto",
                          bucket_cap: int = DEFAULT_BUCKET_CAP, host: str | None = None,
                          recapture: Callable[[int], Graph] | None = None,
                          shapes: int = SHAPES, **options: Any) -> DataParallelTrainer:
    """Plan ``graph`` (this rank's captured share of ``model``'s step) and build the
    rank's trainer, which keeps ``shapes`` other share signatures; the parameters must
    already equal rank 0's (``broadcast_state``). Every rank calls it: a rank whose
    planning fails raises its error, the others ``DistributedError`` naming it, at once
    (the agreement ``PLANNING``, ``RankContext.agree``)."""
    try:
        trainer = _build(model, graph, ctx, budget, device, gpu, policy, bucket_cap, host,
                         recapture, shapes, options)
    except BaseException as exc:
        ctx.report_failure(exc)
        if isinstance(exc, Exception):  # an interrupt does not wait for the others
            _agree_on_planning(ctx, exc)
        raise
    _agree_on_planning(ctx)
    ctx.clear_failure()
    return trainer


def _build(model: nn.Module, graph: Graph, ctx: RankContext, budget: int | str | None,
           device: str, gpu: str | None, policy: str, bucket_cap: int, host: str | None,
           recapture: Callable[[int], Graph] | None, shapes: int,
           options: dict[str, Any]) -> DataParallelTrainer:
    """``data_parallel_trainer``'s work on this rank alone: plan, device, trainer."""
    limit = None if budget is None else parse_bytes(budget)
    tied = tied_names(model)
    cost = rank_cost(gpu, host, ctx.world_size)
    planned, buckets = plan_rank(graph, limit, policy, cost, recapture, bucket_cap,
                                 ctx.world_size, options, tied=tied_gradients(graph, tied))
    dev = rank_device(device, limit, gpu, host, ctx.world_size)
    step = graph.source.step_module
    cast = step.autocast[1] if step.autocast is not None else None
    keep = graph.source.outputs is not None  # captured with outputs=True
    split = planned.plan.sub_batches > 1
    built: list[DataParallelTrainer] = []

    def replan(batch: Any) -> PlannedStep:
        """Capture and plan a share of another signature (module doc)."""
        from outcore.runtime.subbatch import split_batch

        layout = built[0].layout
        share = capture_rank(model, step.loss_fn, batch, ctx, autocast=cast, outputs=keep)

        def again(parts: int) -> Graph:
            first = split_batch(_as_stepped(batch), parts)[0]
            return capture_rank(model, step.loss_fn, first, ctx, autocast=cast, outputs=keep)

        return plan_rank(share, limit, policy, cost, again if split else None, bucket_cap,
                         ctx.world_size, options if split else
                         {**options, "allow_sub_batches": False},
                         buckets_for=lambda p: layout.buckets(p.graph, p.schedule))[0]

    trainer = DataParallelTrainer(model, planned, dev, limit, ctx, buckets, replan=replan,
                                  tied=tied, shapes=shapes)
    built.append(trainer)
    return trainer


#: The agreement point at the end of planning (``data_parallel_trainer``).
PLANNING = "the planning of the ranks' first shares"


def _agree_on_planning(ctx: RankContext, failure: Exception | None = None) -> None:
    """The end of planning on this rank (``failure``: the error its planning raised): wait
    for the others through the store (``RankContext.arrive``: up to ``PLANNING_WAIT``,
    not the group's short collective timeout), then agree. A failed rank returns whatever
    the others did; its caller raises its own error."""
    try:
        ctx.arrive(PLANNING)
    except DistributedError:
        if failure is not None:
            return
        raise
    ctx.agree(PLANNING, failure)


def _guard(ctx: RankContext, what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except RuntimeError as exc:
        raise ctx.error(what, exc) from exc


def capture_rank(model: nn.Module, loss_fn: LossFn, batch: Any,
                 ctx: RankContext, autocast: torch.dtype | None = None,
                 outputs: bool = False) -> Graph:
    """Capture this rank's step on ``batch`` (under ``autocast``, else the ambient one;
    keeping the model's outputs with ``outputs``); a ``nn.SyncBatchNorm`` captures with
    batch statistics over the ranks (``outcore.distributed.sync_bn``)."""
    with traced_sync_batchnorm(model, ctx.group):
        return capture(model, loss_fn, own_storage(batch), autocast=autocast,
                       outputs=outputs)


def rank_cost(gpu: str | None, host: str | None, world_size: int) -> Any:
    """The analytic cost model of one rank: ``gpu``'s, on the host link shared by
    ``world_size`` ranks (a measured "this-cpu" model is returned as it is)."""
    base = cost_model_for(gpu)
    if gpu == "this-cpu" or world_size == 1:
        return base
    from outcore.cost.interconnects import default_host, get_host
    from outcore.sim.multi_gpu import rank_cost_model

    machine = get_host(host) if host else default_host(base.profile.name)
    return rank_cost_model(base.profile, machine, world_size, variants=base.variants)


#: Re-plans ``plan_rank`` tries before it gives up fitting the buckets beside a plan.
REPLANS = 6


def plan_rank(graph: Graph, limit: int | None, policy: str, cost: Any,
              recapture: Callable[[int], Graph] | None, bucket_cap: int, world_size: int,
              options: dict[str, Any], *, tied: Sequence[Sequence[int]] = (),
              buckets_for: Callable[[PlannedStep], list[GradBucket]] | None = None,
              ) -> tuple[PlannedStep, list[GradBucket]]:
    """Plan one rank; its predicted peak includes its gradient buckets: assigned on the plan
    (``tied``: groups of one parameter's gradient ids), or ``buckets_for(plan)`` (another
    share signature: the first plan's buckets, ``outcore.distributed.layout``).

    The buckets are allocated during backward, so they add to the peak only where it falls
    after them: the rank is planned at the budget, and while the peak with its buckets is
    over, re-planned at a budget lowered by the excess (at most ``REPLANS`` times)."""
    target = limit
    buckets: list[GradBucket] = []
    for _ in range(REPLANS):
        planned = plan(graph, target, policy=policy, cost=cost, recapture=recapture,
                       simulate=False, **options)
        buckets = (buckets_for(planned) if buckets_for is not None
                   else _buckets(planned, bucket_cap, world_size, tied))
        peak = peak_with_buckets(planned.graph, planned.schedule, buckets)
        if limit is None or target is None or peak <= limit:
            planned.predicted_peak = peak
            return planned, buckets
        target -= peak - limit
        if target <= 0:
            break
    assert limit is not None  # an unbounded plan returns in the loop
    raise InfeasibleBudgetError(policy, limit, limit + total_bucket_bytes(buckets),
                                "The plan and its gradient buckets "
                                f"({total_bucket_bytes(buckets)} bytes, all held at the end of "
                                "backward) do not fit together; raise the budget or lower "
                                "bucket_cap.")


def _buckets(planned: PlannedStep, cap: int, world_size: int,
             tied: Sequence[Sequence[int]]) -> list[GradBucket]:
    if world_size == 1 or planned.plan.sub_batches > 1:
        return []  # one rank: nothing to reduce; sub-batches: .grad is reduced after them
    return assign_buckets(planned.graph, planned.schedule, cap, tied)


def rank_device(device: str, limit: int | None, gpu: str | None, host: str | None,
                world_size: int) -> Any:
    """This rank's device; a CPU-emulated one gets the shared link's bandwidth."""
    from outcore.runtime.devices import make_device

    if device != "cpu-emulated":
        return make_device(device, capacity=limit)
    if world_size == 1 or gpu == "this-cpu":
        return make_device(device, capacity=limit, gpu=gpu)
    from outcore.cost.interconnects import default_host, get_host
    from outcore.cost.profiles import get_profile
    from outcore.runtime.devices.bandwidth import bandwidth_for_gpu

    profile = get_profile(gpu or "v100-pcie")
    machine = get_host(host) if host else default_host(profile.name)
    d2h, h2d = bandwidth_for_gpu(profile.name)
    share_d2h = machine.copy_bandwidth(profile.d2h_bandwidth, world_size) / profile.d2h_bandwidth
    share_h2d = machine.copy_bandwidth(profile.h2d_bandwidth, world_size) / profile.h2d_bandwidth
    made: Any = make_device(device, capacity=limit,
                            bandwidth=(d2h * share_d2h, h2d * share_h2d))
    made.emulates = profile.name  # scaled to the model on its first steps, keeping the share
    made.link_share = (share_d2h, share_h2d)
    return made


def _as_stepped(batch: Any) -> Any:
    """``batch`` as ``step`` receives it: a list ``[x, y]`` as the tuple ``step(x, y)``
    makes, a dict (``step(batch)``) or any other batch as it is (``tuple`` of a dict would
    be its keys)."""
    return tuple(batch) if isinstance(batch, list) else batch

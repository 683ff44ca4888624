"""SyncBatchNorm on any device: batch statistics over every rank, captured like any op.

``torch.nn.SyncBatchNorm`` runs only on CUDA/XPU (its kernels gather statistics with
collectives inside an autograd Function that tracing cannot follow). While a data-parallel
rank captures its step, ``traced_sync_batchnorm(model, group)`` gives each SyncBatchNorm of
the model a forward outcore can capture and run on any device (the CPU-emulated one with
gloo included), with SyncBatchNorm's semantics:

* forward (training): each rank sums its share per channel, ``sum x`` and ``sum x^2``, and
  its element count (in float32 for a lower-precision input); one all-reduce (sum) of
  ``[sum, sum of squares, count]`` gives the whole batch's; ``mean = sum / n``,
  ``var = sum of squares / n - mean^2`` (biased, as BatchNorm normalises with),
  ``y = x * scale + shift`` with ``scale = weight / sqrt(var + eps)`` and
  ``shift = bias - mean * scale``;
* backward: autograd of the above. The all-reduce's adjoint is an all-reduce (sum) of the
  incoming gradient (every rank's statistics depend on every rank's share), so backward
  issues one all-reduce of the gradients of ``[sum, sum of squares]``: the ``sum_dy`` and
  ``sum_dy_xmu`` reductions of torch's SyncBatchNorm, in another basis. Each rank's input
  gradient is then that of the sum of the ranks' losses; averaged by the gradient buckets
  it is the gradient of the whole batch's loss with BatchNorm on the whole batch;
* running statistics as SyncBatchNorm updates them: the global mean, and the global
  variance made unbiased with the global count (``n / (n - 1)``), with the module's
  momentum (``None``: cumulative average over ``num_batches_tracked``); every rank computes
  the same values;
* eval mode: the running statistics, as BatchNorm (no collective); a group of one rank: the
  same formulas without the all-reduce.

The collective is the custom op ``outcore::sync_bn_all_reduce`` (``all_reduce_sum``): one
node of the captured graph, which the executor runs like any op, once per step. Recompute
does not re-issue it. Its output is read only in forward (the statistics read in backward
are new tensors computed from it; the count enters through ``detach``), so it is no
activation a policy decides about, and a recomputed statistic finds it kept alive until
then (``outcore.plan.lower`` keeps every tensor without a decision resident). A policy that
replays whole segments of its own schedule (SuperNeurons) may still recompute it: the
replay then copies the statistics the forward saved instead of issuing a collective
(``outcore.distributed.replay``). Every rank runs the same schedule (checked when the
trainer is built), so the ranks' collectives match one to one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from outcore.distributed.group import DistributedError
from outcore.errors import OutcoreError

#: The op's name in the captured graph (``Op.target``).
ALL_REDUCE_TARGET = "outcore.sync_bn_all_reduce.default"


class SyncBatchNormCollectiveError(DistributedError):
    """The all-reduce of a SyncBatchNorm's statistics failed (another rank failed or
    stopped); the data-parallel trainer re-raises it naming the rank that failed."""


@torch.library.custom_op("outcore::sync_bn_all_reduce", mutates_args=())
def all_reduce_sum(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """A new tensor: the sum of ``x`` over the ranks of the group named ``group_name``."""
    from torch.distributed.distributed_c10d import GroupName, _resolve_process_group

    # The collective reduces a private buffer and the op returns a copy: the backend may
    # hold the tensor it reduced past the call (gloo's work object, on its own thread), and
    # a returned tensor held so would outlive its Free by a few instructions on the
    # tracker (measured: a 68-byte vector over the plan). Inside the op the tracker's mode
    # is off, so only the returned copy is counted, as the plan counts it.
    buf = x.clone()
    try:
        dist.all_reduce(buf, group=_resolve_process_group(GroupName(group_name)))
    except RuntimeError as exc:
        raise SyncBatchNormCollectiveError(
            f"the all-reduce of SyncBatchNorm statistics failed: {exc}") from exc
    return buf.clone()


@all_reduce_sum.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.group_name = inputs[1]


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    return all_reduce_sum(grad, ctx.group_name), None


all_reduce_sum.register_autograd(_backward, setup_context=_setup)


class TracedSyncBatchNorm(nn.SyncBatchNorm):
    """The class a SyncBatchNorm has while outcore captures it (module doc); never built,
    only assigned to existing modules by ``traced_sync_batchnorm``."""

    _outcore_group: str
    _outcore_world: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        if not self.training and self.running_mean is not None:
            return super().forward(input)  # eval: running statistics, no collective
        return sync_batch_norm(self, input)


def sync_batch_norm(bn: TracedSyncBatchNorm, x: torch.Tensor) -> torch.Tensor:
    """The training forward of ``bn`` on this rank's ``x`` (module doc)."""
    channels = x.shape[1]
    dims = [0, *range(2, x.dim())]
    local = x.numel() // channels
    if local * bn._outcore_world <= 1:
        raise OutcoreError(f"SyncBatchNorm needs more than one value per channel over the "
                           f"ranks, got input of shape {tuple(x.shape)} on each of "
                           f"{bn._outcore_world} rank(s)")
    # statistics in float32 at least (a float16 count overflows past 65504)
    acc = x if x.dtype in (torch.float32, torch.float64) else x.float()
    count = torch.full((1,), float(local), dtype=acc.dtype, device=x.device)
    packed = torch.cat([acc.sum(dims), (acc * acc).sum(dims), count])
    if bn._outcore_world > 1:
        packed = all_reduce_sum(packed, bn._outcore_group)
    inv_total = packed[2 * channels:].detach().reciprocal()
    mean = packed[:channels] * inv_total
    var = (packed[channels:2 * channels] * inv_total - mean * mean).clamp(min=0.0)
    invstd = torch.rsqrt(var + bn.eps)
    scale = invstd if bn.weight is None else invstd * bn.weight
    shift = -mean * scale if bn.bias is None else bn.bias - mean * scale
    shape = [1, channels] + [1] * (x.dim() - 2)
    if bn.training and bn.track_running_stats:
        _update_running_stats(bn, mean.detach(), var.detach(), inv_total)
    return torch.addcmul(shift.view(shape).to(x.dtype), x, scale.view(shape).to(x.dtype))


def _update_running_stats(bn: nn.SyncBatchNorm, mean: torch.Tensor, var: torch.Tensor,
                          inv_total: torch.Tensor) -> None:
    """As SyncBatchNorm: momentum (or the cumulative average), unbiased global variance."""
    assert bn.running_mean is not None and bn.running_var is not None
    assert bn.num_batches_tracked is not None
    with torch.no_grad():
        bn.num_batches_tracked.add_(1)
        factor: Any = (bn.momentum if bn.momentum is not None
                       else 1.0 / bn.num_batches_tracked.to(mean.dtype))
        unbiased = var / (1.0 - inv_total)  # var * n / (n - 1)
        bn.running_mean.mul_(1.0 - factor).add_(mean * factor)
        bn.running_var.mul_(1.0 - factor).add_(unbiased * factor)


@contextlib.contextmanager
def traced_sync_batchnorm(model: nn.Module, group: Any) -> Iterator[int]:
    """While the block runs, every ``nn.SyncBatchNorm`` of ``model`` captures as
    ``TracedSyncBatchNorm`` reducing over its own ``process_group``, or ``group`` (the
    data-parallel group) when it has none; yields how many there are. The modules get their
    class back afterwards (their parameters and buffers are untouched)."""
    swapped: list[nn.SyncBatchNorm] = []
    try:
        for module in model.modules():
            if type(module) is not nn.SyncBatchNorm:
                continue
            assert isinstance(module, nn.SyncBatchNorm)
            own = module.process_group
            chosen = own if own is not None else group
            module.__class__ = TracedSyncBatchNorm
            traced = cast(TracedSyncBatchNorm, module)
            traced._outcore_group = chosen.group_name
            traced._outcore_world = dist.get_world_size(chosen)
            swapped.append(module)
        yield len(swapped)
    finally:
        for module in swapped:
            module.__class__ = nn.SyncBatchNorm
            del module._outcore_group
            del module._outcore_world

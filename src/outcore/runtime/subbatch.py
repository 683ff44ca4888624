"""Sub-batch execution with gradient accumulation (moDNN §4.1).

A mini-batch of N samples is split into ``k`` equal sub-batches along each input's batch
dimension (``outcore.graph.batch_dims``: dimension 0 in the usual batch-first layout, the
dimension of size N otherwise, or what ``batch_dims=`` names); the step graph was captured
for one sub-batch (N / k samples). Each sub-batch runs the same Schedule and its gradients
are accumulated with the loss's weight, read from the traced loss
(``outcore.runtime.loss_split``: 1/k for a mean over samples, 1 for a sum, the sub-batch's
share of the denominator for NLL with ``ignore_index`` or class weights and for label
smoothing; a loss that cannot be split exactly is refused), which gives the full-batch
gradient up to float rounding of the sum order.

Nothing is applied until every sub-batch has run: gradients are summed in a private
buffer and added to ``.grad`` once at the end, so a failure in any sub-batch leaves the
model's ``.grad`` and buffers as they were before the step.

Random ops (dropout) draw the full batch's random numbers and keep each sub-batch's rows, the
same masks as eager for the same seed (``outcore.runtime.sub_batch_rng``; where that cannot
be done the step draws per sub-batch and says so).

BatchNorm: statistics are computed per sub-batch (as with any smaller batch), so gradients
differ from the full batch; running statistics are updated once per sub-batch, i.e. k times
per step with the module's momentum. moDNN only plans this when asked (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from outcore.graph.batch_dims import input_batch_dims
from outcore.runtime.executor import Executor, StepResult
from outcore.runtime.loss_split import sub_batch_weights
from outcore.runtime.sub_batch_assembly import Assembly
from outcore.runtime.sub_batch_rng import install


def split_batch(batch: Any, parts: int, dims: Sequence[int] | None = None) -> list[Any]:
    """Split every tensor of ``batch`` along its batch dimension into ``parts`` equal chunks
    (copies, each with its own storage).

    ``dims`` names each tensor's batch dimension (leaf order); by default it is inferred
    from the shapes (``outcore.graph.batch_dims.input_batch_dims``). Raises ValueError when
    the batch size is not divisible by ``parts``, and ``BatchDimError`` when the layout is
    ambiguous.
    """
    leaves, spec = tree_flatten(batch)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    layout = input_batch_dims([t.shape for t in tensors], None, dims)
    if parts < 1 or layout.size % parts:
        raise ValueError(f"a batch of {layout.size} cannot be split into {parts} equal "
                         "sub-batches; choose a sub-batch count that divides the batch size")
    dim_of = iter(layout.dims)
    # each chunk gets its own storage, laid out as the full batch was: a view would keep the
    # whole batch's storage (counted by the step's memory tracker, not by the plan), and a
    # strided view (a batch-second split) would be captured as another computation
    # (a tensor that requires grad: each chunk a leaf of its own that requires it, whose
    # gradients ``runtime.sub_batch_assembly`` assembles into the tensor's)
    chunks = [[c.detach().clone().requires_grad_(leaf.requires_grad)
               for c in leaf.chunk(parts, dim=next(dim_of))]
              if isinstance(leaf, torch.Tensor) else [leaf] * parts for leaf in leaves]
    return [tree_unflatten([c[i] for c in chunks], spec) for i in range(parts)]


def run_sub_batches(executor: Executor, batch: Any, parts: int,
                    loss_scale: float = 1.0) -> StepResult:
    """Run ``executor`` (built for one sub-batch) over ``parts`` sub-batches of ``batch``.

    Each sub-batch's gradient is weighted as the traced loss reduces
    (``outcore.runtime.loss_split``: 1/k for a mean, 1 for a sum, its share of the
    denominator for NLL with ``ignore_index`` or class weights); the weights are computed,
    and a loss that cannot be split refused, before anything runs. Returns a StepResult
    whose loss is ``sum_i w_i * L_i`` (the full batch's) and whose peak is the largest
    sub-batch peak (``peak_measured``: every sub-batch's was counted). Gradients reach
    ``.grad`` only when every sub-batch succeeded, in one commit; buffer updates of a
    sub-batch are applied as it ends (as BatchNorm would on that many samples) and restored
    if a later one fails.

    A batch tensor that requires grad gets the whole batch's gradient in that commit (one
    the forward changes in place, its new value), and the model's kept outputs
    (``outputs=True``) are the whole batch's, in the result (``runtime.sub_batch_assembly``:
    parked in host memory while the sub-batches run).
    """
    dims = executor.graph.meta.get("batch_dims")
    assembly = Assembly(executor, batch, parts, dims)  # refuses before anything runs
    subs = split_batch(batch, parts, dims)
    weights = sub_batch_weights(executor.graph, subs)
    sums: dict[str, torch.Tensor] = {}
    results: list[StepResult] = []
    losses: list[torch.Tensor] = []
    saved: dict[str, torch.Tensor] = {}  # buffers as they were, restored if a sub-batch fails
    rng = install(executor, parts)  # random ops draw eager's numbers (rows of one full draw)
    if rng is not None:
        rng.begin_step(parts)
    try:
        for i, (sub, weight) in enumerate(zip(subs, weights, strict=True)):
            if rng is not None:
                rng.sub_batch(i)
            result = executor.run(sub, apply=False, loss_scale=loss_scale)
            assembly.add(result, weight)  # (its batch tensors' new values taken out)
            if not saved and result.buffers:
                saved = {n: b.clone() for n, b in executor.named_buffers(result.buffers)}
            executor.apply_buffers(result)
            if weight:  # weight 0: every target ignored, its own loss and grads are 0 / 0
                _accumulate(sums, result.grads, weight)
                losses.append(result.loss * weight)
            result.grads, result.buffers = {}, {}
            results.append(result)
    except BaseException:
        if saved:
            executor.apply_grads({}, saved)
        raise
    finally:
        if rng is not None:
            rng.end_step()
    loss = torch.stack(losses).sum() if losses else torch.zeros_like(results[0].loss)
    input_grads, updates, targets = assembly.inputs()
    executor.apply_grads({**sums, **input_grads}, updates, targets)
    return StepResult(loss=loss, peak_bytes=max(r.peak_bytes for r in results), grads=sums,
                      seconds=sum(r.seconds for r in results),
                      peak_measured=all(r.peak_measured for r in results),
                      outputs=assembly.outputs(loss))


def _accumulate(sums: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
                weight: float) -> None:
    """``sums += weight * grads`` into private tensors (never the model's ``.grad``)."""
    with torch.no_grad():
        for name, grad in grads.items():
            if name in sums:
                sums[name].add_(grad, alpha=weight)
            else:
                sums[name] = grad * weight

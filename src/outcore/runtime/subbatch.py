"""Sub-batch execution with gradient accumulation (moDNN §4.1).

A mini-batch of N samples is split into ``k`` equal sub-batches along each input's batch
dimension (``outcore.graph.batch_dims``: dimension 0 in the usual batch-first layout, the
dimension of size N otherwise, or what ``batch_dims=`` names); the step graph was captured
for one sub-batch (N / k samples). Each sub-batch runs the same Schedule and its gradients
are accumulated with the loss's weight: 1/k for a loss that is a mean over samples, 1 for a
sum (read from the captured loss op; another reduction is refused), which gives exactly the
full-batch gradient up to float rounding of the sum order.

Nothing is applied until every sub-batch has run: gradients are summed in a private
buffer and added to ``.grad`` once at the end, so a failure in any sub-batch leaves the
model's ``.grad`` and buffers as they were before the step.

BatchNorm: statistics are computed per sub-batch (as with any smaller batch), so gradients
differ from the full batch; running statistics are updated once per sub-batch, i.e. k times
per step with the module's momentum. moDNN only plans this when asked (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from outcore.errors import CaptureError
from outcore.graph.batch_dims import input_batch_dims
from outcore.runtime.executor import Executor, StepResult

#: Loss ops whose ``reduction`` argument (1 mean, 2 sum) sits at this position.
_REDUCTION_ARG = {
    "aten.nll_loss_forward.default": 3, "aten.nll_loss2d_forward.default": 3,
    "aten.mse_loss.default": 2, "aten.l1_loss.default": 2, "aten.smooth_l1_loss.default": 2,
    "aten.huber_loss.default": 2, "aten.binary_cross_entropy.default": 3,
    "aten.binary_cross_entropy_with_logits.default": 4, "aten.soft_margin_loss.default": 2,
    "aten.kl_div.default": 2,
}


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
    chunks = [[c.clone() for c in leaf.chunk(parts, dim=next(dim_of))]
              if isinstance(leaf, torch.Tensor) else [leaf] * parts for leaf in leaves]
    return [tree_unflatten([c[i] for c in chunks], spec) for i in range(parts)]


def loss_weight(executor: Executor, parts: int) -> float:
    """The weight of one sub-batch's gradient: 1/parts for a mean over samples, 1 for a sum.

    Raises CaptureError when the loss is reduced otherwise (the accumulated gradient would
    not be the full batch's)."""
    graph, step = executor.graph, executor.step
    for role, tid, _ in step.nodes.output_roles:
        if role != "loss":
            continue
        producer = graph.tensors[tid].producer
        if producer is None:
            break
        op = graph.ops[producer]
        node = step.op_nodes[producer]
        position = _REDUCTION_ARG.get(op.target)
        if position is not None:
            reduction = node.args[position] if len(node.args) > position else 1
            if reduction in (1, 2):
                return 1.0 / parts if reduction == 1 else 1.0
        elif op.target.startswith("aten.mean."):
            return 1.0 / parts
        elif op.target.startswith("aten.sum."):
            return 1.0
        raise CaptureError(f"the loss is computed by {op.target} ({op.name!r}), not a mean or "
                           "a sum over samples; sub-batches cannot reproduce its gradient. "
                           "Use a budget that keeps the whole batch (one sub-batch).")
    return 1.0 / parts


def run_sub_batches(executor: Executor, batch: Any, parts: int,
                    loss_scale: float = 1.0) -> StepResult:
    """Run ``executor`` (built for one sub-batch) over ``parts`` sub-batches of ``batch``.

    Returns a StepResult whose loss is the sub-batch losses combined as the loss reduces
    (mean or sum) and whose peak is the largest sub-batch peak. Gradients reach ``.grad``
    only when every sub-batch succeeded (buffer updates of a sub-batch are applied as it
    ends, as BatchNorm would on that many samples).
    """
    dims = executor.graph.meta.get("batch_dims")
    weight = loss_weight(executor, parts)
    sums: dict[str, torch.Tensor] = {}
    results: list[StepResult] = []
    saved: dict[str, torch.Tensor] = {}  # buffers as they were, restored if a sub-batch fails
    try:
        for sub in split_batch(batch, parts, dims):
            result = executor.run(sub, apply=False, loss_scale=loss_scale)
            if not saved and result.buffers:
                saved = {n: b.clone() for n, b in executor.named_buffers(result.buffers)}
            executor.apply_buffers(result)
            with torch.no_grad():
                for name, grad in result.grads.items():
                    if name in sums:
                        sums[name].add_(grad, alpha=weight)
                    else:
                        sums[name] = grad * weight
            result.grads, result.buffers = {}, {}
            results.append(result)
    except BaseException:
        if saved:
            executor.apply_grads({}, saved)
        raise
    losses = torch.stack([r.loss for r in results])
    loss = losses.sum() if weight == 1.0 else losses.mean()
    executor.apply_grads(sums)
    return StepResult(loss=loss, peak_bytes=max(r.peak_bytes for r in results), grads=sums,
                      seconds=sum(r.seconds for r in results))

"""Sub-batch execution with gradient accumulation (moDNN §4.1).

A mini-batch of N samples is split along dim 0 into ``k`` equal sub-batches; the step graph
was captured for one sub-batch (N / k samples). Each sub-batch runs the same Schedule and
its gradients are accumulated with weight 1/k, which for a loss that is a mean over samples
gives exactly the full-batch gradient (up to float rounding of the sum order).

BatchNorm: statistics are computed per sub-batch (as with any smaller batch), so gradients
differ from the full batch; running statistics are updated once per sub-batch, i.e. k times
per step with the module's momentum. Models without batch statistics are unaffected.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from outcore.runtime.executor import Executor, StepResult


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split every tensor of ``batch`` along dim 0 into ``parts`` equal chunks.

    Raises ValueError when the batch size is not divisible by ``parts``.
    """
    leaves, spec = tree_flatten(batch)
    sizes = {leaf.shape[0] for leaf in leaves if isinstance(leaf, torch.Tensor)}
    if len(sizes) != 1:
        raise ValueError(f"every tensor of the batch needs the same first dimension, got {sizes}")
    (size,) = sizes
    if parts < 1 or size % parts:
        raise ValueError(f"a batch of {size} cannot be split into {parts} equal sub-batches; "
                         "choose a sub-batch count that divides the batch size")
    chunks = [leaf.chunk(parts) if isinstance(leaf, torch.Tensor) else [leaf] * parts
              for leaf in leaves]
    return [tree_unflatten([c[i] for c in chunks], spec) for i in range(parts)]


def run_sub_batches(executor: Executor, batch: Any, parts: int,
                    loss_scale: float = 1.0) -> StepResult:
    """Run ``executor`` (built for one sub-batch) over ``parts`` sub-batches of ``batch``.

    Returns a StepResult whose loss is the mean of the sub-batch losses and whose peak is the
    largest sub-batch peak. Gradients are accumulated into ``.grad`` as they go.
    """
    results = [executor.run(sub, grad_scale=1.0 / parts, loss_scale=loss_scale)
               for sub in split_batch(batch, parts)]
    loss = torch.stack([r.loss for r in results]).mean()
    return StepResult(loss=loss, peak_bytes=max(r.peak_bytes for r in results),
                      seconds=sum(r.seconds for r in results))

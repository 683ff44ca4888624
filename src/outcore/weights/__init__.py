"""Models whose weights do not fit: parameters, gradients and optimizer state in host memory.

``outcore.weights.compile(model, loss_fn, batch, optimizer=..., budget=...)`` plans which
parameters live in host memory (``choose.choose_weights``) together with the activations,
and returns a ``WeightTrainer`` whose ``step`` runs the planned step (``outcore.plan.weights``
puts the held parameters' prefetches and the gradients' offloads in the one Schedule) and
whose ``train_step`` adds the optimizer step, host-held parameters stepped on the CPU while
backward goes on (``host_step``). ``step_cost`` prices that step from the hardware profile;
``mixed.MasterWeights`` holds fp32 masters of a bf16/fp16 model.
"""

from __future__ import annotations

from typing import Any


def compile(model: Any, loss_fn: Any, example_batch: Any, **kwargs: Any) -> Any:
    """Build a ``WeightTrainer`` (see ``outcore.weights.trainer.compile``)."""
    from outcore.weights.trainer import compile as _compile

    return _compile(model, loss_fn, example_batch, **kwargs)

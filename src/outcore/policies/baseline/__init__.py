"""The baseline plans: keep everything, free at last use, offload all, recompute cheap ops.

Policies registered: ``keep-all``, ``liveness``, ``offload-all``, ``recompute-cheap``.
"""

from outcore.policies.baseline import register as _register  # noqa: F401  (registers them)
from outcore.policies.baseline.plans import (
    CHEAP,
    keep_all,
    liveness,
    movable_activations,
    offload_all,
    recompute_cheap,
)

__all__ = ["CHEAP", "keep_all", "liveness", "movable_activations", "offload_all",
           "recompute_cheap"]

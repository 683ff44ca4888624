"""Registers the baseline policies of ``outcore.policies.baseline``."""

from outcore.policies.baseline import plans as baseline
from outcore.policies.registry import from_plan, register

register("keep-all", "network-wide allocation: nothing freed during the step")(
    from_plan(baseline.keep_all))
register("liveness", "keep every activation, free each tensor at its last use")(
    from_plan(baseline.liveness))
register("offload-all", "offload every activation backward reads; prefetch it back")(
    from_plan(baseline.offload_all))
register("recompute-cheap",
         "recompute outputs of cheap ops (element-wise, norm, pool) in backward")(
    from_plan(baseline.recompute_cheap))

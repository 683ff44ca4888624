"""vDNN (Rhu et al., MICRO 2016): layer-wise offload of feature maps with prefetch, and the
cuDNN-4-era convolution algorithms the paper chose between.

Policies registered: ``vdnn-base``, ``vdnn-all``, ``vdnn-conv`` (static, per algorithm) and
``vdnn-dyn`` (the paper's dynamic search).
"""

from outcore.policies.vdnn.config import VdnnAlgo, VdnnConfig, VdnnMode, VdnnStaticConfig
from outcore.policies.vdnn.cudnn import TARGETS, CudnnAlgorithms, relative_time
from outcore.policies.vdnn.policy import (
    ALGOS,
    MODES,
    PAPER,
    VdnnResult,
    baseline_schedule,
    offload_set,
    plan_dyn,
    plan_static,
    release_schedule,
)
from outcore.policies.vdnn.prefetch import PrefetchPoints, prefetch_points, sync_waits

__all__ = [
    "ALGOS",
    "MODES",
    "PAPER",
    "TARGETS",
    "CudnnAlgorithms",
    "PrefetchPoints",
    "VdnnAlgo",
    "VdnnConfig",
    "VdnnMode",
    "VdnnResult",
    "VdnnStaticConfig",
    "baseline_schedule",
    "offload_set",
    "plan_dyn",
    "plan_static",
    "prefetch_points",
    "relative_time",
    "release_schedule",
    "sync_waits",
]

"""moDNN (Chen et al., DATE 2018): sub-batching, convolution-algorithm choice and offload
scheduling under a memory budget.

Policy registered: ``modnn``.
"""

from outcore.policies.modnn.algos import (
    ConvAlgorithmCost,
    bound,
    conv_arg_meta,
    default_relative_time,
)
from outcore.policies.modnn.batch import Footprint, SubBatchChoice, footprint
from outcore.policies.modnn.config import ModnnConfig
from outcore.policies.modnn.memory import SegmentList
from outcore.policies.modnn.policy import PAPER, ModnnResult, minimum_memory, plan_modnn, sub_batch
from outcore.policies.modnn.state import BlockState, ModnnStats

__all__ = [
    "PAPER",
    "BlockState",
    "ConvAlgorithmCost",
    "Footprint",
    "ModnnConfig",
    "ModnnResult",
    "ModnnStats",
    "SegmentList",
    "SubBatchChoice",
    "bound",
    "conv_arg_meta",
    "default_relative_time",
    "footprint",
    "minimum_memory",
    "plan_modnn",
    "sub_batch",
]

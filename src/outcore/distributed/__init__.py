"""Data parallel on ``torch.distributed``: each rank plans and runs its share of the batch.

``outcore.compile(model, loss_fn, my_share, distributed=True, ...)`` (started with
``torchrun --nproc-per-node N`` or ``outcore run --nproc N``) or ``distributed=<ProcessGroup>``
returns a ``DataParallelTrainer``; gradients are averaged over the ranks by all-reduces the
executor issues as backward finishes each gradient bucket. Modules: ``group`` (process
group, timeout, failure reports), ``reducer`` (the buckets' all-reduce), ``sync_bn``
(``nn.SyncBatchNorm`` captured with an all-reduce op), ``replay`` (a recomputed all-reduce
replays its saved result), ``trainer``, ``compile``. The torch-free pieces:
``outcore.plan.grad_buckets`` (buckets and their memory) and ``outcore.sim.multi_gpu`` (N GPUs
simulated on a shared host link).
"""

from outcore.distributed.compile import compile_data_parallel, data_parallel_trainer
from outcore.distributed.group import DistributedError, RankContext, rank_context
from outcore.distributed.trainer import DataParallelTrainer

__all__ = ["DataParallelTrainer", "DistributedError", "RankContext", "compile_data_parallel",
           "data_parallel_trainer",
           "rank_context"]

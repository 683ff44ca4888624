"""Simulated data parallel: N GPUs on one or more hosts, each running one rank's Schedule.

Plain Python (no torch). Model (assumptions written out, see docs/repro/modnn.md):

* every rank holds an equal share of the mini-batch and runs the same Schedule (captured at
  batch / N) in lock step, so one rank's timeline stands for all of them;
* host link: ranks behind one uplink copy at the same moments (same schedule), so each
  copy engine gets ``HostProfile.copy_bandwidth`` (``min(own, link / k)``, k the ranks
  sharing the busiest uplink). The rank's cost model must already carry that bandwidth
  (``rank_cost_model``): that is also what the planner plans with, so the plan knows the
  link is shared;
* gradients: the Schedule's gradients grouped in buckets (``outcore.plan.grad_buckets``),
  a tied parameter (an LM head sharing the embedding's weight) in one slot, as the
  runtime's ``outcore.distributed.layout.BucketLayout`` gives it (its groups read off the
  graph unless given: ``graph_tied_gradients``).
  With one pass, bucket b's all-reduce is issued when its last gradient's instruction ends
  on the compute stream, and all-reduces run one after another on a communication stream
  (``allreduce_time`` on the host's interconnect, plus the network between hosts), beside
  the rest of backward. With sub-batches (``schedule.sub_batches > 1``) the gradients are
  final only after the last pass, so every bucket is issued at the end of the compute
  (the runtime does the same). The step ends when compute, copies and all-reduces are done;
* what is not modelled: all-reduce kernels competing with compute for the GPU's SMs, and
  all-reduce traffic over PCIe competing with offload copies on the same uplink.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from outcore.cost.interconnects import HostProfile, allreduce_time, shared_link_profile
from outcore.cost.model import AnalyticCostModel, CostModel
from outcore.cost.profiles import HardwareProfile
from outcore.graph.ir import Graph
from outcore.plan.grad_buckets import (
    DEFAULT_BUCKET_CAP,
    GradBucket,
    assign_buckets,
    graph_tied_gradients,
    peak_with_buckets,
)
from outcore.plan.schedule import Schedule
from outcore.sim.result import SimResult
from outcore.sim.simulator import simulate


@dataclass
class DataParallelResult:
    """One simulated data-parallel step on ``n_gpus`` ranks.

    ``step_time`` = max(the rank's step, the last all-reduce's end); ``exposed_comm_time``
    is what the all-reduces add to the rank's step (0 when backward hides them all);
    ``comm_time`` the all-reduces' busy time. ``peak_bytes`` is one rank's device peak with
    its gradient buckets (``peak_with_buckets``). ``copy_bandwidth``: bytes/s per
    direction each rank's copy engines got on the shared host link.
    """

    n_gpus: int
    host: str
    rank: SimResult
    buckets: list[GradBucket]
    step_time: float
    comm_time: float
    exposed_comm_time: float
    allreduce_bytes: int
    peak_bytes: int
    copy_bandwidth: tuple[float, float]

    def speedup_over(self, single_step_time: float) -> float:
        """How many times faster than ``single_step_time`` (the whole batch on one GPU)."""
        return single_step_time / self.step_time if self.step_time > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {"n_gpus": self.n_gpus, "host": self.host, "step_time": self.step_time,
                "rank_step_time": self.rank.step_time, "comm_time": self.comm_time,
                "exposed_comm_time": self.exposed_comm_time,
                "exposed_transfer_time": self.rank.exposed_transfer_time,
                "allreduce_bytes": self.allreduce_bytes, "peak_bytes": self.peak_bytes,
                "buckets": len(self.buckets), "d2h_gbs": self.copy_bandwidth[0] / 1e9,
                "h2d_gbs": self.copy_bandwidth[1] / 1e9}


def rank_profile(profile: HardwareProfile, host: HostProfile, n_gpus: int) -> HardwareProfile:
    """The GPU profile one of ``n_gpus`` lock-step ranks sees (shared host link)."""
    return shared_link_profile(profile, host, n_gpus)


def rank_cost_model(profile: HardwareProfile, host: HostProfile, n_gpus: int,
                    **options: Any) -> AnalyticCostModel:
    """An analytic cost model for one rank: ``profile`` with the shared host link; options
    as ``AnalyticCostModel``'s (e.g. ``variants``). Plan and simulate a rank with it."""
    return AnalyticCostModel(rank_profile(profile, host, n_gpus), **options)


def allreduce_stream(buckets: Sequence[GradBucket], ready: Sequence[float], n_gpus: int,
                     host: HostProfile) -> tuple[float, float]:
    """Run the buckets' all-reduces in order on one stream, bucket b not before
    ``ready[b]``; return (end of the last, busy seconds)."""
    free = 0.0
    busy = 0.0
    for bucket, at in zip(buckets, ready, strict=True):
        duration = allreduce_time(bucket.nbytes, n_gpus, host)
        free = max(free, at) + duration
        busy += duration
    return free, busy


def simulate_data_parallel(graph: Graph, schedule: Schedule, cost_model: CostModel,
                           host: HostProfile, n_gpus: int, *,
                           bucket_cap: int | None = None,
                           tied: Sequence[Sequence[int]] | None = None) -> DataParallelResult:
    """Simulate one data-parallel step (module doc).

    Args:
        graph, schedule: one rank's (captured at its share of the batch).
        cost_model: one rank's, with the shared link already applied (``rank_cost_model``).
        host: the machine(s); ranks fill hosts in order.
        n_gpus: ranks (1 = a single GPU: no all-reduce).
        bucket_cap: bytes per gradient bucket (default DDP's 25 MiB).
        tied: groups of gradient ids of one parameter, each one bucket slot (default: read
            off the graph, ``graph_tied_gradients``; ``()`` folds none).
    """
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    sim = simulate(graph, schedule, cost_model)
    groups = graph_tied_gradients(graph) if tied is None else tied
    buckets = assign_buckets(graph, schedule, DEFAULT_BUCKET_CAP if bucket_cap is None
                             else bucket_cap, groups)
    if n_gpus == 1:
        buckets = []
    k = schedule.sub_batches
    last_pass = (k - 1) * sim.pass_time
    compute_end = last_pass + max(sim.end, default=0.0)
    # one pass: when backward made the bucket; sub-batches: after the last pass's compute
    ready = [sim.end[b.ready_at] if k == 1 else compute_end for b in buckets]
    comm_end, busy = allreduce_stream(buckets, ready, n_gpus, host)
    step = max(sim.step_time, comm_end)
    profile = getattr(cost_model, "profile", None)
    bandwidth = ((profile.d2h_bandwidth, profile.h2d_bandwidth) if profile is not None
                 else (0.0, 0.0))
    # the executor's rule; with sub-batches .grad is reduced in place, no bucket buffers
    peak = peak_with_buckets(graph, schedule, buckets if k == 1 else [])
    return DataParallelResult(
        n_gpus=n_gpus, host=host.name, rank=sim, buckets=buckets, step_time=step,
        comm_time=busy, exposed_comm_time=step - sim.step_time,
        allreduce_bytes=sum(b.nbytes for b in buckets), peak_bytes=peak,
        copy_bandwidth=bandwidth)

"""Recomputing a SyncBatchNorm's all-reduce without issuing a collective.

A plan lowered by ``outcore.plan.lower`` never recomputes the all-reduce (its output is no
activation: see ``outcore.distributed.sync_bn``), but a policy that builds its own schedule
may replay a whole segment from a checkpoint (SuperNeurons' recompute segments), the
all-reduce included. A replayed collective would be an extra all-reduce in backward; it
would match across ranks (every rank runs the same schedule, checked when the trainer is
built), but it costs a round trip and its result must be the forward's anyway. So a replay
uses the saved statistics instead, as a recomputed dropout replays its saved RNG state:

* the forward call issues the all-reduce and, only for an op the schedule recomputes, keeps
  a host copy of its result outside the tracked device memory (as an RNG state or an
  offloaded copy; a few floats per channel);
* each recompute allocates its output (counted, as the plan counts a recomputed tensor) and
  copies the saved statistics into it; no collective.

``CollectiveReplay.impls`` are the executor's op replacements (``Executor(impls=...)``),
keyed by op id; each run of the schedule calls such an op ``1 + recomputes`` times in
schedule order, the first being the forward (sub-batches run the schedule once each).
``reset()`` starts a step afresh (after a failed one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from outcore.distributed.sync_bn import ALL_REDUCE_TARGET, all_reduce_sum
from outcore.graph.ir import Graph
from outcore.plan.schedule import Compute, Schedule
from outcore.runtime.devices.base import untracked


class CollectiveReplay:
    """The op replacements of the recomputed all-reduces of one schedule (module doc)."""

    def __init__(self, graph: Graph, schedule: Schedule) -> None:
        calls = Counter(ins.op for ins in schedule.instructions if isinstance(ins, Compute)
                        and graph.ops[ins.op].target == ALL_REDUCE_TARGET)
        self.calls_per_run = {oid: n for oid, n in calls.items() if n > 1}
        self._next = dict.fromkeys(self.calls_per_run, 0)
        self._saved: dict[int, torch.Tensor] = {}
        self.impls: dict[int, Callable[..., Any]] = {
            oid: self._impl(oid) for oid in self.calls_per_run}

    def reset(self) -> None:
        self._next = dict.fromkeys(self.calls_per_run, 0)
        self._saved.clear()

    def _impl(self, oid: int) -> Callable[..., torch.Tensor]:
        def call(x: torch.Tensor, group_name: str) -> torch.Tensor:
            k = self._next[oid]
            self._next[oid] = (k + 1) % self.calls_per_run[oid]
            if k == 0:  # the forward: the one collective of this op in the run
                out = all_reduce_sum(x, group_name)
                with untracked():
                    self._saved[oid] = out.detach().to("cpu", copy=True)
                return out
            out = torch.empty_like(x)
            out.copy_(self._saved[oid])
            return out
        return call

"""Profile a schedule inside real steps on a device: per-op seconds and host costs. Torch.

``Executor.run(timed=True)`` records the wall time of every instruction of a step. From a
few such steps this module makes the ``MeasuredProfile`` the simulator needs to replay the
schedule on the same device:

* ``op_seconds``: per op, the mean over its executions (a recomputed op runs twice) of each
  Compute instruction's time, itself the median over the steps (a stall that hits one
  step is not the op's cost; compare with the median step time);
* ``host_costs``: the mean host seconds of a Free and of issuing an Offload, and a
  least-squares fit ``prefetch + prefetch_per_byte * bytes`` of issuing a Prefetch (both
  terms >= 0). A Wait's time depends on whether its copy had ended, which the simulator
  decides, so its instruction time is not used: ``wake`` is the mean lateness of the Waits
  that blocked in these steps (from the device's statistics, ``StepResult.transfers``:
  seconds from the copy's modelled end to the Wait's return). ``wait``, and ``wake`` when
  no Wait blocked, come from ``outcore.runtime.devices.calibrate.calibrate_waits`` (pass
  its result as ``waits``; without it they are 0).

Taken inside steps of the schedule on the device itself, the op times include what that
device does to compute: on the emulated device, the copy threads share the CPU with the
kernels. What the simulator must still predict is the part of each copy the compute
hides and the stalls of the Waits.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from outcore.cost.host_costs import HostCosts
from outcore.cost.measured import MeasuredProfile
from outcore.errors import ProfileError
from outcore.graph.ir import Graph
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule
from outcore.runtime.devices.calibrate import WaitCalibration
from outcore.runtime.executor import Executor, StepResult


def _fit_prefetch(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``seconds = fixed + per_byte * bytes`` with both terms >= 0."""
    if not points:
        return 0.0, 0.0
    xs = [float(b) for b, _ in points]
    ys = [s for _, s in points]
    if len(set(xs)) < 2:
        return max(0.0, statistics.fmean(ys)), 0.0
    slope, intercept = statistics.linear_regression(xs, ys)
    if slope < 0:
        return max(0.0, statistics.fmean(ys)), 0.0
    if intercept < 0:
        return 0.0, sum(x * y for x, y in points) / sum(x * x for x in xs)
    return intercept, slope


def _wake(steps: Sequence[StepResult], waits: WaitCalibration | None) -> float:
    """Mean lateness of the Waits that blocked in ``steps``; else the calibration's."""
    blocking = late = 0.0
    for step in steps:
        if step.transfers is not None:
            for d in (step.transfers.d2h, step.transfers.h2d):
                blocking += d.blocking_waits
                late += d.late_s
    if blocking:
        return late / blocking
    return waits.wake if waits else 0.0


def profile_from_steps(graph: Graph, schedule: Schedule, steps: Sequence[StepResult], *,
                       device: str = "", waits: WaitCalibration | None = None
                       ) -> MeasuredProfile:
    """The profile of ``schedule`` from timed ``steps`` of it (``Executor.run(timed=True)``).

    Raises:
        ProfileError: no steps, a step that was not timed, or an op the schedule never runs.
    """
    n = len(schedule.instructions)
    if not steps:
        raise ProfileError("no steps to profile; run the executor with timed=True first")
    for k, step in enumerate(steps):
        if len(step.instruction_seconds) != n:
            raise ProfileError(f"step {k} has {len(step.instruction_seconds)} instruction times "
                               f"for {n} instructions; run it with timed=True")
    seconds = [statistics.median([s.instruction_seconds[i] for s in steps]) for i in range(n)]
    per_op: list[list[float]] = [[] for _ in graph.ops]
    frees: list[float] = []
    offloads: list[float] = []
    prefetches: list[tuple[int, float]] = []
    for i, ins in enumerate(schedule.instructions):
        if isinstance(ins, Compute):
            per_op[ins.op].append(seconds[i])
        elif isinstance(ins, Free):
            frees.append(seconds[i])
        elif isinstance(ins, Offload):
            offloads.append(seconds[i])
        elif isinstance(ins, Prefetch):
            prefetches.append((graph.tensors[ins.tensor].nbytes, seconds[i]))
    missing = [graph.ops[o].name for o, times in enumerate(per_op) if not times]
    if missing:
        raise ProfileError(f"the schedule never runs op(s) {missing[:5]}; profile a schedule "
                           "that computes every op")
    fixed, per_byte = _fit_prefetch(prefetches)
    host = HostCosts(free=statistics.fmean(frees) if frees else 0.0,
                     offload=statistics.fmean(offloads) if offloads else 0.0,
                     prefetch=fixed, prefetch_per_byte=per_byte,
                     wait=waits.wait if waits else 0.0, wake=_wake(steps, waits))
    return MeasuredProfile.for_graph(graph, [statistics.fmean(t) for t in per_op],
                                     device=device, repeats=len(steps), host_costs=host)


def profile_step(executor: Executor, batch: Any, *, repeats: int = 5, warmup: int = 1,
                 waits: WaitCalibration | None = None) -> MeasuredProfile:
    """Run ``warmup`` then ``repeats`` timed steps of ``executor`` on ``batch`` (results not
    applied to the model) and profile them with ``profile_from_steps``."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        executor.run(batch, apply=False)
    steps = [executor.run(batch, apply=False, timed=True) for _ in range(repeats)]
    name = str(getattr(executor.device, "name", type(executor.device).__name__))
    return profile_from_steps(executor.graph, executor.schedule, steps, device=name,
                              waits=waits)

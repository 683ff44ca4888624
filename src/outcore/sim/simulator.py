"""Discrete-event simulation of a Schedule on one compute stream and the copy engines.

Timing rules (one pass of the schedule, times in seconds from its start):

* the compute stream runs the instructions in order. ``Compute`` (recompute included) takes
  ``cost_model.op_time(op)``; ``Wait(t, dir)`` stalls the stream until that copy of ``t``
  has ended (the stall is exposed transfer time). The non-kernel instructions also take the
  model's ``host_costs`` (``outcore.cost.host_costs``; zero unless the model has them, as a
  profile of the host-driven emulated device does): ``free`` per Free, the issue cost per
  Offload/Prefetch, ``wait`` per Wait that did not block and ``wake`` after one that did;
* ``Offload(t)`` enqueues a device->host copy of ``t``'s storage. It starts when the compute
  stream has issued it (so the producer has finished: it ran earlier on the same stream)
  and the D2H engine is free; ``Prefetch(t)`` likewise on the H2D engine, and not before the
  host copy of ``t`` has landed. Each engine is FIFO and takes
  ``cost_model.transfer_time(nbytes, dir)`` per copy. With one copy engine
  (``cost_model.copy_engines == 1``) both directions share it;
* the pass ends when the compute stream and every copy are done;
* with ``optimizer=HostSteps(...)`` (``outcore.sim.host_steps``), the optimizer step follows:
  each host-stepped parameter's step on the CPU as soon as its gradient's d2h copy has
  landed (overlapped with the rest of backward), the device-held parameters' step on the
  compute stream after the pass, updated weights the device keeps copied back h2d; the
  step ends when all of that has (``SimResult.optimizer_time`` is what it adds).

Residency, memory and the schedule's soundness come from the one replay of the schedule
(``outcore.plan.residency.Replay``: the memory rule the executor's tracker measures, with
each op's workspace from ``cost_model.workspace``): the simulator times its steps and
records the storages' ``Lifetime`` list from them, and raises the replay's first broken rule
as ``ScheduleError`` (index = the instruction; wording in ``outcore.plan.rules``).

Cost: one pass over the instructions plus one over the op list; no time stepping.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from outcore.cost.host_costs import host_costs_of
from outcore.cost.model import CostModel
from outcore.errors import ProfileError, ScheduleError
from outcore.graph.ir import Graph, Op
from outcore.plan.memory import MemoryTrace, trace_of
from outcore.plan.residency import NONE, TRANSIENT, Replay, Step
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.sim.host_steps import HostSteps, StepTimeline, timeline
from outcore.sim.intervals import overlap, total, union
from outcore.sim.result import COMPUTE, D2H, H2D, Lifetime, SimResult

#: A pool placement: called with (graph, schedule, lifetimes); its return value is kept as
#: ``SimResult.placement``. An object with a ``place`` method of that signature also works.
Placement = Callable[[Graph, Schedule, list[Lifetime]], Any]


@dataclass
class _Copy:
    index: int
    direction: str
    start: float
    end: float


class _Timing:
    """The clocks of one simulated pass: the compute stream, the copy engines and the copies
    in flight. It times instructions the replay already found sound (it checks nothing)."""

    def __init__(self, graph: Graph, schedule: Schedule, model: CostModel,
                 ops: list[Op]) -> None:
        self.graph = graph
        self.schedule = schedule
        self.model = model
        self.host = host_costs_of(model)
        self.host_time = 0.0
        self.ops = ops
        shared = model.copy_engines < 2
        self.engines = {D2H: "copy", H2D: "copy"} if shared else {D2H: D2H, H2D: H2D}
        self.engine_free = dict.fromkeys(self.engines.values(), 0.0)
        self.now = 0.0
        self.stall = 0.0
        self.landed: dict[int, float] = {}  # storage -> end of its latest waited offload
        self.copy_end: dict[tuple[str, int], float] = {}  # (direction, tensor) -> latest end
        self.in_flight: dict[tuple[str, int], _Copy] = {}  # (direction, storage) -> copy
        self.op_times: list[float | None] = [None] * len(ops)
        self.bytes = {D2H: 0, H2D: 0}
        n = len(schedule.instructions)
        self.issue = [0.0] * n
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.stream = [COMPUTE] * n
        self.compute_intervals: list[tuple[float, float]] = []

    def run(self, i: int, ins: Any) -> None:
        """Time instruction ``i`` (sound, by the replay)."""
        self.issue[i] = self.now
        if isinstance(ins, Compute):
            duration = self._op_time(self.ops[ins.op])
            self.start[i] = self.now
            self.now += duration
            self.end[i] = self.now
            if duration > 0:
                self.compute_intervals.append((self.start[i], self.now))
        elif isinstance(ins, Free):
            self.start[i] = self.now
            self._host(self.host.free)
            self.end[i] = self.now
        elif isinstance(ins, Offload):
            self._host(self.host.issue(D2H, self.graph.tensors[ins.tensor].nbytes))
            self.in_flight[D2H, ins.tensor] = self._enqueue(i, D2H, ins.tensor, self.now)
        elif isinstance(ins, Prefetch):
            self._host(self.host.issue(H2D, self.graph.tensors[ins.tensor].nbytes))
            # a parameter held in host memory (schedule.host_static) is there from the start
            ready = max(self.now, self.landed.get(ins.tensor, 0.0))
            self.in_flight[H2D, ins.tensor] = self._enqueue(i, H2D, ins.tensor, ready)
        elif isinstance(ins, Wait):
            self._wait(i, ins)

    def _wait(self, i: int, ins: Wait) -> None:
        copy = self.in_flight.pop((ins.direction, ins.tensor))
        if ins.direction == D2H:
            self.landed[ins.tensor] = copy.end
        self.start[i] = self.now
        if copy.end > self.now:  # a blocking wait: the compute stream resumes after a wake-up
            self.stall += copy.end - self.now
            self.now = copy.end
            self._host(self.host.wake)
        else:
            self._host(self.host.wait)
        self.end[i] = self.now

    def _host(self, seconds: float) -> None:
        """The compute thread spends ``seconds`` of host time on a non-kernel instruction."""
        self.now += seconds
        self.host_time += seconds

    def _enqueue(self, i: int, direction: str, storage: int, ready: float) -> _Copy:
        nbytes = self.graph.tensors[storage].nbytes
        duration = self.model.transfer_time(nbytes, direction)
        if not (duration >= 0 and math.isfinite(duration)):
            raise ProfileError(f"cost model gave transfer time {duration!r} for {nbytes} bytes "
                               f"{direction}; it must be a finite number >= 0")
        engine = self.engines[direction]
        begin = max(ready, self.engine_free[engine])
        self.engine_free[engine] = begin + duration
        self.bytes[direction] += nbytes
        self.start[i], self.end[i], self.stream[i] = begin, begin + duration, direction
        self.copy_end[direction, storage] = begin + duration
        return _Copy(i, direction, begin, begin + duration)

    def _op_time(self, op: Op) -> float:
        t = self.op_times[op.id]
        if t is None:
            t = self.model.op_time(op)
            if not (t >= 0 and math.isfinite(t)):
                raise ProfileError(f"cost model gave time {t!r} for op {op.name!r}; it must be "
                                   "a finite number >= 0")
            self.op_times[op.id] = t
        return t


def with_variants(graph: Graph, variants: Mapping[int, str]) -> list[Op]:
    """The graph's ops with ``variants`` (op id -> the kernel a schedule chose) applied, as
    the simulator and the executor run them."""
    ops = list(graph.ops)
    for oid, variant in variants.items():
        if not 0 <= oid < len(ops):
            raise ScheduleError(f"schedule.variants names unknown op {oid}")
        ops[oid] = dataclasses.replace(ops[oid], variant=variant)
    return ops


def simulate(graph: Graph, schedule: Schedule, cost_model: CostModel, *,
             placement: Placement | Any | None = None, verify: bool = True,
             optimizer: HostSteps | None = None) -> SimResult:
    """Simulate ``schedule`` on ``graph`` under ``cost_model``.

    Args:
        graph: the captured (or hand-made) graph.
        schedule: the instructions to run; checked by the replay as it goes (module doc).
        cost_model: any ``CostModel``; ``bind(graph)`` is called first (an analytic model
            learns per-op dtypes; a measured profile refuses another graph).
        placement: optional pool placement, called as ``placement(graph, schedule,
            lifetimes)`` (or ``placement.place(...)``); its result is ``SimResult.placement``.
        verify: kept for callers; the schedule is always checked, by the same single replay
            that the simulation times (``False`` saves nothing and skips nothing).
        optimizer: the optimizer step after the last pass (``HostSteps``; module doc);
            ``SimResult.optimizer_time`` and ``step_time`` include it.

    Raises:
        ScheduleError: the schedule breaks a rule (index = the instruction).
        ProfileError: the cost model cannot price this graph.
    """
    if schedule.sub_batches < 1:
        raise ScheduleError(f"schedule.sub_batches must be >= 1, got {schedule.sub_batches}")
    model: CostModel = cost_model.bind(graph)
    ops = with_variants(graph, schedule.variants)
    timing = _Timing(graph, schedule, model, ops)
    replay = Replay(graph, schedule, lambda oid: model.workspace(ops[oid]))
    lifetimes: list[Lifetime] = []
    steps = _timed(replay, timing, schedule)
    trace = trace_of(_record_lifetimes(graph, steps, len(schedule), lifetimes))
    broken = replay.end()
    if broken is not None:
        raise broken.error()
    result = _assemble(timing, trace, lifetimes, schedule.sub_batches, repr(cost_model))
    if optimizer is not None:
        _add_optimizer(graph, timing, result, optimizer)
    if placement is not None:
        place = getattr(placement, "place", placement)
        result.placement = place(graph, schedule, lifetimes)
    return result


def _timed(replay: Replay, timing: _Timing, schedule: Schedule) -> Iterator[Step]:
    """Pass the replay's steps through, raising its first broken rule and timing each sound
    instruction."""
    instructions = schedule.instructions
    for step in replay:
        if step.broken is not None:
            raise step.broken.error()
        if step.at >= 0:
            timing.run(step.at, instructions[step.at])
        yield step


def _record_lifetimes(graph: Graph, steps: Iterator[Step], end: int,
                      out: list[Lifetime]) -> Iterator[Step]:
    """Pass ``steps`` through, appending to ``out`` one Lifetime per storage residency: when
    it is released (so in release order), then, once ``steps`` is exhausted, those still
    resident with ``end`` (``len(schedule)``), in allocation order. A static storage starts
    at -1 (its Step's ``at``)."""
    tensors = graph.tensors
    open_at: dict[int, int] = {}  # storage -> allocating index; insertion = allocation order
    for step in steps:
        for alloc in step.allocations:
            if alloc.storage != TRANSIENT:
                open_at[alloc.storage] = step.at
        if step.released != NONE:
            storage = step.released
            out.append(Lifetime(storage, tensors[storage].nbytes, open_at.pop(storage),
                                step.at))
        yield step
    out.extend(Lifetime(storage, tensors[storage].nbytes, start, end)
               for storage, start in open_at.items())


def _assemble(replay: _Timing, trace: MemoryTrace, lifetimes: list[Lifetime], sub_batches: int,
              model_name: str) -> SimResult:
    n = len(replay.issue)
    copies_end = max(replay.engine_free.values(), default=0.0)
    pass_time = max(replay.now, copies_end)
    compute_iv = replay.compute_intervals
    per_dir = {d: [(replay.start[i], replay.end[i]) for i in range(n) if replay.stream[i] == d]
               for d in (D2H, H2D)}
    copy_busy = union(per_dir[D2H], per_dir[H2D])
    compute_time = total(compute_iv)
    overlapped = overlap(compute_iv, copy_busy)
    k = sub_batches
    return SimResult(
        step_time=pass_time * k,
        pass_time=pass_time,
        sub_batches=k,
        compute_time=compute_time * k,
        exposed_transfer_time=(pass_time - compute_time - replay.host_time) * k,
        host_time=replay.host_time * k,
        stall_time=replay.stall * k,
        overlapped_transfer_time=overlapped * k,
        d2h_busy_time=total(per_dir[D2H]) * k,
        h2d_busy_time=total(per_dir[H2D]) * k,
        bytes_d2h=replay.bytes[D2H] * k,
        bytes_h2d=replay.bytes[H2D] * k,
        peak_bytes=trace.peak,
        average_bytes=_time_average(trace.device, replay.issue, pass_time, trace.average),
        host_peak_bytes=max(trace.host, default=0),
        static_bytes=trace.static,
        issue=replay.issue, start=replay.start, end=replay.end, stream=replay.stream,
        kind=[_kind(ins) for ins in replay.schedule.instructions],
        memory=trace.device, host=trace.host, live_tensors=trace.live_tensors,
        lifetimes=lifetimes,
        cost_model=model_name,
    )


def _add_optimizer(graph: Graph, timing: _Timing, result: SimResult, work: HostSteps) -> None:
    """Time ``work`` after the last pass and add what it exposes to ``result``."""
    landed = {g: timing.copy_end[D2H, graph.tensors[g].storage] for g in work.host
              if (D2H, graph.tensors[g].storage) in timing.copy_end}
    prefetched = {t: end for (d, t), end in timing.copy_end.items() if d == H2D}
    h2d_engine = timing.engines[H2D]
    line: StepTimeline = timeline(
        work, compute_end=timing.now, pass_end=result.pass_time, landed=landed,
        prefetched=prefetched, h2d_free=timing.engine_free[h2d_engine],
        h2d_time=lambda n: timing.model.transfer_time(n, H2D))
    result.optimizer_time = line.end - result.pass_time
    result.step_time += result.optimizer_time
    result.host_step_time = line.host_busy
    result.bytes_h2d += line.h2d_bytes
    result.optimizer = line


def _kind(ins: Any) -> str:
    if isinstance(ins, Compute):
        return "recompute" if ins.recompute else "compute"
    return type(ins).__name__.lower()


def _time_average(samples: list[int], issue: list[float], pass_time: float,
                  fallback: float) -> float:
    """Time-weighted device bytes: sample i holds from issue[i] to issue[i+1]."""
    if pass_time <= 0 or not samples:
        return fallback
    acc = 0.0
    for i, value in enumerate(samples):
        nxt = issue[i + 1] if i + 1 < len(samples) else pass_time
        acc += value * (nxt - issue[i])
    return acc / pass_time

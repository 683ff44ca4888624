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
* the pass ends when the compute stream and every copy are done.

Memory after each instruction and the storages' ``Lifetime`` list come from one pass of
``outcore.plan.residency.residency_steps`` (the memory rule of ``outcore.plan.memory``, the
same rule the executor's tracker measures), run once the replay below found the schedule
valid, with each op's workspace from ``cost_model.workspace``.

The simulator also checks the schedule as it goes, with the same rules as
``outcore.plan.verify`` (which runs first when importable), and raises ``ScheduleError``
with the instruction index for: a Compute reading a tensor that is not on the device (or
whose prefetch was not waited for), a recompute of an op that never ran, a Free of a tensor
not on the device or of memory a copy is still using, an Offload or Prefetch of a view, an
Offload of a tensor not on the device, a Prefetch without a completed (waited) offload or of
a tensor already on the device, a Wait on a copy not in flight; and, at the end, a copy
still in flight or a ``keep_at_end`` tensor not on the device.

Cost: one pass over the instructions plus one over the op list; no time stepping.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from outcore.cost.host_costs import host_costs_of
from outcore.cost.model import CostModel
from outcore.errors import ProfileError, ScheduleError
from outcore.graph.ir import STATIC_KINDS, Graph, Op
from outcore.plan.memory import MemoryTrace, trace_of
from outcore.plan.residency import NONE, TRANSIENT, Step, residency_steps
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
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


class _Replay:
    """The state of one simulated pass: residency (to check the schedule), copies in flight,
    clocks. Memory and lifetimes are not tracked here (see ``_memory``)."""

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
        n_tensors = len(graph.tensors)
        self.resident = [False] * n_tensors
        self.count = [0] * n_tensors  # resident tensors per storage id
        self.freed_at: dict[int, int] = {}
        self.on_host: dict[int, _Copy] = {}  # storage -> its latest waited offload
        self.unwaited_d2h: dict[int, _Copy] = {}
        self.pending_h2d: dict[int, _Copy] = {}
        self.ran = [False] * len(ops)
        self.op_times: list[float | None] = [None] * len(ops)
        self.bytes = {D2H: 0, H2D: 0}
        n = len(schedule.instructions)
        self.issue = [0.0] * n
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.stream = [COMPUTE] * n
        self.compute_intervals: list[tuple[float, float]] = []
        for t in graph.tensors:
            if t.kind in STATIC_KINDS:
                self._make_resident(t.id)

    # -- residency ---------------------------------------------------------------------------
    def _make_resident(self, tid: int) -> None:
        if self.resident[tid]:
            return
        self.resident[tid] = True
        self.count[self.graph.tensors[tid].storage] += 1

    def _name(self, tid: int) -> str:
        if not 0 <= tid < len(self.graph.tensors):
            return f"<unknown tensor {tid}>"
        return repr(self.graph.tensors[tid].name)

    def _absent(self, tid: int) -> str:
        """Why ``tid`` is not on the device, for error messages."""
        if tid in self.freed_at:
            storage = self.graph.tensors[tid].storage
            if storage in self.on_host:
                base = self.graph.tensors[storage].name
                return (f"it was freed at instruction {self.freed_at[tid]} after its offload; "
                        f"Prefetch({base!r}) and Wait({base!r}, 'h2d') before this")
            return f"it was freed at instruction {self.freed_at[tid]}"
        if self.graph.tensors[tid].producer is not None:
            return "its producer has not run yet"
        return "it is not resident"

    # -- instructions ------------------------------------------------------------------------
    def compute(self, i: int, ins: Compute) -> None:
        if not 0 <= ins.op < len(self.ops):
            raise ScheduleError(f"Compute names unknown op {ins.op}", i)
        op = self.ops[ins.op]
        if ins.recompute and not self.ran[ins.op]:
            raise ScheduleError(f"recompute of op {op.name!r} before it ever ran", i)
        self.ran[ins.op] = True
        tensors = self.graph.tensors
        for tid in op.inputs:
            if self.resident[tid]:
                continue
            if tid == tensors[tid].storage and tid in self.pending_h2d:
                base = tensors[tensors[tid].storage].name
                raise ScheduleError(f"Compute of op {op.name!r} reads {self._name(tid)} while "
                                    f"its prefetch is in flight; add Wait({base!r}, 'h2d') "
                                    "before this Compute", i)
            raise ScheduleError(f"Compute of op {op.name!r} reads {self._name(tid)}, which "
                                f"is not on the device: {self._absent(tid)}", i)
        duration = self._op_time(op)
        self.start[i] = self.now
        self.now += duration
        self.end[i] = self.now
        if duration > 0:
            self.compute_intervals.append((self.start[i], self.now))
        for tid in op.outputs:
            self._make_resident(tid)

    def free(self, i: int, ins: Free) -> None:
        tid = ins.tensor
        if not 0 <= tid < len(self.graph.tensors):
            raise ScheduleError(f"Free names unknown tensor {tid}", i)
        storage = self.graph.tensors[tid].storage
        releases = self.count[storage] == 1 or tid == storage
        base = self.graph.tensors[storage].name
        if releases and storage in self.unwaited_d2h:
            copy = self.unwaited_d2h[storage]
            raise ScheduleError(f"Free of {self._name(tid)} while the offload at instruction "
                                f"{copy.index} may still be reading it; add "
                                f"Wait({base!r}, 'd2h') before the Free", i)
        if storage in self.pending_h2d:
            copy = self.pending_h2d[storage]
            raise ScheduleError(f"Free of {self._name(tid)} while the prefetch at instruction "
                                f"{copy.index} may still be writing it; add "
                                f"Wait({base!r}, 'h2d') before the Free", i)
        if not self.resident[tid]:
            raise ScheduleError(f"Free of {self._name(tid)}, which is not on the device: "
                                f"{self._absent(tid)}", i)
        self.resident[tid] = False
        self.freed_at[tid] = i
        self.count[storage] -= 1
        self.start[i] = self.now
        self._host(self.host.free)
        self.end[i] = self.now

    def offload(self, i: int, ins: Offload) -> None:
        storage = self._base(i, ins.tensor, "Offload")
        if not self.resident[storage]:
            why = "its prefetch has not been waited for" if storage in self.pending_h2d \
                else self._absent(storage)
            raise ScheduleError(f"Offload of {self._name(storage)}, which is not on the "
                                f"device: {why}", i)
        if storage in self.unwaited_d2h:
            raise ScheduleError(f"Offload of {self._name(storage)} while its previous offload "
                                f"(instruction {self.unwaited_d2h[storage].index}) has not been "
                                "waited for", i)
        self._host(self.host.issue(D2H, self.graph.tensors[storage].nbytes))
        self.unwaited_d2h[storage] = self._enqueue(i, D2H, storage, self.now)

    def prefetch(self, i: int, ins: Prefetch) -> None:
        storage = self._base(i, ins.tensor, "Prefetch")
        if self.count[storage] > 0 or storage in self.pending_h2d:
            raise ScheduleError(f"Prefetch of {self._name(storage)}, which is already on the "
                                "device; drop the Prefetch or Free the tensor before it", i)
        host = self.on_host.get(storage)
        if host is None:
            raise ScheduleError(f"Prefetch of {self._name(storage)}, which has no completed host "
                                "copy; Offload it and Wait(d2h) for that copy first", i)
        self._host(self.host.issue(H2D, self.graph.tensors[storage].nbytes))
        copy = self._enqueue(i, H2D, storage, max(self.now, host.end))
        self._make_resident(storage)
        self.resident[storage] = False  # allocated, but usable only after Wait(h2d)
        self.pending_h2d[storage] = copy

    def wait(self, i: int, ins: Wait) -> None:
        if not 0 <= ins.tensor < len(self.graph.tensors):
            raise ScheduleError(f"Wait names unknown tensor {ins.tensor}", i)
        storage = self.graph.tensors[ins.tensor].storage
        if ins.direction == D2H:
            copy = self.unwaited_d2h.pop(storage, None)
            if copy is not None:
                self.on_host[storage] = copy
        elif ins.direction == H2D:
            copy = self.pending_h2d.pop(storage, None)
            if copy is not None:
                self.resident[storage] = True
        else:
            raise ScheduleError(f"Wait direction must be 'd2h' or 'h2d', got {ins.direction!r}", i)
        if copy is None:
            verb = "Offload" if ins.direction == D2H else "Prefetch"
            raise ScheduleError(f"Wait on the {ins.direction} copy of {self._name(ins.tensor)}, "
                                f"which is not in flight: no {verb} of it since its last Wait", i)
        self.start[i] = self.now
        if copy.end > self.now:  # a blocking wait: the compute stream resumes after a wake-up
            self.stall += copy.end - self.now
            self.now = copy.end
            self._host(self.host.wake)
        else:
            self._host(self.host.wait)
        self.end[i] = self.now

    # -- helpers -----------------------------------------------------------------------------
    def _host(self, seconds: float) -> None:
        """The compute thread spends ``seconds`` of host time on a non-kernel instruction."""
        self.now += seconds
        self.host_time += seconds

    def _base(self, i: int, tid: int, verb: str) -> int:
        if not 0 <= tid < len(self.graph.tensors):
            raise ScheduleError(f"{verb} names unknown tensor {tid}", i)
        t = self.graph.tensors[tid]
        if t.is_view:
            base = self.graph.tensors[t.storage].name
            raise ScheduleError(f"{verb} of view {t.name!r}: only base tensors move; "
                                f"{verb} its base {base!r} instead", i)
        return tid

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

    def finish(self) -> None:
        """End-of-pass checks."""
        in_flight = sorted({*self.unwaited_d2h, *self.pending_h2d})
        if in_flight:
            names = [self.graph.tensors[s].name for s in in_flight]
            raise ScheduleError(f"copies of {names} are still in flight when the step ends; "
                                "add their Wait before the end")
        for tid in self.schedule.keep_at_end:
            if not 0 <= tid < len(self.graph.tensors) or not self.resident[tid]:
                raise ScheduleError(f"{self._name(tid)} must be on the device when the step ends "
                                    "(keep_at_end) but is not; do not Free it, or prefetch it back")


def _run_external_verify(graph: Graph, schedule: Schedule) -> None:
    """Call ``outcore.plan.verify.verify`` when it exists; its ScheduleError propagates."""
    try:
        module = importlib.import_module("outcore.plan.verify")
    except ImportError:
        return
    verify = getattr(module, "verify", None)
    if verify is None:
        return
    problems = verify(graph, schedule)
    if isinstance(problems, (list, tuple)) and problems:
        first = problems[0]
        raise first if isinstance(first, ScheduleError) else ScheduleError(str(first))


def _resolve_ops(graph: Graph, schedule: Schedule) -> list[Op]:
    """The graph's ops with the schedule's chosen variants applied."""
    ops = list(graph.ops)
    for oid, variant in schedule.variants.items():
        if not 0 <= oid < len(ops):
            raise ScheduleError(f"schedule.variants names unknown op {oid}")
        ops[oid] = dataclasses.replace(ops[oid], variant=variant)
    return ops


def simulate(graph: Graph, schedule: Schedule, cost_model: CostModel, *,
             placement: Placement | Any | None = None, verify: bool = True) -> SimResult:
    """Simulate ``schedule`` on ``graph`` under ``cost_model``.

    Args:
        graph: the captured (or hand-made) graph.
        schedule: the instructions to run; checked as described in the module docstring.
        cost_model: any ``CostModel``; if it has ``bind(graph)`` that is called first (an
            analytic model learns per-op dtypes; a measured profile refuses another graph).
        placement: optional pool placement, called as ``placement(graph, schedule,
            lifetimes)`` (or ``placement.place(...)``); its result is ``SimResult.placement``.
        verify: run ``outcore.plan.verify.verify`` first when it is importable.

    Raises:
        ScheduleError: the schedule breaks an invariant (index = the instruction).
        ProfileError: the cost model cannot price this graph.
    """
    if verify:
        _run_external_verify(graph, schedule)
    if schedule.sub_batches < 1:
        raise ScheduleError(f"schedule.sub_batches must be >= 1, got {schedule.sub_batches}")
    bind = getattr(cost_model, "bind", None)
    model: CostModel = bind(graph) if callable(bind) else cost_model
    ops = _resolve_ops(graph, schedule)
    replay = _replay(graph, schedule, model, ops)
    trace, lifetimes = _memory(graph, schedule, lambda oid: model.workspace(ops[oid]))
    result = _assemble(replay, trace, lifetimes, schedule.sub_batches, repr(cost_model))
    if placement is not None:
        place = getattr(placement, "place", placement)
        result.placement = place(graph, schedule, lifetimes)
    return result


def _memory(graph: Graph, schedule: Schedule,
            workspace: Callable[[int], int]) -> tuple[MemoryTrace, list[Lifetime]]:
    """One pass of the memory rule (``residency_steps``): the memory curve (``memory_curve``'s,
    with this workspace) and the storages' lifetimes (``_record_lifetimes``)."""
    lifetimes: list[Lifetime] = []
    steps = residency_steps(graph, schedule, workspace)
    trace = trace_of(_record_lifetimes(graph, steps, len(schedule), lifetimes))
    return trace, lifetimes


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


def _replay(graph: Graph, schedule: Schedule, model: CostModel, ops: list[Op]) -> _Replay:
    replay = _Replay(graph, schedule, model, ops)
    handlers: dict[type, Callable[[int, Any], None]] = {
        Compute: replay.compute, Free: replay.free, Offload: replay.offload,
        Prefetch: replay.prefetch, Wait: replay.wait,
    }
    issue = replay.issue
    for i, ins in enumerate(schedule.instructions):
        issue[i] = replay.now
        handler = handlers.get(type(ins))
        if handler is None:
            raise ScheduleError(f"unknown instruction {ins!r}", i)
        handler(i, ins)
    replay.finish()
    return replay


def _assemble(replay: _Replay, trace: MemoryTrace, lifetimes: list[Lifetime], sub_batches: int,
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

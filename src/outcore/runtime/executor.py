"""Run a Schedule on real PyTorch, on a device, with exact memory accounting.

``Executor(graph, schedule, device).run((x, y))`` executes one training step from generated
code under ``torch.no_grad()``:

* device memory is measured by a fresh ``MemoryTracker`` per step (the device's capacity,
  if any, is enforced by it); the step's static tensors (parameters, buffers, batch) are
  counted first, so the measured peak is comparable with ``plan.memory.predicted_peak``.
  On a real device (``tracker_is_memory`` False: the plain CPU, CUDA) a step whose counted
  twin fitted the capacity runs without the tracker (its Python dispatch costs ~10 us an
  op, 2-3x a small model's eager step) and reports that proven peak (``needs_measuring``).
  Twins have the same batch shapes, strides and dtypes (``batch_key``) and the same
  static storages: sizes and sharing of the batch's, parameters', buffers' and constants'
  storages, which the tracker counts whole (``storage_key``). The schedule then allocates
  the same tensors in the same order, so the tracker would count the same peak;
* random ops save the RNG state in forward and replay it when recomputed;
* only when the whole step has succeeded are the results applied: parameter gradients are
  accumulated into ``.grad`` (as ``loss.backward()`` does) and BatchNorm running statistics
  are copied into the buffers once. A failure (e.g. DeviceOutOfMemory) leaves the model,
  its gradients and any optimizer state untouched.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from outcore.capture.step import CapturedStep, StaleSpecialization
from outcore.errors import OutcoreError
from outcore.graph.ir import Graph
from outcore.plan.schedule import Compute, Offload, Schedule
from outcore.plan.verify import verify
from outcore.runtime.codegen import GeneratedStep, generate
from outcore.runtime.devices.base import Device, SyncCPUDevice, untracked
from outcore.runtime.devices.stats import TransferStats
from outcore.runtime.eager_batch_norm import batch_norm_impls
from outcore.runtime.failsafe import abandon_step, commit
from outcore.runtime.host_weights import check_host_weights, hold_on_host, host_tensor
from outcore.runtime.timed import TimedDevice
from outcore.runtime.tracker import MemoryTracker
from outcore.variants.registry import FRAMEWORK


@dataclass
class StepResult:
    """What one executed step returns and measured.

    ``seconds``: wall time of the step. ``op_seconds`` and ``instruction_seconds``: filled by
    a timed run (see ``Executor.run``). ``transfers``: the device's transfer statistics for
    this step (bytes, busy, blocked, blocking Waits and their lateness), None for a device
    that keeps none.
    """

    loss: torch.Tensor
    peak_bytes: int
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    seconds: float = 0.0
    op_seconds: list[tuple[int, float]] = field(default_factory=list)
    instruction_seconds: list[float] = field(default_factory=list)
    transfers: TransferStats | None = None
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    #: batch tensor index (flat, as the graph's inputs) -> its gradient, for the batch
    #: tensors that require one
    input_grads: dict[int, torch.Tensor] = field(default_factory=dict)
    #: the model's outputs a step keeps (``capture(..., outputs=True)``), by position:
    #: ``CapturedStep.model_output`` rebuilds what the model returned
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    #: False: the step ran without the tracker and ``peak_bytes`` is the peak a counted step
    #: of this schedule on the same batch shapes measured (``Executor.needs_measuring``), or
    #: 0 when ``run(measure=False)`` was asked for with none counted
    peak_measured: bool = True


#: Batch shape keys whose proven peak an Executor keeps (``Executor.needs_measuring``).
PROVEN_SHAPES = 8


def batch_key(leaves: list[torch.Tensor]) -> tuple[Any, ...]:
    """What fixes the bytes a step allocates besides its schedule: each batch tensor's shape,
    strides, dtype and device (strides: a channels-last batch makes other copies)."""
    return tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in leaves)


def storage_key(tensors: Iterable[torch.Tensor]) -> tuple[int, ...]:
    """How the tracker counts a step's static tensors (batch, parameters, buffers,
    constants): per tensor its storage's bytes, or ``-1 - i`` when it shares the storage of
    the ``i``-th (counted once). At equal shapes a batch sliced from a larger tensor, a
    parameter viewing a flat vector, a constant rebound to a row of a matrix, or two batch
    tensors that stop being one change it, and the step's peak with it."""
    first: dict[int, int] = {}
    out: list[int] = []
    for t in tensors:
        storage = t.untyped_storage()
        at = first.setdefault(storage._cdata, len(out))
        out.append(storage.nbytes() if at == len(out) else -1 - at)
    return tuple(out)


#: How the capture names the gradient of the batch's i-th tensor (``input:<i>``).
INPUT_PREFIX = "input:"


def _check_input_leaves(leaves: list[torch.Tensor]) -> None:
    """Refuse, before anything runs, a batch tensor that requires grad but is not a leaf:
    eager PyTorch would carry its gradient back into the autograd graph that made it, which
    a planned step (run without autograd) cannot reach."""
    for i, t in enumerate(leaves):
        if t.requires_grad and t.grad_fn is not None:
            raise OutcoreError(
                f"batch tensor {i} requires grad and was computed by autograd "
                f"({type(t.grad_fn).__name__}): outcore cannot carry its gradient back into "
                "the graph that made it. Move that computation into the model, or pass a "
                "leaf (t.detach().requires_grad_()) and backpropagate its .grad yourself.")


class GradHook(Protocol):
    """Told when each parameter gradient is final (data parallel: ``outcore.distributed``).

    ``tensors``: the gradient ids it wants. Per step: ``begin()``; ``ready(tid, value)``
    right after the Compute that makes ``tid`` (inside the measured step: what it allocates
    is counted); ``finish(outputs)`` once the schedule has run, which may replace gradient
    values in ``outputs`` before they are applied; ``abort()`` when the step failed.
    """

    tensors: frozenset[int]

    def begin(self) -> None: ...

    def ready(self, tid: int, value: torch.Tensor) -> None: ...

    def finish(self, outputs: dict[int, torch.Tensor]) -> None: ...

    def abort(self, error: BaseException) -> None: ...


class Runtime:
    """The object generated code calls: device copies, tensor naming, RNG save/replay."""

    def __init__(self, device: Device, tracker: MemoryTracker, timed: bool,
                 grad_hook: GradHook | None = None) -> None:
        self.device = device
        self.untimed = device
        #: Data parallel: called after a gradient's Compute (no timing mark: not an
        #: instruction of the schedule).
        self.grad_ready = grad_hook.ready if grad_hook is not None else None
        self.tracker = tracker
        self.rng: dict[int, RngState] = {}
        self.timed = timed
        #: When timed: the time each instruction started. Generated code makes exactly one
        #: runtime call per instruction, in order, so mark i belongs to instruction i.
        self.marks: list[float] = []
        if timed:  # the device marks each copy call; ``begin`` marks each Compute
            device = TimedDevice(device, self.marks)
        self.device = device
        #: gradient id -> (size, stride, storage offset): to read it back from the host copy
        self.layouts: dict[int, tuple[tuple[int, ...], tuple[int, ...], int]] = {}
        self.start_offload = device.start_offload
        self.wait_offload = device.wait_offload
        self.wait_prefetch = device.wait_prefetch
        self.release = device.release

    def begin(self, oid: int, name: str) -> None:
        """Called before every Compute: names the allocations and, when timed, marks time."""
        self.tracker.naming = name
        if self.timed:
            self.marks.append(time.perf_counter())

    def start_prefetch(self, tid: int, name: str) -> torch.Tensor:
        self.tracker.naming = name
        return self.device.start_prefetch(tid, name)

    def keep_layout(self, tid: int, t: torch.Tensor) -> None:
        """Remember the layout of a gradient sent to host memory (``from_host`` rebuilds it)."""
        self.layouts[tid] = (tuple(t.size()), tuple(t.stride()), int(t.storage_offset()))

    def from_host(self, storage: int, tid: int) -> torch.Tensor:
        """Tensor ``tid`` read from the completed host copy of ``storage`` (no device bytes)."""
        size, stride, offset = self.layouts[tid]
        with untracked():
            return host_tensor(self.untimed, storage).as_strided(size, stride, offset)

    def save_rng(self, oid: int, fn: Callable[[], Any]) -> Any:
        with untracked():
            self.rng[oid] = rng_state()
        return fn()

    def replay_rng(self, oid: int, fn: Callable[[], Any], last: bool = False) -> Any:
        """Run ``fn`` (a recompute of random op ``oid``) from the state saved at its first
        run, then restore the current state; ``last``: its last recompute, so the saved
        state is dropped (the memory rule holds it until then, ``outcore.plan.residency``)."""
        with untracked():
            current = rng_state()
            saved = self.rng.pop(oid) if last else self.rng[oid]  # freed on return
            set_rng_state(saved)
        try:
            return fn()
        finally:
            with untracked():
                set_rng_state(current)


RngState = tuple[torch.Tensor, torch.Tensor | None]


def rng_state() -> RngState:
    """The CPU generator's state and, once CUDA is in use, the current GPU's (dropout on a
    CUDA tensor draws from the GPU's generator, so a recompute must replay that one)."""
    gpu = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), gpu


def set_rng_state(state: RngState) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1])


def kernel_impls(graph: Graph, schedule: Schedule) -> dict[int, Callable[..., Any]]:
    """Op id -> the callable run instead of the captured ATen op: eager's BatchNorm backend
    (``eager_batch_norm``: cuDNN's kernels on CUDA where eager picks them), then the operator
    algorithm the schedule chose (variants win)."""
    impls = batch_norm_impls(graph)
    if not schedule.variants:
        return impls
    from outcore.variants.registry import implementation

    return {**impls, **{oid: implementation(graph.ops[oid].target, variant)
                        for oid, variant in schedule.variants.items() if variant != FRAMEWORK}}


def _made_at(graph: Graph, tid: int) -> int:
    """The position of the op that made tensor ``tid`` (-1: none, an input)."""
    producer = graph.tensors[tid].producer
    return -1 if producer is None else producer


class Executor:
    """Runs one Schedule of one captured Graph; reusable across steps.

    Args:
        graph: a Graph from ``outcore.capture`` with real (not fake) tensors.
        schedule: a Schedule for it; verified here unless ``check=False``.
        device: where to run (default: the plain CPU, synchronous copies, no capacity).
        impls: op id -> callable replacing the op's ATen kernel (operator variants).
        grad_hook: told when each parameter gradient is final (``GradHook``; data parallel).
    """

    def __init__(self, graph: Graph, schedule: Schedule, device: Device | None = None, *,
                 impls: dict[int, Callable[..., Any]] | None = None, check: bool = True,
                 grad_hook: GradHook | None = None) -> None:
        step = graph.source
        if not isinstance(step, CapturedStep):
            raise OutcoreError("this graph has no captured step: capture it with "
                               "outcore.capture(model, loss_fn, (x, y)) to run it")
        if step.fake:
            raise OutcoreError("this graph was captured with fake tensors (fake=True or a fake "
                               "model); it can be planned and simulated but not run. Capture "
                               "the real model to execute it.")
        if check:
            verify(graph, schedule)
        self.graph = graph
        self.schedule = schedule
        self.step = step
        #: the step's output roles in the order the traced step made them (their producing
        #: op's position; gradients then come in autograd's engine order), so that
        #: ``failsafe.commit`` sums a tied parameter's contributions as eager does
        self._roles = sorted(step.nodes.output_roles, key=lambda role: _made_at(graph, role[1]))
        self.device: Device = device if device is not None else SyncCPUDevice()
        #: op id -> the callable run for it instead of its ATen kernel
        self.impls: dict[int, Callable[..., Any]] = {**kernel_impls(graph, schedule),
                                                     **(impls or {})}
        self.grad_hook = grad_hook
        notify = grad_hook.tensors if grad_hook is not None else frozenset()
        self.generated: GeneratedStep = generate(graph, schedule, self.impls, notify)
        self.capacity: int | None = self.device.capacity
        #: (``batch_key``, ``storage_key``) -> the tracker's peak of a counted step on them
        self.proven: dict[tuple[Any, ...], int] = {}
        self._copied = sorted({i.tensor for i in schedule.instructions if isinstance(i, Offload)}
                              | set(schedule.host_static))
        self._held = frozenset(schedule.host_static)
        if schedule.host_static or schedule.host_outputs:
            check_host_weights(self.device)

    def kernel(self, oid: int) -> Callable[..., Any]:
        """The callable op ``oid`` runs: its replacement, or its ATen kernel."""
        chosen = self.impls.get(oid)
        if chosen is not None:
            return chosen
        target = self.step.op_nodes[oid].target
        assert callable(target)  # an op's node calls a function
        return target

    def replace_ops(self, impls: dict[int, Callable[..., Any]]) -> None:
        """Run ``impls[oid]`` for op ``oid`` from now on (the step's code is generated again;
        other kernels may allocate otherwise, so no peak counted before is taken as proven)."""
        self.impls.update(impls)
        self.proven.clear()
        notify = self.grad_hook.tensors if self.grad_hook is not None else frozenset()
        self.generated = generate(self.graph, self.schedule, self.impls, notify)

    #: True: count every step with the tracker, even once a counted one proved its peak; on
    #: the class (``Executor.measure_every_step = True``) for every executor, on an
    #: instance (``trainer.executor``) for that plan's
    measure_every_step: bool = False

    def needs_measuring(self, key: tuple[Any, ...]) -> bool:
        """Whether a step with ``key`` (its ``batch_key`` and the ``storage_key`` of its
        static tensors) runs under the tracker: always on a device whose memory is the
        tracker's count (``tracker_is_memory``: the emulated device) or with
        ``measure_every_step``; on a real device until a counted step with that key proved
        a peak within the capacity (read at each step: a lowered capacity counts again)."""
        if self.measure_every_step or getattr(self.device, "tracker_is_memory", True):
            return True
        peak = self.proven.get(key)
        return peak is None or (self.capacity is not None and peak > self.capacity)

    def run(self, batch: Any, *, apply: bool = True, grad_scale: float = 1.0,
            timed: bool = False, measure: bool | None = None,
            loss_scale: float = 1.0) -> StepResult:
        """Execute one step on ``batch = (x, y)``; see the module docstring for guarantees.

        ``timed=True`` also records the wall time of every instruction, from its start to
        the next one's (the last ends with the step), in ``StepResult.instruction_seconds``
        (one per instruction); ``StepResult.op_seconds`` lists the Computes among them as
        (op id, seconds): a profile taken inside a real step.
        ``StepResult.transfers`` is the device's transfer statistics for this step, when
        the device keeps them (``stats()``). ``measure``: None (default) counts the step
        with the memory tracker when ``needs_measuring`` says so, else reports the proven
        peak (``StepResult.peak_measured`` False); True always counts; False never (then
        ``peak_bytes`` is the proven peak, or 0), refused where a capacity is to enforce
        and no counted step on these shapes proved it. ``loss_scale`` seeds the backward
        with that value instead of 1 (loss scaling: the gradients come out multiplied by
        it).
        """
        leaves = self.step.batch_tensors(batch)
        _check_input_leaves(leaves)
        values = self.step.static_values(self.graph, batch, loss_scale)
        key = (batch_key(leaves),
               storage_key(v for t, v in values.items() if t not in self._held))
        if measure is None:
            measure = self.needs_measuring(key)
        elif not measure and self.capacity is not None and (
                self.proven.get(key, self.capacity + 1) > self.capacity):
            raise OutcoreError("measure=False would skip enforcing the device's capacity; "
                               "use a device without one (e.g. device='cpu'), or count one "
                               "step of these batch shapes first")
        tracker = MemoryTracker(self.capacity)
        self.device.tracker = tracker
        hook = self.grad_hook
        rt = Runtime(self.device, tracker, timed=timed, grad_hook=hook)
        before = self.device.stats()
        start = time.perf_counter()
        try:
            if hook is not None:
                hook.begin()
            with torch.no_grad(), (tracker if measure else contextlib.nullcontext()):
                for tid in self._held:  # parameters held in host memory: not device bytes
                    hold_on_host(self.device, tid, values[tid])
                if measure:
                    tracker.track([v for t, v in values.items() if t not in self._held],
                                  "step inputs")
                outputs = self.generated.fn(rt, values)
            self.device.synchronize()
            if hook is not None:
                hook.finish(outputs)
        except BaseException as exc:  # failure safety: no copy in flight, no bytes held
            if hook is not None:
                hook.abort(exc)
            values.clear()
            rt.rng.clear()
            abandon_step(self.device, exc)
            if self.step.guards and isinstance(exc, (RuntimeError, IndexError, ValueError)) \
                    and not isinstance(exc, OutcoreError):
                raise StaleSpecialization(
                    f"the step raised {type(exc).__name__} before its guards were compared; "
                    "it was specialised on values of another batch, which may be what the "
                    "op refused", exc) from exc
            raise
        finally:
            for tid in self._copied:
                self.device.drop_host(tid)
            tracker.close()
        end = time.perf_counter()
        if measure:
            self._prove(key, tracker.peak)
        result = StepResult(loss=torch.zeros(()), seconds=end - start, peak_measured=measure,
                            peak_bytes=tracker.peak if measure else self.proven.get(key, 0))
        after = self.device.stats()
        if before is not None and after is not None:
            result.transfers = after - before
        if timed:
            self._timings(rt.marks, end, result)
        self._collect(outputs, result)
        self.step.check_guards(outputs)  # a specialised step whose values changed: not applied
        if apply:
            self.apply(result, outputs, grad_scale, inputs=leaves)
        return result

    def _prove(self, key: tuple[Any, ...], peak: int) -> None:
        """Keep ``peak`` as the proven peak of steps on ``key`` (at most ``PROVEN_SHAPES``
        keys, the oldest out first)."""
        self.proven.pop(key, None)
        self.proven[key] = peak
        while len(self.proven) > PROVEN_SHAPES:
            del self.proven[next(iter(self.proven))]

    def _timings(self, marks: list[float], end: float, result: StepResult) -> None:
        instructions = self.schedule.instructions
        if len(marks) != len(instructions):
            raise OutcoreError(f"timed step made {len(marks)} runtime calls for "
                               f"{len(instructions)} instructions; codegen must make one each")
        stamps = [*marks, end]
        result.instruction_seconds = [stamps[i + 1] - stamps[i] for i in range(len(marks))]
        result.op_seconds = [(ins.op, result.instruction_seconds[i])
                             for i, ins in enumerate(instructions) if isinstance(ins, Compute)]

    def _collect(self, outputs: dict[int, torch.Tensor], result: StepResult) -> None:
        """``result`` filled from the step's outputs, in ``_roles``' order."""
        for role, tid, name in self._roles:
            if role == "loss":
                result.loss = outputs[tid]
            elif role == "grad" and name.startswith(INPUT_PREFIX):
                result.input_grads[int(name.removeprefix(INPUT_PREFIX))] = outputs[tid]
            elif role == "grad":
                result.grads[name.removeprefix("model.")] = outputs[tid]
            elif role == "buffer":
                result.buffers[name.removeprefix("model.")] = outputs[tid]
            elif role == "output":
                result.outputs[int(name)] = outputs[tid]

    def apply(self, result: StepResult, outputs: dict[int, torch.Tensor] | None = None,
              grad_scale: float = 1.0, inputs: list[torch.Tensor] | None = None) -> None:
        """Accumulate ``result``'s gradients (times ``grad_scale``) into ``.grad`` and write
        its buffer updates, all or nothing (``outcore.runtime.failsafe.commit``).

        ``inputs``: the batch's tensors, whose ``.grad`` receives ``result.input_grads``
        (a batch tensor with ``requires_grad=True``, as ``loss.backward()`` fills it) and
        which receive the forward's in-place changes to them (``x.sub_(mean)``), as eager's
        forward leaves them.
        A gradient laid out like its parameter is used as it is (no copy), as autograd's
        AccumulateGrad does; another layout is copied into the parameter's layout."""
        grads = dict(result.grads)
        targets: dict[str, torch.Tensor] = {}
        if result.input_grads:
            if inputs is None:
                raise OutcoreError("the step computed input gradients but was not given the "
                                   "batch's tensors to write them to")
            for idx, g in result.input_grads.items():
                grads[f"{INPUT_PREFIX}{idx}"] = g
                targets[f"{INPUT_PREFIX}{idx}"] = inputs[idx]
        for name in result.buffers:  # a batch tensor the forward changed in place (x.sub_())
            if name.startswith(INPUT_PREFIX):
                if inputs is None:
                    raise OutcoreError("the step changed a batch tensor in place but was not "
                                       "given the batch's tensors to write it to")
                targets[name] = inputs[int(name.removeprefix(INPUT_PREFIX))]
        with torch.no_grad():
            if grad_scale != 1.0:
                grads = {n: g * grad_scale for n, g in grads.items()}
        self.apply_grads(grads, result.buffers, targets)

    def apply_grads(self, grads: dict[str, torch.Tensor],
                    buffers: dict[str, torch.Tensor] | None = None,
                    inputs: dict[str, torch.Tensor] | None = None) -> None:
        """Commit gradients and buffer updates named as in ``StepResult``, all or nothing;
        ``inputs``: the batch tensors named ``input:<index>`` that gradients and in-place
        changes go to. Gradients are only ever named after parameters and inputs, so one
        name map (``_state`` and ``inputs``) serves both."""
        owned = {**self._state(), **(inputs or {})}
        commit(owned, grads, owned, buffers or {})

    def named_buffers(self, names: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """(name, the module's buffer) for every name of ``names`` (``StepResult`` naming)."""
        owned = self._state()
        return [(n, owned[n]) for n in names]

    def _state(self) -> dict[str, torch.Tensor]:
        """What a step's in-place updates may write, by ``StepResult`` name: the module's
        buffers (BatchNorm statistics), and its parameters where the forward changes one in
        place under no_grad (``nn.Embedding(max_norm=...)`` renorms the rows it looks up,
        as eager does before the lookup)."""
        module = self.step.step_module
        owned: dict[str, torch.Tensor] = {
            n.removeprefix("model."): p
            for n, p in module.named_parameters(remove_duplicate=False)}
        owned.update({n.removeprefix("model."): b
                      for n, b in module.named_buffers(remove_duplicate=False)})
        return owned

    def apply_buffers(self, result: StepResult) -> None:
        """Write only ``result``'s buffer updates (a sub-batch's BatchNorm statistics)."""
        self.apply_grads({}, result.buffers)

"""Run a Schedule as a forward half and a backward half, under autograd.

``outcore.runtime.codegen.generate`` compiles a whole training step into one function. A
``torch.compile`` backend must instead hand autograd a forward and a backward that run at
different times (the user's loss is computed in between).

``generate_split`` emits the same straight-line code as ``generate`` (same ``Emitter``, same
rules: frees via ``del`` after ``rt.release``, offload/prefetch/wait via the runtime, RNG
saved in forward and replayed by a recompute), cut in two:

* ``forward(rt, inputs) -> env``: binds every static tensor from ``inputs`` and runs the
  instructions before the cut; returns ``env``, every tensor resident at the cut
  (``SplitStep.carried``).
* ``backward(rt, env) -> {tid: tensor}``: binds the carried tensors by *popping* them from
  ``env`` (so a later ``del`` really drops the last reference), runs the rest and returns
  every tensor of ``schedule.keep_at_end``.

The instruction order is the schedule's, unchanged, so ``plan.memory``'s accounting (and
``verify``) hold for the pair exactly as for the whole step. The cut is the first Compute
that is a recompute or a backward-phase op; a forward-phase op computed (not recomputed)
after it is refused with ScheduleError. Copies may be in flight across the cut (an offload
started in forward, a prefetch hoisted into forward), so both halves share one runtime.

``CompiledGraph`` runs the pair as a ``torch.autograd.Function``; see its docstring for the
memory-accounting and buffer-update rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.autograd.function import once_differentiable

from outcore.capture.step import CapturedStep
from outcore.errors import CaptureError, OutcoreError, ScheduleError
from outcore.graph.ir import Graph, Phase
from outcore.plan.memory import memory_curve
from outcore.plan.residency import Replay, no_workspace
from outcore.plan.schedule import (
    Compute,
    Offload,
    Schedule,
)
from outcore.plan.verify import verify
from outcore.runtime.codegen import Emitter, recomputed_ops
from outcore.runtime.devices.base import Device
from outcore.runtime.executor import Runtime, kernel_impls
from outcore.runtime.tracker import MemoryTracker
from outcore.units import format_bytes

if TYPE_CHECKING:
    from outcore.api import PlannedStep


@dataclass
class SplitStep:
    """The two generated halves of one step and what passes between them.

    Attributes:
        forward: ``forward(rt, inputs) -> env`` (see the module docstring).
        backward: ``backward(rt, env) -> {tid: tensor}`` for ``schedule.keep_at_end``.
        cut: index of the first instruction the backward half runs.
        carried: tensor ids resident at the cut, the keys of ``env``.
        static_ids: tensor ids the forward half reads from ``inputs``.
        source: the generated source of both functions (for debugging and tests).
    """

    forward: Callable[..., dict[int, Any]]
    backward: Callable[..., dict[int, Any]]
    cut: int
    carried: list[int]
    static_ids: list[int]
    source: str


def split_point(graph: Graph, schedule: Schedule) -> int:
    """Index of the first instruction of the backward half (``len`` when there is none).

    Raises:
        ScheduleError: a forward-phase op is computed (not recomputed) after the cut, so the
            schedule cannot be run as a forward followed by a backward.
    """
    instructions = schedule.instructions
    cut = next((i for i, ins in enumerate(instructions) if isinstance(ins, Compute)
                and (ins.recompute or graph.ops[ins.op].phase is not Phase.FORWARD)),
               len(instructions))
    for i in range(cut, len(instructions)):
        ins = instructions[i]
        if isinstance(ins, Compute) and not ins.recompute \
                and graph.ops[ins.op].phase is Phase.FORWARD:
            raise ScheduleError(f"forward op {graph.ops[ins.op].name!r} runs after the backward "
                                "has started; a torch.compile backend needs every forward op "
                                "before the first backward op (use a policy lowered by "
                                "outcore.plan.lower)", i)
    return cut


def _function(name: str, params: str, lines: list[str]) -> str:
    return f"def {name}({params}):\n" + "\n".join("    " + ln for ln in lines) + "\n"


def _returned(tids: list[int]) -> str:
    return "return {" + ", ".join(f"{t}: v{t}" for t in tids) + "}"


def generate_split(graph: Graph, schedule: Schedule,
                   impls: dict[int, Callable[..., Any]] | None = None) -> SplitStep:
    """Compile ``schedule`` into a forward half and a backward half (module docstring).

    ``impls`` overrides an op's callable (operator variants), as for ``codegen.generate``.
    """
    step = graph.source
    if not isinstance(step, CapturedStep):
        raise OutcoreError("this graph has no captured step to run; capture it first")
    cut = split_point(graph, schedule)
    em = Emitter(graph, step, impls or {})
    em.replayed = recomputed_ops(schedule)
    replay = Replay(graph, schedule, no_workspace)  # what is resident, what a Free releases
    steps = iter(replay)
    first = next(steps)
    em.track(first)
    static = list(first.made_resident)
    em.lines += [f"v{tid} = inputs[{tid}]" for tid in static]
    for ins, step in zip(schedule.instructions[:cut], steps, strict=False):
        em.emit(ins, step)
    carried = replay.resident_tensors()
    forward_src = _function("forward", "rt, inputs", [*em.lines, _returned(carried)])
    em.lines = [f"v{tid} = env.pop({tid})" for tid in carried]
    for ins, step in zip(schedule.instructions[cut:], steps, strict=True):
        em.emit(ins, step)
    backward_src = _function("backward", "rt, env", [*em.lines, _returned(schedule.keep_at_end)])
    source = forward_src + "\n\n" + backward_src
    namespace = dict(em.globals)
    exec(compile(source, f"<outcore split step {graph.name}>", "exec"), namespace)  # ours
    return SplitStep(forward=namespace["forward"], backward=namespace["backward"], cut=cut,
                     carried=carried, static_ids=static, source=source)


#: Ops that read a buffer only to compute its update: target -> (argument positions of
#: those buffers, position of the flag that must be True for the other outputs not to
#: depend on them). BatchNorm in training normalises with the batch statistics.
_UPDATE_ONLY_READS: dict[str, tuple[tuple[int, ...], int]] = {
    "aten._native_batch_norm_legit_functional.default": ((3, 4), 5),
}


def check_late_buffer_reads(graph: Graph, schedule: Schedule, cut: int, updated: set[int],
                            new_values: set[int]) -> None:
    """Refuse a backward half that would read a buffer's value after its in-place update.

    Buffer updates are applied when the forward half ends, so an op after the cut that
    reads an ``updated`` buffer sees the new value. That is harmless when the op's outputs
    are all buffer updates (``new_values``: kept resident to the end, so a recompute's copies
    are discarded) or when the op reads the buffer only to update it (``_UPDATE_ONLY_READS``,
    e.g. BatchNorm recomputed in training); anything else raises CaptureError.
    """
    step = graph.source
    for i in range(cut, len(schedule.instructions)):
        ins = schedule.instructions[i]
        if not isinstance(ins, Compute):
            continue
        op = graph.ops[ins.op]
        if not updated & set(op.inputs) or set(op.outputs) <= new_values:
            continue
        rule = _UPDATE_ONLY_READS.get(op.target)
        if rule is not None:
            positions, flag = rule
            args = step.op_nodes[ins.op].args
            others = {step.nodes.node_tensors.get(a) for k, a in enumerate(args)
                      if k not in positions and isinstance(a, fx.Node)}
            if len(args) > flag and args[flag] is True and not others & updated:
                continue
        raise CaptureError(f"{'recomputed ' if ins.recompute else ''}op {op.name!r} reads, after "
                           "the forward, a buffer the forward updates in place, and its result "
                           "depends on the old value; outcore's backend cannot run it"
                           + (" (choose a policy or budget that does not recompute it)"
                              if ins.recompute else ""))


# -- running the halves under autograd -------------------------------------------------------
@dataclass
class GraphStats:
    """What one compiled graph predicted and what its last steps measured, in bytes.

    ``measured_peak`` covers forward and backward of the last step whose backward finished;
    ``measured_forward_peak`` the forward half of the last step that ran one, to compare
    with ``predicted_forward_peak`` (the plan's peak over the instructions before the cut).
    """

    predicted_peak: int
    predicted_forward_peak: int
    measured_peak: int = 0
    measured_forward_peak: int = 0
    steps: int = 0

    def __str__(self) -> str:
        return (f"peak {format_bytes(self.measured_peak)} measured vs "
                f"{format_bytes(self.predicted_peak)} predicted over {self.steps} steps")


@dataclass
class Signature:
    """How the joint graph's placeholders and outputs map to the compiled call.

    ``bindings``: tensor id -> ("arg", flat index) | ("const", tensor) | ("tangent", its fake
    value, whose shape, stride and dtype the reserved tangent takes). ``outputs``: the
    user-visible outputs' tensor ids, in dynamo's order. ``tangents``: output index ->
    tangent tensor id. ``grads``: flat index -> gradient id.
    ``mutations``: (flat index, tensor id of the new value), applied once per forward.
    """

    bindings: dict[int, tuple[str, Any]] = field(default_factory=dict)
    outputs: list[int] = field(default_factory=list)
    tangents: dict[int, int] = field(default_factory=dict)
    grads: dict[int, int] = field(default_factory=dict)
    mutations: list[tuple[int, int]] = field(default_factory=list)
    n_inputs: int = 0


class _DevicePool:
    """One device per step in flight: host copies are keyed by tensor id, so two forwards
    before one backward must not share a device. Devices come back after their backward."""

    def __init__(self, make: Callable[[], Device]) -> None:
        self._make = make
        self._idle: list[Device] = []

    def acquire(self) -> Device:
        return self._idle.pop() if self._idle else self._make()

    def release(self, device: Device, tids: Sequence[int]) -> None:
        """Wait for copies in flight, forget host copies; reuse the device if that worked."""
        try:
            device.synchronize()
        finally:
            for tid in tids:
                device.drop_host(tid)
        self._idle.append(device)

    def close(self) -> None:
        for device in self._idle:
            closer = getattr(device, "close", None)
            if closer is not None:
                closer()
        self._idle.clear()


@dataclass
class _StepState:
    """A step between its forward and its backward."""

    device: Device
    tracker: MemoryTracker
    rt: Runtime
    env: dict[int, torch.Tensor] | None


class CompiledGraph:
    """One planned graph, callable as ``compiled(*flat_inputs) -> tuple of outputs``.

    Each call is one step: a ``torch.autograd.Function`` whose forward runs the forward half
    under ``no_grad`` and whose backward runs the backward half with the incoming gradients
    as tangents, returning one gradient per flat input (None where the graph has none).

    * Memory: one fresh ``MemoryTracker`` spans forward and backward of a step. The inputs,
      the outputs and the tangents stay referenced by the step for its whole length, as the
      plan assumes (tangents are reserved, uninitialised, in forward and filled in backward:
      the plan counts them resident from the start), so the measured peak equals
      ``plan.memory.predicted_peak``. What the caller does between the halves is not counted.
    * Buffer updates (BatchNorm statistics) are copied into the inputs once, when the forward
      half ends; a backward half whose result would depend on a buffer's old value is
      refused at construction (``check_late_buffer_reads``).
    * Each step in flight gets its own device from a pool (host copies are keyed by tensor
      id), returned after its backward; a step whose backward never runs keeps its device.

    Attributes:
        planned: the graph, plan and schedule (``planned.explain()`` says why).
        split: the generated forward and backward halves.
        signature: how inputs and outputs map to the joint graph.
        stats: predicted and last measured peak.
    """

    def __init__(self, planned: PlannedStep, signature: Signature,
                 make_device: Callable[[], Device], capacity: int | None) -> None:
        graph, schedule = planned.graph, planned.schedule
        if schedule.sub_batches != 1:
            raise ScheduleError("the plan splits the batch into sub-batches, which a "
                                "torch.compile backend cannot do; choose another policy")
        verify(graph, schedule)
        self.planned = planned
        self.signature = signature
        self.split: SplitStep = generate_split(graph, schedule, kernel_impls(graph, schedule))
        updated = {tid for tid, (kind, index) in signature.bindings.items()
                   if kind == "arg" and index in {i for i, _ in signature.mutations}}
        check_late_buffer_reads(graph, schedule, self.split.cut, updated,
                                {tid for _, tid in signature.mutations})
        curve = memory_curve(graph, schedule)
        self.stats = GraphStats(planned.predicted_peak,
                                max(curve.device[:self.split.cut], default=curve.static))
        self.capacity = capacity
        self._devices = _DevicePool(make_device)
        self._copied = sorted({ins.tensor for ins in schedule.instructions
                               if isinstance(ins, Offload)})

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not self.signature.tangents:  # no output needs a gradient: the step ends here
            state, outputs = self.forward(args)
            self.backward(state, ())
            return outputs
        return _StepFunction.apply(self, *args)

    # -- the two halves ----------------------------------------------------------------------
    def forward(self, args: Sequence[torch.Tensor]) -> tuple[_StepState, tuple[torch.Tensor, ...]]:
        """Run the forward half, apply buffer updates; outputs are fresh tensors."""
        device = self._devices.acquire()
        tracker = MemoryTracker(self.capacity)
        device.tracker = tracker
        state = _StepState(device, tracker, Runtime(device, tracker, timed=False), None)
        try:
            with torch.no_grad(), tracker:
                values = self._bind(args)
                tracker.track(values.values(), "step inputs")
                env = self.split.forward(state.rt, values)
                del values
            with torch.no_grad():
                for index, tid in self.signature.mutations:
                    args[index].copy_(env[tid])
        except BaseException:
            self._devices.release(device, self._copied)
            raise
        self.stats.measured_forward_peak = tracker.peak
        outputs = tuple(env[tid] for tid in self.signature.outputs)
        for tid in self.signature.outputs:  # env keeps aliases without autograd history
            env[tid] = env[tid].detach()
        state.env = env
        return state, outputs

    def backward(self, state: _StepState | None, grad_outputs: Sequence[torch.Tensor | None]
                 ) -> list[torch.Tensor | None]:
        """Run the backward half with ``grad_outputs`` as tangents; one gradient per input."""
        env = state.env if state is not None else None
        if state is None or env is None:
            raise OutcoreError("backward ran twice through one compiled step; outcore frees "
                               "the step's tensors after the first (retain_graph is unsupported)")
        state.env = None
        try:
            with torch.no_grad(), state.tracker:
                for k, tid in self.signature.tangents.items():
                    grad = grad_outputs[k]
                    if grad is None:
                        env[tid].zero_()
                    else:
                        env[tid].copy_(grad)
                result = self.split.backward(state.rt, env)
                del env
        finally:
            self._devices.release(state.device, self._copied)
        self.stats.measured_peak = state.tracker.peak
        self.stats.steps += 1
        return [result[self.signature.grads[i]] if i in self.signature.grads else None
                for i in range(self.signature.n_inputs)]

    def _bind(self, args: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
        """Tensor id -> value for every static tensor; tangents are reserved (empty) here."""
        if len(args) != self.signature.n_inputs:
            raise OutcoreError(f"the compiled graph takes {self.signature.n_inputs} inputs, "
                               f"got {len(args)}")
        values: dict[int, torch.Tensor] = {}
        for tid, (kind, what) in self.signature.bindings.items():
            if kind == "arg":
                values[tid] = args[what].detach()
            elif kind == "const":
                values[tid] = what.detach()
            else:
                meta = what
                values[tid] = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype,
                                                  device=meta.device)
        return values

    def close(self) -> None:
        """Stop idle devices' copy engines."""
        self._devices.close()


class _StepFunction(torch.autograd.Function):
    """Autograd's view of one compiled graph: forward half, then backward half."""

    @staticmethod
    def forward(ctx: Any, compiled: CompiledGraph, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        state, outputs = compiled.forward(args)
        ctx.compiled, ctx.state = compiled, state
        constant = [o for k, o in enumerate(outputs) if k not in compiled.signature.tangents]
        if constant:
            ctx.mark_non_differentiable(*constant)
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        state, ctx.state = ctx.state, None
        return (None, *ctx.compiled.backward(state, grad_outputs))

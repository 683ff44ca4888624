"""Generate Python source that runs a Schedule (FX-style codegen, not an interpreter).

Each tensor id ``k`` lives in a local ``v{k}``. Instructions become straight-line code:

* ``Compute``: ``v7 = f3(v1, k3_0)`` (or ``_o = f3(...); v7 = _o[0]; ...; del _o`` for a
  multi-output op); outputs already resident (a recompute's duplicates) are not rebound, so
  they die with ``_o``. Random ops that the schedule recomputes save (forward) and replay
  (recompute) the RNG state; the others keep none (a saved CPU state is 5,056 bytes).
* ``Free``: ``rt.release(k, v{k}, last_alias); del v{k}``.

Which outputs a Compute makes resident and whether a Free releases its storage (``last_alias``)
are read from the one replay of the schedule (``outcore.plan.residency.Replay``), the memory
rule the tracker measures.
* ``Offload`` / ``Prefetch`` / ``Wait``: calls on the runtime ``rt`` (the device).
* A gradient of ``schedule.host_outputs`` (sent to host memory, ``outcore.plan.weights``):
  ``rt.keep_layout(k, v{k})`` after the Compute that makes it, and at the end
  ``v{k} = rt.from_host(storage, k)``, a view of the host copy of its storage.

Op callables and non-tensor constants are passed in through the generated function's
globals (``f{op}``, ``k{op}_{i}``), never through ``repr``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import fx

from outcore.capture.step import CapturedStep
from outcore.graph.ir import Graph
from outcore.plan.residency import NONE, TRANSIENT, Step, no_workspace, residency_steps
from outcore.plan.schedule import Compute, Free, Instruction, Offload, Prefetch, Schedule, Wait
from outcore.runtime.layout import layout_bases, rebase, recorded_stride, relayout


@dataclass
class GeneratedStep:
    """The generated function and its source (kept for debugging and for tests)."""

    fn: Callable[..., dict[int, Any]]
    source: str
    static_ids: list[int]


class Emitter:
    def __init__(self, graph: Graph, step: CapturedStep,
                 impls: dict[int, Callable[..., Any]]) -> None:
        self.graph = graph
        self.step = step
        self.impls = impls
        self.globals: dict[str, Any] = {"_relayout": relayout, "_rebase": rebase}
        #: storage id -> its resident tensors, as the emitted code goes (``track``)
        self.resident_of: dict[int, set[int]] = {}
        self.lines: list[str] = []
        #: random ops the schedule recomputes: only these save their RNG state (None: every
        #: random op saves it)
        self.replayed: set[int] | None = None
        #: random op -> recomputes of it still to emit: the last one drops the saved state
        #: (as the memory rule releases it; empty: kept to the step's end)
        self.replays_left: dict[int, int] = {}
        #: tensor id -> the stride capture recorded, for each base a layout-sensitive op reads
        self.strides: dict[int, tuple[int, ...]] = {}
        bases = layout_bases(graph, step.op_nodes)
        for node, tid in step.nodes.node_tensors.items():
            stride = recorded_stride(node.meta.get("val"))
            if tid in bases and stride is not None:
                self.strides[tid] = stride

    def bind_layout(self, tid: int) -> None:
        """After ``v{tid}`` is bound: give it its recorded layout if a view relies on it
        (``outcore.runtime.layout``)."""
        stride = self.strides.get(tid)
        if stride is not None:
            self.lines.append(f"v{tid} = _relayout(v{tid}, {stride!r})")

    def arg(self, value: Any, oid: int, counter: list[int]) -> str:
        if isinstance(value, fx.Node):
            tid = self.step.nodes.node_tensors.get(value)
            if tid is None:
                raise ValueError(f"op {oid} reads {value.name}, which holds no tensor")
            return f"v{tid}"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.arg(v, oid, counter) for v in value)
            if isinstance(value, list):
                return f"[{inner}]"
            return f"({inner}{',' if len(value) == 1 else ''})"
        if value is None or isinstance(value, bool):
            return repr(value)
        name = f"k{oid}_{counter[0]}"
        counter[0] += 1
        self.globals[name] = value
        return name

    def track(self, step: Step) -> None:
        """Follow which tensors are resident per storage (to find a rebase's holder)."""
        storage_of = self.graph.tensors
        if step.dropped != NONE:
            self.resident_of[storage_of[step.dropped].storage].discard(step.dropped)
        for tid in step.made_resident:
            self.resident_of.setdefault(storage_of[tid].storage, set()).add(tid)

    def rebase(self, step: Step) -> None:
        """After a Compute: each output the replay rebases (a TRANSIENT allocation naming a
        tensor it made resident) is rebound to the storage a resident view of it holds, so
        the kernel's fresh storage dies with the instruction, as the memory rule counts it."""
        made = set(step.made_resident)
        for alloc in step.allocations:
            if alloc.storage == TRANSIENT and alloc.tensor in made:
                tid = alloc.tensor
                holder = min(self.resident_of.get(tid, set()) - {tid})
                self.lines.append(f"v{tid} = _rebase(v{tid}, v{holder})")

    def compute(self, oid: int, new: tuple[int, ...], recompute: bool) -> None:
        """Emit op ``oid``; only the outputs in ``new`` (made resident by it) are bound."""
        op = self.graph.ops[oid]
        node = self.step.op_nodes[oid]
        fname = f"f{oid}"
        self.globals[fname] = self.impls.get(oid, node.target)
        counter = [0]
        args = [self.arg(a, oid, counter) for a in node.args]
        args += [f"{k}={self.arg(v, oid, counter)}" for k, v in node.kwargs.items()]
        call = f"{fname}({', '.join(args)})"
        if op.random and recompute:
            left = self.replays_left.get(oid, 0) - 1
            self.replays_left[oid] = left
            last = ", last=True" if left == 0 else ""
            call = f"rt.replay_rng({oid}, lambda: {call}{last})"
        elif op.random and (self.replayed is None or oid in self.replayed):  # for a recompute
            call = f"rt.save_rng({oid}, lambda: {call})"
        self.lines.append(f"rt.begin({oid}, {op.name!r})")
        slots = self.step.nodes.op_outputs.get(node)
        if slots is None and not op.outputs:  # run for its effect (a check)
            self.lines.append(call)
        elif slots is None:
            (tid,) = op.outputs
            target = f"v{tid}" if tid in new else "_dup"
            self.lines.append(f"{target} = {call}")
            if target == "_dup":
                self.lines.append("del _dup")
            else:
                self.bind_layout(tid)
        else:
            self.lines.append(f"_o = {call}")
            for idx, slot in enumerate(slots):
                if slot is not None and slot in new:
                    self.lines.append(f"v{slot} = _o[{idx}]")
            self.lines.append("del _o")
            for slot in slots:
                if slot is not None and slot in new:
                    self.bind_layout(slot)

    def emit(self, ins: Instruction, step: Step, notify: frozenset[int] = frozenset()) -> None:
        """Append the code of one instruction, given its step of the replay; after a Compute
        that makes a tensor of ``notify`` resident, ``rt.grad_ready(tid, v{tid})`` (data
        parallel)."""
        if isinstance(ins, Compute):
            self.compute(ins.op, step.made_resident, ins.recompute)
            self.rebase(step)
            self.lines += [f"rt.grad_ready({t}, v{t})" for t in step.made_resident
                           if t in notify]
        elif isinstance(ins, Free):
            last = step.released != NONE
            self.lines.append(f"rt.release({ins.tensor}, v{ins.tensor}, {last})")
            self.lines.append(f"del v{ins.tensor}")
        elif isinstance(ins, Offload):
            self.lines.append(f"rt.start_offload({ins.tensor}, v{ins.tensor})")
        elif isinstance(ins, Prefetch):
            name = self.graph.tensors[ins.tensor].name
            self.lines.append(f"v{ins.tensor} = rt.start_prefetch({ins.tensor}, {name!r})")
        elif isinstance(ins, Wait):
            fn = "wait_offload" if ins.direction == "d2h" else "wait_prefetch"
            self.lines.append(f"rt.{fn}({ins.tensor})")
        self.track(step)


def recomputed_ops(schedule: Schedule) -> set[int]:
    """The ops ``schedule`` recomputes (a random one among them saves its RNG state)."""
    return {ins.op for ins in schedule.instructions if isinstance(ins, Compute) and ins.recompute}


def generate(graph: Graph, schedule: Schedule,
             impls: dict[int, Callable[..., Any]] | None = None,
             notify: frozenset[int] = frozenset()) -> GeneratedStep:
    """Compile ``schedule`` into a Python function ``step(rt, inputs) -> {tid: tensor}``.

    ``inputs`` maps every static tensor id to its value; the result maps each tensor in
    ``schedule.keep_at_end`` to its value. ``impls`` overrides an op's callable (variants).
    ``notify``: tensor ids (parameter gradients) for which the code calls
    ``rt.grad_ready(tid, value)`` right after the Compute that makes them (data parallel).
    The schedule is not checked here (the executor verifies it unless told not to).
    """
    step = graph.source
    if not isinstance(step, CapturedStep):
        raise TypeError("this graph has no captured step to run; capture it with "
                         "outcore.capture")
    em = Emitter(graph, step, impls or {})
    em.replayed = recomputed_ops(schedule)
    em.replays_left = dict(Counter(ins.op for ins in schedule.instructions
                                   if isinstance(ins, Compute) and ins.recompute))
    steps = residency_steps(graph, schedule, no_workspace)  # checked by the executor's verify
    first = next(steps)
    em.track(first)
    static = list(first.made_resident)
    for tid in static:
        em.lines.append(f"v{tid} = inputs[{tid}]")
        em.bind_layout(tid)
    sent = set(schedule.host_outputs)
    for ins, at in zip(schedule.instructions, steps, strict=True):
        em.emit(ins, at, notify)
        em.lines += [f"rt.keep_layout({t}, v{t})" for t in at.made_resident if t in sent]
    em.lines += [f"v{t} = rt.from_host({graph.tensors[t].storage}, {t})"
                 for t in schedule.host_outputs]
    em.lines.append("return {" + ", ".join(f"{t}: v{t}" for t in schedule.keep_at_end) + "}")
    source = "def step(rt, inputs):\n" + "\n".join("    " + ln for ln in em.lines) + "\n"
    namespace = dict(em.globals)
    exec(compile(source, f"<outcore step {graph.name}>", "exec"), namespace)  # our generated code
    return GeneratedStep(fn=namespace["step"], source=source, static_ids=static)

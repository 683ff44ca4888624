"""``torch.compile(model, backend=outcore.backend(budget=...))``: outcore as a dynamo backend.

    >>> import torch, outcore
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> be = outcore.backend(budget="64KiB", device="cpu")
    >>> compiled = torch.compile(net, backend=be)
    >>> x, y = torch.randn(4, 8), torch.tensor([0, 1, 1, 0])
    >>> torch.nn.functional.cross_entropy(compiled(x), y).backward()
    >>> be.stats.measured_peak == be.stats.predicted_peak
    True

How it works, per graph dynamo hands the backend (one per graph break or recompilation):

1. **Capture.** The FX graph is wrapped in a module whose inputs needing gradients are
   parameters and whose module state (BatchNorm statistics) are buffers; its joint
   forward+backward ATen graph is exported with ``aot_export_joint_with_descriptors`` (as
   ``outcore.capture`` does) and converted to the IR. Each differentiable output gets a
   tangent placeholder: the gradient autograd passes back for it.
2. **Plan.** ``outcore.api.plan`` with the backend's budget and policy. A budget that cannot
   fit raises ``InfeasibleBudgetError`` from the first call of the compiled model (dynamo would
   otherwise hide it inside its own ``BackendCompilerFailed``). The schedule must run as a
   forward followed by a backward (``runtime.split.split_point``): a portfolio candidate that
   re-makes a tensor during the forward (moDNN re-makes views of a block it brought back)
   cannot, so under outcore-auto the backend then takes outcore-auto's own greedy plan
   (``portfolio=False``, lowered by ``outcore.plan.lower``: every forward op first) and warns.
3. **Run.** ``outcore.runtime.split`` generates the schedule as a forward and a backward half
   (a ``CompiledGraph``). A ``torch.autograd.Function`` runs the forward half under
   ``no_grad``, applies buffer updates once, returns the outputs and keeps every tensor live
   at the cut (``env``) on its context; its backward copies the incoming gradients into the
   tangents and runs the rest, returning one gradient per input (None where there is none).
   Autograd accumulates them into ``.grad`` exactly as for eager PyTorch.

Memory accounting: one ``MemoryTracker`` spans the forward and the backward of a step. The
step's inputs, its outputs and the tangents (reserved in forward, filled in backward) stay
counted the whole step, as the plan assumes, so ``stats.measured_peak == stats.predicted_peak``
on the emulated and the plain CPU devices. Work the user does between forward and backward
(the loss) runs outside the tracker and outside the plan.

Limits: graphs that need no gradient (``no_grad``, inference) run as dynamo traced them,
unplanned. outcore plans static shapes: a graph dynamo made shape-dynamic is captured and
planned again on the first call with each new shape (``dynamic=False`` makes dynamo do the
same by recompiling). With graph breaks the budget applies to each graph separately; tensors
passed between graphs are inputs of the next one. Double backward (``create_graph=True``),
``retain_graph=True`` and outputs that are views of inputs are refused with an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn
from torch._functorch._aot_autograd import descriptors as aot

from outcore.api import plan
from outcore.capture.convert import NodeMap, build_graph
from outcore.capture.effect_tokens import TOKEN_INPUTS, TOKEN_OUTPUTS
from outcore.capture.step import CapturedStep
from outcore.errors import CaptureError, OutcoreError, ReplanWarning, ScheduleError
from outcore.graph.ir import Graph
from outcore.runtime.devices import make_device
from outcore.runtime.devices.base import Device
from outcore.runtime.split import CompiledGraph, GraphStats, Signature

if TYPE_CHECKING:
    from outcore.planned import PlannedStep

#: Names of outcore-auto (whose portfolio may pick a plan the backend cannot split).
_AUTO = ("auto", "outcore-auto")

Role = str  # "param" (needs a gradient), "buffer" (module state), "input" (an argument)
#            or "const" (a number, e.g. a dynamic size, fixed for one specialisation)


# -- capture ---------------------------------------------------------------------------------
def _source_name(node: fx.Node) -> str:
    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None:
        return ""
    name = source.name
    return name() if callable(name) else str(name)


def _is_argument(node: fx.Node) -> bool:
    """True when dynamo says the placeholder is (part of) an argument of the compiled call."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    while source is not None and hasattr(source, "base"):
        source = source.base
    return source is None or bool(getattr(source, "is_input", True))


def placeholder_states(gm: fx.GraphModule) -> list[bool]:
    """Per placeholder, True when dynamo's source says it is module state (a buffer, or a
    tensor that is not an argument of the call).

    Read when dynamo hands the graph to the backend: dynamo drops the placeholders'
    ``grapharg`` once compilation ends, so a shape-dynamic graph planned later, on its first
    call, must use what was read here (else its BatchNorm buffers look like arguments).
    """
    return ["_buffers[" in _source_name(n) or not _is_argument(n)
            for n in gm.graph.nodes if n.op == "placeholder"]


def input_roles(gm: fx.GraphModule, example_inputs: Sequence[Any],
                states: list[bool] | None = None) -> list[Role]:
    """The role of each flat input: what needs a gradient is a parameter; module state
    (buffers, tensors that are not arguments; ``states``, from ``placeholder_states``) a
    buffer, whose in-place updates are kept; a number (a dynamic size dynamo passes) a
    constant the graph is specialised for."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise CaptureError(f"dynamo passed {len(example_inputs)} example inputs for "
                           f"{len(placeholders)} graph inputs")
    if states is None:
        states = placeholder_states(gm)
    roles: list[Role] = []
    for is_state, value in zip(states, example_inputs, strict=True):
        if not isinstance(value, torch.Tensor):
            roles.append("const")
        elif isinstance(value, nn.Parameter) or value.requires_grad:
            roles.append("param")
        elif is_state:
            roles.append("buffer")
        else:
            roles.append("input")
    return roles


class _DynamoStep(nn.Module):
    """Runs dynamo's graph; flat input ``i`` is attribute ``in{i}`` when it is a parameter or
    a buffer, a fixed number when it is a constant, and an argument of ``forward`` otherwise."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor],
                 roles: list[Role]) -> None:
        super().__init__()
        self.gm = gm
        self.roles = roles
        self.constants = {i: v
                          for i, (v, role) in enumerate(zip(example_inputs, roles, strict=True))
                          if role == "const"}
        for i, (role, value) in enumerate(zip(roles, example_inputs, strict=True)):
            if role == "param":
                param = value if isinstance(value, nn.Parameter) else nn.Parameter(value)
                self.register_parameter(f"in{i}", param)
            elif role == "buffer":
                self.register_buffer(f"in{i}", value)

    def forward(self, *arguments: torch.Tensor) -> Any:
        given = iter(arguments)
        flat = [next(given) if role == "input" else
                self.constants[i] if role == "const" else getattr(self, f"in{i}")
                for i, role in enumerate(self.roles)]
        return self.gm(*flat)

    def forget_inputs(self) -> None:
        """Drop the example inputs once exported: a tensor passed across a graph break is an
        activation that would otherwise stay alive as long as the compiled graph."""
        for i, role in enumerate(self.roles):
            if role in ("param", "buffer"):
                delattr(self, f"in{i}")


def _flat_index(desc: Any, arguments: list[int]) -> int:
    """The flat input index an input descriptor names."""
    if isinstance(desc, (aot.ParamAOTInput, aot.BufferAOTInput)) and desc.target.startswith("in"):
        return int(desc.target[2:])
    if isinstance(desc, aot.PlainAOTInput):
        return arguments[desc.idx]
    raise CaptureError(f"the compiled graph updates or differentiates {desc!r}, which is not "
                       "one of its inputs; outcore's backend cannot run it")


def _signature(joint: fx.GraphModule, roles: list[Role], nodes: NodeMap,
               step: _DynamoStep) -> Signature:
    arguments = [i for i, role in enumerate(roles) if role == "input"]
    sig = Signature(n_inputs=len(roles))
    for tid, target in nodes.constants.items():  # lifted tensor constants (get_attr)
        sig.bindings[tid] = ("const", joint.get_buffer(target) if "." in target
                             else getattr(joint, target))
    for node in joint.graph.nodes:
        if node.op == "placeholder":
            tid, desc = nodes.node_tensors[node], node.meta.get("desc")
            if isinstance(desc, aot.TangentAOTInput) \
                    and isinstance(desc.output, aot.PlainAOTOutput):
                sig.bindings[tid] = ("tangent", node.meta["val"])
                sig.tangents[desc.output.idx] = tid
            elif type(desc).__name__ in TOKEN_INPUTS:  # never read (``effect_tokens``)
                sig.bindings[tid] = ("const", torch.empty(0))
            elif isinstance(desc, aot.TangentAOTInput) \
                    and isinstance(desc.output, aot.InputMutationAOTOutput):
                # a parameter changed in place under no_grad (``nn.Embedding(max_norm=...)``):
                # nothing after the step reads its new value, so its tangent is zero
                val = node.meta["val"]
                sig.bindings[tid] = ("const", torch.zeros(val.shape, dtype=val.dtype,
                                                          device=val.device))
            elif isinstance(desc, (aot.ParamAOTInput, aot.BufferAOTInput)) \
                    and not desc.target.startswith("in"):
                sig.bindings[tid] = ("const", step.get_parameter(desc.target)
                                     if isinstance(desc, aot.ParamAOTInput)
                                     else step.get_buffer(desc.target))
            else:
                sig.bindings[tid] = ("arg", _flat_index(desc, arguments))
        elif node.op == "output":
            outputs: dict[int, int] = {}
            for value, desc in zip(node.args[0], node.meta.get("desc") or [], strict=False):
                if value is None:
                    continue
                tid = nodes.node_tensors[value]
                if isinstance(desc, aot.PlainAOTOutput):
                    outputs[desc.idx] = tid
                elif isinstance(desc, aot.GradAOTOutput):
                    sig.grads[_flat_index(desc.grad_of, arguments)] = tid
                elif isinstance(desc, aot.InputMutationAOTOutput):
                    sig.mutations.append((_flat_index(desc.mutated_input, arguments), tid))
                elif type(desc).__name__ in TOKEN_OUTPUTS:
                    continue
                else:
                    raise CaptureError(f"the compiled graph returns {desc!r}, which outcore's "
                                       "backend cannot run (an output aliasing an input?)")
            sig.outputs = [outputs[k] for k in sorted(outputs)]
    return sig


def _check_inputs_unmutated(joint: fx.GraphModule) -> None:
    """A mutated argument (not module state) has no name the IR could record: refuse it."""
    out = next(n for n in joint.graph.nodes if n.op == "output")
    for desc in out.meta.get("desc") or []:
        if isinstance(desc, aot.InputMutationAOTOutput) \
                and isinstance(desc.mutated_input, aot.PlainAOTInput):
            raise CaptureError("the compiled region updates its argument "
                               f"#{desc.mutated_input.idx} in place; outcore's backend keeps "
                               "in-place updates of module buffers only. Move the in-place op "
                               "out of the compiled code.")


def capture_dynamo_graph(gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor],
                         name: str, states: list[bool] | None = None
                         ) -> tuple[Graph, Signature]:
    """Export dynamo's graph as one joint ATen graph; return the IR and its signature.

    The Graph's ``source`` is a ``CapturedStep`` over the joint graph (its ``step_module``
    is the wrapper whose attribute ``in{i}`` is flat input ``i``).
    """
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    from outcore.capture.traced_as_eager import traced_as_eager

    roles = input_roles(gm, example_inputs, states)
    step = _DynamoStep(gm, example_inputs, roles)
    arguments = tuple(v for v, role in zip(example_inputs, roles, strict=True) if role == "input")
    with contextlib.ExitStack() as stack:
        try:
            with traced_as_eager():  # eager's RNN dropout (capture/traced_as_eager.py)
                joint = aot_export_joint_with_descriptors(stack, step, arguments).graph_module
        except Exception as exc:  # torch raises many types here; keep its reason
            reason = str(exc).splitlines()[0] if str(exc) else ""
            raise CaptureError(f"could not export the compiled graph {name}: "
                               f"{type(exc).__name__}: {reason}") from exc
        _check_inputs_unmutated(joint)
        graph, nodes = build_graph(joint, name)
    graph.meta["fake"] = False
    graph.source = CapturedStep.from_export(joint, graph, step, arguments, fake=False, nodes=nodes)
    signature = _signature(joint, roles, nodes, step)
    step.forget_inputs()
    _check_outputs_differentiable(gm, signature)
    return graph, signature


def _check_outputs_differentiable(gm: fx.GraphModule, signature: Signature) -> None:
    """Every output that requires grad in dynamo's trace must have a tangent in the joint
    graph. aot_autograd leaves out of the joint graph outputs that are views of inputs (it
    regenerates them outside), so their gradient would be lost: refuse them."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = [a.meta.get("example_value") if isinstance(a, fx.Node) else a for a in out.args[0]]
    if len(values) != len(signature.outputs):
        raise CaptureError(f"the compiled graph returns {len(values)} values but its joint "
                           f"graph {len(signature.outputs)}: an output aliases an input or "
                           "another output; return a copy (.clone()) instead")
    for k, value in enumerate(values):
        if isinstance(value, torch.Tensor) and value.requires_grad \
                and k not in signature.tangents:
            raise CaptureError(f"output #{k} of the compiled graph needs a gradient but is a "
                               "view of one of its inputs, which outcore cannot differentiate; "
                               "return a copy (.clone()) instead")


# -- the backend -----------------------------------------------------------------------------
class OutcoreBackend:
    """A torch.compile backend that trains each graph within ``budget`` (see module docs).

    Attributes:
        graphs: every planned graph (a ``CompiledGraph``), in compilation order: several with
            graph breaks, recompilations or new shapes; each is planned separately and the
            budget applies to each.
        unplanned: how many graphs needed no gradient and run as dynamo traced them.
    """

    def __init__(self, budget: int | None, policy: str, device: str, gpu: str | None,
                 options: dict[str, Any]) -> None:
        self.budget = budget
        self.policy = policy
        self.device = device
        self.gpu = gpu
        self.options = options
        self.graphs: list[CompiledGraph] = []
        self.unplanned = 0
        self.last: CompiledGraph | None = None

    @property
    def stats(self) -> GraphStats:
        """The stats of the graph that ran last (the only one without graph breaks or
        recompilations; a new shape, e.g. a smaller last batch, is planned as another graph
        and its step is the last one). With graph breaks read ``graphs[i].stats``."""
        if self.last is None:
            raise OutcoreError("nothing ran yet: call the compiled model (and backward) first")
        return self.last.stats

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        if not torch.is_grad_enabled() or not any(
                isinstance(v, torch.Tensor) and v.requires_grad for v in example_inputs):
            self.unplanned += 1
            return gm.forward
        states = placeholder_states(gm)  # dynamo forgets the sources after this call
        if any(not isinstance(v, torch.Tensor) for v in example_inputs):
            return _PerShape(self, gm, states)
        return self.compile_graph(gm, example_inputs, states)

    def compile_graph(self, gm: fx.GraphModule, inputs: Sequence[Any],
                      states: list[bool] | None = None) -> Callable[..., Any]:
        """Capture, plan and generate one graph for these concrete ``inputs``.

        An OutcoreError (infeasible budget, unsupported graph) is returned as a callable that
        raises it: dynamo would otherwise wrap it in its own BackendCompilerFailed.
        """
        from outcore.cost.measure_temporaries import real_outputs_alone
        from outcore.hardware import default_gpu
        from outcore.log import announce

        if self.graphs:
            announce(f"planning compiled graph #{len(self.graphs)} (a graph break, a "
                     "recompilation or a new input shape): it is captured and planned on its "
                     "own", ReplanWarning, stacklevel=3)
        try:
            self._check_device(inputs)
            graph, signature = capture_dynamo_graph(gm, inputs, f"compiled{len(self.graphs)}",
                                                    states)
            if not self.device.startswith("cuda"):  # what CPU kernels really return
                real_outputs_alone(graph)
            planned = self._plan(graph, self.gpu or default_gpu(graph, self.device))
            compiled = CompiledGraph(planned, signature, self._make_device, self.budget)
        except OutcoreError as err:
            return _Raiser(err)
        self.graphs.append(compiled)
        return _Tracked(self, compiled)

    def _plan(self, graph: Graph, gpu: str) -> PlannedStep:
        """Plan ``graph``; a schedule that cannot be cut into a forward and a backward is
        replaced, under outcore-auto, by its greedy planner's (module docstring, step 2)."""
        from outcore.log import announce
        from outcore.runtime.split import split_point

        planned = plan(graph, self.budget, policy=self.policy, gpu=gpu, simulate=False,
                       **self.options)
        try:
            split_point(planned.graph, planned.schedule)
        except ScheduleError as err:
            if self.policy not in _AUTO or self.options.get("portfolio") is False:
                raise
            announce(f"outcore-auto's chosen plan ({planned.plan.policy}) re-makes a tensor "
                     f"during the forward ({err}); a torch.compile backend runs the forward "
                     "and the backward separately, so the backend uses outcore-auto's own "
                     "greedy plan (portfolio=False) for this graph", ReplanWarning,
                     stacklevel=4)
            planned = plan(graph, self.budget, policy=self.policy, gpu=gpu, simulate=False,
                           **{**self.options, "portfolio": False})
        return planned

    def _make_device(self) -> Device:
        return make_device(self.device, capacity=self.budget,
                           gpu=self.gpu if self.device == "cpu-emulated" else None)

    def _check_device(self, inputs: Sequence[Any]) -> None:
        kinds = {v.device.type for v in inputs if isinstance(v, torch.Tensor)}
        wanted = "cuda" if self.device == "cuda" else "cpu"
        if kinds - {wanted}:
            raise OutcoreError(f"device={self.device!r} runs {wanted} tensors but the compiled "
                               f"graph gets {', '.join(sorted(kinds))} ones; pass the matching "
                               "device to outcore.backend")

    def close(self) -> None:
        """Stop the copy engines of every compiled graph's idle devices."""
        for compiled in self.graphs:
            compiled.close()


class _PerShape:
    """A graph dynamo made shape-dynamic: captured and planned for each concrete shape on
    its first call (outcore plans static shapes), then reused for that shape."""

    def __init__(self, backend: OutcoreBackend, gm: fx.GraphModule,
                 states: list[bool]) -> None:
        self.backend = backend
        self.gm = gm
        self.states = states
        self.by_shape: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a
                    for a in args)
        compiled = self.by_shape.get(key)
        if compiled is None:
            compiled = self.by_shape[key] = self.backend.compile_graph(self.gm, args,
                                                                       self.states)
        return compiled(*args)


class _Tracked:
    """A planned graph that tells its backend it ran (for ``OutcoreBackend.stats``)."""

    def __init__(self, backend: OutcoreBackend, compiled: CompiledGraph) -> None:
        self.backend = backend
        self.compiled = compiled

    def __call__(self, *args: Any) -> Any:
        self.backend.last = self.compiled
        return self.compiled(*args)


class _Raiser:
    """What the backend returns for a graph it could not plan: raises the reason when called."""

    def __init__(self, error: OutcoreError) -> None:
        self.error = error

    def __call__(self, *args: Any) -> Any:
        raise self.error.with_traceback(None)


def backend(budget: int | str | None = "6GiB", *, policy: str = "auto", device: str = "cpu",
            gpu: str | None = None, **options: Any) -> OutcoreBackend:
    """A ``torch.compile`` backend that trains each compiled graph within ``budget``.

    Args:
        budget: device memory per compiled graph (bytes, "64MB", "11.5GiB"); None = unbounded.
        policy: a name from ``outcore.policies()``; "auto" = outcore-auto.
        device: "cpu" (the plain CPU, copies synchronous), "cpu-emulated" (an accelerator
            emulated on the CPU with the budget as its capacity and timed copy engines) or
            "cuda" (CUDA tensors).
        gpu: hardware profile for planning and, on "cpu-emulated", for the link bandwidth.
        options: policy-specific options (see each policy's docstring).

    Returns:
        An ``OutcoreBackend``; pass it as ``torch.compile(model, backend=...)`` and read
        ``.stats`` (one graph) or ``.graphs[i].stats`` after a step.

    Raises (from the call of the compiled model that first runs the graph):
        InfeasibleBudgetError: the budget is below what the policy can reach.
        CaptureError: the graph cannot be exported or run as a forward and a backward.
        InvalidArgumentError: (a ValueError) an unknown device, policy or GPU, or an
            unreadable, non-positive or non-finite budget (at once).
    """
    from outcore.validation import check_budget, check_device, check_gpu, check_policy

    limit = check_budget(budget)  # every argument fails here, not at the first call
    check_device(device)
    check_policy(policy, options)
    return OutcoreBackend(limit, policy, device, check_gpu(gpu), options)

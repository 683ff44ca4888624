"""Capture one training step (forward, loss, backward) as an outcore Graph.

This is the only module that traces torch. It exports the joint forward+backward ATen graph
with ``aot_export_joint_with_descriptors`` (always traced with fake tensors, so capturing
never allocates activations) and converts it to the plain-data IR in ``outcore.graph.ir``.

Calling conventions (``outcore.capture.batching``): ``(x, y)`` with ``loss_fn(model(x), y)``,
a dict batch (``model(**batch)``), or ``loss_fn=None`` for a model that returns its own loss.
Data-dependent Python control flow (``.item()``, ``if tensor:``) is specialised on the
example's values with guards checked at every step (``outcore.capture.specialize``). The
model's own ``torch.utils.checkpoint`` calls are traced as plain calls: outcore plans what to
recompute (``outcore.capture.checkpoints``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from outcore.capture import (
    inner_backward,
    module_paths,
    rebound,
    stashed,
    traced_as_eager,
)
from outcore.capture.batching import LossFn, TrainingStep, split_batch_leaves
from outcore.capture.checkpoints import announce_checkpoints, plain_checkpoints
from outcore.capture.closed_over import lifted
from outcore.capture.convert import build_graph
from outcore.capture.layouts import repair_layouts
from outcore.capture.specialize import export_step
from outcore.capture.step import CapturedStep
from outcore.capture.wrappers import check_initialized, check_wrappers
from outcore.errors import CaptureError, OutcoreWarning, RoundingWarning
from outcore.graph.ir import Graph
from outcore.log import announce


def _existing_fake_mode(values: list[Any]) -> FakeTensorMode | None:
    for v in values:
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return None


@contextlib.contextmanager
def _faked(module: nn.Module, mode: FakeTensorMode) -> Iterator[None]:
    """Temporarily replace every parameter and buffer of ``module`` by a fake twin."""
    saved: list[tuple[nn.Module, str, str, Any]] = []
    twins: dict[int, nn.Parameter] = {}  # a tied parameter keeps one twin
    for mod in module.modules():
        for name, param in list(mod._parameters.items()):
            if param is None or isinstance(param, FakeTensor):
                continue
            if id(param) not in twins:
                twins[id(param)] = nn.Parameter(mode.from_tensor(param), param.requires_grad)
            mod._parameters[name] = twins[id(param)]
            saved.append((mod, "param", name, param))
        for name, buf in list(mod._buffers.items()):
            if buf is None or isinstance(buf, FakeTensor):
                continue
            mod._buffers[name] = mode.from_tensor(buf)
            saved.append((mod, "buffer", name, buf))
    try:
        yield
    finally:
        for mod, kind, name, value in saved:
            (mod._parameters if kind == "param" else mod._buffers)[name] = value


@contextlib.contextmanager
def _fake_attributes_as_buffers(module: nn.Module) -> Iterator[None]:
    """Temporarily make every plain fake-tensor attribute of ``module``'s modules a buffer.

    A model built under the user's ``FakeTensorMode`` (to size it without its memory) may
    keep a plain tensor attribute (``self.scale = torch.ones(8)``, not ``register_buffer``):
    a fake tensor the trace would record as a constant, which AOTAutograd refuses ("Unexpected
    fake buffer"). As a buffer it is a static input of the graph, counted as the device
    memory it is. Such a graph is planned and simulated, never run, so nothing binds it by
    that name later. Each attribute is put back as it was on exit."""
    moved: list[tuple[nn.Module, str, Any]] = []
    for mod in module.modules():
        for name, value in list(vars(mod).items()):
            if isinstance(value, FakeTensor) and not name.startswith("__"):
                del mod.__dict__[name]
                mod._buffers[name] = value
                moved.append((mod, name, value))
    try:
        yield
    finally:
        for mod, name, value in moved:
            mod._buffers.pop(name, None)
            mod.__dict__[name] = value


@contextlib.contextmanager
def _state_restored(module: nn.Module) -> Iterator[None]:
    """Put every parameter and buffer object back where it was when the block ends.

    The export swaps a module's tensors for traced ones and back; a module reachable under
    two paths (timm's CoaT shares its positional-encoding convolutions between blocks) is
    swapped twice and restored once, leaving traced tensors in the live model.
    """
    mods = list(module.modules(remove_duplicate=False))
    params = [dict(mod._parameters) for mod in mods]
    buffers = [dict(mod._buffers) for mod in mods]
    try:
        yield
    finally:
        for mod, p, b in zip(mods, params, buffers, strict=True):
            mod._parameters.clear()
            mod._parameters.update(p)
            mod._buffers.clear()
            mod._buffers.update(b)


def capture(model: nn.Module, loss_fn: LossFn, example_batch: Any, *,
            fake: bool = False, name: str | None = None,
            autocast: torch.dtype | None = None, outputs: bool = False) -> Graph:
    """Capture one whole training step of ``model`` as a Graph.

    Args:
        model: any ``nn.Module``, captured in the state it is in: each module's ``training``
            flag decides what it computes (dropout, BatchNorm batch or running statistics),
            as in eager PyTorch.
        loss_fn: ``loss_fn(model(x), y) -> scalar``; a function or an ``nn.Module``; None for
            a model that returns its own loss (see ``outcore.capture.batching``).
        example_batch: ``(x, y)`` as a data loader yields it; with ``loss_fn=None`` (or a dict
            batch) the model's input: a dict (``model(**batch)``), a tuple or a tensor.
        fake: size the step without real tensors: a real model and batch are replaced by fake
            twins (nothing is allocated); a model/batch already built under FakeTensorMode is
            used as it is. A fake graph can be planned and simulated, not executed.
        name: a name for the graph (default: the model's class name).
        autocast: run the step under ``torch.autocast`` with this dtype (bfloat16 or
            float16). By default the autocast in effect at the call (``with
            torch.autocast(...)``) is captured; the graph then holds the casts explicitly.
        outputs: keep what the model returns, detached, as outputs of the step (copies held
            to its end, so the plan counts them; ``CapturedStep.model_output``).

    Returns:
        A validated Graph whose ``source`` is a ``CapturedStep`` the executor can run (when
        the capture was not fake).

    Raises:
        CaptureError: the batch does not fit the calling convention, the loss is not a
            scalar, or tracing failed (the message carries torch's reason, the node and
            module concerned, and what to change).

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> g = capture(net, torch.nn.functional.cross_entropy,
        ...             (torch.randn(3, 4), torch.tensor([0, 1, 1])))
        >>> sum(1 for t in g.tensors if t.kind == "parameter")
        4
    """
    if not isinstance(model, nn.Module):
        raise CaptureError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_wrappers(model)
    check_initialized(model)
    if isinstance(loss_fn, nn.Module):
        check_wrappers(loss_fn)
    if loss_fn is not None and not isinstance(example_batch, Mapping) and not (
            isinstance(example_batch, (tuple, list)) and len(example_batch) == 2):
        raise CaptureError("example_batch must be (x, y) as a data loader yields it (or a dict, "
                           "or loss_fn=None for a model returning its own loss); got "
                           f"{type(example_batch).__name__} of length "
                           f"{len(example_batch) if hasattr(example_batch, '__len__') else '?'}")
    cast = autocast_state(autocast, example_batch, model)
    step = TrainingStep(model, loss_fn, example_batch, cast)
    step.keep_outputs = outputs
    tensors, signature = split_batch_leaves(example_batch)
    leaves = [*tensors, *step.parameters(), *step.buffers()]
    mode = _existing_fake_mode(leaves)
    is_fake = fake or mode is not None
    modes = [(mod, mod.training) for mod in model.modules()]
    stashes = stashed.Stashes(model, loss_fn)  # the trace's tensors off the modules
    step.before_pass = stashes.restore
    try:
        with stashed.kept(stashes) as put_back, _state_restored(step), \
                contextlib.ExitStack() as stack:
            args = tuple(tensors)
            if mode is None and fake:
                mode = FakeTensorMode()
                stack.enter_context(_faked(step, mode))
                args = tuple(mode.from_tensor(t) for t in tensors)
            stack.enter_context(_fake_attributes_as_buffers(step))
            stack.enter_context(module_paths.recording(model))
            flattened = stack.enter_context(plain_checkpoints())
            rebinds = stack.enter_context(rebound.watching())  # buffers the forward rebinds
            stack.enter_context(inner_backward.watching(  # .grad kept: a backward's backward
                [*((n.removeprefix("model."), p) for n, p in step.named_parameters()),
                 *((f"batch tensor {i}", t) for i, t in enumerate(tensors)
                   if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf)]))
            traced_as_eager.decomposed_rnns()  # cleared: what this capture traces
            joint, guards = export_step(stack, step, args, is_fake)
            rnns = traced_as_eager.decomposed_rnns()
            gm = joint.graph_module
            repair_layouts(gm)  # real kernels' layouts where fake ones differ
            kept = step.output_spec
            graph, nodes = build_graph(gm, name or type(model).__name__,
                                       kept=0 if kept is None else kept.tensor_count)
            graph.meta["module_paths"] = module_paths.op_module_paths(
                gm, [o.name for o in graph.ops])
        constants = lifted(gm, step, loss_fn)  # the live model: its own parameters
    finally:  # whatever the model ran, its training flags are the user's
        step.before_pass = None
        for mod, training in modes:
            mod.training = training
    graph.meta["fake"] = is_fake
    if flattened.calls:
        graph.meta["user_checkpoints"] = True
        announce_checkpoints(flattened)
    rebound.announce_kept((model, loss_fn), rebinds)
    if put_back:
        announce(stashed.note(put_back), OutcoreWarning)
    if rnns:
        graph.meta["rounding"] = traced_as_eager.rounding_note(rnns)
        announce(graph.meta["rounding"], RoundingWarning)
    if cast is not None:
        graph.meta["autocast"] = f"{cast[0]}:{str(cast[1]).removeprefix('torch.')}"
    graph.source = CapturedStep.from_export(gm, graph, step, args, fake=is_fake, nodes=nodes,
                                            signature=signature, guards=guards,
                                            lifted=constants, outputs=kept)
    return graph


def autocast_state(autocast: torch.dtype | None, batch: Any,
                   model: nn.Module) -> tuple[str, torch.dtype] | None:
    """``(device type, dtype)`` of the autocast to capture, or None: the one asked for, else
    the one in effect now for the device the model's parameters live on."""
    device_type = next((p.device.type for p in model.parameters()), None)
    if device_type is None:
        tensors, _ = split_batch_leaves(batch)
        device_type = tensors[0].device.type if tensors else "cpu"
    if device_type == "meta":
        device_type = "cpu"
    if autocast is not None:
        if autocast not in (torch.bfloat16, torch.float16):
            raise CaptureError(f"autocast must be torch.bfloat16 or torch.float16, got {autocast}")
        return (device_type, autocast)
    if torch.is_autocast_enabled(device_type):
        return (device_type, torch.get_autocast_dtype(device_type))
    return None


def fx_graph_of(graph: Graph) -> fx.GraphModule:
    """The joint ATen GraphModule a graph was captured from (for debugging and tools)."""
    if not isinstance(graph.source, CapturedStep):
        raise CaptureError("this graph carries no captured step (it was loaded from JSON?)")
    return graph.source.gm

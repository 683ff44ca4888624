"""Capture one training step (forward, loss, backward) as an outcore Graph.

This is the only module that traces torch. It exports the joint forward+backward ATen graph
with ``aot_export_joint_with_descriptors`` (always traced with fake tensors, so capturing
never allocates activations) and converts it to the plain-data IR in ``outcore.graph.ir``.

Calling convention, used everywhere in outcore: ``example_batch = (x, y)`` as a data loader
yields it; the model is called as ``model(x)`` (``model(*x)`` when x is a tuple) and the loss
as ``loss_fn(output, y)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten

from outcore.capture import module_paths
from outcore.capture.convert import build_graph
from outcore.capture.step import CapturedStep
from outcore.errors import CaptureError
from outcore.graph.ir import Graph


class _TrainingStep(nn.Module):
    """``(x, y) -> (loss,)``: the module that aot_autograd exports."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, x: Any, y: Any) -> tuple[torch.Tensor]:
        out = self.model(*x) if isinstance(x, tuple) else self.model(x)
        loss = self.loss_fn(out, y)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise CaptureError("loss_fn(model(x), y) must return a scalar tensor, got "
                               f"{type(loss).__name__} {getattr(loss, 'shape', '')}")
        return (loss,)


def _existing_fake_mode(values: list[Any]) -> FakeTensorMode | None:
    for v in values:
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return None


@contextlib.contextmanager
def _faked(module: nn.Module, mode: FakeTensorMode) -> Iterator[None]:
    """Temporarily replace every parameter and buffer of ``module`` by a fake twin."""
    saved: list[tuple[nn.Module, str, str, Any]] = []
    for mod in module.modules():
        for name, param in list(mod._parameters.items()):
            if param is None or isinstance(param, FakeTensor):
                continue
            mod._parameters[name] = nn.Parameter(mode.from_tensor(param), param.requires_grad)
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


def capture(model: nn.Module, loss_fn: Callable[..., torch.Tensor], example_batch: Any, *,
            fake: bool = False, name: str | None = None) -> Graph:
    """Capture one whole training step of ``model`` as a Graph.

    Args:
        model: any ``nn.Module``; it is put in training mode for the capture and restored.
        loss_fn: ``loss_fn(model(x), y) -> scalar``; a function or an ``nn.Module``.
        example_batch: ``(x, y)`` as a data loader yields it.
        fake: size the step without real tensors: a real model and batch are replaced by fake
            twins (nothing is allocated); a model/batch already built under FakeTensorMode is
            used as it is. A fake graph can be planned and simulated, not executed.
        name: a name for the graph (default: the model's class name).

    Returns:
        A validated Graph whose ``source`` is a ``CapturedStep`` the executor can run (when
        the capture was not fake).

    Raises:
        CaptureError: the batch is not ``(x, y)``, the loss is not a scalar, or tracing failed
            (the message carries torch's reason).

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
    if not (isinstance(example_batch, (tuple, list)) and len(example_batch) == 2):
        raise CaptureError("example_batch must be (x, y) as a data loader yields it; got "
                           f"{type(example_batch).__name__} of length "
                           f"{len(example_batch) if hasattr(example_batch, '__len__') else '?'}")
    x, y = example_batch
    step = _TrainingStep(model, loss_fn)
    leaves = tree_flatten((x, y))[0] + list(step.parameters()) + list(step.buffers())
    mode = _existing_fake_mode(leaves)
    is_fake = fake or mode is not None
    was_training = model.training
    model.train()
    try:
        with contextlib.ExitStack() as stack:
            if mode is None and fake:
                mode = FakeTensorMode(allow_non_fake_inputs=False)
                stack.enter_context(_faked(step, mode))
                x, y = _fake_batch(mode, (x, y))
            stack.enter_context(module_paths.recording(model))
            joint = _export(stack, step, (x, y))
            gm = joint.graph_module
            graph, nodes = build_graph(gm, name or type(model).__name__)
            graph.meta["module_paths"] = module_paths.op_module_paths(
                gm, [o.name for o in graph.ops])
    finally:
        model.train(was_training)
    graph.meta["fake"] = is_fake
    graph.source = CapturedStep.from_export(gm, graph, step, (x, y), fake=is_fake, nodes=nodes)
    return graph


def _fake_batch(mode: FakeTensorMode, batch: Any) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v, batch)


def _export(stack: contextlib.ExitStack, step: nn.Module, args: tuple[Any, Any]) -> Any:
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    try:
        return aot_export_joint_with_descriptors(stack, step, args)
    except CaptureError:
        raise
    except Exception as exc:  # torch raises many types here; keep its reason
        cause = exc
        while cause.__cause__ is not None and isinstance(cause.__cause__, CaptureError):
            cause = cause.__cause__
        if isinstance(cause, CaptureError):
            raise cause from None
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CaptureError(f"could not capture the training step as one graph: "
                           f"{type(exc).__name__}: {first}. {_way_out(exc)}") from exc


_DATA_DEPENDENT = ("DataDependent", "GuardOnDataDependent", "data-dependent", "_local_scalar_dense",
                   "nonzero", "item()")


def _way_out(exc: BaseException) -> str:
    """What the user can change, for the common reasons a step cannot be one graph."""
    text = f"{type(exc).__name__} {exc}"
    if any(marker in text for marker in _DATA_DEPENDENT):
        return ("The model's control flow or shapes depend on tensor values (an `if` on a "
                "tensor, `.item()`, `nonzero`), which one static graph cannot hold. Make the "
                "branch depend on shapes or Python values, use torch.where, or move that part "
                "out of the model (e.g. into the data loader).")
    if "Unsupported" in text or "graph break" in text.lower():
        return ("The model calls something that cannot be traced (a graph break). Rewrite that "
                "call with torch operations, or keep it out of the model.")
    return ("Check that model(x) and loss_fn(output, y) run eagerly on the example batch; "
            "outcore traces them with fake tensors, so code that needs real values fails here.")


def fx_graph_of(graph: Graph) -> fx.GraphModule:
    """The joint ATen GraphModule a graph was captured from (for debugging and tools)."""
    if not isinstance(graph.source, CapturedStep):
        raise CaptureError("this graph carries no captured step (it was loaded from JSON?)")
    return graph.source.gm

"""CapturedStep: the torch side of a captured Graph, kept for the executor and profilers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from outcore.capture.batching import BatchSignature, ModelOutputs, split_batch_leaves
from outcore.capture.closed_over import Origin, describe, same_kind
from outcore.capture.convert import NodeMap, attribute, first_accelerator
from outcore.capture.effect_tokens import TOKEN_INPUTS
from outcore.capture.specialize import ScalarGuard
from outcore.errors import CaptureError, OutcoreError
from outcore.graph.ir import Graph


class SpecializationMismatch(OutcoreError):
    """A step read a tensor value different from the one its graph was specialised on."""


class StaleSpecialization(SpecializationMismatch):
    """A specialised step raised before its guards could be compared: run with the values of
    another batch (a boolean mask's old positions gathering padding into a loss's targets),
    an op may refuse its inputs. The Trainer captures the step again for this batch; when
    the fresh capture raises too, ``raised`` (the step's own error) is what the user gets."""

    def __init__(self, message: str, raised: BaseException) -> None:
        super().__init__(message)
        self.raised = raised


class ConstantRebound(SpecializationMismatch):
    """A tensor the step reads as a lifted constant (``outcore.capture.closed_over``) was
    rebound to one the captured graph cannot take (another shape, dtype or device, or one
    that requires grad); the Trainer captures and plans the step again."""


class BatchMismatch(OutcoreError):
    """A batch does not match the signature (structure, shapes, dtypes) the step was
    captured with."""

_MODEL_PREFIX = "model."


@dataclass
class CapturedStep:
    """The exported joint graph and how to feed it.

    Attributes:
        gm: the joint ATen GraphModule (forward, loss and backward).
        nodes: how FX nodes map to IR tensors and ops.
        step_module: the ``(x, y) -> (loss,)`` wrapper whose parameters the graph reads.
        fake: True when the capture used fake tensors only (the graph cannot be executed).
        batch_leaves: number of tensors in the batch (the graph's plain inputs).
        signature: the batch signature captured (None for a graph not from a batch).
        guards: the values the step was specialised on (``outcore.capture.specialize``).
        lifted: ``get_attr`` target -> where the user's tensor it holds lives (a variable
            the loss closes over, a plain tensor attribute: ``outcore.capture.closed_over``),
            read again at every step (``constant``).
        outputs: the structure of the model's output, where the step keeps it (outputs of
            role "output": ``model_output``); None where it does not.
    """

    gm: fx.GraphModule
    nodes: NodeMap
    step_module: nn.Module
    fake: bool
    batch_leaves: int
    signature: BatchSignature | None = None
    guards: list[ScalarGuard] = field(default_factory=list)
    lifted: dict[str, Origin] = field(default_factory=dict)
    outputs: ModelOutputs | None = None

    def model_output(self, kept: dict[int, torch.Tensor]) -> Any:
        """What the model returned in a step, from its kept outputs (``StepResult.outputs``);
        None for a step that keeps none, and None in the place of an output the step could
        not give (a statistic of the batch under sub-batches: ``batch_dims.UNASSEMBLED``)."""
        if self.outputs is None:
            return None
        return self.outputs.rebuild([kept.get(i) for i in range(self.outputs.tensor_count)])

    @property
    def op_nodes(self) -> list[fx.Node]:
        """Op id -> the FX node of the joint graph."""
        return self.nodes.op_nodes

    @classmethod
    def from_export(cls, gm: fx.GraphModule, graph: Graph, step: nn.Module, batch: Any,
                    fake: bool, nodes: NodeMap | None = None,
                    signature: BatchSignature | None = None,
                    guards: list[ScalarGuard] | None = None,
                    lifted: dict[str, Origin] | None = None,
                    outputs: ModelOutputs | None = None) -> CapturedStep:
        """``batch``: the flat tensors the export was called with (or a pytree of them)."""
        tensors, _ = split_batch_leaves(batch)
        return cls(gm=gm, nodes=nodes if nodes is not None else NodeMap(), step_module=step,
                   fake=fake, batch_leaves=len(tensors), signature=signature,
                   guards=list(guards or []), lifted=dict(lifted or {}), outputs=outputs)

    def batch_tensors(self, batch: Any) -> list[torch.Tensor]:
        """The graph inputs of ``batch``, checked against the captured signature.

        Raises:
            BatchMismatch: another structure, constant, shape or dtype (the message names
                the first difference and what to do).
        """
        tensors, sig = split_batch_leaves(batch)
        if self.signature is None:
            if len(tensors) != self.batch_leaves:
                raise BatchMismatch(f"the batch has {len(tensors)} tensors but the step was "
                                    f"captured with {self.batch_leaves}; pass a batch shaped "
                                    "like the example")
            return tensors
        if sig != self.signature:
            what = ("structure" if sig.spec != self.signature.spec else
                    "non-tensor values" if sig.constants != self.signature.constants else
                    "shapes, dtypes or requires_grad")
            raise BatchMismatch(f"this batch {sig.describe()} does not match the captured "
                                f"signature {self.signature.describe()}: its {what} differ; "
                                "Trainer.step captures and plans each new signature, an "
                                "Executor runs only the one it was built for")
        return tensors

    def check_guards(self, outputs: dict[int, torch.Tensor]) -> None:
        """Raise SpecializationMismatch when a guard output differs from its recorded value."""
        for role, tid, name in self.nodes.output_roles:
            if role != "guard":
                continue
            guard = self.guards[int(name)]
            if not guard.holds(outputs[tid]):
                raise SpecializationMismatch(
                    f"the step was specialised on {guard.describe()}, and this batch reads "
                    "otherwise; capture it again for this batch (Trainer.step does so by "
                    "itself)")

    # -- binding real values -------------------------------------------------------------------
    def static_values(self, graph: Graph, batch: Any,
                      loss_scale: float = 1.0) -> dict[int, torch.Tensor]:
        """Tensor id -> real tensor for every placeholder, for a batch ``(x, y)``.

        Parameters and buffers come from the live module (so an optimizer's updates are seen);
        the tangent (d loss / d loss) is a fresh scalar ``loss_scale`` (1: plain gradients;
        a GradScaler's scale: scaled gradients, as ``scaler.scale(loss).backward()`` gives).
        """
        params = dict(self.step_module.named_parameters(remove_duplicate=False))
        buffers = dict(self.step_module.named_buffers(remove_duplicate=False))
        leaves = self.batch_tensors(batch)
        values: dict[int, torch.Tensor] = {}
        tangents: list[tuple[int, bool]] = []  # (tensor id, the loss's seed)
        for tid, target in self.nodes.constants.items():
            values[tid] = self.constant(target)
        for tid, desc in self.nodes.placeholders.items():
            cls = type(desc).__name__
            if cls == "ParamAOTInput":
                values[tid] = params[desc.target].detach()
            elif cls == "BufferAOTInput":
                values[tid] = buffers[desc.target]
            elif cls == "PlainAOTInput":
                values[tid] = leaves[desc.idx]
            elif cls in TOKEN_INPUTS:  # an effect token, never read (``effect_tokens``)
                values[tid] = torch.empty(0)
            elif cls == "TangentAOTInput":
                # the loss's seed, or (not a plain output) the tangent of a mutated input's
                # new value (a parameter renormed in place under no_grad,
                # ``nn.Embedding(max_norm=...)``): nothing after the step reads that
                # value, so its gradient is zero
                tangents.append((tid, type(desc.output).__name__ == "PlainAOTOutput"))
            else:
                raise CaptureError(f"the joint graph has an input outcore cannot bind: "
                                   f"{graph.tensors[tid].name} ({desc!r}); report it with the "
                                   "model, or run the step eagerly")
        if tangents:  # on the device the step computes on: the loss's, its inputs'
            device = _step_device(params.values(), leaves)
            for tid, of_loss in tangents:
                seed = graph.tensors[tid]
                values[tid] = torch.full(seed.shape, loss_scale if of_loss else 0.0,
                                         device=device, dtype=getattr(torch, seed.dtype))
        return values

    def constant(self, target: str) -> torch.Tensor:
        """The value of the graph's tensor constant ``target`` for this step: the user's
        tensor where it lives now, when it was lifted from a place it can be read again
        (a rebinding to a tensor of the same shape, dtype and device is followed, and kept
        for later steps), else the tensor captured.

        Raises:
            ConstantRebound: the place now holds something the graph cannot take.
        """
        value: torch.Tensor = attribute(self.gm, target)
        origin = self.lifted.get(target)
        if origin is None:
            return value
        now = origin.read()
        if now is value:
            return value
        if not same_kind(now, value):
            held = describe(now) if isinstance(now, torch.Tensor) else type(now).__name__
            grad = " (requires grad)" if getattr(now, "requires_grad", False) else ""
            raise ConstantRebound(
                f"the step was captured reading {origin.where} as a {describe(value)} tensor, "
                f"and it is now {held}{grad}; capture the step again for it (Trainer.step "
                "does so by itself; a tensor that requires grad is refused there)")
        owner, _, attr = target.rpartition(".")
        setattr(attribute(self.gm, owner) if owner else self.gm, attr, now)
        return now

    def parameter(self, name: str) -> nn.Parameter:
        """The live parameter ``name`` of the step module."""
        return dict(self.step_module.named_parameters(remove_duplicate=False))[name]

    def buffer(self, name: str) -> torch.Tensor:
        return dict(self.step_module.named_buffers(remove_duplicate=False))[name]


def _step_device(params: Any, leaves: Any) -> torch.device:
    """The device a step computes on (``first_accelerator`` of its parameters and batch
    tensors), else the CPU. The loss seed is made there: a seed on another device than the
    loss fails the loss's backward kernel (``nll_loss_backward`` on CUDA)."""
    return first_accelerator([*params, *leaves]) or torch.device("cpu")


"""CapturedStep: the torch side of a captured Graph, kept for the executor and profilers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils._pytree import tree_flatten

from outcore.capture.convert import NodeMap
from outcore.graph.ir import Graph

_MODEL_PREFIX = "model."


@dataclass
class CapturedStep:
    """The exported joint graph and how to feed it.

    Attributes:
        gm: the joint ATen GraphModule (forward, loss and backward).
        nodes: how FX nodes map to IR tensors and ops.
        step_module: the ``(x, y) -> (loss,)`` wrapper whose parameters the graph reads.
        fake: True when the capture used fake tensors only (the graph cannot be executed).
        batch_spec: number of flattened leaves in ``(x, y)``.
    """

    gm: fx.GraphModule
    nodes: NodeMap
    step_module: nn.Module
    fake: bool
    batch_leaves: int

    @property
    def op_nodes(self) -> list[fx.Node]:
        """Op id -> the FX node of the joint graph."""
        return self.nodes.op_nodes

    @classmethod
    def from_export(cls, gm: fx.GraphModule, graph: Graph, step: nn.Module, batch: Any,
                    fake: bool, nodes: NodeMap | None = None) -> CapturedStep:
        leaves = tree_flatten(batch)[0]
        return cls(gm=gm, nodes=nodes if nodes is not None else NodeMap(), step_module=step,
                   fake=fake, batch_leaves=len(leaves))

    # -- binding real values -------------------------------------------------------------------
    def static_values(self, graph: Graph, batch: Any) -> dict[int, torch.Tensor]:
        """Tensor id -> real tensor for every placeholder, for a batch ``(x, y)``.

        Parameters and buffers come from the live module (so an optimizer's updates are seen);
        the tangent (d loss / d loss) is a fresh scalar one.
        """
        params = dict(self.step_module.named_parameters(remove_duplicate=False))
        buffers = dict(self.step_module.named_buffers(remove_duplicate=False))
        leaves = tree_flatten(batch)[0]
        if len(leaves) != self.batch_leaves:
            raise ValueError(f"the batch has {len(leaves)} tensors but the step was captured "
                             f"with {self.batch_leaves}; pass (x, y) shaped like the example")
        values: dict[int, torch.Tensor] = {}
        for tid, desc in self.nodes.placeholders.items():
            cls = type(desc).__name__
            if cls == "ParamAOTInput":
                values[tid] = params[desc.target].detach()
            elif cls == "BufferAOTInput":
                values[tid] = buffers[desc.target]
            elif cls == "PlainAOTInput":
                values[tid] = leaves[desc.idx]
            elif cls == "TangentAOTInput":
                loss = graph.tensors[graph.by_name("tangents_1").id]
                values[tid] = torch.ones(loss.shape, dtype=getattr(torch, loss.dtype))
            else:
                raise ValueError(f"unknown graph input {graph.tensors[tid].name}: {desc!r}")
        return values

    def parameter(self, name: str) -> nn.Parameter:
        return dict(self.step_module.named_parameters(remove_duplicate=False))[name]

    def buffer(self, name: str) -> torch.Tensor:
        return dict(self.step_module.named_buffers(remove_duplicate=False))[name]

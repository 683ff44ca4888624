"""Real tensor layouts versus the layouts capture recorded.

Capture traces with fake tensors, whose strides come from PyTorch's meta kernels. A real
kernel may return another layout for the same inputs: on CPU and CUDA, batch norm over a
transposed ``(B, C, T)`` activation returns a contiguous tensor where the meta kernel
preserves the input's strides; ``native_layer_norm_backward`` and
``native_dropout_backward`` differ the same way. Values are the same, but the joint graph
was decomposed *assuming* the fake layout: a later ``aten.view`` that the fake tensor allows
fails on the real one ("view size is not compatible with input tensor's size and stride"),
and an ``aten.as_strided`` reads the wrong elements, silently.

Invariant kept by the executor: every tensor that a layout-sensitive op reads (directly or
through a chain of views of the same storage) has, when it is made, the strides capture
recorded for it. ``layout_bases`` names those tensors (their storage's base); the generated
code calls ``relayout`` on each one right after it is made (or bound, for a step input), and
``relayout`` copies the value into the recorded layout only when the real kernel chose
another. The copy is the one eager PyTorch makes itself in that case (``reshape`` instead of
``view``); it is transient and is the only allocation the plan does not predict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from outcore.graph.ir import Graph

#: ATen ops whose result depends on the input's strides, not only its values.
_SENSITIVE = frozenset({
    "view", "_unsafe_view", "as_strided", "_reshape_alias", "view_as_complex", "view_as_real",
    "as_strided_scatter", "as_strided_copy",
})


def is_layout_sensitive(target: Any) -> bool:
    """Whether an op's result depends on its first input's strides (a view, as_strided)."""
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    return getattr(target, "namespace", "") == "aten" and name in _SENSITIVE


def layout_bases(graph: Graph, op_nodes: Sequence[fx.Node]) -> set[int]:
    """Ids of the base tensors (storage owners) read by a layout-sensitive op."""
    bases: set[int] = set()
    for op, node in zip(graph.ops, op_nodes, strict=True):
        if not is_layout_sensitive(node.target) or not op.inputs:
            continue
        first = node.args[0] if node.args else None
        if isinstance(first, fx.Node):
            bases.add(graph.tensors[op.inputs[0]].storage)
    return bases


def same_layout(real: Sequence[int], shape: Sequence[int], recorded: Sequence[int]) -> bool:
    """Strides equal where they matter: dimensions of size 1 may have any stride."""
    return all(s == 1 or a == b for s, a, b in zip(shape, real, recorded, strict=True))


def recorded_stride(val: Any) -> tuple[int, ...] | None:
    """The stride of a traced value (``node.meta['val']``), or None for a non-tensor."""
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(int(s) for s in val.stride())


def relayout(value: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``value`` itself when it already has ``stride``; else a copy laid out with it."""
    if same_layout(value.stride(), value.shape, stride):
        return value
    return relayout_copy(value, stride)


def relayout_copy(value: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """A new tensor equal to ``value``, laid out with ``stride`` (``capture.layouts``'s
    explicit copy: always a new storage, as the graph counts it)."""
    out = torch.empty_strided(value.shape, stride, dtype=value.dtype, device=value.device)
    out.copy_(value)
    return out


def rebase(fresh: torch.Tensor, holder: torch.Tensor) -> torch.Tensor:
    """``fresh`` (a recomputed base) as a tensor over ``holder``'s storage, where a view of the
    base's first value still lives: the same values (a recompute replays the op), one storage
    instead of two; ``fresh``'s own storage is released with the caller's last reference."""
    out = torch.empty(0, dtype=fresh.dtype, device=fresh.device)
    return out.set_(holder.untyped_storage(), fresh.storage_offset(), fresh.size(),
                    fresh.stride())

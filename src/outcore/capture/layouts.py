"""Make the captured graph's layouts the ones real kernels produce, where PyTorch's differ.

Capture traces with fake tensors, whose strides come from PyTorch's meta kernels; a few
real kernels lay their output out otherwise (``KNOWN_RULES``: batch norm returns a tensor
contiguous in its input's suggested memory format where the meta kernel keeps a transposed
input's strides; ``native_layer_norm_backward`` returns a contiguous gradient;
``native_dropout_backward`` is an elementwise product of the gradient and the mask, laid out
by eager's TensorIterator, where the meta kernel returns a contiguous tensor). A graph
decomposed for the fake layout would fail at a later ``view`` of such an output on the real
tensor, and it would sum in another order than eager's.

While a step is traced (``outcore.capture.traced_as_eager``) ``outcore.capture.eager_meta``
gives these outputs the real kernel's layout from the rules below, so the whole trace is
decomposed for eager's layouts. ``repair_layouts(gm)`` is the net behind that (a graph
traced without those rules: a torch with no Python kernel to replace). It rewrites the graph
for each such output (whoever reads it: a layout propagates through elementwise ops to a
view further on): the output is recorded with the layout the real kernel gives, and an
explicit ``relayout_copy`` node (a real op of the graph, planned and counted like any other) copies
it into the layout the rest of the graph was traced for. Invariant afterwards: every traced
value that a view relies on has the strides the real kernel gives it. Divergences not in
the table are caught at run time by ``outcore.runtime.layout`` (correct values, one
unplanned transient copy) and by the layout cross-check in ``tests/matrix``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch._prims_common import (
    compute_elementwise_output_strides,
    make_channels_last_strides_for,
    make_contiguous_strides_for,
    suggest_memory_format,
)

from outcore.runtime.layout import relayout_copy, same_layout

Stride = tuple[int, ...]


def _suggested(t: torch.Tensor) -> Stride:
    """Strides of a tensor shaped like ``t``, contiguous in ``t``'s suggested format
    (``at::empty_like(t, t.suggest_memory_format())``)."""
    shape = tuple(t.shape)
    if suggest_memory_format(t) is torch.contiguous_format:
        return tuple(make_contiguous_strides_for(shape))
    return tuple(make_channels_last_strides_for(shape))


def _contiguous(t: torch.Tensor) -> Stride:
    return tuple(make_contiguous_strides_for(tuple(t.shape)))


def _elementwise(*operands: torch.Tensor) -> Stride:
    """The strides eager's TensorIterator gives the output of an elementwise op reading
    ``operands`` in this order (each broadcast to the first one's shape)."""
    shape = tuple(operands[0].shape)
    return tuple(int(s) for s in compute_elementwise_output_strides(
        *(o.expand(shape) for o in operands)))


Rule = Callable[[list[Any]], Stride]

#: ATen op name -> (output index, the real kernel's layout of that output from the op's
#: argument values); CPU and CUDA kernels of torch 2.13 agree on these.
KNOWN_RULES: dict[str, tuple[int, Rule]] = {
    "_native_batch_norm_legit_functional": (0, lambda a: _suggested(a[0])),
    "_native_batch_norm_legit": (0, lambda a: _suggested(a[0])),
    "_native_batch_norm_legit_no_training": (0, lambda a: _suggested(a[0])),
    "native_batch_norm": (0, lambda a: _suggested(a[0])),
    "native_batch_norm_backward": (0, lambda a: _suggested(a[1])),
    "native_layer_norm_backward": (0, lambda a: _contiguous(a[1])),
    "native_dropout_backward": (0, lambda a: _elementwise(a[0], a[1])),  # grad * mask * scale
}


def _name(target: Any) -> str:
    packet = getattr(target, "overloadpacket", None)
    return str(getattr(packet, "__name__", "")) if packet is not None else ""


def _output_node(node: fx.Node, index: int) -> fx.Node | None:
    """The node holding output ``index`` of ``node`` (its getitem for a tuple)."""
    if not isinstance(node.meta.get("val"), (tuple, list)):
        return node if index == 0 else None
    for user in node.users:
        if user.target is operator.getitem and user.args[1] == index:
            return user
    return None


def repair_layouts(gm: fx.GraphModule) -> int:
    """Rewrite ``gm`` in place (module docstring); returns the number of copies inserted."""
    inserted = 0
    for node in list(gm.graph.nodes):
        rule = KNOWN_RULES.get(_name(node.target)) if node.op == "call_function" else None
        if rule is None:
            continue
        index, real_of = rule
        out = _output_node(node, index)
        fake = out.meta.get("val") if out is not None else None
        if out is None or not isinstance(fake, torch.Tensor):
            continue
        args = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in node.args]
        real = real_of(args)
        if same_layout(real, tuple(fake.shape), tuple(fake.stride())):
            continue
        _insert_copy(gm, node, index, out, fake, real)
        inserted += 1
    if inserted:
        gm.graph.lint()
        gm.recompile()
    return inserted


def _insert_copy(gm: fx.GraphModule, node: fx.Node, index: int, out: fx.Node,
                 fake: torch.Tensor, real: Stride) -> None:
    """Record ``out`` with the ``real`` layout and read it through a copy in the fake one."""
    as_real = fake.new_empty_strided(tuple(fake.shape), real)
    if out is node:
        node.meta["val"] = as_real
    else:
        vals = list(node.meta["val"])
        vals[index] = as_real
        node.meta["val"] = type(node.meta["val"])(vals)
        out.meta["val"] = as_real
    with gm.graph.inserting_after(out):
        copy = gm.graph.call_function(relayout_copy, (out, tuple(int(s) for s in fake.stride())))
    out.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)
    copy.meta.update({k: v for k, v in out.meta.items() if k != "val"})
    for key in ("partitioner_tag", "nn_module_stack", "stack_trace"):
        if key in node.meta:
            copy.meta[key] = node.meta[key]
    copy.meta["val"] = fake

"""Eager dropout in a joint graph: the backward needs its mask, never its output.

Under Inductor's ``fallback_random`` (``inductor_backend``'s default) a dropout stays one
``aten.native_dropout`` node that draws with eager's generator and returns ``(output,
mask)``. The draw cannot be repeated in the backward, so the partition must save whatever
the backward reads of it (``saved.is_forced``): the mask (one byte per element) for the
dropout's own gradient, and the float output (four bytes) whenever the plan recomputes a
value downstream of it (the attention's dropped probabilities for its value product's
gradient, a residual sum). Both outputs are functions of the input and the mask: ``output =
input * mask * scale`` with ``scale = 1 / (1 - p)`` (0 when ``p == 1``), as ATen's CPU
kernel computes it (the input times the 0/1 mask, then times the scale: the same two
roundings).

``mask_only_dropout(gm)`` rewrites the joint graph so that every reader of a dropout's output
reads ``mul(mul(input, mask), scale)`` instead: the output node is left without readers, so
the one thing the draw must hand the backward is its mask, and a recompute of anything
downstream goes through the mask and the input, which the plan keeps or recomputes as any
other value. The unread output is marked ``capture.convert.SCRATCH_OUTPUTS``: the eager
kernel still allocates it and drops it when it returns, so the planned graph holds it as
the op's scratch (``Op.temporaries``), not as a tensor no op reads.

Invariants: the draws are unchanged (same node, same generator calls, in the same order);
each value the graph computes is the same function of the draws, to the same roundings; a
``native_dropout`` not in training mode (``train`` False) is left as is.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from outcore.capture.convert import SCRATCH_OUTPUTS

_aten = torch.ops.aten


def _outputs(node: fx.Node) -> tuple[fx.Node | None, fx.Node | None]:
    """The ``getitem`` nodes reading ``node``'s output 0 and mask 1 (None where absent)."""
    found: list[fx.Node | None] = [None, None]
    for user in node.users:
        if user.target is operator.getitem and user.args[1] in (0, 1):
            found[int(user.args[1])] = user  # type: ignore[arg-type]
    return found[0], found[1]


def _fresh(out: fx.Node) -> dict[str, object]:
    """``out``'s meta with a fake value of its own storage (saved bytes count storages)."""
    meta = dict(out.meta)
    val = meta.get("val")
    mode = getattr(val, "fake_mode", None)
    if isinstance(val, torch.Tensor) and mode is not None:
        with mode:
            meta["val"] = torch.empty_like(val)
    return meta


def mask_only_dropout(gm: fx.GraphModule) -> int:
    """Rewrite each training ``native_dropout``'s output readers as above (module
    docstring); returns the number of dropouts rewritten. ``gm`` is changed in place and
    recompiled when anything changed."""
    done = 0
    for node in list(gm.graph.find_nodes(op="call_function",
                                         target=_aten.native_dropout.default)):
        x, p = node.args[0], float(node.args[1])  # type: ignore[arg-type]
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
        out, mask = _outputs(node)
        if train is False or out is None or not out.users or not isinstance(x, fx.Node):
            continue
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        graph = gm.graph
        with graph.inserting_after(out):
            if mask is None:
                mask = graph.call_function(operator.getitem, (node, 1))
                mask.meta = {**out.meta, "val": node.meta["val"][1]}
            with graph.inserting_after(mask):
                kept = graph.call_function(_aten.mul.Tensor, (x, mask))
                kept.meta = _fresh(out)
                with graph.inserting_after(kept):
                    scaled = graph.call_function(_aten.mul.Tensor, (kept, scale))
                    scaled.meta = _fresh(out)
        out.replace_all_uses_with(scaled)
        node.meta[SCRATCH_OUTPUTS] = {0}  # read by nothing now: the kernel's scratch
        done += 1
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done

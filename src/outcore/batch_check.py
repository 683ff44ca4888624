"""``Trainer.step`` checks each batch against the captured signature before running it.

The generated code was captured for fixed shapes and dtypes; a batch of another dtype or
shape would fail deep inside it with a raw ``RuntimeError``. ``check_batch`` names the leaf,
what was captured and what to do instead (``BatchMismatchError``, also a ``ValueError``).
With sub-batches the graph holds one sub-batch: one dimension of the batch (its batch
dimension, which ``outcore.graph.batch_dims`` proves at planning) is ``parts`` times the
captured one, and every other dimension equals it.
"""

from __future__ import annotations

from typing import Any

from outcore.capture.batching import split_batch_leaves
from outcore.errors import BatchMismatchError
from outcore.graph.ir import Graph


def captured_inputs(graph: Graph) -> dict[int, tuple[tuple[int, ...], str]]:
    """Index among the batch's tensors (``split_batch_leaves``' order) -> (shape, dtype) of
    what the graph was captured with."""
    nodes = getattr(graph.source, "nodes", None)
    if nodes is None:
        return {}
    out = {}
    for tid, desc in nodes.placeholders.items():
        if type(desc).__name__ == "PlainAOTInput":
            t = graph.tensors[tid]
            out[desc.idx] = (tuple(t.shape), t.dtype.removeprefix("torch."))
    return out


def check_batch(graph: Graph, batch: Any, parts: int = 1) -> None:
    """Raise BatchMismatchError when ``batch`` does not match the captured signature."""
    expected = captured_inputs(graph)
    if not expected:
        return
    # the graph's inputs index the batch's tensors (non-tensor leaves are constants of it)
    leaves = split_batch_leaves(batch)[0]
    if len(leaves) != len(expected):
        raise BatchMismatchError(f"{len(leaves)} tensors", f"{len(expected)} tensors, as "
                                 "the example batch", "Pass the batch as the data loader "
                                 "yields it, shaped like the example.")
    for k, leaf in enumerate(leaves):
        if k not in expected:
            continue
        shape, dtype = expected[k]
        got_dtype = str(leaf.dtype).removeprefix("torch.")
        if not _same_shape(tuple(leaf.shape), shape, parts) or got_dtype != dtype:
            if shape and parts > 1:
                shape = (shape[0] * parts, *shape[1:])
            raise BatchMismatchError(
                f"tensor #{k} of shape {tuple(leaf.shape)} and dtype {got_dtype}",
                f"shape {shape} and dtype {dtype}, as captured",
                "outcore plans one shape: convert the batch (e.g. .to(dtype)), drop or pad the "
                "last batch, or compile again for this shape.")


def _same_shape(got: tuple[int, ...], captured: tuple[int, ...], parts: int) -> bool:
    """``got`` is the captured shape, or with sub-batches the captured shape with exactly one
    dimension ``parts`` times as large. With sub-batches the captured shape itself does not
    match: it is one sub-batch, and every input has a batch dimension that the split divides
    (a share of a data-parallel step as large as the first share's sub-batch, the last
    batch's 2 samples where 4 ran as 2 sub-batches of 2, is a new signature, not the first)."""
    if parts <= 1 or got == captured:
        return parts <= 1 and got == captured
    if len(got) != len(captured):
        return False
    grown = [i for i, (g, c) in enumerate(zip(got, captured, strict=True)) if g != c]
    return len(grown) == 1 and got[grown[0]] == captured[grown[0]] * parts

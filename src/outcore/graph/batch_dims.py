"""Which dimension of each tensor carries the batch, and whether samples stay independent.

Plain Python on the shapes a Graph records (no torch). Two questions, answered in turn:

1. **Where is the batch in the inputs?** ``input_batch_dims(shapes)`` takes the shapes of the
   batch's tensors (the step's inputs, in leaf order) and returns the batch size and, per
   tensor, the dimension that holds it. The batch size is the size every input shares: when
   the first dimensions all agree that is it (the usual batch-first layout); otherwise the
   one size that every input has somewhere (a batch-second ``(S, B, E)`` input with ``(B,)``
   labels). Each input's batch dimension is its only dimension of that size. Anything
   ambiguous (two candidate sizes, or an input with the size twice, such as ``(B, B)``) or
   impossible (a scalar input) is refused with ``BatchDimError``, which names the option to
   pass: ``batch_size=`` and ``batch_dims=`` (one dimension per input).

2. **Which tensors scale, along which dimension, and are samples independent?**
   ``follow(full, sub, parts)`` takes the step captured at the batch ``B`` and at ``B /
   parts`` (the inputs split along the dimensions of question 1) and follows the batch from
   the inputs through every op. A tensor *scales* when its shape differs between the two
   captures; it must then differ in exactly one dimension, by exactly ``parts`` (a batch
   reshaped into another dimension, ``(B, T, E) -> (B*T, E)``, scales that merged dimension).
   Anything else, a graph whose ops differ between the two sizes, or a parameter gradient
   that scales, cannot be proven to be the same computation on fewer samples and raises
   ``BatchDimError``. Then, op by op in forward order:

   * a tensor is *batch-derived* when it is computed from a scaling tensor;
   * an op that reads a batch-derived tensor that does not scale (a statistic over the
     batch) and writes a scaling tensor, or that reads a scaling tensor and writes both a
     scaling and a batch-derived non-scaling one (``batch_norm`` in training: the output and
     the batch mean), *couples samples*: a sub-batch then computes something else than its
     share of the full batch (``BatchDims.coupled`` lists these ops).

   The loss must be a batch-derived scalar that does not scale (a reduction over samples).
   A batch tensor's gradient (the tensor requires grad) and its new value after an
   in-place change in the forward (``x.mul_(0.5)``) scale as the tensor does.
   The model's kept outputs (``outcore.compile(..., outputs=True)``, sources ``output:N``)
   may scale: each sub-batch's are concatenated along that dimension
   (``BatchDims.outputs``). A kept copy of the loss (a model that returns its own loss) is
   the step's loss, summed over sub-batches with their weights. Any other kept output that
   is batch-derived but does not scale (a statistic over the batch: a mixture-of-experts
   router's auxiliary loss) cannot be assembled from sub-batches: it is given as None, and
   the split's note says so; one that is not batch-derived (computed from parameters
   only) is the same in every sub-batch.

Limits (stated, not hidden): shapes alone cannot see an op that mixes samples along the
batch dimension without changing any shape (a softmax or cumulative sum over dimension 0);
such a model gets a different gradient under sub-batching. Whether the loss is a mean or a
sum over samples is decided on the torch side (``outcore.runtime.subbatch``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from outcore.errors import CaptureError
from outcore.graph.ir import STATIC_KINDS, Graph, Phase, Tensor, TensorKind


class BatchDimError(CaptureError):
    """The batch dimension of a step cannot be proven; the message says what to pass."""


@dataclass(frozen=True)
class InputSplit:
    """The batch size and, per input tensor (leaf order), the dimension holding it."""

    size: int
    dims: tuple[int, ...]


@dataclass
class BatchDims:
    """What ``follow`` proved about a graph captured at the full batch.

    Attributes:
        parts: how many sub-batches the comparison used.
        scales: tensor id -> the dimension that scales with the batch (absent: does not).
        derived: tensor ids computed from a scaling tensor (the scaling ones included).
        coupled: ids of forward ops that mix samples (batch statistics), in graph order.
        outputs: kept model output position (``output:N``) -> the dimension its
            sub-batches are concatenated along, ``LOSS_COPY`` for a copy of the loss,
            ``UNASSEMBLED`` for a statistic of the batch (given as None), or None when it
            is not batch-derived (the same in every sub-batch).
    """

    parts: int
    scales: dict[int, int] = field(default_factory=dict)
    derived: set[int] = field(default_factory=set)
    coupled: list[int] = field(default_factory=list)
    outputs: dict[int, int | str | None] = field(default_factory=dict)



def _refuse(what: str) -> BatchDimError:
    return BatchDimError(
        f"{what}. Pass the batch layout explicitly: options batch_size=<samples> and "
        "batch_dims=(<dim of input 0>, <dim of input 1>, ...), one dimension per tensor of "
        "the batch (x, y) in order")


def input_batch_dims(raw: Sequence[Sequence[int]], batch_size: int | None = None,
                     dims: Sequence[int] | None = None) -> InputSplit:
    """The batch size and each input's batch dimension (module docstring, question 1)."""
    shapes = [tuple(int(s) for s in shape) for shape in raw]
    if not shapes:
        raise _refuse("the step has no input tensor to split")
    if dims is not None:
        return _explicit(shapes, batch_size, tuple(int(d) for d in dims))
    if any(not shape for shape in shapes):
        raise _refuse(f"an input is a scalar (shapes {shapes}); it has no batch dimension")
    size = batch_size if batch_size is not None else _common_size(shapes)
    found = []
    for k, shape in enumerate(shapes):
        at = [d for d, s in enumerate(shape) if s == size]
        if len(at) == 1 or (at and at[0] == 0 and _batch_first(shapes, size)):
            found.append(at[0])
            continue
        reason = "has no dimension" if not at else f"has {len(at)} dimensions"
        raise _refuse(f"input {k} of shape {shape} {reason} of the batch size {size}")
    return InputSplit(size, tuple(found))


def _batch_first(shapes: list[tuple[int, ...]], size: int) -> bool:
    return all(shape[0] == size for shape in shapes)


def _common_size(shapes: list[tuple[int, ...]]) -> int:
    firsts = {shape[0] for shape in shapes}
    if len(firsts) == 1:
        return firsts.pop()
    common = set(shapes[0]).intersection(*(set(s) for s in shapes[1:]))
    if len(common) != 1:
        raise _refuse(f"cannot tell the batch size from the input shapes {shapes} (sizes "
                      f"shared by every input: {sorted(common)})")
    return common.pop()


def _explicit(shapes: list[tuple[int, ...]], batch_size: int | None,
              dims: tuple[int, ...]) -> InputSplit:
    if len(dims) != len(shapes):
        raise _refuse(f"batch_dims names {len(dims)} dimensions for {len(shapes)} inputs")
    sizes = set()
    for k, (shape, d) in enumerate(zip(shapes, dims, strict=True)):
        if not -len(shape) <= d < len(shape):
            raise _refuse(f"batch_dims[{k}] = {d} is not a dimension of input {k} {shape}")
        sizes.add(shape[d])
    if len(sizes) != 1 or (batch_size is not None and sizes != {batch_size}):
        raise _refuse(f"batch_dims {dims} give batch sizes {sorted(sizes)}, which differ"
                      + (f" from batch_size={batch_size}" if batch_size is not None else ""))
    norm = tuple(d % len(shape) for shape, d in zip(shapes, dims, strict=True))
    return InputSplit(sizes.pop(), norm)


def graph_inputs(graph: Graph) -> list[int]:
    """The step's input tensor ids in batch-leaf order (``source`` ``input:<leaf>``)."""
    inputs = [t for t in graph.tensors if t.kind is TensorKind.INPUT]

    def leaf(t: Tensor) -> int:
        return int(t.source.split(":", 1)[1]) if t.source.startswith("input:") else t.id

    return [t.id for t in sorted(inputs, key=leaf)]


def graph_batch(graph: Graph, options: Mapping[str, object]) -> InputSplit:
    """``input_batch_dims`` on ``graph``'s inputs with the ``batch_size``/``batch_dims``
    options; a graph whose inputs are not tensors of a batch (hand-made) needs
    ``batch_size``."""
    size = options.get("batch_size")
    dims = options.get("batch_dims")
    shapes = [graph.tensors[t].shape for t in graph_inputs(graph)]
    if size is not None and dims is None and not shapes:
        return InputSplit(int(size), ())  # type: ignore[call-overload]
    return input_batch_dims(shapes, None if size is None else int(size),  # type: ignore[call-overload]
                            None if dims is None else tuple(dims))  # type: ignore[arg-type]


def follow(full: Graph, sub: Graph, parts: int) -> BatchDims:
    """Which tensors scale and which ops couple samples (module docstring, question 2)."""
    _same_structure(full, sub)
    result = BatchDims(parts)
    for a, b in zip(full.tensors, sub.tensors, strict=True):
        changed = [d for d, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if x != y]
        if not changed:
            continue
        d = changed[0]
        if len(changed) > 1 or a.shape[d] != parts * b.shape[d]:
            raise _refuse(f"tensor {a.name!r} is {a.shape} at the full batch but {b.shape} with "
                          f"{parts} sub-batches: not one dimension scaled by {parts}")
        if a.source.startswith("const:"):
            raise BatchDimError(
                f"the step's constant {a.name!r} changes shape with the batch ({a.shape} vs "
                f"{b.shape}): it holds values the step was specialised on (a boolean mask's "
                "positions: t[mask], nonzero, masked_select; outcore.capture.value_shapes), "
                "which sub-batches cannot share. Give a budget that holds the whole batch, "
                "or keep the shapes fixed (F.cross_entropy(..., ignore_index=-100), "
                "torch.where(mask, t, 0))")
        if a.kind in (TensorKind.PARAMETER, TensorKind.BUFFER) or (
                a.source.startswith("grad:") and not a.source.startswith(INPUT_GRAD)):
            raise _refuse(f"{a.kind} {a.name!r} changes shape with the batch ({a.shape} vs "
                          f"{b.shape}); sub-batches would not share it")
        result.scales[a.id] = d
    for t in full.tensors:
        if t.kind is TensorKind.INPUT and t.id not in result.scales:
            raise _refuse(f"input {t.name!r} {t.shape} does not change with the batch")
    _follow_ops(full, result)
    return result


def _same_structure(full: Graph, sub: Graph) -> None:
    if len(full.tensors) != len(sub.tensors) or len(full.ops) != len(sub.ops) or any(
            a.target != b.target or a.inputs != b.inputs or a.outputs != b.outputs
            for a, b in zip(full.ops, sub.ops, strict=False)) or any(
            len(a.shape) != len(b.shape) for a, b in zip(full.tensors, sub.tensors, strict=False)):
        raise BatchDimError(f"graph {full.name!r} is not the same computation at the smaller "
                            "batch (its ops or tensor ranks differ): the model's code depends "
                            "on the batch size, so this sub-batch size is not used")


def _follow_ops(graph: Graph, result: BatchDims) -> None:
    """Batch-derived tensors and sample-coupling ops, forward ops in order."""
    scales, derived = result.scales, result.derived
    derived.update(scales)
    for op in graph.ops:
        ins = [t for t in op.inputs if t in derived]
        if not ins:
            continue
        derived.update(op.outputs)
        if op.phase is not Phase.FORWARD:
            continue
        stats_in = any(t not in scales for t in ins)
        scaled_out = any(t in scales for t in op.outputs)
        stats_out = any(t not in scales for t in op.outputs)
        reads_scaled = any(t in scales for t in ins)
        if scaled_out and (stats_in or (reads_scaled and stats_out)):
            result.coupled.append(op.id)
    for tid in graph.outputs:
        t = graph.tensors[tid]
        if t.source.startswith(KEPT_OUTPUT):
            result.outputs[int(t.source.removeprefix(KEPT_OUTPUT))] = _kept_dim(graph, t, result)
        elif tid in scales and not t.source.startswith((INPUT_GRAD, INPUT_UPDATE)):
            # (a batch tensor's gradient, or its value after an in-place change in the
            # forward: assembled along its batch dimension, runtime.sub_batch_assembly)
            raise _refuse(f"the step's output {t.name!r} {t.shape} scales with the batch; "
                          "sub-batches can only accumulate outputs that do not (the loss, "
                          "gradients)")


#: The source prefix of the model's outputs a step keeps (``capture(..., outputs=True)``).
KEPT_OUTPUT = "output:"
#: The source prefix of a batch tensor's gradient (a batch tensor that requires grad).
INPUT_GRAD = "grad:input:"
#: The source prefix of a batch tensor's new value (the forward changed it in place).
INPUT_UPDATE = "update:input:"
#: ``BatchDims.outputs``' value for a kept output that is a copy of the step's loss.
LOSS_COPY = "loss"
#: ``BatchDims.outputs``' value for a statistic of the batch (a router's load-balancing
#: loss, ``logits.mean()``): sub-batches cannot assemble it, so it is given as None
UNASSEMBLED = "unassembled"
#: Ops that hand their one input on unchanged (a kept output is ``detach`` then ``clone``).
_COPIES = frozenset({"aten.clone.default", "aten.detach.default", "aten.alias.default"})


def _kept_dim(graph: Graph, t: Tensor, dims: BatchDims) -> int | str | None:
    """How a kept model output is assembled from sub-batches: the dimension they are
    concatenated along, ``LOSS_COPY`` for a copy of the loss, ``UNASSEMBLED`` for any other
    batch-derived output that does not scale (a statistic of the batch: no split gives its
    full-batch value), None when it is not batch-derived."""
    if t.id in dims.scales:
        return dims.scales[t.id]
    if t.id in dims.derived and _copy_of_loss(graph, t.id):
        return LOSS_COPY
    if t.id in dims.derived:
        return UNASSEMBLED
    return None


def _copy_of_loss(graph: Graph, tid: int) -> bool:
    """``tid`` is the step's loss handed on through copies (clone, detach, alias)."""
    while graph.tensors[tid].source != "loss":
        if graph.tensors[tid].kind in STATIC_KINDS:  # made before the step: no producer
            return False
        op = graph.producer_op(tid)
        if op.target not in _COPIES or len(op.inputs) != 1:
            return False
        tid = op.inputs[0]
    return True


def random_scales(graph: Graph, dims: BatchDims) -> dict[str, int]:
    """Tensor id (as a string, JSON-safe) -> batch dimension, for the inputs and outputs of
    ``graph``'s forward random ops that scale with the batch (``outcore.runtime.sub_batch_rng``
    draws them for the full batch and keeps each sub-batch's rows)."""
    return {str(t): d for op in graph.ops if op.random and op.phase is Phase.FORWARD
            for t in op.inputs + op.outputs if (d := dims.scales.get(t)) is not None}


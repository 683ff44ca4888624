"""Shapes set by tensor values inside an op: boolean masks and sizes given as tensors,
specialised on their values.

**Boolean masks.**

``t[mask]``, ``t[mask] = v``, ``nonzero``, ``argwhere``, ``torch.where(mask)`` and
``masked_select`` make (or take) as many elements as the mask holds ``True``: a shape that
depends on values, which fake tensors cannot trace (``DynamicOutputShapeException``).
DeBERTa's sequence-classification loss keeps the labels that are not negative that way, and so
do hand-written losses that drop padding (``logits[labels != -100]``). outcore specialises on
the mask as it does on values read in Python (``outcore.capture.specialize``):

1. while the step runs eagerly, each such call's mask is recorded with its positions
   (``mask.nonzero(as_tuple=True)``), in order, among the values read in Python;
2. while it is traced, the call is rewritten to index with the recorded positions (long
   tensors: a fixed shape), and the mask becomes a guard output of the step;
3. every step compares each mask with the recorded one (``torch.equal``) before anything is
   applied; a mask that differs makes the Trainer capture and plan the step again.

Invariant: the rewritten call computes what the original computes, forward and backward.
PyTorch itself indexes with ``mask.nonzero()`` wherever a boolean index meets ``index`` or
``index_put``, and the positions of a mask are distinct, so the gradient's sums are the same
additions (``tests/spine/test_mask_specialisation.py`` compares each form with eager, bit for
bit). A call the rewrite does not know (a 0-d mask, an ``out=`` argument) is left as it is,
and the capture fails as before, with its way out.

A 0-d integer tensor used as an index (``w[expert_idx]``, as the experts loops of Hugging
Face's gpt-oss family index their weights) or as a slice's bound (``x[:, :n]``: Pixtral's
crop) is read as an ``int`` the same way as the sizes below.

**Sizes given as tensors.** ``torch.arange(n)``, ``torch.zeros(n, 4)``, ``x.new_full((n,),
v)``, ``x.view(n, -1)`` with ``n`` a 0-d tensor read it in C++, where Python's readers are
not seen (Longformer's ``torch.arange(max_num_global_attn_indices)``). Each 0-d tensor given
to ``SIZE_TAKERS`` (not the tensor a method is called on) is read in Python first, with
``int`` or ``float`` by its dtype, which is a value read like any other (a guard). The call
then gets the number, as eager's C++ would have read it. ``tensor_split`` with a 1-D tensor
of indices (``LIST_TAKERS``) gets them read with ``.tolist()``, one guard for the list, and
``repeat_interleave`` by a tensor of repeats becomes the ``index_select`` ATen runs, by an
index made from the repeats read so. ``F.ctc_loss`` is traced as ``ctc_loss_as_eager``
(below).

**Outputs that follow the input whole.** ``unique``, ``unique_consecutive`` and ``bincount``
(``WHOLE_OUTPUTS``) are recorded whole in the eager run and replayed as constants; the input
tensor is the guard (``VALUES_READER``: its every value), and no gradient goes through them.
``bincount`` by weights is left as it is (the weights' values would need a guard too).

**``torch.equal``** returns a bool from C++: read as ``bool((a == b).all())`` (``_equal``), a
value read like any other (D-FINE's and DEIMv2's losses).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: mask -> its positions (``nonzero(as_tuple=True)``), recorded or replayed
Positions = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
#: what a tensor is turned into: its positions, or an op's outputs
Compute = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
#: ``(reader, tensor, compute) -> outputs``: ``compute(tensor)`` recorded, ``tensor``'s values
#: the guard (``specialize.record_reads``), or the recorded outputs replayed
#: (``specialize.replaying``)
Specialise = Callable[[str, torch.Tensor, Compute], tuple[torch.Tensor, ...]]

#: ``ScalarGuard.reader`` of a mask guard (its outputs: the mask's positions)
MASK_READER = "mask"
#: ``ScalarGuard.reader`` of a guard on a whole tensor's values (``unique``'s input; its
#: outputs: the op's)
VALUES_READER = "values"


def mask_positions(mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What PyTorch indexes a boolean mask by (``Tensor.nonzero``, unrewritten)."""
    return torch.Tensor.nonzero(mask, as_tuple=True)


def _is_mask(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.bool and x.dim() > 0


def _is_scalar_index(x: Any) -> bool:
    """A 0-d integer tensor used as an index: eager reads it as an ``int`` (in C++)."""
    return (isinstance(x, torch.Tensor) and x.dim() == 0 and not x.dtype.is_floating_point
            and not x.dtype.is_complex and x.dtype != torch.bool)


def _tensor_bounded(item: Any) -> bool:
    """A slice with a 0-d tensor as a bound (``x[:, :n]``: Pixtral crops its patches by the
    image's size so), which eager reads in C++."""
    return isinstance(item, slice) and any(
        _is_scalar_index(b) for b in (item.start, item.stop, item.step))


def _read_bound(bound: Any) -> Any:
    return int(bound) if _is_scalar_index(bound) else bound


def _index_without_masks(index: Any, positions: Positions) -> Any:
    """``index`` with each boolean tensor in it replaced by its positions and each 0-d integer
    tensor (an index, or a slice's bound) by its value read in Python (``None`` when it holds
    none of these: not a call to rewrite)."""
    items = index if isinstance(index, tuple) else (index,)
    if not any(_is_mask(i) or _is_scalar_index(i) or _tensor_bounded(i) for i in items):
        return None
    out: list[Any] = []
    for item in items:
        if _is_mask(item):
            out.extend(positions(item))
        elif _tensor_bounded(item):
            out.append(slice(*(_read_bound(b) for b in (item.start, item.stop, item.step))))
        else:
            out.append(int(item) if _is_scalar_index(item) else item)
    return tuple(out)


def _getitem(positions: Positions, args: tuple, kwargs: dict) -> Any:
    index = _index_without_masks(args[1], positions) if len(args) == 2 and not kwargs else None
    return NotImplemented if index is None else torch.Tensor.__getitem__(args[0], index)


def _setitem(positions: Positions, args: tuple, kwargs: dict) -> Any:
    index = _index_without_masks(args[1], positions) if len(args) == 3 and not kwargs else None
    if index is None:
        return NotImplemented
    torch.Tensor.__setitem__(args[0], index, args[2])
    return None


def _mask_of(t: Any) -> torch.Tensor | None:
    """The boolean mask ``nonzero(t)`` selects by (``t != 0`` for other dtypes)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return None
    return t if t.dtype == torch.bool else t != 0


def _nonzero(positions: Positions, args: tuple, kwargs: dict) -> Any:
    if len(args) != 1 or set(kwargs) - {"as_tuple"} or (mask := _mask_of(args[0])) is None:
        return NotImplemented
    found = positions(mask)
    return tuple(found) if kwargs.get("as_tuple", False) else torch.stack(found, dim=1)


def _argwhere(positions: Positions, args: tuple, kwargs: dict) -> Any:
    if len(args) != 1 or kwargs or (mask := _mask_of(args[0])) is None:
        return NotImplemented
    return torch.stack(positions(mask), dim=1)


def _where(positions: Positions, args: tuple, kwargs: dict) -> Any:
    """Only ``torch.where(condition)``, which is ``nonzero(condition, as_tuple=True)``."""
    if len(args) != 1 or kwargs or (mask := _mask_of(args[0])) is None:
        return NotImplemented
    return tuple(positions(mask))


def _masked_select(positions: Positions, args: tuple, kwargs: dict) -> Any:
    given = dict(zip(("input", "mask"), args, strict=False)) | kwargs
    t, mask = given.get("input"), given.get("mask")
    if set(given) != {"input", "mask"} or not isinstance(t, torch.Tensor) or not _is_mask(mask):
        return NotImplemented
    t, mask = torch.broadcast_tensors(t, mask)
    return t[positions(mask)]


def _number(t: torch.Tensor) -> int | float | bool:
    """A 0-d tensor as C++ would read it, through Python's readers (so a read, a guard)."""
    if t.dtype == torch.bool:
        return bool(t)
    return float(t) if t.dtype.is_floating_point else int(t)


def _is_0d(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0


def _numbers(value: Any) -> Any:
    """``value`` with each 0-d tensor in it (itself, or an element of a list or tuple) read."""
    if _is_0d(value):
        return _number(value)
    if isinstance(value, (list, tuple)) and any(_is_0d(v) for v in value):
        return type(value)(_number(v) if _is_0d(v) else v for v in value)
    return value


#: functions that read a 0-d tensor given as a size or a number in C++ (``_numbers``); for
#: the Tensor methods the tensor they are called on is left as it is
SIZE_TAKERS: frozenset[Any] = frozenset({
    torch.arange, torch.linspace, torch.logspace, torch.zeros, torch.ones, torch.empty,
    torch.full, torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye,
    torch.tril_indices, torch.triu_indices,
    torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_empty,
    torch.Tensor.new_full, torch.Tensor.view, torch.Tensor.reshape, torch.Tensor.expand,
    torch.Tensor.repeat, torch.Tensor.narrow, torch.Tensor.tile, torch.Tensor.unflatten,
    # split sizes as a list of 0-d tensors (Mistral 3's patch merger: h * w per image)
    torch.split, torch.Tensor.split, torch.Tensor.split_with_sizes})
_METHODS = frozenset(f for f in SIZE_TAKERS if getattr(torch.Tensor, f.__name__, None) is f)


#: functions that read a 1-D tensor of indices in C++ (``tensor_split``'s
#: ``tensor_indices_or_sections``): read in Python with ``.tolist()`` instead
LIST_TAKERS: frozenset[Any] = frozenset({torch.tensor_split, torch.Tensor.tensor_split})


def _listed(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() == 1:
        return value.tolist()
    return _numbers(value)


def _sizes_read(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    first = 1 if func in _METHODS or func in LIST_TAKERS else 0
    read = _listed if func in LIST_TAKERS else _numbers
    return ((*args[:first], *(read(a) for a in args[first:])),
            {k: read(v) for k, v in kwargs.items()})


def _repeated_index(counts: list[int], device: torch.device) -> torch.Tensor:
    """``repeat_interleave(arange(len(counts)), counts)`` made in Python: a constant."""
    return torch.tensor([i for i, c in enumerate(counts) for _ in range(c)],
                        dtype=torch.long, device=device)


def _repeat_interleave(positions: Positions, args: tuple, kwargs: dict) -> Any:
    """``repeat_interleave`` by a tensor of repeats, read with ``.tolist()`` (a guard): the
    ``index_select`` by the repeated index that ATen's own ``repeat_interleave`` runs, with
    that index a constant. A step whose repeats changed selects with the old index (a valid
    one: the input's shape is the same) and fails its guard before anything is applied;
    ``output_size`` would instead make it raise."""
    given = dict(zip(("input", "repeats", "dim"), args, strict=False)) | kwargs
    if set(given) == {"input"} and isinstance(given["input"], torch.Tensor) and (
            given["input"].dim() == 1):  # repeat_interleave(repeats): the index itself
        return _repeated_index(given["input"].tolist(), given["input"].device)
    t, repeats, dim = given.get("input"), given.get("repeats"), given.get("dim")
    if (not isinstance(t, torch.Tensor) or not isinstance(repeats, torch.Tensor)
            or repeats.dim() > 1 or set(given) - {"input", "repeats", "dim"}):
        return NotImplemented
    if dim is None:
        t, dim = t.flatten(), 0
    counts = repeats.tolist()
    if isinstance(counts, int) or len(counts) == 1:  # one count for every element
        counts = [counts if isinstance(counts, int) else counts[0]] * t.shape[dim]
    return t.index_select(dim, _repeated_index(counts, t.device))


def _equal(args: tuple, kwargs: dict) -> Any:
    """``torch.equal(a, b)`` as a value read: False for other shapes (no value needed), else
    ``bool((a == b).all())``, one read through ``__bool__`` (a guard). D-FINE's loss asks
    ``if torch.equal(pred_corners, target_corners)``; ``aten.equal`` returns its bool from
    C++, where no Python reader sees it."""
    given = list(args) + [kwargs[k] for k in ("input", "other") if k in kwargs]
    if len(given) != 2 or not all(isinstance(t, torch.Tensor) for t in given):
        return NotImplemented
    a, b = given
    if a.shape != b.shape:
        return False
    return bool((a == b).all())


#: ``torch.equal`` and its method, read as values (``_equal``)
_EQUALS = frozenset({torch.equal, torch.Tensor.equal})

_REWRITES: dict[Any, Callable[[Positions, tuple, dict], Any]] = {
    torch.Tensor.__getitem__: _getitem,
    torch.Tensor.__setitem__: _setitem,
    torch.nonzero: _nonzero, torch.Tensor.nonzero: _nonzero,
    torch.argwhere: _argwhere, torch.Tensor.argwhere: _argwhere,
    torch.where: _where,
    torch.masked_select: _masked_select, torch.Tensor.masked_select: _masked_select,
    torch.repeat_interleave: _repeat_interleave,
    torch.Tensor.repeat_interleave: _repeat_interleave,
}



#: ops whose outputs' shapes follow their input's values and which no gradient goes through:
#: their outputs are recorded whole, and the input is the guard (Qwen2.5-VL's window
#: attention takes ``unique_consecutive`` of its window boundaries)
WHOLE_OUTPUTS: frozenset[Any] = frozenset({
    torch.unique, torch.Tensor.unique, torch.unique_consecutive,
    torch.Tensor.unique_consecutive, torch.bincount, torch.Tensor.bincount})


def _whole(specialise: Specialise, func: Any, args: tuple, kwargs: dict) -> Any:
    t = args[0] if args else kwargs.get("input")
    if not isinstance(t, torch.Tensor) or (func in (torch.bincount, torch.Tensor.bincount) and (
            kwargs.get("weights") is not None or len(args) > 1)):
        return NotImplemented  # bincount by weights: the weights' values too
    rest = {k: v for k, v in kwargs.items() if k != "input"}

    def compute(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = func(x, *args[1:], **rest)
        return out if isinstance(out, tuple) else (out,)

    found = specialise(VALUES_READER, t, compute)
    return found[0] if len(found) == 1 else tuple(found)  # a tuple has inverse or counts


class ValueShapes(TorchFunctionMode):
    """Rewrites the calls of the module doc: masks to index with their positions, 0-d
    tensors given as sizes to numbers read in Python, ``WHOLE_OUTPUTS`` to their outputs,
    both through ``specialise`` (recorded or replayed).

    Inside ``__torch_function__`` this mode is off, so the rewritten call (and
    ``specialise``) run as plain PyTorch; Python's readers stay patched
    (``specialize._patched``)."""

    def __init__(self, specialise: Specialise) -> None:
        super().__init__()
        self.specialise = specialise

    def positions(self, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.specialise(MASK_READER, mask, mask_positions)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _EQUALS:
            out = _equal(args, kwargs)
            if out is not NotImplemented:
                return out
        if func in WHOLE_OUTPUTS:
            out = _whole(self.specialise, func, args, kwargs)
            if out is not NotImplemented:
                return out
        if func in SIZE_TAKERS or func in LIST_TAKERS:
            args, kwargs = _sizes_read(func, args, kwargs)
        rewrite = _REWRITES.get(func)
        if rewrite is not None:
            out = rewrite(self.positions, args, kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


#: torch's own ``F.ctc_loss`` (``ctc_loss_traced`` rebinds the module attribute)
_CTC_LOSS = torch.nn.functional.ctc_loss
_CTC_ARGS = ("log_probs", "targets", "input_lengths", "target_lengths", "blank", "reduction",
             "zero_infinity")


def _lengths(value: Any) -> Any:
    """A tensor of lengths read as eager's ``ctc_loss`` reads it (``.tolist()``: a guard)."""
    if isinstance(value, torch.Tensor):
        read = value.tolist()
        return read if isinstance(read, list) else [read]
    return list(value)


def ctc_loss_as_eager(*args: Any, **kwargs: Any) -> torch.Tensor:
    """``F.ctc_loss`` as ATen's ``ctc_loss`` computes it, in steps a trace can follow: the
    lengths read into lists (what eager's ``ctc_loss`` does with tensors; the kernel's saved
    ``log_alpha`` is as wide as the longest target, padded targets or not), the kernel with
    ``reduction="none"``, then ATen's own reduction (the mean of each loss over its target
    length, at least 1; or the sum), which ATen builds with ``at::tensor`` of the lengths, a
    tensor made from host data that a fake trace cannot fill."""
    given = dict(zip(_CTC_ARGS, args, strict=False)) | kwargs
    inputs, targets = _lengths(given["input_lengths"]), _lengths(given["target_lengths"])
    reduction = given.get("reduction", "mean")
    # the kernel indexes log_probs by each target without a check: a step run with another
    # batch's specialised values (a mask's old positions gathering -100 padding) would read
    # and write out of bounds before its guards are compared. Clamping changes no target
    # eager accepts (0 <= t < classes), and padding past a length is never read.
    classes = given["log_probs"].shape[-1]
    labels = given["targets"].clamp(0, classes - 1)
    losses = _CTC_LOSS(given["log_probs"], labels, inputs, targets,
                       given.get("blank", 0), reduction="none",
                       zero_infinity=given.get("zero_infinity", False))
    if reduction == "mean":
        counts = torch.tensor(targets, dtype=losses.dtype, device=losses.device).clamp_min(1)
        return (losses / counts).mean()
    return losses.sum() if reduction == "sum" else losses


@contextlib.contextmanager
def ctc_loss_traced() -> Iterator[None]:
    """While a step is traced or its values recorded: ``torch.nn.functional.ctc_loss`` (what
    ``nn.CTCLoss`` and Hugging Face's CTC heads call) is ``ctc_loss_as_eager``. Its kernel,
    ``aten._ctc_loss``, is sized by ``outcore.capture.eager_meta``; its tensor lengths are
    values read (guards). A module attribute, not a mode: a TorchFunctionMode would see every
    call of every trace (about 15% more capture time on ResNet-50)."""
    functional = torch.nn.functional
    functional.ctc_loss = ctc_loss_as_eager  # type: ignore[assignment]
    try:
        yield
    finally:
        functional.ctc_loss = _CTC_LOSS

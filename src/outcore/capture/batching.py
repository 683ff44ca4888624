"""The calling conventions of the ecosystem: how a batch reaches the model and the loss.

Two conventions, chosen by ``loss_fn``:

* ``loss_fn`` given: the batch is ``(x, y)`` as a data loader yields it. The model is called
  as ``model(x)``, ``model(*x)`` when x is a tuple or list, ``model(**x)`` when x is a dict,
  and the loss is ``loss_fn(output, y)``. A batch that is a dict (a Hugging Face data
  collator's) is passed whole: ``model(**batch)`` and ``loss_fn(output, batch)``.
* ``loss_fn=None``: the model computes its own loss. The batch is the model's input:
  ``model(**batch)`` for a dict, ``model(*batch)`` for a tuple or list, ``model(batch)``
  otherwise; the loss is read from the output (``loss_of``).

A dict or a tuple goes to the model whole instead (``model(batch)``) when its forward takes
one argument and cannot take it spread out (``forward(self, batch)`` reading
``batch["image"]``; ``spread``).

Outputs may be tensors, ``ModelOutput``s, dicts, tuples or dataclasses; a ``loss_fn`` gets
them as the model returned them.

A batch is flattened with ``torch.utils._pytree``: its tensors become the graph's inputs, in
flattening order (a mapping pytree does not know, such as Hugging Face's ``BatchEncoding``
that tokenizers and data collators return, is read as the plain dict it holds:
``plain_batch``); every other leaf (a bool, an int, None) is a constant of the captured
step. ``BatchSignature`` is what must match for a captured step to run a batch: the tree
structure, the constants, and each tensor's shape, dtype and device.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import (
    SUPPORTED_NODES,
    TreeSpec,
    keystr,
    tree_flatten,
    tree_flatten_with_path,
    tree_map,
    tree_unflatten,
)

from outcore.capture import rebound
from outcore.capture.closed_over import Traced, held_outside
from outcore.capture.specialize import guard_outputs
from outcore.errors import CaptureError, ReplanWarning
from outcore.log import announce

LossFn = Callable[..., Any] | None


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a mapping, ``model(*inputs)`` for a tuple/list, else
    ``model(inputs)``; but a mapping or sequence the forward cannot take spread out goes in
    whole, ``model(inputs)``, when the forward takes exactly one argument (``forward(self,
    batch)`` reading ``batch["image"]``: ``spread`` decides, from the forward's signature).
    The same call is made eagerly and when tracing, so the captured step is what eager runs.
    """
    if isinstance(inputs, Mapping):
        return model(**inputs) if spread(model, inputs) else model(inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs) if spread(model, inputs) else model(inputs)
    return model(inputs)


def spread(model: nn.Module, inputs: Mapping[str, Any] | tuple[Any, ...] | list[Any]) -> bool:
    """Whether ``call_model`` spreads ``inputs`` over the forward's parameters (``**`` for a
    mapping, ``*`` for a sequence), the ecosystem's convention, or passes them as its one
    argument. Spread unless the forward's signature rejects the spread call (a key that is no
    parameter name, or another count of arguments) and binds ``inputs`` as its one argument
    (``forward(self, batch)``, or ``forward(self, batch, train=True)``). A signature
    ``inspect`` cannot read keeps the convention, and so does one that binds neither (its
    TypeError then names the key that does not fit)."""
    import inspect

    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return True
    try:
        if isinstance(inputs, Mapping):
            signature.bind(**{str(key): None for key in inputs})
        else:
            signature.bind(*inputs)
        return True
    except TypeError:
        pass
    try:
        signature.bind(inputs)
    except TypeError:
        return True  # neither binds: keep the convention, whose TypeError names the key
    return False


def plain_batch(batch: Any) -> Any:
    """``batch`` with every mapping that pytree would take as one opaque leaf (a
    ``BatchEncoding``, a ``UserDict``) replaced by a plain dict of the same items, at any depth
    inside tuples, lists and dicts. Without it the mapping's tensors would be one constant of
    the captured step instead of its inputs. The model is then called with the dict, which
    ``model(**batch)`` cannot tell apart."""
    if isinstance(batch, Mapping) and type(batch) not in SUPPORTED_NODES:
        return {key: plain_batch(value) for key, value in batch.items()}
    if type(batch) in (tuple, list):
        return type(batch)(plain_batch(value) for value in batch)
    if type(batch) is dict:
        return {key: plain_batch(value) for key, value in batch.items()}
    return batch


def loss_of(output: Any) -> torch.Tensor:
    """The loss a model (or a loss function) returned: a scalar tensor; the ``loss`` of a
    ``ModelOutput``, a dict or a dataclass; or the first element of a tuple or list.

    Raises:
        CaptureError: no scalar loss can be found (the message says what was returned).
    """
    found: Any = output
    if isinstance(output, Mapping):
        found = output.get("loss")
    elif isinstance(output, (tuple, list)) and not _is_namedtuple(output):
        found = output[0] if output else None
    elif not isinstance(output, torch.Tensor):
        found = getattr(output, "loss", None)
        if found is None and dataclasses.is_dataclass(output):
            found = next((getattr(output, f.name) for f in dataclasses.fields(output)
                          if f.name == "loss"), None)
    if not isinstance(found, torch.Tensor) or found.dim() != 0:
        shape = tuple(found.shape) if isinstance(found, torch.Tensor) else type(found).__name__
        raise CaptureError(
            f"no scalar loss found in the output ({type(output).__name__}; its loss is "
            f"{shape}). With loss_fn=None the model must return its loss: a scalar tensor, a "
            "ModelOutput/dict/dataclass with a 'loss' (Hugging Face models do when the batch "
            "has 'labels'), or a tuple whose first element is the loss. Otherwise pass a "
            "loss_fn(output, y).")
    return found


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields") and hasattr(value, "loss")


def step_loss(model: nn.Module, loss_fn: LossFn, batch: Any) -> torch.Tensor:
    """The loss of one training step on ``batch`` under the module's conventions (eager)."""
    return step_loss_and_output(model, loss_fn, batch)[0]


def step_loss_and_output(model: nn.Module, loss_fn: LossFn, batch: Any
                         ) -> tuple[torch.Tensor, Any]:
    """``step_loss`` and what the model returned (its loss in it, with ``loss_fn=None``)."""
    if loss_fn is None:
        output = call_model(model, batch)
        return loss_of(output), output
    if isinstance(batch, Mapping):
        output = call_model(model, batch)
        return loss_of(loss_fn(output, batch)), output
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        size = len(batch) if hasattr(batch, "__len__") else "?"
        raise CaptureError(
            f"with a loss_fn the batch must be (x, y) as a data loader yields it, or a dict; "
            f"got {type(batch).__name__} of length {size}. For a model that computes its own "
            "loss pass loss_fn=None and the model's input as the batch.")
    x, y = batch
    output = call_model(model, x)
    return loss_of(loss_fn(output, y)), output


@dataclass(frozen=True)
class BatchSignature:
    """What a batch must match to run a captured step: structure, constants, tensors.

    Attributes:
        spec: the pytree structure of the batch.
        constants: every non-tensor leaf, by flat position (they are baked into the graph).
        tensors: per tensor leaf, in order: (shape, dtype, device type).
        requires_grad: per tensor leaf, whether it asks for a gradient (its ``.grad`` is
            then computed, as ``loss.backward()`` computes it).
    """

    spec: TreeSpec
    constants: tuple[tuple[int, Any], ...]
    tensors: tuple[tuple[tuple[int, ...], torch.dtype, str], ...]
    requires_grad: tuple[bool, ...] = ()

    def describe(self) -> str:
        """A short human-readable form (for errors and stats)."""
        grads = self.requires_grad or (False,) * len(self.tensors)
        parts = [f"{list(s)}:{str(d).removeprefix('torch.')}{' (requires grad)' if g else ''}"
                 for (s, d, _), g in zip(self.tensors, grads, strict=True)]
        return f"({', '.join(parts)})"


def split_batch_leaves(batch: Any) -> tuple[list[torch.Tensor], BatchSignature]:
    """The batch's tensors (the graph inputs, in order) and its signature."""
    leaves, spec = tree_flatten(plain_batch(batch))
    tensors: list[torch.Tensor] = []
    consts: list[tuple[int, Any]] = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
        else:
            consts.append((i, _hashable(leaf)))
    sig = BatchSignature(spec=spec, constants=tuple(consts),
                         tensors=tuple((tuple(int(s) for s in t.shape), t.dtype, t.device.type)
                                       for t in tensors),
                         requires_grad=tuple(bool(t.requires_grad) for t in tensors))
    return tensors, sig


def announce_constant_replan(planned: Iterable[object], new: BatchSignature,
                             batch: Any, *, stacklevel: int = 5) -> None:
    """A ``ReplanWarning`` when ``new`` (a batch about to be captured and planned) differs
    from a planned signature only in non-tensor leaves (the same structure and tensors):
    those values are baked into the captured step, so a leaf that changes every batch (a
    list of sample ids or file names a collate function kept) re-plans every step. The
    message names the leaves (``batch['ids'][0]``) and how to stop it; it carries no values,
    so Python shows it once per call site."""
    for old in planned:
        if not isinstance(old, BatchSignature):
            continue
        if (old.spec, old.tensors, old.requires_grad) != (new.spec, new.tensors,
                                                          new.requires_grad):
            continue
        differ = {i for (i, a), (_, b) in zip(old.constants, new.constants, strict=True)
                  if a != b}
        if not differ:
            continue
        paths = [keystr(path) for i, (path, _) in
                 enumerate(tree_flatten_with_path(plain_batch(batch))[0]) if i in differ]
        shown = ", ".join(f"batch{path}" for path in paths[:3])
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        announce(f"the batch's non-tensor leaves {shown}{more} differ from those of a batch "
                 "already planned, with the same tensors: outcore bakes non-tensor values into "
                 "the captured step, so it captures and plans the step again for each new "
                 "value (a list of sample ids or file names that changes every batch re-plans "
                 "every step). If the model and loss do not read them, drop them from the "
                 "batch before the step (in the collate function); if they do, pass them as "
                 "tensors.", ReplanWarning, stacklevel=stacklevel)
        return


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class TrainingStep(nn.Module):
    """``(*batch tensors) -> (loss, *guards)``: the module that aot_autograd exports.

    The batch is rebuilt from its tensors and the constants recorded in ``signature``; the
    step runs under ``autocast`` when one is given (``(device_type, dtype)``).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn, example: Any,
                 autocast: tuple[str, torch.dtype] | None = None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self._skeleton = Skeleton.of(plain_batch(example))[0]
        self.autocast = autocast
        #: while specialising (``outcore.capture.specialize``): the tensors whose values the
        #: step read; they become extra outputs (guards) after the loss.
        self.guard_sink: list[torch.Tensor] | None = None
        #: the tensors the loss or a forward holds outside the model
        #: (``closed_over.held_outside``), found before a trace swaps the parameters: the
        #: model's are traced as the model's, the others guarded against changes in place
        #: (``Traced``; nothing found, the usual case: no mode entered)
        self.outside = held_outside(self, loss_fn)
        #: called before each pass of the trace (``outcore.capture.stashed``: the last
        #: pass's tensors taken off the modules); None outside a capture
        self.before_pass: Callable[[], None] | None = None
        #: the model's output kept: its tensors become outputs after the guards (copies,
        #: detached), its structure and other values ``output_spec`` (``ModelOutputs``)
        self.keep_outputs = False
        self.output_spec: ModelOutputs | None = None

    def rebuild(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        """The batch of the example's structure with these tensors in it."""
        return self._skeleton.rebuild(tensors)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch = self.rebuild(tensors)
        if self.before_pass is not None:
            self.before_pass()
        if self.guard_sink is not None:
            self.guard_sink.clear()  # one pass of tracing: its own reads
        with Traced(self, self.outside) if self.outside else contextlib.nullcontext():
            if self.autocast is None:
                loss, output = step_loss_and_output(self.model, self.loss_fn, batch)
            else:
                device_type, dtype = self.autocast
                with torch.autocast(device_type, dtype=dtype):
                    loss, output = step_loss_and_output(self.model, self.loss_fn, batch)
        rebound.settle()  # buffers the forward rebound: carried in place (capture/rebound.py)
        kept: tuple[torch.Tensor, ...] = ()
        if self.keep_outputs:
            self.output_spec, kept = ModelOutputs.split(output)
        return (loss, *guard_outputs(self.guard_sink or []), *kept)


#: a tensor's place among ``Skeleton.constants``
TENSOR = object()
#: the other values of a model's output kept as they are (others are given as None)
_PLAIN_OUTPUTS = (bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


@dataclass(frozen=True)
class Skeleton:
    """A pytree with its tensors taken out: its structure and every other leaf, so that
    ``rebuild`` puts tensors (the same number, in the same order) back in their places."""

    spec: TreeSpec
    constants: tuple[Any, ...]  # per leaf: the value, or ``TENSOR`` for a tensor

    @classmethod
    def of(cls, tree: Any, keep: Callable[[Any], Any] = lambda v: v
           ) -> tuple[Skeleton, list[torch.Tensor]]:
        """The skeleton of ``tree`` (each non-tensor leaf as ``keep`` gives it) and its
        tensors, in order."""
        leaves, spec = tree_flatten(tree)
        constants = tuple(TENSOR if isinstance(v, torch.Tensor) else keep(v) for v in leaves)
        return cls(spec, constants), [v for v in leaves if isinstance(v, torch.Tensor)]

    @property
    def tensor_count(self) -> int:
        return sum(c is TENSOR for c in self.constants)

    def rebuild(self, tensors: Sequence[torch.Tensor | None]) -> Any:
        """The tree with ``tensors`` in the tensors' places (None where one is not given)."""
        given = iter(tensors)
        leaves = [next(given) if c is TENSOR else c for c in self.constants]
        return tree_unflatten(leaves, self.spec)


class ModelOutputs(Skeleton):
    """The structure of what the model returned, for a step that keeps it
    (``outcore.compile(..., outputs=True)``): its tensors are the step's outputs after the
    guards, copied and detached (a copy, not a view: an output is held to the step's end,
    and a view would hold the activation it reads with it under every plan); its plain
    values (numbers, strings) are kept here as traced, and any other object (a key/value
    cache, which holds the trace's tensors) is given as None."""

    @classmethod
    def split(cls, output: Any) -> tuple[ModelOutputs, tuple[torch.Tensor, ...]]:
        skeleton, tensors = Skeleton.of(
            output, lambda v: v if isinstance(v, _PLAIN_OUTPUTS) else None)
        return (cls(skeleton.spec, skeleton.constants),
                tuple(t.detach().clone() for t in tensors))


def batch_of(args: tuple[Any, ...], loss_fn: LossFn) -> Any:
    """The batch a ``Trainer.step(*args)`` call means: ``step(x, y)`` is ``(x, y)``;
    ``step(batch)`` is the batch itself (mappings made plain dicts: ``plain_batch``)."""
    if len(args) == 1:
        return plain_batch(args[0])
    if len(args) == 2 and loss_fn is not None:
        return plain_batch((args[0], args[1]))
    raise TypeError(f"step() takes the batch, or x and y; got {len(args)} arguments"
                    if loss_fn is not None else
                    f"step() takes one batch (the model's input) when loss_fn is None; got "
                    f"{len(args)} arguments")


def own_storage(batch: Any) -> Any:
    """``batch`` with every tensor that is a view into a larger storage (``data[i:i + b]``
    sliced from a dataset tensor, a rank's share of the global batch) copied into a storage
    of its own size; tensors that require grad are left as they are (their ``.grad`` must
    reach the user's tensor), as is everything else.

    The memory rule sizes an input by its storage: a slice that views a whole dataset would
    be planned, moved and measured as the whole dataset. Captured and stepped with own
    storages, an input is counted at its own size, the same on every step.
    """
    def own(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.requires_grad:
            return t
        if t.untyped_storage().nbytes() == t.numel() * t.element_size():
            return t
        return t.clone(memory_format=torch.contiguous_format)

    return tree_map(own, batch)

"""Export a training step, specialising data-dependent Python control flow on its values.

A model that reads a tensor's value in Python (``if mask.all():``, ``.item()``, ``int(t)``,
``t.tolist()``, ``t.numpy()`` or ``np.asarray(t)``: DETR's Hungarian matching hands its cost
matrix to SciPy) cannot be one static graph: tracing with fake tensors stops at
``aten._local_scalar_dense``. Hugging Face models do this on their inputs (BART checks its
padding mask). When a value is the same at every step, outcore specialises on it:

1. the step runs once eagerly (no gradient; RNG state and buffers restored afterwards), and
   every value read this way is recorded, in order;
2. the step is exported again with those reads answered by the recorded values, and each
   tensor read becomes an extra output of the graph (a *guard*);
3. every executed step compares the guards with the recorded values before anything is
   applied (``CapturedStep.check_guards``); on a mismatch the step raises
   ``SpecializationMismatch`` and the Trainer captures and plans the step again for the new
   values.

A fake capture (``fake=True``) has no values to specialise on: it keeps the CaptureError.

Boolean masks that set a shape (``t[mask]``, ``nonzero``, ``masked_select``, ...) are
specialised the same way, among the reads and in the same order (``outcore.capture.value_shapes``):
the mask is the guard, and the trace indexes with the recorded positions.

Invariant: one read in the step's code is one guard, in the eager run and in every trace
alike. The tensor subclasses tracing runs on override some readers (``FunctionalTensor`` and
``FakeTensor`` implement ``tolist`` as one ``item()`` per element, ``FunctionalTensor`` its
``__bool__`` as ``item()``), so the readers are patched on every class that defines one, and
each replayed read is checked against its guard's reader and shape: a trace that reads in
another order is refused, never answered with another read's value. A read that only eager
makes (formatting a tensor into a string: ``Tensor.__format__`` reads ``item()`` on a plain
tensor, a traced one prints its metadata) is not recorded (``_formatting_reads_nothing``);
recorded, it shifted every later answer by one read.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._subclasses.fake_tensor  # loaded, so _reader_owners finds the classes tracing
import torch._subclasses.functional_tensor  # runs on
from torch import nn

from outcore.capture import host_random
from outcore.capture.value_shapes import (
    MASK_READER,
    VALUES_READER,
    Compute,
    ValueShapes,
    ctc_loss_traced,
)
from outcore.errors import CaptureError

#: Tensor methods that read a value into Python (each dispatches ``_local_scalar_dense``).
_READERS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__",
            "numpy", "__array__")
#: readers whose value is a NumPy array (copied when recorded and when answered: the array
#: eager returns shares the tensor's memory, and the model may write into it)
_ARRAYS = ("numpy", "__array__")

_DATA_DEPENDENT = ("DataDependent", "GuardOnDataDependent", "data-dependent",
                   "_local_scalar_dense", "nonzero", "item()", "DynamicOutputShapeException",
                   ".numpy() is not supported for tensor subclasses")


@dataclass(frozen=True)
class ScalarGuard:
    """One value the captured step was specialised on: how it was read and what it was.

    A guard of ``outcore.capture.value_shapes`` (``reader`` ``MASK_READER`` or
    ``VALUES_READER``) holds the tensor itself as ``value`` and what the op made of it as
    ``outputs`` (a mask's positions, ``unique``'s results), replayed in the trace."""

    reader: str
    value: Any
    #: the shape of the tensor read (a replayed read of another shape is another read)
    shape: tuple[int, ...] = ()
    outputs: tuple[torch.Tensor, ...] = field(default=(), compare=False)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` (the guard output of a step) reads as the recorded value."""
        if self.reader in (MASK_READER, VALUES_READER):
            return torch.equal(tensor.to(self.value.device), self.value)
        if self.reader in _ARRAYS:
            import numpy as np

            read = tensor.detach().cpu().numpy()
            return read.shape == self.value.shape and bool(
                np.array_equal(read.astype(self.value.dtype), self.value))
        return bool(getattr(tensor, self.reader)() == self.value)

    def describe(self) -> str:
        """The read, for messages."""
        if self.reader == MASK_READER:
            return (f"a boolean mask of shape {self.shape} selecting "
                    f"{int(self.value.sum())} elements (t[mask], nonzero, masked_select)")
        if self.reader == VALUES_READER:
            return f"the values of a tensor of shape {self.shape} (unique, bincount)"
        return (f"a tensor value read with .{self.reader}() being {self.value!r} (of a "
                f"tensor of shape {self.shape})")


def _reader_owners() -> list[type]:
    """``torch.Tensor`` and every loaded subclass of it that defines a reader of its own."""
    owners: list[type] = [torch.Tensor]
    seen: set[type] = set()
    todo = list(torch.Tensor.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        if any(name in vars(cls) for name in _READERS):
            owners.append(cls)
    return owners


@contextlib.contextmanager
def _patched(hook: Callable[[str, Callable[..., Any], torch.Tensor], Any]) -> Iterator[None]:
    """Route every reader through ``hook(reader, original, tensor)`` for the duration: on
    ``torch.Tensor`` and on each subclass that overrides a reader (``_reader_owners``)."""
    # (class, reader, its own attribute or None where it inherits torch's C method)
    originals = [(cls, name, vars(cls).get(name))
                 for cls in _reader_owners() for name in _READERS
                 if cls is torch.Tensor or name in vars(cls)]

    def make(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def reader(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if args or kwargs:  # numpy(force=True), __array__(dtype)
                return hook(name, lambda t: original(t, *args, **kwargs), self)
            return hook(name, original, self)
        return reader

    try:
        for cls, name, own in originals:
            setattr(cls, name, make(name, own if own is not None else getattr(cls, name)))
        yield
    finally:
        for cls, name, own in originals:
            if own is None:
                delattr(cls, name)
            else:
                setattr(cls, name, own)


@contextlib.contextmanager
def _formatting_reads_nothing(depth: list[int]) -> Iterator[None]:
    """While the eager run records: a tensor formatted into a string (``f"tokens: {n}"``,
    the messages of Hugging Face's checks; ``print(t)``, ``repr(t)``) reads its values
    through ``item()`` in eager, but not when traced (a tensor subclass prints its
    metadata). Such a read is not recorded, so the trace's reads line up with the eager
    run's: LLaVA's and PaliGemma's placeholder check answered its ``_is_all_true().item()``
    with the token count formatted before it ("cond must be a bool, but got int")."""
    originals = {name: vars(torch.Tensor)[name] for name in ("__format__", "__repr__")}

    def unread(original: Callable[..., str]) -> Callable[..., str]:
        def text(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        return text

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, unread(original))
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def record_reads(step: nn.Module, args: tuple[torch.Tensor, ...]) -> list[ScalarGuard]:
    """Run ``step`` once eagerly without gradient and return every value it read."""
    seen: list[ScalarGuard] = []
    depth = [0]

    def hook(name: str, original: Callable[..., Any], tensor: torch.Tensor) -> Any:
        if depth[0]:  # a reader calling another (tolist -> item): record the outer one
            return original(tensor)
        depth[0] += 1
        try:
            value = original(tensor)
        finally:
            depth[0] -= 1
        kept = value.copy() if name in _ARRAYS else value
        seen.append(ScalarGuard(name, kept, tuple(tensor.shape)))
        return value

    def specialise(reader: str, t: torch.Tensor, compute: Compute) -> tuple[torch.Tensor, ...]:
        found = compute(t)
        seen.append(ScalarGuard(reader, t.detach().clone(), tuple(t.shape),
                                tuple(f.detach().clone() for f in found)))
        return found

    buffers = [(b, b.detach().clone()) for b in step.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        with torch.no_grad(), _patched(hook), ValueShapes(specialise), ctc_loss_traced(), \
                _formatting_reads_nothing(depth):
            step(*args)
    finally:
        with torch.no_grad():
            for buf, saved in buffers:
                buf.copy_(saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return seen


def _same(value: Any) -> Any:
    return value


_CONVERT: dict[str, Callable[[Any], Any]] = {"__bool__": bool, "__int__": int,
                                              "__index__": int, "__float__": float,
                                              "__complex__": complex,
                                              "numpy": lambda a: a.copy(),
                                              "__array__": lambda a: a.copy()}


@contextlib.contextmanager
def replaying(guards: list[ScalarGuard], sink: list[torch.Tensor]) -> Iterator[None]:
    """Answer each read with the next recorded value, each mask with its recorded positions;
    the tensor read (the mask) goes to ``sink``."""
    def next_guard(name: str, tensor: torch.Tensor) -> ScalarGuard:
        # the export traces the step more than once; TrainingStep.forward empties the sink
        # at the start of each pass, so the sink's length is the position in this pass
        what = {MASK_READER: "boolean mask", VALUES_READER: "tensor's values"}.get(
            name, f".{name}()")
        if len(sink) >= len(guards):
            raise CaptureError(
                f"the model read more tensor values ({what}) while tracing than when it ran "
                "eagerly, so outcore cannot specialise on them; make the branch depend on "
                "shapes or Python values, or use torch.where")
        guard = guards[len(sink)]
        if name != guard.reader or tuple(tensor.shape) != guard.shape:
            raise CaptureError(
                f"while tracing, the model's read number {len(sink) + 1} of a tensor value was "
                f"{what} of a tensor of shape {tuple(tensor.shape)}, but when it ran "
                f"eagerly it was {guard.describe()}; outcore cannot specialise on reads that "
                "differ between runs. Make the branch depend on shapes or Python values, or "
                "use torch.where")
        sink.append(tensor.detach())  # copied when the step returns (``guard_outputs``)
        return guard

    def hook(name: str, original: Callable[..., Any], tensor: torch.Tensor) -> Any:
        return _CONVERT.get(name, _same)(next_guard(name, tensor).value)

    def specialise(reader: str, t: torch.Tensor, compute: Compute) -> tuple[torch.Tensor, ...]:
        return next_guard(reader, t).outputs

    with _patched(hook), ValueShapes(specialise):
        yield
    if len(sink) != len(guards):
        raise CaptureError("the traced step read fewer tensor values than the eager run; "
                           "outcore cannot specialise this model's control flow")


def guard_outputs(sink: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The step's guard outputs: a copy of each traced tensor read, not a view. A guard
    output is kept to the step's end, and a view would keep the activation it reads from (a
    mask) alive with it under every plan: vdnn-dyn offloaded Qwen3-VL's image-token mask and
    prefetched it back while the guard's view still held it (an invalid schedule). Copied
    here, when the step returns, not where the value is read: a read can happen inside
    ``torch.tensor([...])``'s own construction, where a copy crashed the process. A plain
    tensor is a constant of the trace (``NodeMap.constant_guards``), whose storage the trace
    may hold unallocated: not copied."""
    return tuple(t if type(t) is torch.Tensor else t.clone() for t in sink)


def export_step(stack: contextlib.ExitStack, step: nn.Module, args: tuple[Any, ...],
                fake: bool) -> tuple[Any, list[ScalarGuard]]:
    """Export ``step(*args)`` as one joint graph; specialise on read values when needed.

    Returns the export and the guards it was specialised on (empty when it was not).
    Numbers the step drew from NumPy's or Python's generators are checked: a step that
    depends on them is refused (``outcore.capture.host_random``; a fake capture, which only
    plans, is not checked).
    """
    before = host_random.state()
    result = _specialised(stack, step, args, fake, before)
    after = host_random.state()
    if fake or host_random.same(before, after):
        return result
    _refuse_host_draws_that_matter(step, args)
    host_random.set_state(after)
    return result


def _refuse_host_draws_that_matter(step: nn.Module, args: tuple[Any, ...]) -> None:
    """Export the step in ``host_random``'s two forced worlds; refuse unless both graphs are
    the same."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    prints = []
    sites: set[str] = set()
    for world in (0, 1):  # outside the fake mode the first export keeps open
        with unset_fake_temporarily(), contextlib.ExitStack() as scratch, \
                host_random.forced(world, sites):
            try:
                joint, _ = _specialised(scratch, step, args, False, host_random.state())
            except CaptureError as err:
                raise host_random.refuse(sites) from err
            prints.append(host_random.fingerprint(joint.graph_module))
    if not host_random.same_graph(*prints):
        raise host_random.refuse(sites)


#: models whose step was specialised when last captured: the next capture (a guard failed)
#: goes straight to the eager run and the replayed trace, without first tracing plainly to
#: meet the read again (half of a re-capture's time: DETR's 4.5 s -> 2.3 s)
_SPECIALISED: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def _specialised(stack: contextlib.ExitStack, step: nn.Module, args: tuple[Any, ...],
                 fake: bool, drawn_from: host_random.HostState) -> tuple[Any, list[ScalarGuard]]:
    """``export_step`` without the host-draw check; the eager run and the trace of a
    specialised step each start from the generators' state ``drawn_from``, so both draw
    what the first export drew."""
    model = getattr(step, "model", None)
    if not fake and model is not None and model in _SPECIALISED:
        guards = _recorded(step, args, drawn_from)
        if guards:
            return _replayed(stack, step, args, guards, drawn_from), guards
        host_random.set_state(drawn_from)  # it reads nothing now: a plain trace
    first = contextlib.ExitStack()  # the export's modes stay entered only if it succeeds
    try:
        result = _export(first, step, args)
    except CaptureError as err:
        first.close()
        if fake or not _is_data_dependent(err):
            raise
        failure = err
    else:
        stack.enter_context(first)
        return result, []
    guards = _recorded(step, args, drawn_from)
    if not guards:  # no value read: a rewrite that needs none (torch.equal of two shapes),
        replay = contextlib.ExitStack()  # or a shape no rewrite covers (bincount by weights)
        try:
            result = _replayed(replay, step, args, [], drawn_from)
        except Exception:  # noqa: BLE001 - the first failure is the one to report
            replay.close()
            raise failure from None
        stack.enter_context(replay)
        return result, []
    if model is not None:
        _SPECIALISED[model] = True
    return _replayed(stack, step, args, guards, drawn_from), guards


def _recorded(step: nn.Module, args: tuple[Any, ...],
              drawn_from: host_random.HostState) -> list[ScalarGuard]:
    host_random.set_state(drawn_from)
    return record_reads(step, args)


def _replayed(stack: contextlib.ExitStack, step: nn.Module, args: tuple[Any, ...],
              guards: list[ScalarGuard], drawn_from: host_random.HostState) -> Any:
    sink: list[torch.Tensor] = []
    setattr(step, "guard_sink", sink)  # noqa: B010 - read by TrainingStep.forward
    host_random.set_state(drawn_from)
    try:
        with replaying(guards, sink):
            return _export(stack, step, args)
    finally:
        setattr(step, "guard_sink", None)  # noqa: B010


def _is_data_dependent(err: BaseException) -> bool:
    text = f"{err} {err.__cause__}"
    return any(marker in text for marker in _DATA_DEPENDENT)


def _export(stack: contextlib.ExitStack, step: nn.Module, args: tuple[Any, ...]) -> Any:
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    from outcore.capture.closed_over import real_constants_allowed
    from outcore.capture.traced_as_eager import traced_as_eager

    try:  # a tensor the step closes over becomes a constant (``closed_over``)
        with traced_as_eager(), real_constants_allowed(), ctc_loss_traced():
            return aot_export_joint_with_descriptors(stack, step, args)
    except CaptureError:
        raise
    except Exception as exc:  # torch raises many types here; keep its reason
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, CaptureError):
            cause = cause.__cause__
        if isinstance(cause, CaptureError):
            raise cause from None
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CaptureError(f"could not capture the training step as one graph: "
                           f"{type(exc).__name__}: {first}. {_way_out(exc)}") from exc


def _way_out(exc: BaseException) -> str:
    """What the user can change, for the common reasons a step cannot be one graph."""
    text = f"{type(exc).__name__} {exc}"
    if "DynamicOutputShapeException" in text:
        return ("PyTorch has no shape rule for that op on fake tensors: the shape of what it "
                "makes depends on its inputs' values (torch.compile breaks the graph there "
                "too; bincount by weights is one). On a real capture outcore "
                "specialises on boolean masks (t[mask], nonzero, masked_select, "
                "torch.where(mask)) and on values read in Python (.item(), an `if` on a "
                "tensor), capturing the step again when they change; it cannot with "
                "fake=True, nor on a shape another op makes. Keep the shapes fixed: "
                "torch.where(mask, t, 0) or t * mask (and "
                "mask.sum() where a mean over the selected elements is meant), masked_fill, "
                "or select the rows in the data loader; a mixture of experts keeps them fixed "
                "by sorting the tokens by expert and running F.grouped_mm over the groups "
                "(offs: the running count per expert), as Hugging Face transformers 5 does; "
                "otherwise train this model eagerly.")
    if any(marker in text for marker in _DATA_DEPENDENT):
        return _way_out_text(data_dependent=True)
    if "unsupported format string passed to" in text and "Tensor" in text:
        return ("The model or the loss formats a tensor with a format spec (f'{t:.3f}', "
                "'{:.3f}'.format(t)); outcore traces the step on tensor subclasses, which "
                "cannot be formatted so, and a planned step does not run the forward's "
                "Python again, so the text would not be printed at each step anyway. Print "
                "outside the model (trainer.step returns the loss), or without a spec "
                "(f'{t}').")
    if "Unexpected fake buffer" in text and "_constant" in text:
        return ("The model was built under FakeTensorMode and the step reads a fake tensor "
                "that is neither a parameter, a buffer nor part of the batch, held where "
                "outcore does not look for one (a list or dict attribute, a variable the loss "
                "closes over); a plain tensor attribute of a module is taken as a buffer. "
                "Register it as a buffer (module.register_buffer('w', w, persistent=False)), "
                "or make it outside FakeTensorMode.")
    if "entirely functional graph" in text and "_constant" in text:
        return ("The model or the loss changes in place a tensor that is neither a "
                "parameter, a buffer nor part of the batch (a tensor the loss closes over, a "
                "plain tensor attribute: w.mul_(...), self.count += 1); outcore reads such a "
                "tensor as a constant of the step, which the step cannot change. Register it "
                "as a buffer (module.register_buffer('w', w); a loss module's buffer for a "
                "loss), whose changes the step carries, or change a copy (w = w * ...).")
    if "non-Fake Tensor" in text or "allow_non_fake_inputs" in text:
        return ("The model or the loss changes the shape or strides of a tensor in place "
                "(resize_, t_, as_strided_, ...) that is neither a parameter, a buffer nor "
                "part of the batch (a plain tensor attribute, a tensor the loss closes over): "
                "outcore reads such a tensor as a constant of the step, which cannot change "
                "shape. Change a copy instead (t = t.t()), or register it as a buffer "
                "(module.register_buffer('t', t)).")
    if "Unsupported" in text or "graph break" in text.lower():
        return ("The model calls something that cannot be traced (a graph break). Rewrite that "
                "call with torch operations, or keep it out of the model.")
    return _way_out_text(data_dependent=False)


def _way_out_text(data_dependent: bool) -> str:
    if data_dependent:
        return ("The model's control flow or shapes depend on tensor values (an `if` on a "
                "tensor, `.item()`, `nonzero`). outcore specialises on the example's values "
                "when the capture is real; with fake=True it cannot. Make the branch depend on "
                "shapes or Python values, use torch.where, or move that part out of the model "
                "(e.g. into the data loader).")
    return ("Check that model(x) and loss_fn(output, y) run eagerly on the example batch; "
            "outcore traces them with fake tensors, so code that needs real values fails here.")

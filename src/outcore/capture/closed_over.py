"""Tensors a step reads that are neither parameters, buffers nor batch: lifted constants.

A loss often closes over a tensor (``lambda o, y: F.cross_entropy(o, y, weight=w)``, a
``pos_weight`` for BCE-with-logits, a fixed mask, a class prior added to the logits), and a
model may keep a plain tensor attribute (``self.t = torch.ones(5)``, not a buffer). Capture
traces with fake tensors and lets such a real tensor through (``real_constants_allowed``):
the export records it as a ``get_attr`` constant of the joint graph whose value *is* the
user's tensor object, and every step binds it from there (``CapturedStep.static_values``),
so a change made in place between steps (``w.mul_(2)``) is read by the next step, as eager
reads it.

Where the tensor came from is looked up by identity (``origins``): an attribute of a module
of the step (the model's or a loss module's, or an item of a list/tuple/dict attribute), a
variable a function closes over or a global it names (or an item of a list or tuple held
there), an argument of a ``functools.partial``, an attribute of a callable object. The
functions looked at are the loss function (and the functions it closes over or names, a
few levels down) and every module's ``forward``. Each step reads the place again (``Origin.read``):

* the same object: bound as it is;
* another tensor of the same shape, dtype and device that needs no gradient (the name or
  attribute was rebound, ``w = new_w``): followed, as eager follows it;
* anything else: ``ConstantRebound`` before anything is applied; ``outcore.compile``'s
  Trainer captures and plans the step again for it (another shape is another graph).

A tensor found in none of those places (deeper in a Python object) is bound as captured:
changes in place are seen, a rebinding is not (the guide says so).

A parameter or buffer of the model held in a variable outside it (an L2 term over
``params = list(model.parameters())`` in the loss, a loss reading ``model.bn.running_mean``
through a variable), found where ``origins`` looks (``held_outside``), is not a constant:
while the step is traced, ``Traced`` swaps the user's tensor for the one the trace holds
for that parameter or buffer in every torch call, so its gradient sums both uses, as
eager's does. ``Traced`` also refuses a call that would change a found constant in place
(``w.mul_(0.5)`` in the loss, ``self.count += 1`` on a plain attribute) before it runs:
the graph cannot change a constant, and the trace would have changed the user's tensor
(twice). It is entered only when something was found (it costs about a tenth of a
capture's time).

Any other constant that requires grad (a closed-over leaf with ``requires_grad=True``, a
tensor computed from a parameter outside the step) would get no gradient from the graph,
where eager gives it one: ``lifted`` refuses it with a CaptureError naming it (where,
shape, dtype, device) and what to do. Invariant: a captured step has no constant that
requires grad.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map_only

from outcore.errors import CaptureError

#: nn.Module's own attributes (``_parameters``, hooks, ``training``): not user tensors
_MODULE_OWN = frozenset(vars(nn.Module()))
#: how many functions deep the walk from the loss function goes (helpers it calls)
_DEPTH = 3
#: a list, tuple or dict is looked into up to this many items (a longer one is data)
_MAX_ITEMS = 256


@dataclass(frozen=True)
class Origin:
    """Where a lifted tensor lives: ``where`` says it for messages; ``read()`` gives what is
    there now (None when it is gone)."""

    where: str
    read: Callable[[], Any]


#: Tensor methods that change their tensor in place without a trailing "_" in their name
_IN_PLACE = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                       "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                       "__irshift__", "__imatmul__", "__setitem__"})


@dataclass(frozen=True)
class Outside:
    """The tensors a step holds outside its model, found before it is traced
    (``held_outside``): ``live``, ``id`` -> name of the model's parameters and buffers held
    there; ``constants``, ``id`` -> where of the other tensors (lifted constants)."""

    live: dict[int, str]
    constants: dict[int, str]

    def __bool__(self) -> bool:
        return bool(self.live or self.constants)


def held_outside(step: nn.Module, loss_fn: Any) -> Outside:
    """What ``origins`` finds outside the model of ``step`` (``Outside``). A parameter held
    deeper is not redirected and is refused as a constant that requires grad (a buffer is
    then bound as the constant it is at the step's start)."""
    places = origins(step, loss_fn)
    named = [*step.named_parameters(remove_duplicate=False),
             *step.named_buffers(remove_duplicate=False)]
    live = {id(t): name for name, t in named if id(t) in places}
    return Outside(live, {i: o.where for i, o in places.items() if i not in live})


class Traced(TorchFunctionMode):
    """While the step is traced, in every torch call: an argument that is one of
    ``module``'s parameters or buffers as the user holds it outside the model
    (``Outside.live``, taken before the trace swapped them) is replaced by the tensor the
    trace holds under that name now; a call that would change one of ``Outside.constants``
    in place raises CaptureError before it runs (the graph cannot change a constant, and the
    trace would have changed the user's tensor)."""

    def __init__(self, module: nn.Module, outside: Outside) -> None:
        super().__init__()
        self.module = module
        self.outside = outside

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE:
            self._refuse_change(name, args[0] if args else None)
        if "out" in kwargs:
            self._refuse_change(name, kwargs["out"])
        if not self.outside.live:
            return func(*args, **kwargs)
        found: dict[str, torch.Tensor] = {}

        def swap(value: torch.Tensor) -> torch.Tensor:
            held = self.outside.live.get(id(value))
            if held is None:
                return value
            if not found:
                found.update(self.module.named_parameters(remove_duplicate=False))
                found.update(self.module.named_buffers(remove_duplicate=False))
            return found.get(held, value)

        args, kwargs = tree_map_only(torch.Tensor, swap, (args, kwargs))
        return func(*args, **kwargs)

    def _refuse_change(self, name: str, target: Any) -> None:
        where = self.outside.constants.get(id(target)) if isinstance(target, torch.Tensor) \
            else None
        if where is None:
            return
        raise CaptureError(
            f"the step changes {where} ({describe(target)}) in place ({name}): outcore reads "
            "a tensor that is neither a parameter, a buffer nor part of the batch as a "
            "constant of the step, which the step cannot change. Register it as a buffer "
            "(module.register_buffer(...); a loss module's buffer for a loss), whose changes "
            "the step carries, or change a copy (w = w * ...).")


@contextlib.contextmanager
def real_constants_allowed() -> Iterator[None]:
    """Let every fake mode take real tensors as constants for the block (thread-local)."""
    from torch._subclasses.fake_tensor import fake_tensor_tls

    before = fake_tensor_tls.allow_non_fake_inputs_override
    fake_tensor_tls.allow_non_fake_inputs_override = True
    try:
        yield
    finally:
        fake_tensor_tls.allow_non_fake_inputs_override = before


def describe(value: torch.Tensor) -> str:
    """``[3] float32 on cpu``: a tensor's shape, dtype and device for messages."""
    return (f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')} on "
            f"{value.device}")


def same_kind(new: Any, old: torch.Tensor) -> bool:
    """Whether ``new`` can stand in for ``old`` in the captured graph (the rebinding is
    followed): a tensor of the same shape, dtype and device that needs no gradient."""
    return (isinstance(new, torch.Tensor) and not new.requires_grad
            and new.shape == old.shape and new.dtype == old.dtype
            and new.device == old.device)


def origins(step: nn.Module, loss_fn: Any) -> dict[int, Origin]:
    """``id(tensor) -> Origin`` for every tensor the step could read (module docstring); the
    first place found wins. ``step``: the ``TrainingStep`` (its submodules are the model and
    a loss module); ``loss_fn``: the loss function when it is not a module."""
    found: dict[int, Origin] = {}
    seen: set[int] = set()
    for path, module in step.named_modules():
        if not path:
            continue
        _attributes(module, path, found)
        forward = getattr(type(module), "forward", None)
        if isinstance(forward, types.FunctionType):
            _function(forward, found, seen, 1)
    if loss_fn is not None and not isinstance(loss_fn, nn.Module):
        _function(loss_fn, found, seen, 0)
    return found


def _add(found: dict[int, Origin], value: Any, where: str, read: Callable[[], Any]) -> None:
    if isinstance(value, torch.Tensor) and id(value) not in found:
        found[id(value)] = Origin(where, read)


def _attributes(obj: Any, label: str, found: dict[int, Origin]) -> None:
    """The tensors ``obj`` holds as attributes, and one level into lists, tuples, dicts."""
    try:
        names = vars(obj)
    except TypeError:
        return
    for name, value in list(names.items()):
        if isinstance(obj, nn.Module) and name in _MODULE_OWN:
            continue
        _add(found, value, f"attribute {label}.{name}", _reader(names, name))
        if isinstance(value, (list, tuple)) and len(value) <= _MAX_ITEMS:
            for i, item in enumerate(value):
                _add(found, item, f"attribute {label}.{name}[{i}]",
                     _item_reader(names, name, i))
        elif isinstance(value, dict) and len(value) <= _MAX_ITEMS:
            for key, item in value.items():
                _add(found, item, f"attribute {label}.{name}[{key!r}]",
                     _item_reader(names, name, key))


def _reader(space: dict[str, Any], name: str) -> Callable[[], Any]:
    return lambda: space.get(name)


def _item_reader(space: dict[str, Any], name: str, key: Any,
                 call: bool = False) -> Callable[[], Any]:
    """Reads ``space[name][key]`` (``call``: ``space[name]()[key]``), None when gone."""
    def read() -> Any:
        try:
            held = space.get(name)
            return (held() if call else held)[key]  # type: ignore[index,misc]
        except (KeyError, IndexError, TypeError):
            return None
    return read


def _cell_reader(cell: Any) -> Callable[[], Any]:
    def read() -> Any:
        try:
            return cell.cell_contents
        except ValueError:  # an empty cell
            return None
    return read


def code_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code nested in it (lambdas, comprehensions) use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def _function(fn: Any, found: dict[int, Origin], seen: set[int], depth: int) -> None:
    """The tensors ``fn`` closes over or names as globals, and those of the functions it
    holds the same way, ``_DEPTH`` levels down."""
    if depth > _DEPTH or id(fn) in seen:
        return
    seen.add(id(fn))
    if isinstance(fn, functools.partial):
        label = f"the functools.partial of {getattr(fn.func, '__qualname__', fn.func)!r}"
        for i, arg in enumerate(fn.args):
            _add(found, arg, f"argument {i} of {label}", _item_reader({"a": fn.args}, "a", i))
        for key, arg in fn.keywords.items():
            _add(found, arg, f"argument {key}= of {label}", _reader(fn.keywords, key))
        _function(fn.func, found, seen, depth + 1)
        return
    if isinstance(fn, types.MethodType):
        if not isinstance(fn.__self__, nn.Module):
            _attributes(fn.__self__, type(fn.__self__).__name__, found)
        _function(fn.__func__, found, seen, depth)
        return
    if not isinstance(fn, types.FunctionType):  # a callable object: its attributes, __call__
        if not isinstance(fn, (nn.Module, type)) and callable(fn):
            _attributes(fn, type(fn).__name__, found)
            _function(inspect.getattr_static(type(fn), "__call__", None), found, seen,
                      depth + 1)
        return
    name = fn.__qualname__
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        read = _cell_reader(cell)
        value = read()
        _add(found, value, f"variable {var!r} that {name} closes over", read)
        if isinstance(value, (list, tuple)) and len(value) <= _MAX_ITEMS:
            for i, item in enumerate(value):
                _add(found, item, f"variable {var!r}[{i}] that {name} closes over",
                     _item_reader({"v": read}, "v", i, call=True))
        if callable(value):
            _function(value, found, seen, depth + 1)
    space = fn.__globals__
    for var in sorted(code_names(fn.__code__)):
        value = space.get(var)
        where = f"global {var!r} of module {fn.__module__} (read by {name})"
        _add(found, value, where, _reader(space, var))
        if isinstance(value, (list, tuple)) and len(value) <= _MAX_ITEMS:
            for i, item in enumerate(value):
                _add(found, item, f"{where}, item {i}", _item_reader(space, var, i))
        if isinstance(value, (types.FunctionType, functools.partial)):
            _function(value, found, seen, depth + 1)


def lifted(gm: fx.GraphModule, step: nn.Module, loss_fn: Any) -> dict[str, Origin]:
    """``get_attr`` target -> Origin for each tensor constant of ``gm`` that is a user's
    tensor found by ``origins`` (fresh constants the forward built are not), after
    ``refuse_trained``."""
    places = origins(step, loss_fn)
    out: dict[str, Origin] = {}
    constants = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for target in sorted(constants):
        value = getattr(gm, target, None)
        if not isinstance(value, torch.Tensor):
            continue
        origin = places.get(id(value))
        if value.requires_grad:
            raise _trained(value, origin, step)
        if origin is not None:
            out[target] = origin
    return out


def _trained(value: torch.Tensor, origin: Origin | None, step: nn.Module) -> CaptureError:
    """The refusal of a constant that requires grad (module docstring)."""
    where = origin.where if origin is not None else "a tensor held outside the model"
    what = f"{where} ({describe(value)})"
    param = next((name for name, p in step.named_parameters() if p is value), None)
    if param is not None:
        return CaptureError(
            f"the step reads the model's parameter {param.removeprefix('model.')} through "
            f"{what}, outside the model: the trace sees it as a constant and would give it no "
            "gradient there. Read it through the model inside the loss (a loss_fn that uses "
            "model.<path>.weight, or a loss module holding the model) or compute that term "
            "in the model's forward." + ("" if origin is not None else
            " Where a custom autograd.Function's backward reads it (a module kept on ctx, "
            "ctx.layer.weight), pass the parameter to Function.apply as an input and save "
            "it with ctx.save_for_backward."))
    return CaptureError(
        f"the step reads {what}, which requires grad but is neither a parameter of the "
        "model nor of a loss module: outcore lifts it as a constant of the graph, so it would "
        "get no gradient where eager PyTorch gives it one. To train it, make it an "
        "nn.Parameter of the model or of a loss module (nn.Module attribute); if it is not "
        "trained, pass it detached (w.detach(), or w.requires_grad_(False)).")

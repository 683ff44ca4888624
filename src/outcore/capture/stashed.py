"""Tensors the traced forward left on the model's modules, put back as they were.

A forward may store a tensor on a module (``self.last_attention = probs.detach()``, a
list of per-call statistics ``self.history.append(loss.detach())``, a table built on the
first call and cached, as rotary embeddings do). While a step is captured those are the
trace's tensors (``FunctionalTensor`` or fake ones): the capture failed when a second pass
of the trace (aot_autograd traces the forward twice) read the first pass's cached table
("Unexpected fake buffer"), and after the capture they raised "Attempting to use
FunctionalTensor on its own" wherever they were read (by the user, or by the model's own
next eager forward: an evaluation). Later steps run the captured graph, not that Python
code, so they would never hold a step's values as eager's forward leaves them.

The same holds for a list or dict the step's own code fills (a forward hook collecting
features, ``features[name] = output.detach()``, into a dict it closes over or a global).
``Stashes(roots)`` takes each module's attributes (torch's own bookkeeping left out), the
lists and dicts the modules' ``forward``s, the forward hooks and a loss function close
over or name as globals (``_containers``), and a shallow copy of each list, tuple and dict
among them; ``restore()`` puts back every attribute that holds a traced tensor now,
directly or one container level down (one the capture added is removed; a list appended to
in place gets its old items back), and refills every such container that holds one. A
private attribute (``_name``) is put back without a word: a module's own bookkeeping, as
``nn.LSTM``'s ``_flat_weights`` (the list of its weights, which the capture left holding the
trace's tensors after putting the parameters back: every RNN model before session 31), and
so is one that torch's own forward pre-hooks recompute at every call (old-style
``weight_norm`` / ``spectral_norm``'s ``weight``). The
capture calls it before each pass of the trace (``TrainingStep.before_pass``) and at its
end (``kept``), and says what it put back (``note``).

Invariant: after ``restore()`` no attribute of the roots' modules (one container level
deep) holds a tensor made by a trace that it did not hold when ``Stashes`` was made.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.nn.modules import module as module_mod

from outcore.capture.closed_over import code_names

#: ``nn.Module``'s own attributes (parameters, buffers, submodules, hooks, ``training``)
_TORCH_OWN = frozenset(vars(nn.Module()))
_CONTAINERS = (list, tuple, dict)


def _traced(value: Any) -> bool:
    """Whether ``value`` is, or a list / tuple / dict directly holds, a trace's tensor."""
    if isinstance(value, torch.Tensor):
        return isinstance(value, (FunctionalTensor, FakeTensor))
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, (list, tuple)) and any(
        isinstance(v, (FunctionalTensor, FakeTensor)) for v in value)


def _as_before(value: Any, old: tuple[Any, Any] | None) -> bool:
    """Whether ``value`` is the object ``old`` recorded, with the same items (a fake model's
    own fake tensors, held before the capture, stay)."""
    if old is None or value is not old[0]:
        return False
    if isinstance(value, dict):
        return value.keys() == old[1].keys() and all(value[k] is old[1][k] for k in value)
    if isinstance(value, (list, tuple)):
        return len(value) == len(old[1]) and all(a is b for a, b in zip(value, old[1], strict=True))
    return True


def _refill(container: list[Any] | dict[Any, Any], items: Any) -> None:
    """``container``'s items made ``items`` again, in place."""
    if isinstance(container, list):
        container[:] = items
    else:
        container.clear()
        container.update(items)


def _copy(value: Any) -> Any:
    return type(value)(value) if type(value) in _CONTAINERS else None


def _functions(roots: tuple[Any, ...]) -> Iterator[tuple[str, Any]]:
    """(what, function) for the code a step runs besides torch's: each module class's
    ``forward``, the forward hooks and pre-hooks (the modules' and the global ones), and a
    loss function that is not a module."""
    for root in roots:
        if isinstance(root, nn.Module):
            for path, module in root.named_modules():
                where = path or type(root).__name__
                yield f"{type(module).__name__}.forward", type(module).forward
                for hook in (*module._forward_pre_hooks.values(),
                             *module._forward_hooks.values()):
                    yield f"a forward hook of module {where!r}", hook
        elif callable(root):
            yield "the loss function", root
    for hook in (*module_mod._global_forward_pre_hooks.values(),
                 *module_mod._global_forward_hooks.values()):
        yield "a global forward hook", hook


def _containers(roots: tuple[Any, ...]) -> list[tuple[str, list[Any] | dict[Any, Any]]]:
    """The lists and dicts the step's own code (``_functions``) closes over or names as
    globals, one level: where a forward hook collects features (``features[name] = out``)."""
    found: dict[int, tuple[str, list[Any] | dict[Any, Any]]] = {}
    seen: set[int] = set()  # a class's forward once, however many modules share it
    for what, given in _functions(roots):
        fn = getattr(given, "func", given)  # functools.partial
        fn = getattr(fn, "__func__", fn)  # a bound method
        code = getattr(fn, "__code__", None)
        if code is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        named: list[tuple[str, Any]] = []
        for var, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            with contextlib.suppress(ValueError):  # an empty cell
                named.append((f"variable {var!r} that {what} closes over", cell.cell_contents))
        space = getattr(fn, "__globals__", {})
        named += [(f"global {var!r} read by {what}", space[var])
                  for var in sorted(code_names(code)) if var in space]
        for where, value in named:
            if type(value) in (list, dict) and id(value) not in found:
                found[id(value)] = (where, value)
    return list(found.values())


class Stashes:
    """The roots' module attributes when made; ``restore`` (module doc)."""

    def __init__(self, *roots: Any) -> None:
        self.modules = [(path or type(root).__name__, module)
                        for root in roots if isinstance(root, nn.Module)
                        for path, module in root.named_modules()]
        self.before = [{name: (value, _copy(value)) for name, value in vars(module).items()
                        if name not in _TORCH_OWN} for _, module in self.modules]
        self.containers = [(where, value, _copy(value)) for where, value in _containers(roots)]
        #: (module id, attribute) that torch's own forward pre-hooks recompute at every call
        #: (old-style ``weight_norm`` / ``spectral_norm`` set ``module.weight``): put back
        #: without a word, as private attributes are
        self.recomputed = {(id(module), hook.name) for _, module in self.modules
                           for hook in module._forward_pre_hooks.values()
                           if isinstance(getattr(hook, "name", None), str)
                           and type(hook).__module__.startswith("torch.nn.utils")}
        #: every ``module.attribute`` (or container) put back so far
        self.put_back: list[str] = []

    def restore(self) -> None:
        """Put back each attribute holding a traced tensor now (module doc)."""
        for where, value, items in self.containers:
            if _traced(value) and not _as_before(value, (value, items)):
                if where not in self.put_back:
                    self.put_back.append(where)
                _refill(value, items)
        for (path, module), old in zip(self.modules, self.before, strict=True):
            for name, value in list(vars(module).items()):
                if name in _TORCH_OWN or not _traced(value) or _as_before(value, old.get(name)):
                    continue
                said = not name.startswith("_") and (id(module), name) not in self.recomputed
                if said and f"{path}.{name}" not in self.put_back:
                    self.put_back.append(f"{path}.{name}")  # a private one silently: below
                if name not in old:
                    delattr(module, name)
                    continue
                original, items = old[name]
                if value is original and isinstance(value, (list, dict)):
                    _refill(value, items)  # changed in place: its old items back
                else:
                    object.__setattr__(module, name, original)


@contextlib.contextmanager
def kept(stashes: Stashes) -> Iterator[list[str]]:
    """``stashes.restore()`` when the block ends, however it ends; yields the names put
    back (filled when it ends)."""
    try:
        yield stashes.put_back
    finally:
        stashes.restore()


def note(names: list[str]) -> str:
    """What a capture says when ``Stashes`` put attributes or containers back."""
    return (f"the model's forward stores tensors where they outlive the step "
            f"({'; '.join(names[:5])}{' and more' if len(names) > 5 else ''}): a captured "
            "step runs the traced graph, not that Python code, so later steps do not update "
            "them where eager's forward would; outcore left them as they were before the "
            "capture (the trace's tensors cannot be used outside it). Return such a tensor "
            "from the forward, or compute it from the model after the step (under "
            "torch.no_grad()).")

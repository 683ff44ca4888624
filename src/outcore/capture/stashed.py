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

``Stashes(roots)`` takes each module's attributes (torch's own bookkeeping left out) and a
shallow copy of each list, tuple and dict among them; ``restore()`` puts back every
attribute that holds a traced tensor now, directly or one container level down (one the
capture added is removed; a list appended to in place gets its old items back). The
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


def _copy(value: Any) -> Any:
    return type(value)(value) if type(value) in _CONTAINERS else None


class Stashes:
    """The roots' module attributes when made; ``restore`` (module doc)."""

    def __init__(self, *roots: Any) -> None:
        self.modules = [(path or type(root).__name__, module)
                        for root in roots if isinstance(root, nn.Module)
                        for path, module in root.named_modules()]
        self.before = [{name: (value, _copy(value)) for name, value in vars(module).items()
                        if name not in _TORCH_OWN} for _, module in self.modules]
        #: every ``module.attribute`` put back so far
        self.put_back: list[str] = []

    def restore(self) -> None:
        """Put back each attribute holding a traced tensor now (module doc)."""
        for (path, module), old in zip(self.modules, self.before, strict=True):
            for name, value in list(vars(module).items()):
                if name in _TORCH_OWN or not _traced(value) or _as_before(value, old.get(name)):
                    continue
                if f"{path}.{name}" not in self.put_back:
                    self.put_back.append(f"{path}.{name}")
                if name not in old:
                    delattr(module, name)
                    continue
                original, items = old[name]
                if value is original and isinstance(value, list):
                    value[:] = items  # appended to in place: its old items back
                elif value is original and isinstance(value, dict):
                    value.clear()
                    value.update(items)
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
    """What a capture says when ``kept`` put attributes back."""
    return (f"the model's forward stores tensors on its modules ({', '.join(names[:5])}"
            f"{' and more' if len(names) > 5 else ''}): a captured step runs the traced "
            "graph, not that Python code, so later steps do not update them where eager's "
            "forward would; outcore left them as they were before the capture (the trace's "
            "tensors cannot be used outside it). Return such a tensor from the forward, or "
            "compute it from the model after the step (under torch.no_grad()).")

"""The plain Python values a captured step may have baked in, as one hashable fingerprint.

Capture traces the forward once: every Python value the forward reads (a softmax
temperature ``self.temp``, a flag ``self.use_aux``, ``nn.Dropout``'s ``p``, timm's
``DropPath.drop_prob``, a Hugging Face ``config.output_hidden_states``) becomes a constant
of the graph. A user who changes one between steps (a temperature or drop-path schedule,
a gradient-reversal coefficient ramped per step) changes what eager PyTorch computes; the
captured step would go on computing with the old value. ``python_state`` lists those
values so that the Trainer keys its plan cache on them and captures again when one changes.

What is listed, for ``model`` and for ``loss_fn`` when it is a module: every attribute in
each module's ``__dict__`` whose name does not start with ``_`` (PyTorch's own bookkeeping:
``_parameters``, ``_buffers``, hooks) and whose value is plain (None, bool, int, float,
complex, str, bytes, a ``torch.dtype`` / ``torch.device`` / ``torch.Size``, an enum
member, or a tuple / list / frozenset / dict of those); and, one level down, the plain
attributes of the other objects a module holds (a config object, shared by many modules
and listed once). ``training`` is left out (the Trainer keys on it already). Not seen:
globals, closures, and values deeper than one object (document these in the guide).

Invariant: equal fingerprints for two model states mean every listed value is equal. The
fingerprint is a tuple with one tuple of ``(name, value)`` per module (and per held
object), in ``named_modules`` order, so it is hashable; ``changed`` names what differs
between two. Cost: linear in the attributes, about 2 ms per step for a ResNet-50 (856
values; ``benchmarks`` not needed: a step of that model is ~100x longer on a GPU).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Any, cast

import torch
from torch import nn

from outcore.errors import OutcoreWarning, ReplanWarning
from outcore.log import announce

_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, torch.dtype,
                      torch.device, torch.Size})
#: a container is listed only up to this many items (longer ones are data, not settings)
_MAX_ITEMS = 64
_SKIP = frozenset({"training"})


def _plain(value: Any, depth: int = 0) -> Hashable | None:
    """``value`` as a hashable plain value, or None when it is not plain (not listed)."""
    kind = type(value)
    if kind in _SCALARS or isinstance(value, enum.Enum):
        return value if kind is not float else (float, value)  # 1 == 1.0 == True otherwise
    if depth > 1 or kind not in (tuple, list, frozenset, dict) or len(value) > _MAX_ITEMS:
        return None
    if kind is dict:
        items = tuple((k, _plain(v, depth + 1)) for k, v in value.items())
        return None if any(v is None for _, v in items) else (dict, items)
    members = tuple(_plain(v, depth + 1) for v in value)
    return None if any(m is None for m in members) else (kind, members)


def _listed(obj: Any, held: list[Any], seen: set[int]) -> tuple[tuple[str, Hashable], ...]:
    """``obj``'s plain public attributes; the other objects it holds go to ``held``."""
    try:
        names = vars(obj)
    except TypeError:  # no __dict__ (slots, builtins)
        return ()
    out = []
    for name, value in names.items():
        if name[0] == "_" or name in _SKIP:
            continue
        plain = _plain(value)
        if plain is not None:
            out.append((name, plain))
        elif not isinstance(value, (nn.Module, torch.Tensor)) and id(value) not in seen:
            seen.add(id(value))
            held.append((name, value))
    return tuple(out)


def python_state(*roots: Any) -> tuple[Hashable, ...]:
    """The fingerprint of the plain Python values of ``roots`` (modules; anything else is
    skipped) and of the objects they hold one level down (module docstring)."""
    out: list[Hashable] = []
    seen: set[int] = set()
    for root in roots:
        if not isinstance(root, nn.Module):
            continue
        for module in root.modules():
            held: list[Any] = []
            out.append(_listed(module, held, seen))
            out.extend(_listed(obj, [], seen) for _, obj in held)
    return tuple(out)


def changed(roots: tuple[Any, ...], before: tuple[Hashable, ...],
            after: tuple[Hashable, ...], *, first_set: bool = True) -> list[str]:
    """``module.attribute`` names whose values differ between two fingerprints of
    ``roots`` (taken with the same module structure; [] when it changed). With
    ``first_set=False``, a value that was None or absent before is left out (a lazy
    initialisation, as Hugging Face's ``config.problem_type``)."""
    paths: list[str] = []
    seen: set[int] = set()
    for root in roots:
        if isinstance(root, nn.Module):
            for path, module in root.named_modules():
                paths.append(path or type(root).__name__)
                held: list[Any] = []
                _listed(module, held, seen)
                paths.extend(f"{paths[-1]}.{name}" for name, _ in held)
    if len(before) != len(after):
        return []
    out: list[str] = []
    for where, (old, new) in zip(paths, zip(before, after, strict=True), strict=False):
        if old == new:
            continue
        old_items: dict[str, Any] = dict(cast(Any, old))
        new_items: dict[str, Any] = dict(cast(Any, new))
        out += [f"{where}.{k}" for k in sorted(old_items.keys() | new_items.keys())
                if old_items.get(k) != new_items.get(k)
                and (first_set or old_items.get(k) is not None)]
    return out


def replan_note(roots: tuple[Any, ...], before: tuple[Hashable, ...],
                after: tuple[Hashable, ...]) -> str:
    """What the Trainer announces when a step is captured again because values changed."""
    names = ", ".join(changed(roots, before, after)[:5]) or "(attributes)"
    return (f"captured and planned again: the model's Python value(s) {names} changed since "
            "the last step (a captured step computes with the values it was captured with). "
            "A value changed every step is better held in a tensor buffer (register_buffer), "
            "which a step reads without a new capture.")


def side_effect_note(names: list[str]) -> str:
    """What the Trainer says when the traced forward itself changed Python values."""
    return (f"the model's forward changed its Python value(s) {', '.join(names[:5])} while "
            "it was captured. Later steps run the captured graph and do not run that Python "
            "code again: if the forward changes them on every call (a step counter), they "
            "stay as they are now, where eager PyTorch would go on changing them. Keep such "
            "state in a tensor buffer (register_buffer) and change it with tensor ops.")


def announce_replan(roots: tuple[Any, ...], last: Hashable, key: Hashable) -> None:
    """A ``ReplanWarning`` naming the values that changed, when the Trainer's cache key
    ``key`` differs from the last used ``last`` in those values only (signatures whose last
    item is the fingerprint)."""
    if isinstance(last, tuple) and isinstance(key, tuple) and last[:-1] == key[:-1] \
            and last[-1] != key[-1]:
        announce(replan_note(roots, last[-1], key[-1]), ReplanWarning, stacklevel=5)


def announce_side_effects(roots: tuple[Any, ...], before: Hashable, after: Hashable) -> None:
    """An ``OutcoreWarning`` when the traced forward changed a value that was already set
    (the Trainer's keys before and after a capture)."""
    if isinstance(before, tuple) and isinstance(after, tuple) and before[-1] != after[-1]:
        names = changed(roots, before[-1], after[-1], first_set=False)
        if names:
            announce(side_effect_note(names), OutcoreWarning, stacklevel=5)

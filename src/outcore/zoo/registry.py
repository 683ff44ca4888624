"""``names()`` and ``get()``: look up a zoo network and build it, real or fake, full or small."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from outcore.zoo.catalog import ENTRIES, Entry
from outcore.zoo.workload import Workload

_BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}
if len(_BY_NAME) != len(ENTRIES):
    raise RuntimeError("outcore.zoo.catalog registers a name twice; give each entry its own name")


def names() -> list[str]:
    """Every registered network name, grouped by family."""
    return [e.name for e in ENTRIES]


def options(name: str, *, small: bool = False) -> dict[str, Any]:
    """The options ``name`` accepts, with the values ``get`` uses when they are not given."""
    entry = _lookup(name)
    return {**entry.defaults, **(entry.small if small else {})}


def get(
    name: str,
    batch_size: int | None = None,
    *,
    batch: int | None = None,
    fake: bool = False,
    small: bool = False,
    seed: int = 0,
    **opts: Any,
) -> Workload:
    """Build network ``name`` with an example batch of ``batch_size``.

    Args:
        name: one of ``names()``.
        batch_size: examples in the batch (>= 1); ``batch=`` is accepted as well, e.g.
            ``get("resnet50", batch=256)``.
        fake: build the model and batch inside a fresh ``FakeTensorMode`` (no memory is
            allocated; sizes, strides and dtypes are real). The mode is ``Workload.fake_mode``.
        small: the reduced width/resolution version of the same topology, for CPU tests.
        seed: parameters and batch are a deterministic function of it.
        **opts: per-network options (see ``options(name)``), overriding the defaults.

    Raises:
        ValueError: an unknown name (the message lists the valid ones), an unknown option (the
            message lists the valid ones), or an option value of the wrong type or range.

    The caller's global RNG state is left untouched.
    """
    entry = _lookup(name)
    if batch is not None and batch_size is not None and batch != batch_size:
        raise ValueError(f"give the batch size once: batch_size={batch_size}, batch={batch}")
    batch_size = batch if batch is not None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    resolved = _resolve(entry, small, opts)
    fake_mode = FakeTensorMode() if fake else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with fake_mode if fake_mode is not None else nullcontext():
            model = entry.build_model(resolved)
            model.train()
            gen = torch.Generator().manual_seed(seed)
            example = entry.make_batch(resolved, batch_size, gen)
    shown = ", ".join(f"{k}={v!r}" for k, v in resolved.items())
    scale = "small" if small else "full"
    description = f"{entry.description} [{scale}; batch {batch_size}; {shown}]"
    return Workload(
        name=name, model=model, loss_fn=entry.loss_fn, batch=example, description=description,
        fake_mode=fake_mode, options=resolved,
    )  # fmt: skip


def _lookup(name: str) -> Entry:
    entry = _BY_NAME.get(name)
    if entry is None:
        close = difflib.get_close_matches(str(name), list(_BY_NAME), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown zoo network {name!r}.{hint} Valid names: {', '.join(names())}")
    return entry


def _resolve(entry: Entry, small: bool, given: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults, then small overrides, then the caller's options, each type-checked."""
    unknown = sorted(set(given) - set(entry.defaults))
    if unknown:
        raise ValueError(
            f"{entry.name}: unknown option(s) {', '.join(unknown)}; "
            f"valid options: {', '.join(sorted(entry.defaults))}"
        )
    resolved = {**entry.defaults, **(entry.small if small else {})}
    for key, value in given.items():
        resolved[key] = _check_type(entry.name, key, entry.defaults[key], value)
    return resolved


def _check_type(name: str, key: str, default: Any, value: Any) -> Any:
    """``value`` converted to the kind of ``default``, or ValueError saying what is expected."""

    def bad(expected: str) -> ValueError:
        return ValueError(f"{name}: option {key}={value!r} must be {expected}")

    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("a bool")
        return value
    if key == "image_size":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, tuple | list) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return (int(value[0]), int(value[1]))
        raise bad("an int or a (height, width) pair of ints")
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an int")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, tuple | list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise bad("a sequence of ints")
        return tuple(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise bad("a string")
        return value
    return value

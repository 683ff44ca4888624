"""Random numbers a step draws from NumPy's or Python's generators, outside torch.

A captured step runs its graph, not the model's Python: whatever the forward drew from
``numpy.random`` or ``random`` while it was traced is baked into the graph, and repeated at
every step where eager draws anew. Hugging Face's speech models do this in training mode
(SpecAugment's ``_compute_mask_indices`` with ``mask_time_prob > 0``; LayerDrop as
``np.random.random() < layerdrop`` in Wav2Vec2's adapter, VITS; ``random.uniform`` in
MusicGen), and BigBird's random attention draws its blocks with ``np.random.permutation``.
Before session 30 such a step trained on one fixed SpecAugment mask or one fixed set of
dropped layers, silently.

What outcore does (``export_step`` in ``outcore.capture.specialize``):

1. ``state()`` is taken before and after the capture; unchanged, nothing was drawn.
2. Otherwise the step is exported twice more, in two forced worlds (``forced``): every draw
   of the common functions (``NUMPY``, ``PYTHON``) answered with the low end of its range
   (world 0: ``u`` the smallest positive draw, the first element, no shuffle) or the high
   end (world 1: ``u`` the largest draw below 1, the last element, reversed), the generators
   seeded apart for any other
   draw. A threshold test (``u < p``) takes both branches across the two worlds unless
   ``p`` is 0 (or 1), a mask drawn from positions or spans differs, a permutation differs.
3. When the two graphs (their code and every constant's values, ``fingerprint``) are the
   same, what was drawn does not change the step (``layerdrop = 0``, a draw whose value is
   not used): the capture stands. When they differ, the capture is refused
   (``HostRandomError``, a ``CaptureError``) with the call sites and the way out.

A step that seeds a generator itself before drawing (BigBird) draws the same numbers at
every step: those draws are not forced, and the capture stands.

The generators are left as the first export left them; later steps draw nothing from them
(eager would draw at every step). Functions bound before the capture
(``from numpy.random import rand``) and ``numpy.random.Generator`` objects are not forced;
their draws are still seen by ``state()`` when they use the global generators, and then
differ between the worlds by the seeds.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from outcore.capture.convert import attribute
from outcore.errors import HostRandomError

#: (generator state of numpy.random's global RandomState, of Python's random module)
HostState = tuple[Any, Any]

#: the ends of a draw in [0, 1): the smallest positive value and the largest below 1 that
#: the generators return (not 0 itself: ``u > p`` with ``p = 0`` is always true in eager)
_BOTTOM = 2.0 ** -53
_TOP = 1.0 - 2.0 ** -53


def state() -> HostState:
    """Both generators' states."""
    return np.random.get_state(), random.getstate()


def set_state(saved: HostState) -> None:
    np.random.set_state(saved[0])
    random.setstate(saved[1])


def same(a: HostState, b: HostState) -> bool:
    """Whether nothing was drawn between ``a`` and ``b``."""
    (na, pa), (nb, pb) = a, b
    return (pa == pb and na[0] == nb[0] and np.array_equal(na[1], nb[1])
            and tuple(na[2:]) == tuple(nb[2:]))


def _array_or_scalar(value: float, size: Any) -> Any:
    return value if size is None else np.full(size, value)


def _ordered(pool: Any, high: bool) -> np.ndarray:
    items = np.arange(pool) if isinstance(pool, (int, np.integer)) else np.asarray(pool)
    return items[::-1].copy() if high else items.copy()


def _numpy_forced(high: bool) -> dict[str, Callable[..., Any]]:
    u = _TOP if high else _BOTTOM
    z = 3.0 if high else -3.0

    def rand(*shape: int) -> Any:
        return _array_or_scalar(u, shape or None)

    def random_sample(size: Any = None) -> Any:
        return _array_or_scalar(u, size)

    def uniform(low: float = 0.0, high_: float = 1.0, size: Any = None) -> Any:
        return _array_or_scalar(low + (high_ - low) * u, size)

    def randint(low: int, high_: int | None = None, size: Any = None, dtype: Any = int) -> Any:
        lo, hi = (0, low) if high_ is None else (low, high_)
        return np.full(size, hi - 1 if high else lo, dtype=dtype) if size is not None else (
            hi - 1 if high else lo)

    def choice(a: Any, size: Any = None, replace: bool = True, p: Any = None) -> Any:
        pool = _ordered(a, high)
        return pool[0] if size is None else np.resize(pool, size)

    def permutation(x: Any) -> np.ndarray:
        return _ordered(x, high)

    def shuffle(x: Any) -> None:
        if high:
            x[:] = x[::-1].copy()

    def randn(*shape: int) -> Any:
        return _array_or_scalar(z, shape or None)

    def standard_normal(size: Any = None) -> Any:
        return _array_or_scalar(z, size)

    def normal(loc: float = 0.0, scale: float = 1.0, size: Any = None) -> Any:
        return _array_or_scalar(loc + z * scale, size)

    return {"rand": rand, "random": random_sample, "random_sample": random_sample,
            "ranf": random_sample, "sample": random_sample, "uniform": uniform,
            "randint": randint, "choice": choice, "permutation": permutation,
            "shuffle": shuffle, "randn": randn, "standard_normal": standard_normal,
            "normal": normal}


def _python_forced(high: bool) -> dict[str, Callable[..., Any]]:
    u = _TOP if high else _BOTTOM
    z = 3.0 if high else -3.0

    def pick(seq: Any) -> Any:
        return seq[-1] if high else seq[0]

    def shuffle(x: list[Any]) -> None:
        if high:
            x.reverse()

    def sample(population: Any, k: int, **_: Any) -> list[Any]:
        items = list(population)
        return (items[::-1] if high else items)[:k]

    def randrange(start: int, stop: int | None = None, step: int = 1) -> int:
        return pick(range(start) if stop is None else range(start, stop, step))

    return {"random": lambda: u, "uniform": lambda a, b: a + (b - a) * u,
            "randint": lambda a, b: b if high else a, "randrange": randrange,
            "choice": pick, "shuffle": shuffle, "sample": sample,
            "gauss": lambda mu=0.0, sigma=1.0: mu + z * sigma,
            "normalvariate": lambda mu=0.0, sigma=1.0: mu + z * sigma}


#: the functions ``forced`` answers: numpy.random's and random's module-level ones
NUMPY = tuple(_numpy_forced(False))
PYTHON = tuple(_python_forced(False))


@contextlib.contextmanager
def forced(world: int, sites: set[str]) -> Iterator[None]:
    """Answer the draws of ``NUMPY`` and ``PYTHON`` at the low (world 0) or high (world 1)
    end, the generators seeded by ``world`` for any other draw; each forced call's site
    (file:line of its caller) goes to ``sites``. Once the step seeds a generator itself
    (BigBird's ``np.random.seed(seed)`` before its random blocks), that generator's draws
    are its own: the same at every step in eager, so not forced. Everything is put back on
    exit."""
    high = world == 1
    saved = state()
    patched: list[tuple[Any, str, Any]] = []
    seeded: set[Any] = set()  # the modules the step seeded: their draws are eager's own

    def sited(module: Any, fn: Callable[..., Any], original: Callable[..., Any]) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if module in seeded:
                return original(*args, **kwargs)
            frame = sys._getframe(1)
            sites.add(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            return fn(*args, **kwargs)
        return call

    def seeding(module: Any, original: Callable[..., Any]) -> Any:
        def seed(*args: Any, **kwargs: Any) -> Any:
            seeded.add(module)
            return original(*args, **kwargs)
        return seed

    try:
        np.random.seed(1 + world)
        random.seed(1 + world)
        modules: tuple[tuple[Any, dict[str, Callable[..., Any]]], ...] = (
            (np.random, _numpy_forced(high)), (random, _python_forced(high)))
        for module, table in modules:
            for name, fn in table.items():
                original = getattr(module, name)
                patched.append((module, name, original))
                setattr(module, name, sited(module, fn, original))
            patched.append((module, "seed", module.seed))
            module.seed = seeding(module, module.seed)
        yield
    finally:
        for module, name, original in reversed(patched):
            setattr(module, name, original)
        set_state(saved)


def refuse(sites: set[str]) -> HostRandomError:
    where = ", ".join(sorted(sites)[:4]) or "a generator outcore does not force"
    return HostRandomError(
        "the model draws random numbers from NumPy's or Python's generator while the step "
        f"runs ({where}), and the step depends on what it draws. outcore runs a captured "
        "step without running the model's Python again, so one draw would be repeated at "
        "every step where eager draws anew. Turn those draws off for training with outcore "
        "(Hugging Face: config.layerdrop = 0.0; SpecAugment: config.mask_time_prob = 0.0 and "
        "mask_feature_prob = 0.0, or apply it in the data pipeline; BigBird: "
        "attention_type='original_full'), or draw with torch (torch.rand, torch.randperm), "
        "whose draws every step repeats as eager does.")


def fingerprint(gm: Any) -> tuple[str, list[tuple[str, Any]]]:
    """What a drawn number could change in an exported graph: its code (ops, and the Python
    numbers baked into their arguments) and its constants (a mask made with NumPy)."""
    return gm.code, [(str(n.target), attribute(gm, str(n.target)))
                     for n in gm.graph.nodes if n.op == "get_attr"]


def same_graph(a: tuple[str, list[tuple[str, Any]]],
               b: tuple[str, list[tuple[str, Any]]]) -> bool:
    """Whether two ``fingerprint``s are of the same graph (outside any fake mode the
    capture holds open: the constants are real tensors)."""
    def equal(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        return type(x) is type(y)

    with unset_fake_temporarily():
        return a[0] == b[0] and len(a[1]) == len(b[1]) and all(
            na == nb and equal(x, y) for (na, x), (nb, y) in zip(a[1], b[1], strict=True))

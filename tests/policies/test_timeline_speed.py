"""The faster pieces of PoocH's timeline (``policies.common.timeline``) give exactly what
their plain definitions give, so PoocH's and Dymem's searches (and plans) are unchanged."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from outcore.policies.common import earliest_fit, span_sum


def _earliest_fit_by_definition(size: float, lo: int, need: int, memory: np.ndarray,
                                budget: float) -> int:
    """PoocH §4.3 written out: the first position from which the map fits until ``need``."""
    for at in range(lo, need + 1):
        if all(memory[i] + size <= budget for i in range(at, need + 1)):
            return at
    return need


def test_earliest_fit_matches_its_definition() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(1, 30)
        memory = np.array([float(rng.randint(0, 100) * 1024) for _ in range(n)])
        size = float(rng.randint(0, 40) * 1024)
        lo, need = rng.randint(0, n), rng.randint(0, n - 1)
        budget = float(rng.randint(0, 140) * 1024)
        profile = SimpleNamespace(size={0: size})
        got = earliest_fit(profile, 0, lo, need, memory, budget)  # type: ignore[arg-type]
        assert got == _earliest_fit_by_definition(size, lo, need, memory, budget), (
            memory, size, lo, need, budget)


def test_span_sum_equals_slice_by_slice_addition() -> None:
    rng = random.Random(11)
    for _ in range(500):
        n = rng.randint(1, 50)
        spans = [(rng.randint(0, n + 3), rng.randint(0, n + 3), float(rng.randint(1, 2**40)))
                 for _ in range(rng.randint(0, 20))]
        expected = np.zeros(n)
        for a, b, v in spans:
            expected[a:b] += v
        assert np.array_equal(span_sum(spans, n), expected)

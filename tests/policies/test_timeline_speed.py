"""The faster pieces of PoocH's timeline (``policies.common.timeline``) give exactly what
their plain definitions give, so PoocH's and Dymem's searches (and plans) are unchanged."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import numpy as np
import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies.common import (
    KEEP,
    RECOMPUTE,
    SWAP,
    Evaluation,
    ForwardPrefixes,
    Profile,
    earliest_fit,
    evaluate,
    span_sum,
)
from outcore.sim.synthetic import residual_chain


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


def _fields(ev: Evaluation) -> str:
    return repr(dataclasses.astuple(ev))


@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.8])
def test_a_resumed_forward_replay_gives_the_whole_replay(fraction: float) -> None:
    """``ForwardPrefixes``: a classification differing from the recorded one in one map,
    replayed from that map's producer, equals its replay from position 0 in every field
    (strict or not, with the end-of-forward wait or not), including strict replays that
    overflow in forward (where ``at`` gives no state past the first overflow)."""
    graph = residual_chain(12)
    p = Profile(graph, [op.id for op in graph.ops], cost_model_for("v100-pcie"))
    budget = float(int(reference_peaks(graph).liveness * fraction))
    rng = random.Random(3)
    resumed = whole_only = 0
    for _ in range(6):
        base = {x: rng.choice((KEEP, SWAP, RECOMPUTE)) for x in p.features}
        prefixes = ForwardPrefixes(p, base, budget, {p.prod[x] for x in p.features})
        for x in p.features:
            for cls in (KEEP, SWAP, RECOMPUTE):
                for strict in (True, False):
                    state = prefixes.at(p, x, strict)
                    resumed += state is not None
                    whole_only += state is None
                    for sync in (None, False, True):
                        trial = {**base, x: cls}
                        got = evaluate(p, trial, budget, strict=strict, sync_forward=sync,
                                       resume=state)
                        want = evaluate(p, trial, budget, strict=strict, sync_forward=sync)
                        assert _fields(got) == _fields(want), (x, cls, strict, sync)
    assert resumed, "some replays started past position 0"
    if fraction == 0.3:
        assert whole_only, "some strict replays overflow in forward before the map's producer"

"""The real-model corpus against eager PyTorch: one step per (model, policy) on the
emulated device, halfway between the model's layer-wise lower bound and its in-core peak
(see harness.check for what is compared).

The default run takes the pairs of ``corpus.DEFAULT_PAIRS`` (each class of model and each
policy at least once, on small models); every other pair of the corpus is marked ``corpus``
(``pytest -m corpus tests/realmodels``), and ``benchmarks/realmodel_corpus.py`` runs the whole
grid as BENCHMARKS.md's table.
A pair known to fail is an ``xfail(strict=True)`` naming its cause and the issue item that owns
it (``known_failures``): when the cause is fixed the pair passes, the xfail turns into a
failure, and its entry must go.
"""

from __future__ import annotations

import functools

import pytest

from corpus import BY_NAME, CORPUS, DEFAULT_PAIRS, KNOWN_FAILURES
from harness import POLICIES, check, in_core_peak


@functools.cache
def _peak(name: str) -> int:
    return in_core_peak(BY_NAME[name])[2]


def _pairs(pairs: list[tuple[str, str]]) -> list[object]:
    """(name, policy) parameters, each known failure marked xfail(strict=True) with its cause."""
    params: list[object] = []
    for name, policy in pairs:
        cause = KNOWN_FAILURES.get((name, policy))
        marks = [pytest.mark.xfail(strict=True, reason=cause)] if cause else []
        params.append(pytest.param(name, policy, marks=marks, id=f"{name}-{policy}"))
    return params


def _run(name: str, policy: str) -> None:
    outcome = check(BY_NAME[name], policy, _peak(name))
    assert outcome.ok, f"{name} under {policy}: " + "; ".join(outcome.problems[:5])


@pytest.mark.parametrize(("name", "policy"), _pairs(DEFAULT_PAIRS))
def test_default_slice(name, policy):
    _run(name, policy)


@pytest.mark.corpus
@pytest.mark.parametrize(("name", "policy"),
                         _pairs([(c.name, policy) for c in CORPUS for policy in POLICIES
                                 if (c.name, policy) not in DEFAULT_PAIRS]))
def test_whole_corpus(name, policy):
    _run(name, policy)


def test_known_failures_name_real_pairs_and_an_owner():
    """Every known failure names a corpus model, a policy of the harness and the issue item
    that owns its cause (so a stale entry cannot hide); the default pairs are corpus pairs
    and cover every policy."""
    for (name, policy), cause in KNOWN_FAILURES.items():
        assert name in BY_NAME, name
        assert policy in POLICIES, policy
        assert cause.startswith("issue "), cause
    assert {policy for _, policy in DEFAULT_PAIRS} == set(POLICIES)
    assert all(name in BY_NAME for name, _ in DEFAULT_PAIRS)

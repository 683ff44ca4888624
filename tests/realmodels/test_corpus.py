"""The real-model corpus against eager PyTorch: one step per (model, policy) on the
emulated device, halfway between the model's layer-wise lower bound and its in-core peak
(see harness.check for what is compared).

The default run takes ``corpus.DEFAULT_SLICE`` under every policy; the whole corpus is marked
``corpus`` and run by ``benchmarks/realmodel_corpus.py`` (which writes BENCHMARKS.md's table).
A pair known to fail is an ``xfail(strict=True)`` naming its cause and the issue item that owns
it (``known_failures``): when the cause is fixed the pair passes, the xfail turns into a
failure, and its entry must go.
"""

from __future__ import annotations

import functools

import pytest

from corpus import BY_NAME, CORPUS, DEFAULT_SLICE, KNOWN_FAILURES
from harness import POLICIES, check, in_core_peak


@functools.cache
def _peak(name: str) -> int:
    return in_core_peak(BY_NAME[name])[2]


def _pairs(names: list[str]) -> list[object]:
    """(name, policy) parameters, each known failure marked xfail(strict=True) with its cause."""
    params: list[object] = []
    for name in names:
        for policy in POLICIES:
            cause = KNOWN_FAILURES.get((name, policy))
            marks = [pytest.mark.xfail(strict=True, reason=cause)] if cause else []
            params.append(pytest.param(name, policy, marks=marks, id=f"{name}-{policy}"))
    return params


def _run(name: str, policy: str) -> None:
    outcome = check(BY_NAME[name], policy, _peak(name))
    assert outcome.ok, f"{name} under {policy}: " + "; ".join(outcome.problems[:5])


@pytest.mark.parametrize(("name", "policy"), _pairs(DEFAULT_SLICE))
def test_default_slice(name, policy):
    _run(name, policy)


@pytest.mark.corpus
@pytest.mark.parametrize(("name", "policy"),
                         _pairs([c.name for c in CORPUS if c.name not in DEFAULT_SLICE]))
def test_whole_corpus(name, policy):
    _run(name, policy)


def test_known_failures_name_real_pairs_and_an_owner():
    """Every known failure names a corpus model, a policy of the harness and the issue item
    that owns its cause (so a stale entry cannot hide)."""
    for (name, policy), cause in KNOWN_FAILURES.items():
        assert name in BY_NAME, name
        assert policy in POLICIES, policy
        assert cause.startswith("issue "), cause

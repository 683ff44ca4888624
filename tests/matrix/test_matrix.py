"""The differential matrix (issue 21): every model of ``matrix_models`` under every policy,
one step against eager PyTorch (``matrix_harness.run_cell``: loss, every ``.grad`` including
the batch's, BatchNorm buffers, training flags and parameter objects, measured peak ==
predicted within the budget).

The default slice (CI) runs every model under outcore-auto (the default policy) and the
models marked ``every_policy`` under one policy of each paper; the rest is marked ``slow``
and runs with ``pytest -m slow tests/matrix`` or ``benchmarks/matrix.py`` (a table).
A cell that a known open item breaks is ``xfail(strict=True)`` with that item as reason.
"""

from __future__ import annotations

import pytest
from matrix_harness import run_cell
from matrix_models import ALL_POLICIES, CASES, Case

import outcore

DEFAULT_POLICY = "outcore-auto"
#: one policy per paper (and the simplest baseline) for the ``every_policy`` models in CI
SLICE_POLICIES = ("superneurons", "modnn", "pooch", "dymem", "vdnn-conv-p", "recompute-cheap")


def test_the_matrix_names_every_registered_policy() -> None:
    assert sorted(ALL_POLICIES) == sorted(outcore.policies())


def in_default_slice(case: Case, policy: str) -> bool:
    return policy == DEFAULT_POLICY or (case.every_policy and policy in SLICE_POLICIES)


def _params() -> list[object]:
    out = []
    for case in CASES:
        for policy in ALL_POLICIES:
            marks = [] if in_default_slice(case, policy) else [pytest.mark.slow]
            if policy in case.xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=case.xfail[policy]))
            out.append(pytest.param(case, policy, marks=marks, id=f"{case.name}-{policy}"))
    return out


@pytest.mark.parametrize(("case", "policy"), _params())
def test_step_matches_eager(case: Case, policy: str) -> None:
    cell = run_cell(case, policy)
    assert cell.ok, f"{case.name} under {policy} at {cell.budget} B: " + "; ".join(cell.problems)

"""Bound model: a recompute re-runs its producer whole, however few of its outputs it needs.

``Candidate.recompute_floor`` shares a producer's time among its movable outputs, so the
bound model charged a third of ``native_layer_norm`` when only its output was recomputed
(its mean and rstd kept), and half of a dropout when only its output was. This module
replaces those shares, for each producer op ``m`` that no recompute chain re-makes
(``Model.remake`` names no run of ``m``), by one full run of ``m``:

* columns ``u_(m,b)`` in ``[0, 1]``, one per distinct first backward stage ``b`` among
  ``m``'s candidate outputs: ``m`` is re-run before stage ``b``; the compute stream row of
  ``b`` charges ``t_m u_(m,b)`` (``t_m`` the producer's time);
* per candidate output ``k`` of ``m``: ``sum_{b <= b_k} u_(m,b) >= r_k``;
* ``r_k`` itself is charged nothing (``Model.recompute_cost``).

Why it stays a lower bound. Take any Plan lowered by ``outcore.plan.lower`` and the point
of the bound model it maps to (``formulation``'s derivation). Let ``S`` be the candidate
outputs of ``m`` the plan recomputes, ``k0`` the one of them with the least ``b``. Each
``k`` in ``S`` was freed after forward and is resident again when Compute of ``b_k`` reads
it; ``lower`` makes it resident again only by re-running ``m`` (``_sequence.ensure``: a
recompute re-makes every output of its op; no chain re-runs ``m``, by the choice of ``m``).
So ``m`` runs at least once, and at or before ``b_k0`` (the run that serves ``k0``). Set
``u_(m,b_k0) = 1`` and the other ``u_(m,.)`` to 0: every row above holds (``b_k >= b_k0``
for ``k`` in ``S``, and ``r_k = 0`` outside it). The charge, ``t_m`` at ``b_k0``, is at
most the plan's work for ``m``: the time of one run, at the stage the model already
charges ``k0``'s recompute at (the model's convention for every recompute: charged at the
first backward stage of what it re-makes, the run itself at or before it). The previous
charge there was ``sum_{k in S} t_m / n_m <= t_m`` (``n_m`` movable outputs), at the same or
later stages; no other row reads the charge. When ``S`` is empty all ``u`` are 0, as
before. A producer some chain re-runs keeps the shared floor: a single run of it may both
serve a dead-input re-make (``z``, charged at its own stage) and re-make a candidate output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from outcore.policies.optimal.problem import Problem
from outcore.policies.optimal.rows import Rows


@dataclass
class OpRuns:
    """The ``u`` columns of the bound model (see the module doc).

    ``cols[(m, b)]``: the column of "producer stage ``m`` re-run before stage ``b``";
    ``members[m]``: the candidate indices ``m`` produces; ``seconds[m]``: its time."""

    cols: dict[tuple[int, int], int] = field(default_factory=dict)
    members: dict[int, list[int]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)

    @property
    def grouped(self) -> set[int]:
        """Candidates whose recompute is charged through a ``u`` column."""
        return {k for ks in self.members.values() for k in ks}

    def charges(self) -> dict[int, list[tuple[int, float]]]:
        """Stage -> ``(column, seconds)`` to charge on its compute stream row."""
        out: dict[int, list[tuple[int, float]]] = {}
        for (m, b), col in self.cols.items():
            out.setdefault(b, []).append((col, self.seconds[m]))
        return out

    def add_rows(self, rows: Rows, recompute: list[int | None], problem: Problem) -> None:
        """Per candidate output ``k`` of ``m``: ``sum_{b <= b_k} u_(m,b) - r_k >= 0``."""
        runs_of: dict[int, list[tuple[int, int]]] = {}
        for (m, when), col in self.cols.items():
            runs_of.setdefault(m, []).append((when, col))
        for m, ks in self.members.items():
            for k in ks:
                rk = recompute[k]
                if rk is None:
                    continue
                b = problem.candidates[k].first_backward
                entries = {col: 1.0 for when, col in runs_of[m] if when <= b}
                entries[rk] = -1.0
                rows.add(entries, 0.0, math.inf)


def op_runs(problem: Problem, chain_makers: set[int], first_col: int) -> OpRuns:
    """The ``u`` columns from ``first_col`` on, for every producer stage of a candidate
    whose op (``problem.op_order``) is not in ``chain_makers`` (op ids some bound-model
    re-make ``z`` runs) and whose ``recompute_floor`` is a share of the op's time (an op
    with one movable output is already charged whole: a ``u`` column would only add
    degenerate columns, which slowed HiGHS's interior point method on DenseNet-121)."""
    runs = OpRuns()
    col = first_col
    for k, c in enumerate(problem.candidates):
        m = c.produce
        if problem.op_order[m] in chain_makers or c.recompute_floor >= problem.op_time[m]:
            continue  # re-run by a chain, or already charged whole (its only movable output)
        runs.members.setdefault(m, []).append(k)
        runs.seconds[m] = problem.op_time[m]
    for m, ks in runs.members.items():
        for b in sorted({problem.candidates[k].first_backward for k in ks}):
            runs.cols[(m, b)] = col
            col += 1
    return runs

"""The bound model on fewer prefetch and release options: the same relaxation, a smaller LP.

In the bound model (``formulation``, ``relaxed=True``) a candidate's prefetch option ``j``
stands for every stage of the interval ``(bound_options[j-1], bound_options[j]]`` (the
first from ``last_forward``): the candidate is freed until the interval's later end and its
prefetch issued at the earlier one; a release option likewise stands for an interval of
release stages, freed from its earlier end and waited for at its later one (see
``Candidate``). ``coarsen`` keeps only the last ``options`` prefetch options (so the first
kept option stands for everything from ``last_forward + 1`` up to it) and the first
``releases - 1`` release options plus the last (the last forward stage, which every release
interval must reach).

Why it stays a bound: merging two adjacent intervals into one moves the freed-until end
later and the issued-at end earlier, so every row the option enters only gets easier:

* the memory rows free the candidate over a longer range;
* an H2D window starting at the merged option's issue stage holds no more copies than the
  window of the finer option it replaces (the copy may start earlier);
* leaf residency asks for a re-make only while the leaf's prefetch option lies wholly after
  the recompute's stage; a merged option lies wholly after it only if both of its parts do;
* a release interval's earlier end frees sooner and its later end moves the Wait later, so
  the D2H rows (and the big-M-free windows) relax too.

So every lowered Plan still maps to a feasible point whose objective is at most its simulated
step, and the coarse LP's value is a lower bound on every such plan; it is at most the full
model's LP value. Measured on the planner table's rows (``relaxed=True`` LP, one thread,
/work/notes/s19/lead/bcoarse_rows.py at 2 prefetch and 1 release options): the same value
on ResNet-152 b256 pcie (2.33384 s; 1.9 against 8.0 s CPU), ResNet-50 b640 pcie, VGG-16,
Inception-v4, DenseNet-121, GPT-2 small and medium, ResNet-50 b256 at 30%; lower on
ResNet-50 b640 nvlink (1.82186 against 1.82366 s) and at ResNet-50 b256's floor (0.93836
against 0.99813 s: release points matter there). ``policy.lower_bound`` solves it first and
the full model only where the coarse gap is above ``REFINE_ABOVE``.
"""

from __future__ import annotations

import dataclasses

from outcore.policies.optimal.problem import Candidate, Problem

#: Prefetch options each candidate keeps in the coarse bound model (the latest ones).
COARSE_OPTIONS = 2
#: Release options each candidate keeps in the coarse bound model (the earliest, then the
#: last forward stage).
COARSE_RELEASES = 1


def coarsen(problem: Problem, options: int = COARSE_OPTIONS,
            releases: int = COARSE_RELEASES) -> Problem:
    """``problem`` with each candidate's bound-model options merged (see the module doc);
    the primal options are unchanged. ``options`` and ``releases`` are at least 1."""
    if options < 1 or releases < 1:
        raise ValueError(f"coarsen needs at least one option of each kind, got {options} "
                         f"prefetch and {releases} release options")
    return dataclasses.replace(problem, candidates=tuple(
        _coarse(c, options, releases) for c in problem.candidates))


def _coarse(c: Candidate, options: int, releases: int) -> Candidate:
    prefetch = c.bound_options
    if len(prefetch) > options:
        prefetch = prefetch[-options:]
    release = c.bound_release
    if len(release) > releases:
        release = (*release[:releases - 1], release[-1])
    return dataclasses.replace(c, bound_options=prefetch, bound_release=release)

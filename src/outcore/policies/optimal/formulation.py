"""The joint keep / offload / recompute MILP over stages, on HiGHS (``scipy.optimize.milp``).

Input: a ``Problem`` (plain data, see ``problem.py``). Output: per candidate a decision
(keep, offload with the stage its prefetch is issued at, recompute), the model's step time
and, for the bound model, a proven lower bound.

Derivation
----------
Stages ``s = 0..n-1`` are the ops in execution order; ``c_s`` their times. Variables:

* ``A_s >= 0``: when Compute of stage ``s`` starts on the compute stream (``A_0 = 0``);
  ``A_n`` is the end of the step, the objective.
* ``x_kj in {0,1}``: candidate ``k`` is offloaded and its prefetch issued before stage
  ``options_k[j]``; ``r_k in {0,1}``: ``k`` is recomputed; ``sum_j x_kj + r_k <= 1``
  (nothing chosen = keep). ``o_k = sum_j x_kj``. The model's columns are the cumulative
  ``y_kj = sum_{j' >= j} x_kj'`` (``1 >= y_k0 >= y_k1 >= ...``, ``o_k = y_k0``), so that a
  window row names each copy once.
* ``D_t >= max(0, M_t - B_t)``: bytes the plan frees at the Compute sample of stage ``t``,
  where ``M_t`` is the in-core memory at that sample (the executor's rule). A candidate is
  freed at ``t`` when ``f_k < t < q`` (``q`` its prefetch stage, or ``b_k`` when recomputed):
  ``D_t = D_{t-1} + sum_{f_k+1=t} size_k (o_k + r_k) - sum_{q=t} size_k x_kj -
  sum_{b_k=t} size_k r_k``, so the memory rows have O(1) entries per candidate.
  ``B_t`` is the budget, lowered by cuts where the executor's rule measured more than the
  model (``Cuts``).
  The bound model keeps only ``D_t >= M_t - B_t``: it may hold more than the in-core
  schedule at a stage (a kept-alive freed input, below), so ``D_t < 0`` is a plan's value
  there, and ``D_t >= 0`` cut off plans that keep such an input alive (``test_kept_alive``).
* Release points (``Plan.release_at``): ``v_ki in {0,1}``, cumulative like ``y``: ``k`` is
  offloaded and its ``Wait(d2h)`` + ``Free`` are placed before the Compute of release option
  ``i`` or a later one (``o_k >= v_k0 >= v_k1 >= ...``; none set: right after ``f_k``). The
  memory rows hold ``k`` from ``f_k + 1`` until its release (``+ size_k v_k0`` at ``f_k + 1``,
  ``- size_k (v_ki - v_k(i+1))`` at option ``i``'s stage), and the Wait moves with it.
* Compute stream: ``A_{s+1} >= A_s + c_s + sum_{b_k=s+1} R_k r_k`` (recomputes run before
  the op that needs them).
* D2H engine, FIFO in issue order (= production order): ``E_k >= E_{k-1} + d_k o_k`` and
  ``E_k >= A_{p_k} + c_{p_k} + d_k o_k`` give the end of ``k``'s copy; the Wait before ``k``'s
  forward Free: ``A_{f_k+1} >= E_k - M_k (1 - o_k + v_k0)`` and at release option ``i``,
  ``A_{rho_ki} >= E_k - M_k (1 - o_k + v_k(i+1))`` (``M_k = 0`` when ``k`` has no release
  options and no earlier copy may be waited for after ``f_k + 1``, else the earlier copies'
  total time plus ``d_k``). Those big-M rows are weak in the LP: a fraction ``eps`` of a
  later release switches off ``eps * M`` of the Wait. Big-M-free windows carry the LP
  bound instead (``d2h_windows``): for a start stage ``s`` and an end stage ``w``, the
  copies issued after Compute of ``s`` and waited for before Compute of ``w`` fit on the
  engine in between, ``A_w - A_s >= c_s + sum_m d_m (o_m - v_m(j_m+1))`` (``j_m``: the last
  release choice of ``m`` waited for by ``w``), so a fractional release only removes its
  own fraction of the copy's time. Each holds at every integral point (each copy starts
  after its producer ends, one engine runs copies one at a time and a shared engine's
  prefetches only delay them, a Wait holds the Compute after it), so adding them keeps
  the bound a bound; on ResNet-50 b640 v100-pcie they raise the bound LP from 2.013 s
  to 2.135 s (without them the LP ran 2.4 s of copy-outs inside a 0.71 s forward by
  waiting for every copy fractionally at the end of the forward).
* H2D engine: for each prefetch choice ``(k, j)`` issued before stage ``tau_kj`` (after
  Compute of ``tau_kj - 1`` ends; the Wait comes before Compute of ``b_k``), every prefetch
  issued at or after it and due by ``b_k`` fits in ``[A_{tau-1} + c_{tau-1}, A_{b_k}]``
  (a single-machine window; a subset of a window's copies is still a valid constraint,
  so large windows are truncated). D2H copies end in forward and prefetches start after
  their offload, so with one shared copy engine the two directions do not meet inside
  these windows.

Two models share this code:

* **bound** (``relaxed=True``): every true plan maps to a feasible point with objective at most
  its simulated step: option ``j`` stands for every prefetch stage in ``(options_{j-1},
  options_j]``, freed until the later end and issued at the earlier end; any candidate may be
  recomputed at its ``recompute_floor`` (a producer with several movable outputs: one whole
  run per op, ``op_runs``); no leaf constraint; but a recompute whose producer
  reads an activation no policy may move and that the in-core schedule has freed by then
  keeps that activation alive until the recompute (``lower`` extends its life) unless the
  plan re-makes it too (a recompute chain), so ``r_k <= y_u + sum_{b' <= b_k} z_(u,b')``:
  ``y_u`` adds its bytes over ``(last use of u, min b_k)``, ``z_(u,b')`` (u re-made before
  stage ``b'``, once for every later use) adds the least time re-making it costs (its
  producer's time) to the compute stream at ``b'``; the bytes a chain holds while it runs
  are not counted (a relaxation); deeper freed inputs likewise, up to ``CHAIN_DEPTH``
  levels (deeper re-makes are free). A recompute (or a re-make ``z``) finds each
  candidate input of its op resident: kept, prefetched by then (lowering's just-in-time
  bring-back), or re-made by then and held from there (``leaf_residency``). Release
  option ``i`` stands for every stage of ``(rho_k(i-1), rho_ki]`` (the last option ends at
  the last forward stage): freed from the earlier end, waited for at the later one. Its
  LP (or MILP dual) value is a lower bound on the simulated step time of every Plan
  lowered by ``outcore.plan.lower`` from these decisions (framework kernels, one
  sub-batch).
* **primal**: exact prefetch and release stages, recompute priced at the producer's time
  (plus, for a chain, the producers of the freed forward intermediates it re-makes first),
  only when its candidate inputs (``leaves``) are resident at ``b_k`` or recomputed
  themselves: ``r_k + sum_{q_uj > b_k} x_uj <= 1``; a recomputed leaf ``u`` is then re-made
  first, at ``b_k``, and held until ``b_u``: ``n_ku >= r_k + r_u - 1`` adds its bytes over
  ``[b_k, b_u)``. One level only (``n_ku + n_uw <= 1``, and ``u``'s own leaves resident at
  ``b_k``: ``n_ku + sum_{q_wj > b_k} x_wj <= 1``); ``u``'s time stays charged at ``b_u``
  (the primal model's plans are simulated anyway; only the bound must be a bound). An
  offloaded leaf is waited for by the recompute, so its prefetch and the recompute end
  before Compute of ``b_k`` (``_leaf_arrives``, a big-M row per prefetch option at or
  before ``b_k``). Random producers (dropout) may be recomputed: lowering replays their
  forward RNG state.
"""

from __future__ import annotations

import bisect
import itertools
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp  # type: ignore[import-untyped]
from scipy.sparse import coo_matrix  # type: ignore[import-untyped]

from outcore.policies.optimal.d2h_windows import WINDOW_CAP, add_d2h_windows
from outcore.policies.optimal.leaf_residency import LeafResidency, leaf_residency
from outcore.policies.optimal.op_runs import OpRuns, op_runs
from outcore.policies.optimal.problem import Candidate, Problem
from outcore.policies.optimal.rows import BYTES, SECONDS, Rows

LP_SOLVER = "ipm"
"""HiGHS's solver for the bound model's LP (``relaxed=True, integral=False``): its interior
point method with crossover (on by default). Only that LP's value is read (a lower bound).
On ResNet-152 b256 (v100-pcie 16 GiB, one thread) it takes 4.7 s against the dual simplex's
12.0 s, with the same optimum. The primal relaxation stays on the dual simplex. IPM is faster
there too (2.2 s against 4.1 s), but it ends on another optimal vertex with fewer integral
candidates, and the search starts from that vertex: r50-pcie's plan went from 2.152 to 2.187 s.
Deterministic (no time limit). MILPs keep HiGHS's MIP solver."""


@dataclass
class Solution:
    """A model's answer. ``choice[k]`` is ``("keep",)``, ``("offload", q)`` or ``("recompute",)``
    by candidate index; ``objective`` the model's step time; ``bound`` a lower bound on
    the model's optimum (HiGHS's dual bound, or the LP value); ``optimal`` when proven."""

    choice: list[tuple] = field(default_factory=list)
    objective: float = math.inf
    bound: float = 0.0
    optimal: bool = False
    status: str = ""
    settled: list[bool] = field(default_factory=list)


class Model:
    """The MILP of a Problem (see the module doc); ``cuts`` maps stage -> bytes to subtract
    from the budget at that stage."""

    def __init__(self, problem: Problem, *, relaxed: bool,
                 cuts: dict[int, int] | None = None) -> None:
        self.p = problem
        self.relaxed = relaxed
        n, cands = problem.stages, problem.candidates
        self.A = 0
        self.D = n + 1
        self.E = self.D + n
        col = self.E + len(cands)
        self.x: list[list[int]] = []
        self.r: list[int | None] = []
        for c in cands:
            self.x.append(list(range(col, col + len(self.options(c)))))
            col += len(self.options(c))
        for c in cands:
            if relaxed or c.recompute is not None:
                self.r.append(col)
                col += 1
            else:
                self.r.append(None)
        # bound model: y_u >= r_k for every k whose producer reads u, a kept activation dead at
        # b_k in the in-core schedule (lowering keeps u alive until that recompute)
        # v_ki: candidate k is offloaded and released (Wait d2h + Free) at option >= i
        self.v: list[list[int]] = []
        for c in cands:
            self.v.append(list(range(col, col + len(self.releases(c)))))
            col += len(self.releases(c))
        self.ext: dict[int, tuple[int, int, int, list[int]]] = {}  # u -> col, bytes, from, ks
        # ... or re-made (a recompute chain): z_(u,b) = u re-made before stage b, at its floor
        # z_(m,b): op m re-run before stage b (a chain), at its full time
        self.remake: dict[tuple[int, int], tuple[int, float]] = {}  # (m, b) -> col, seconds
        if relaxed:
            for k, c in enumerate(cands):
                for d in c.dead_inputs:
                    if d.storage not in self.ext:
                        self.ext[d.storage] = (col, d.nbytes, d.last, [])
                        col += 1
                    if k not in self.ext[d.storage][3]:
                        self.ext[d.storage][3].append(k)
                    if d.maker >= 0 and (d.maker, c.first_backward) not in self.remake:
                        self.remake[(d.maker, c.first_backward)] = (col, d.seconds)
                        col += 1
        # primal: n_(k,u) >= r_k + r_u - 1: k's recompute re-makes its recomputed leaf u
        # first, which then stays resident from b_k until b_u
        self.nest: dict[tuple[int, int], int] = {}
        if not relaxed:
            index = {c.tensor: k for k, c in enumerate(cands)}
            for k, c in enumerate(cands):
                for leaf in c.leaves:
                    u = index[leaf]
                    if self.r[k] is not None and self.r[u] is not None:
                        self.nest[(k, u)] = col
                        col += 1
        # bound: u_(m,b) = producer m re-run whole before stage b (``op_runs``)
        self.runs = OpRuns()
        if relaxed:
            self.runs = op_runs(problem, {m for m, _ in self.remake}, col)
            col += len(self.runs.cols)
        self._grouped = self.runs.grouped
        # bound: w_(u,s) = recomputed leaf u re-made by stage s (``leaf_residency``)
        self.leaf_res = LeafResidency()
        if relaxed:
            self.leaf_res = leaf_residency(problem, self.r, self.remake, col)
            col += len(self.leaf_res.cols)
        self.ncols = col
        self.cuts = dict(cuts or {})
        self._built: tuple | None = None

    # -- prices per model -------------------------------------------------------------------
    def options(self, c: Candidate) -> tuple[int, ...]:
        return c.bound_options if self.relaxed and c.bound_options else c.options

    def releases(self, c: Candidate) -> tuple[int, ...]:
        return c.bound_release if self.relaxed else c.release

    def release_stages(self, k: int, i: int) -> tuple[int, int]:
        """(first stage freed, stage the copy-out is waited before) of release option ``i``:
        the option's stage in the primal model; in the bound model option ``i`` stands for
        every stage of ``(releases[i-1], releases[i]]``, freed from the earlier end and
        waited for at the later one."""
        c = self.p.candidates[k]
        rel = self.releases(c)
        if not self.relaxed:
            return rel[i], rel[i]
        return (rel[i - 1] if i > 0 else c.last_forward + 1) + 1, rel[i]

    def recompute_cost(self, k: int) -> float:
        c = self.p.candidates[k]
        if self.relaxed and k in self._grouped:
            return 0.0  # charged through its producer's run (``op_runs``)
        return SECONDS * (c.recompute_floor if self.relaxed else float(c.recompute or 0.0))

    def time_stage(self, k: int, j: int) -> int:
        """The earliest stage a prefetch of option ``j`` may be issued before."""
        c = self.p.candidates[k]
        opts = self.options(c)
        if not self.relaxed:
            return opts[j]
        return opts[j - 1] + 1 if j > 0 else c.last_forward + 1

    # -- building ---------------------------------------------------------------------------
    def build(self) -> tuple[Rows, np.ndarray, np.ndarray]:
        rows = Rows()
        self._stream(rows)
        self._memory(rows)
        self._d2h(rows)
        self._h2d(rows)
        self._choices(rows)
        lo = np.zeros(self.ncols)
        hi = np.full(self.ncols, math.inf)
        hi[self.A] = 0.0  # A_0 = 0
        budget = self.p.budget
        for t, mem in enumerate(self.p.memory):
            # bound model: D_t < 0 when it holds more than the in-core schedule there (a
            # kept-alive freed input, ``ext``), so only the memory rule bounds it below
            need = float(mem - budget + self.cuts.get(t, 0))
            lo[self.D + t] = BYTES * (need if self.relaxed else max(0.0, need))
        for xs in self.x:
            hi[xs] = 1.0
        for vs in self.v:
            hi[vs] = 1.0
        for rc in self.r:
            if rc is not None:
                hi[rc] = 1.0
        for col, _, _, _ in self.ext.values():
            hi[col] = 1.0
        for col, _ in self.remake.values():
            hi[col] = 1.0
        for col in self.nest.values():
            hi[col] = 1.0
        for col in self.runs.cols.values():
            hi[col] = 1.0
        for col in self.leaf_res.cols.values():
            hi[col] = 1.0
        return rows, lo, hi

    def _stream(self, rows: Rows) -> None:
        rec: dict[int, list[int]] = {}
        for k, c in enumerate(self.p.candidates):
            if self.r[k] is not None:
                rec.setdefault(c.first_backward, []).append(k)
        remade: dict[int, list[tuple[int, float]]] = {}
        for (_, b), (col, floor) in self.remake.items():
            remade.setdefault(b, []).append((col, floor))
        for b, charged in self.runs.charges().items():
            remade.setdefault(b, []).extend(charged)
        for s, cs in enumerate(self.p.op_time):
            entries = {self.A + s + 1: 1.0, self.A + s: -1.0}
            for k in rec.get(s + 1, []):
                entries[self.r[k]] = -self.recompute_cost(k)  # type: ignore[index]
            for col, floor in remade.get(s + 1, []):
                entries[col] = -SECONDS * floor
            rows.add(entries, SECONDS * cs)

    def _memory(self, rows: Rows) -> None:
        delta: list[dict[int, float]] = [{} for _ in range(self.p.stages)]
        for k, c in enumerate(self.p.candidates):
            size = BYTES * c.nbytes
            start = delta[c.last_forward + 1]
            ys = self.x[k]
            start[ys[0]] = start.get(ys[0], 0.0) - size
            for j, q in enumerate(self.options(c)):  # x_kj = y_kj - y_k(j+1) ends at q
                delta[q][ys[j]] = delta[q].get(ys[j], 0.0) + size
                if j + 1 < len(ys):
                    delta[q][ys[j + 1]] = delta[q].get(ys[j + 1], 0.0) - size
            vs = self.v[k]
            if vs:  # released later: held from f_k + 1 until the release's first freed stage
                start[vs[0]] = start.get(vs[0], 0.0) + size
                for i, col in enumerate(vs):
                    at = delta[self.release_stages(k, i)[0]]
                    at[col] = at.get(col, 0.0) - size
                    if i + 1 < len(vs):
                        at[vs[i + 1]] = at.get(vs[i + 1], 0.0) + size
            rc = self.r[k]
            if rc is not None:
                start[rc] = start.get(rc, 0.0) - size
                end = delta[c.first_backward]
                end[rc] = end.get(rc, 0.0) + size
        for (k, u), col in self.nest.items():
            cu, b = self.p.candidates[u], self.p.candidates[k].first_backward
            delta[b][col] = delta[b].get(col, 0.0) + BYTES * cu.nbytes
            delta[cu.first_backward][col] = delta[cu.first_backward].get(col, 0.0) - \
                BYTES * cu.nbytes
        for col, nbytes, last, ks in self.ext.values():
            until = min(self.p.candidates[k].first_backward for k in ks)
            if last + 1 < until:
                delta[last + 1][col] = delta[last + 1].get(col, 0.0) + BYTES * nbytes
                delta[until][col] = delta[until].get(col, 0.0) - BYTES * nbytes
        self.leaf_res.add_memory(delta, self.p)
        for t in range(self.p.stages):
            entries = {self.D + t: 1.0, **delta[t]}
            if t > 0:
                entries[self.D + t - 1] = -1.0
            rows.add(entries, 0.0, 0.0)

    def _d2h(self, rows: Rows) -> None:
        cands = self.p.candidates
        order = sorted(range(len(cands)), key=lambda k: (cands[k].produce, cands[k].tensor))
        prev: int | None = None
        latest = -1
        total = 0.0
        for k in order:
            c = cands[k]
            d = SECONDS * c.d2h
            o = {self.x[k][0]: -d}
            e = self.E + k
            if prev is not None:
                rows.add({e: 1.0, self.E + prev: -1.0, **o}, 0.0)
            rows.add({e: 1.0, self.A + c.produce: -1.0, **o}, SECONDS * self.p.op_time[c.produce])
            vs = self.v[k]
            # o_k = 0: E_k <= A_{f+1} + (earlier copies' time) when an earlier copy may be
            # waited for after f_k + 1; released later: E_k <= A_{f+1} + that + d_k
            big = total + d if vs else (total if latest > c.last_forward else 0.0)
            for i in range(-1, len(vs)):  # the Wait at f_k + 1 (i = -1) or at option i
                wait = c.last_forward + 1 if i < 0 else self.release_stages(k, i)[1]
                row = {self.A + wait: 1.0, e: -1.0, self.x[k][0]: -big}
                if i + 1 < len(vs):
                    row[vs[i + 1]] = big  # released at a later option: no Wait here
                rows.add(row, -big)
            latest = max(latest, self.release_stages(k, len(vs) - 1)[1] - 1 if vs
                         else c.last_forward)
            total += d
            prev = k
        add_d2h_windows(self, rows, order)

    def _h2d(self, rows: Rows) -> None:
        cands = self.p.candidates
        order = sorted(range(len(cands)), key=lambda k: cands[k].first_backward)
        due = [cands[k].first_backward for k in order]
        for k, c in enumerate(cands):
            for j in range(len(self.options(c))):
                tau = self.time_stage(k, j)
                # issued after Compute of stage tau - 1 ends, due when Compute of b starts
                entries: dict[int, float] = {self.A + c.first_backward: 1.0,
                                             self.A + tau - 1: -1.0}
                listed = 0
                hi = bisect.bisect_right(due, c.first_backward)
                lo = bisect.bisect_left(due, tau)
                for m in reversed(order[lo:hi]):
                    if listed >= WINDOW_CAP:
                        break
                    first = self._first_at(m, tau)
                    if first is not None:  # y_m,first: issued at or after tau
                        col = self.x[m][first]
                        entries[col] = entries.get(col, 0.0) - SECONDS * cands[m].h2d
                        listed += 1
                rows.add(entries, SECONDS * self.p.op_time[tau - 1])

    def _first_at(self, m: int, tau: int) -> int | None:
        """The first option of candidate ``m`` whose prefetch is issued at or after ``tau``."""
        for j in range(len(self.x[m])):
            if self.time_stage(m, j) >= tau:
                return j
        return None

    def _choices(self, rows: Rows) -> None:
        cands = self.p.candidates
        index = {c.tensor: k for k, c in enumerate(cands)}
        for k in range(len(cands)):
            entries = {self.x[k][0]: 1.0}
            if self.r[k] is not None:
                entries[self.r[k]] = 1.0  # type: ignore[index]
            rows.add(entries, -math.inf, 1.0)
            for a, b in itertools.pairwise(self.x[k]):
                rows.add({b: 1.0, a: -1.0}, -math.inf, 0.0)
            for a, b in itertools.pairwise([self.x[k][0], *self.v[k]]):
                rows.add({b: 1.0, a: -1.0}, -math.inf, 0.0)  # released later => offloaded
        if self.relaxed:
            self._dead_inputs(rows)
            self.leaf_res.add_rows(rows, self.r, self._later_options(),
                                   {d: col for d, (col, _, _, _) in self.ext.items()})
            self.runs.add_rows(rows, self.r, self.p)
            return
        for k, c in enumerate(cands):
            rk = self.r[k]
            if rk is None:
                continue
            for leaf in c.leaves:
                u = index[leaf]
                entries = {rk: 1.0}
                ru = self.r[u]
                if ru is not None:
                    rows.add({self.nest[(k, u)]: 1.0, rk: -1.0, ru: -1.0}, -1.0)
                later = [j for j, q in enumerate(self.options(cands[u])) if q > c.first_backward]
                if later:
                    entries[self.x[u][later[0]]] = 1.0
                rows.add(entries, -math.inf, 1.0)
                self._leaf_arrives(rows, k, u)
        self._nesting(rows, index)

    def _leaf_arrives(self, rows: Rows, k: int, u: int) -> None:
        """Primal: an offloaded leaf ``u`` of a recomputed ``k`` is waited for by ``k``'s
        recompute before stage ``b_k``, not at ``b_u``: its prefetch (option ``j``, issued
        after Compute of ``q_j - 1``) ends before the recompute, which ends before Compute of
        ``b_k``: ``A_(b_k) - A_(q_j - 1) >= c_(q_j - 1) + h_u + R_k`` when ``r_k = x_uj = 1``
        (big-M off otherwise; the H2D windows only hold ``u`` to ``b_u``, so without this
        row the model missed that stall: 42 ms on ResNet-50 b256 at 30%)."""
        cands = self.p.candidates
        b = cands[k].first_backward
        rk = self.r[k]
        assert rk is not None
        ys = self.x[u]
        for j, q in enumerate(self.options(cands[u])):
            if q > b:
                break
            need = SECONDS * (self.p.op_time[q - 1] + cands[u].h2d) + self.recompute_cost(k)
            entries = {self.A + b: 1.0, self.A + q - 1: -1.0, rk: -need, ys[j]: -need}
            if j + 1 < len(ys):
                entries[ys[j + 1]] = need  # x_uj = y_uj - y_u(j+1)
            rows.add(entries, -need)

    def _nesting(self, rows: Rows, index: dict[int, int]) -> None:
        """One level only: a leaf re-made early is not itself re-made from a recomputed leaf
        (``n_(k,u) + n_(u,w) <= 1``), and its own leaves are resident at ``b_k`` already
        (``n_(k,u) + sum_{q_wj > b_k} x_wj <= 1``)."""
        cands = self.p.candidates
        for (k, u), col in self.nest.items():
            b = cands[k].first_backward
            for leaf in cands[u].leaves:
                w = index[leaf]
                if (u, w) in self.nest:
                    rows.add({col: 1.0, self.nest[(u, w)]: 1.0}, -math.inf, 1.0)
                later = [j for j, q in enumerate(self.options(cands[w])) if q > b]
                if later:
                    rows.add({col: 1.0, self.x[w][later[0]]: 1.0}, -math.inf, 1.0)

    def _dead_inputs(self, rows: Rows) -> None:
        """What needs a freed input ``d`` (k's recompute, or re-running ``d.needed_by``
        before ``b_k``) has it: kept alive (``y``) or re-made at or before ``b_k`` (the
        ``z`` of its maker's runs)."""
        remakes: dict[int, list[tuple[int, int]]] = {}
        for (m, when), (z, _) in self.remake.items():
            remakes.setdefault(m, []).append((when, z))
        for k, c in enumerate(self.p.candidates):
            b = c.first_backward
            for d in c.dead_inputs:
                need = (self.r[k] if d.needed_by < 0
                        else self.remake[(d.needed_by, b)][0])
                assert need is not None  # the bound model has r_k for every candidate
                entries = {self.ext[d.storage][0]: 1.0, need: -1.0}
                if d.maker >= 0:
                    entries.update({z: 1.0 for when, z in remakes[d.maker] if when <= b})
                rows.add(entries, 0.0)

    def _later_options(self) -> dict[tuple[int, int], int]:
        """Bound model, per need ``(u, b)`` of ``leaf_residency``: the column ``y_u,j`` of
        ``u``'s first prefetch option wholly after stage ``b`` (``u`` still freed at ``b``)."""
        out: dict[tuple[int, int], int] = {}
        for u, b in self.leaf_res.cols:
            later = [j for j in range(len(self.x[u])) if self.time_stage(u, j) > b]
            if later:
                out[(u, b)] = self.x[u][later[0]]
        return out

    # -- solving ----------------------------------------------------------------------------
    def fix(self, k: int, pick: tuple) -> dict[int, float]:
        """Column values that force candidate ``k`` to ``pick`` (a ``Solution.choice`` entry)."""
        c = self.p.candidates[k]
        at = self.options(c).index(pick[1]) if pick[0] == "offload" else -1
        values = {col: float(j <= at) for j, col in enumerate(self.x[k])}
        rel = self.releases(c)
        late = rel.index(pick[2]) if pick[0] == "offload" and len(pick) > 2 and pick[2] in rel \
            else -1
        values.update({col: float(i <= late) for i, col in enumerate(self.v[k])})
        rc = self.r[k]
        if rc is not None:
            values[rc] = float(pick[0] == "recompute")
        return values

    def solve(self, *, integral: bool, gap: float = 1e-4,
              fixed: dict[int, float] | None = None, node_limit: int | None = None,
              cutoff: float | None = None, light: bool = False) -> Solution:
        """Solve with HiGHS; ``fixed`` pins columns (see ``fix``) for a local search.
        ``node_limit`` bounds the branch-and-bound work of a MILP in nodes. No wall-clock
        limit is ever set: HiGHS's MIP solver is deterministic for a given model and node
        limit, so the same input gives the same answer on a loaded machine and an idle one
        (data-parallel ranks compare their plans). The matrix is built once per Model.
        ``cutoff`` (seconds, MILPs only): HiGHS prunes every node whose bound is not below
        it (``objective_bound``), so a local search that only wants a better plan than its
        incumbent stops as soon as none can exist (the answer is then empty). ``light``
        turns HiGHS's RINS and RENS sub-MIP heuristics off (both deterministic): on
        ResNet-152's segment MILPs they took half the CPU and found no better plans. The bound
        model's LP (``relaxed`` and not ``integral``) is solved by ``LP_SOLVER``."""
        if self._built is None:
            rows, lo0, hi0 = self.build()
            matrix = coo_matrix((rows.v, (rows.r, rows.c)),
                                shape=(len(rows.lo), self.ncols)).tocsr()
            self._built = (matrix, rows.lo, rows.hi, lo0, hi0)
        matrix, row_lo, row_hi, lo0, hi0 = self._built
        lo, hi = lo0.copy(), hi0.copy()
        for col, value in (fixed or {}).items():
            lo[col] = hi[col] = value
        cost = np.zeros(self.ncols)
        cost[self.A + self.p.stages] = 1.0
        integrality = np.zeros(self.ncols)
        if integral:
            for xs in self.x:
                integrality[xs] = 1
            for vs in self.v:
                integrality[vs] = 1
            for rc in self.r:
                if rc is not None:
                    integrality[rc] = 1
        options: dict[str, float | bool | str] = {"mip_rel_gap": gap, "presolve": True}
        if node_limit is not None and integral:
            options["node_limit"] = node_limit
        if cutoff is not None and integral and math.isfinite(cutoff):
            options["objective_bound"] = cutoff * SECONDS
        if not integral and self.relaxed:
            options["solver"] = LP_SOLVER
        if light and integral:
            options["mip_heuristic_run_rins"] = False
            options["mip_heuristic_run_rens"] = False
        with warnings.catch_warnings():  # scipy passes HiGHS's own options on with a warning
            warnings.filterwarnings("ignore", "Unrecognized options", RuntimeWarning)
            res = milp(cost, integrality=integrality, bounds=Bounds(lo, hi),
                       constraints=LinearConstraint(matrix, row_lo, row_hi), options=options)
        sol = Solution(status=str(res.message))
        if res.x is None:
            return sol
        sol.objective = float(res.fun) / SECONDS
        dual = getattr(res, "mip_dual_bound", None)
        sol.bound = (float(dual) if integral and dual is not None and math.isfinite(dual)
                     else (float(res.fun) if res.status == 0 else 0.0)) / SECONDS
        sol.optimal = res.status == 0
        sol.choice = self._read(res.x)
        sol.settled = self._settled(res.x)
        return sol

    def _settled(self, values: np.ndarray, tol: float = 1e-6) -> list[bool]:
        """Per candidate: every column of it is integral in ``values``."""
        out = []
        for k in range(len(self.p.candidates)):
            cols = [*self.x[k], *self.v[k], *([self.r[k]] if self.r[k] is not None else [])]
            out.append(all(min(abs(values[c]), abs(1 - values[c])) <= tol for c in cols))
        return out

    def _release_read(self, k: int, values: np.ndarray, eps: float) -> int:
        """The earliest release stage with a share in ``values`` (``last_forward + 1`` when
        the share released there is positive), so the rounded plan frees at least as much."""
        c = self.p.candidates[k]
        vs = [float(values[col]) for col in self.v[k]]
        shares = [float(values[self.x[k][0]]) - (vs[0] if vs else 0.0)]
        shares += [vs[i] - (vs[i + 1] if i + 1 < len(vs) else 0.0) for i in range(len(vs))]
        for i, share in enumerate(shares):
            if share > eps:
                return c.last_forward + 1 if i == 0 else self.release_stages(k, i - 1)[0]
        return c.last_forward + 1

    def _read(self, values: np.ndarray, eps: float = 1e-6) -> list[tuple]:
        """Integral choices from (possibly fractional) values, rounded so that every stage
        frees at least the bytes the values free (the memory rows stay met): a candidate
        with any recompute share is recomputed when that share is the larger, else
        offloaded with its prefetch at the latest option it has a share in (just in time
        when it also has a recompute share); a candidate with no share is kept."""
        out: list[tuple] = []
        for k, c in enumerate(self.p.candidates):
            ys = [float(values[col]) for col in self.x[k]] + [0.0]
            xs = [ys[j] - ys[j + 1] for j in range(len(ys) - 1)]
            rc = self.r[k]
            rv = float(values[rc]) if rc is not None else 0.0
            off = ys[0]
            opts = self.options(c)
            if rv > eps and rv >= off:
                out.append(("recompute",))
            elif off > eps:
                latest = max(j for j in range(len(xs)) if xs[j] > eps or j == 0)
                out.append(("offload", opts[-1] if rv > eps else opts[latest],
                            self._release_read(k, values, eps)))
            else:
                out.append(("keep",))
        return out

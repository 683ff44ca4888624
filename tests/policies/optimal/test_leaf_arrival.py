"""The primal model prices the stall of a recompute that waits for an offloaded input.

A hand-made Problem (plain data, eight 1 ms stages, budget never binding): ``u`` is offloaded
and prefetched before stage 5, a 10 ms copy; ``k`` is recomputed before stage 5 from ``u``
(a 1 ms recompute). Lowering waits for ``u`` before that recompute, so Compute of stage 5
starts no earlier than 4 + 1 (stage 4) + 10 (the copy) + 1 (the recompute) = 16 ms, and the
step ends at 16 + 3 = 19 ms. Before the leaf-arrival row the model only held ``u``'s copy
to ``u``'s own first backward use (stage 7) and said 16 ms.
"""

import pytest

from outcore.policies.optimal import Candidate, Problem, formulation

MS = 1e-3


def _problem() -> Problem:
    u = Candidate(tensor=1, nbytes=1 << 20, produce=0, last_forward=1, first_backward=7,
                  d2h=0.5 * MS, h2d=10 * MS, recompute=None, recompute_floor=MS, leaves=(),
                  options=(5, 7))
    k = Candidate(tensor=2, nbytes=1 << 20, produce=2, last_forward=2, first_backward=5,
                  d2h=0.5 * MS, h2d=MS, recompute=MS, recompute_floor=MS, leaves=(1,),
                  options=(5,))
    return Problem(op_order=tuple(range(8)), op_time=(MS,) * 8, memory=(0,) * 8,
                   budget=1 << 30, candidates=(u, k), copy_engines=2)


@pytest.mark.parametrize(("u_pick", "expected_ms"), [
    (("offload", 5, 2), 19.0),  # k's recompute waits for u's copy before stage 5
    (("keep",), 9.0),           # u resident: only the recompute's 1 ms
])
def test_a_recompute_waits_for_its_offloaded_input(u_pick, expected_ms):
    model = formulation.Model(_problem(), relaxed=False)
    pins = {**model.fix(0, u_pick), **model.fix(1, ("recompute",))}
    sol = model.solve(integral=True, fixed=pins)
    assert sol.choice and sol.objective * 1e3 == pytest.approx(expected_ms, abs=1e-6)


def test_an_input_prefetched_after_its_recompute_is_refused():
    model = formulation.Model(_problem(), relaxed=False)
    pins = {**model.fix(0, ("offload", 7, 2)), **model.fix(1, ("recompute",))}
    assert not model.solve(integral=True, fixed=pins).choice

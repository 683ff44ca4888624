"""The portfolio's side process (``outcore.policies.auto.side``): PoocH and
outcore-checkpoint computed in a forked child give the entries running them in this process
gives; whatever the child cannot send (an error, an outcome that does not pickle) is run
here again; no child outlives the portfolio."""

from __future__ import annotations

import os

import pytest

from outcore.api import cost_model_for
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.policies import PolicyContext
from outcore.policies.auto import SIDE, SideRun, can_fork, greedy_policy, portfolio, run_portfolio
from outcore.policies.registry import PolicyOutput, get
from outcore.sim.synthetic import residual_chain

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs os.fork and two cores")

COST = cost_model_for("v100-pcie")
NAMES = ("outcore-optimal", "outcore-auto", "outcore-checkpoint", "pooch")
GRAPH = residual_chain(6, activation_bytes=1 << 28, conv_flops=4e9)


def _ctx(fraction: float) -> PolicyContext:
    return PolicyContext(budget=int(reference_peaks(GRAPH).liveness * fraction), cost=COST)


def _runners(calls: list[str], replace: dict | None = None) -> dict:
    """Every name of ``NAMES`` recorded in ``calls`` when it runs in this process (a child's
    appends stay in the child); outcore-optimal stands in as the greedy planner."""
    def runner_for(name: str):
        fn = (replace or {}).get(name) or (
            greedy_policy if name in ("outcore-auto", "outcore-optimal") else get(name).fn)

        def run(graph, ctx):
            calls.append(name)
            return fn(graph, ctx)
        return run
    return {n: runner_for(n) for n in NAMES}


def _same(a, b) -> None:
    assert [e.name for e in a.entries] == [e.name for e in b.entries]
    for x, y in zip(a.entries, b.entries, strict=True):
        assert (x.seconds, x.peak, x.host_peak, x.skipped) == (y.seconds, y.peak, y.host_peak,
                                                               y.skipped)
        assert (x.error is None) == (y.error is None)
        if x.output is not None:
            assert y.output is not None
            assert x.output.graph is GRAPH and y.output.graph is GRAPH
            assert x.output.plan.decisions == y.output.plan.decisions
            assert x.output.schedule == y.output.schedule
            assert x.output.predicted_peak == y.output.predicted_peak


@pytest.fixture
def children(monkeypatch):
    """The pids of the side processes started while the test runs."""
    pids: list[int] = []

    class Recorded(SideRun):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pids.append(self.pid)

    monkeypatch.setattr(portfolio, "SideRun", Recorded)
    return pids


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.parametrize("fraction", [0.5, 0.7])
def test_the_side_process_gives_the_entries_of_one_process(fraction, children):
    here: list[str] = []
    side = run_portfolio(GRAPH, _ctx(fraction), NAMES, _runners(here), parallel=True)
    alone: list[str] = []
    serial = run_portfolio(GRAPH, _ctx(fraction), NAMES, _runners(alone), parallel=False)
    assert all(e.skipped is None for e in serial.entries)  # the side ones did run
    assert sorted(alone) == sorted(NAMES)
    assert sorted(here) == sorted(n for n in NAMES if n not in SIDE)  # not run here
    _same(side, serial)
    assert len(children) == 1 and _reaped(children[0])


def test_side_candidates_skipped_here_are_never_read(children):
    ctx = PolicyContext(budget=reference_peaks(GRAPH).liveness, cost=COST)  # at the floor
    side = run_portfolio(GRAPH, ctx, NAMES, _runners([]), parallel=True)
    serial = run_portfolio(GRAPH, ctx, NAMES, _runners([]), parallel=False)
    assert [e.name for e in side.entries if e.skipped] == ["outcore-optimal",
                                                           "outcore-checkpoint", "pooch"]
    _same(side, serial)
    assert len(children) == 1 and _reaped(children[0])


def test_an_error_in_the_side_process_is_raised_here(children):
    def broken(graph, ctx):
        raise RuntimeError("a bug in pooch")

    here: list[str] = []
    with pytest.raises(RuntimeError, match="a bug in pooch"):
        run_portfolio(GRAPH, _ctx(0.5), NAMES, _runners(here, {"pooch": broken}),
                      parallel=True)
    assert "pooch" in here  # run again in this process, where the error is raised
    assert len(children) == 1 and _reaped(children[0])


def test_an_infeasible_budget_travels_back_whole(children):
    def refuses(graph, ctx):
        raise InfeasibleBudgetError("pooch", ctx.budget, 12345, "a hint")

    here: list[str] = []
    result = run_portfolio(GRAPH, _ctx(0.5), NAMES, _runners(here, {"pooch": refuses}),
                           parallel=True)
    assert "pooch" not in here
    error = {e.name: e for e in result.entries}["pooch"].error
    assert error is not None and (error.policy, error.required, error.hint) == (
        "pooch", 12345, "a hint")
    assert error.budget == _ctx(0.5).budget and "12345 bytes" in str(error)


def test_an_outcome_that_does_not_pickle_is_computed_here(children):
    def odd(graph, ctx):
        out = get("pooch").fn(graph, ctx)
        return PolicyOutput(out.plan, out.schedule, out.graph,
                            notes=[lambda: "does not pickle"])  # type: ignore[list-item]

    here: list[str] = []
    side = run_portfolio(GRAPH, _ctx(0.5), NAMES, _runners(here, {"pooch": odd}),
                         parallel=True)
    assert "pooch" in here and "outcore-checkpoint" not in here
    serial = run_portfolio(GRAPH, _ctx(0.5), NAMES, _runners([]), parallel=False)
    _same(side, serial)


def test_small_graphs_plan_in_one_process(children):
    here: list[str] = []
    run_portfolio(GRAPH, _ctx(0.5), NAMES, _runners(here))  # parallel=None: by the size
    assert sorted(here) == sorted(NAMES) and children == []


def test_every_candidate_gives_the_entries_of_one_process(children):
    """The whole portfolio: the cheap seed policies in the child too."""
    from outcore.policies.auto import CANDIDATES

    runners = {"outcore-auto": greedy_policy}
    side = run_portfolio(GRAPH, _ctx(0.6), CANDIDATES, runners, parallel=True)
    serial = run_portfolio(GRAPH, _ctx(0.6), CANDIDATES, runners, parallel=False)
    assert {"vdnn-dyn", "superneurons", "modnn", "dymem", "offload-all"} <= set(SIDE)
    _same(side, serial)
    assert len(children) == 1 and _reaped(children[0])


def test_this_process_plans_ahead_of_reading_the_child(monkeypatch, children):
    """outcore-optimal (here the greedy stand-in) runs in this process before the first
    entry is read from the child, though the candidates before it in order run there: the
    HiGHS solves do not wait for the child's planners."""
    here: list[str] = []
    seen_at_first_take: list[list[str]] = []
    take = SideRun.take

    def recording_take(self, name):
        if not seen_at_first_take:
            seen_at_first_take.append(list(here))
        return take(self, name)

    monkeypatch.setattr(SideRun, "take", recording_take)
    names = ("outcore-auto", "superneurons", "outcore-optimal", "outcore-checkpoint", "pooch")
    runners = _runners(here)
    runners["superneurons"] = get("superneurons").fn
    side = run_portfolio(GRAPH, _ctx(0.5), names, runners, parallel=True)
    assert seen_at_first_take == [["outcore-auto", "outcore-optimal"]]
    serial = run_portfolio(GRAPH, _ctx(0.5), names, runners, parallel=False)
    _same(side, serial)

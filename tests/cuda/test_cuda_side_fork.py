"""outcore-auto's forked side process (``outcore.policies.auto.side``) in a process that has
already initialized CUDA, as a user's training script has by the time it plans.

A fork after CUDA initialization is safe only while the child never touches CUDA: the child
runs PoocH and outcore-checkpoint (pure Python) and leaves with ``os._exit``. Asserted: a
child was forked and reaped, the plan is the one planning in one process gives, and CUDA
still works in the parent afterwards (a kernel runs and its result is right).
"""

from __future__ import annotations

import os

import pytest
import torch

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies import PolicyContext
from outcore.policies.auto import can_fork, greedy_policy, run_portfolio
from outcore.policies.registry import get
from outcore.sim.synthetic import residual_chain

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs os.fork and two cores")


#: outcore-optimal (HiGHS, in this process) beside the two candidates the child runs.
NAMES = ("outcore-optimal", "outcore-auto", "outcore-checkpoint", "pooch")


def _portfolio(graph, budget: int, parallel: bool):
    runners = {n: greedy_policy if n == "outcore-auto" else get(n).fn for n in NAMES}
    ctx = PolicyContext(budget=budget, cost=cost_model_for("v100-pcie"))
    return run_portfolio(graph, ctx, NAMES, runners, parallel=parallel)


@pytest.mark.parametrize("fraction", [0.5, 0.7])
def test_the_side_process_after_cuda_init_gives_the_serial_plan(fraction, monkeypatch):
    a = torch.randn(128, 128, device="cuda")
    expected = (a @ a).cpu()  # CUDA and cuBLAS are initialized in this process
    forked: list[int] = []
    real_fork = os.fork

    def recorded_fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", recorded_fork)
    graph = residual_chain(6, activation_bytes=1 << 28, conv_flops=4e9)
    budget = int(reference_peaks(graph).liveness * fraction)
    side = _portfolio(graph, budget, parallel=True)
    assert len(forked) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(forked[0], os.WNOHANG)  # reaped by the portfolio
    serial = _portfolio(graph, budget, parallel=False)
    assert len(forked) == 1
    assert [e.name for e in side.entries] == [e.name for e in serial.entries]
    for x, y in zip(side.entries, serial.entries, strict=True):
        assert (x.seconds, x.peak, x.skipped, x.error is None) == (
            y.seconds, y.peak, y.skipped, y.error is None)
        if x.output is not None:
            assert y.output is not None and x.output.graph is graph
            assert x.output.plan.decisions == y.output.plan.decisions
            assert x.output.schedule == y.output.schedule
    assert side.winner is not None and side.winner.name == serial.winner.name
    again = (a @ a).cpu()
    torch.cuda.synchronize()
    assert torch.equal(again, expected)

"""Dymem: DFS order, offload without barriers, Alg. 2's prefetch positions, GTBM placement,
budgets, and the executor against eager PyTorch."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import OpCategory, Phase
from outcore.graph.order import execution_order
from outcore.plan.memory import predicted_peak
from outcore.plan.schedule import Compute, Offload, Prefetch, Wait
from outcore.policies import PolicyContext, get, names
from outcore.policies.dymem import (
    RECLAIMED,
    alg2_position,
    all_swap_minimum_for,
    conv_positions,
    place,
    plan_dymem,
)
from outcore.pool import blocks_from_schedule, check_placement
from outcore.runtime.executor import Executor
from outcore.sim import simulate
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
from models import make


class SlowLink:
    """Convolutions 1 s, views free, other ops 0.1 s, copies at 1e4 B/s."""

    copy_engines = 2

    def op_time(self, op) -> float:
        if op.category is OpCategory.VIEW:
            return 0.0
        return 1.0 if op.category is OpCategory.CONV else 0.1

    def transfer_time(self, nbytes: int, direction: str) -> float:
        return nbytes / 1e4

    def bind(self, graph):  # needs nothing from the graph
        return self

    def workspace(self, op) -> int:
        return 0


def captured(model: str):
    m, loss_fn, batch = make(model)
    return m, loss_fn, batch, capture(copy.deepcopy(m), loss_fn, batch)


def test_registered():
    assert "dymem" in names()


def test_execution_order_is_dfs():
    *_, g = captured("inception")
    out = get("dymem").fn(g, PolicyContext(cost=SlowLink()))
    ran = [i.op for i in out.schedule.instructions if isinstance(i, Compute) and not i.recompute]
    dfs = execution_order(g, "dfs")
    assert ran == dfs
    assert ran != [op.id for op in g.ops]  # the fork/join model is not already in DFS order


def test_offload_candidates_leave_fc_softmax_dropout_on_the_device():
    *_, g = captured("transformer")
    result = plan_dymem(g, PolicyContext(cost=SlowLink()))
    moved = {i.tensor for i in result.schedule.instructions if isinstance(i, Offload)}
    producers = {x: g.ops[g.tensors[x].producer].category for x in result.profile.features}
    assert moved and all(producers[x] not in RECLAIMED for x in moved)
    assert {producers[x] for x in set(producers) - moved} <= RECLAIMED
    assert any(c in RECLAIMED for c in producers.values())


def test_forward_runs_without_per_layer_barriers():
    """Copies are 10x slower than the ops; forward still runs back to back and waits for
    the copy-outs once, when it ends (the paper's end-of-forward synchronisation)."""
    g = residual_chain(4, activation_bytes=16_000, param_bytes=100)
    result = plan_dymem(g, PolicyContext(cost=SlowLink()))
    ev = result.evaluation
    fwd_ops = [op for op in g.ops if op.phase is Phase.FORWARD]
    assert not ev.forward_stall
    assert ev.forward_end == pytest.approx(sum(SlowLink().op_time(op) for op in fwd_ops))
    sim = simulate(g, result.schedule, SlowLink())
    ins = result.schedule.instructions
    first_bwd = next(i for i, x in enumerate(ins) if isinstance(x, Compute)
                     and g.ops[x.op].phase is Phase.BACKWARD)
    stalls = [i for i, x in enumerate(ins) if isinstance(x, Wait) and x.direction == "d2h"
              and sim.end[i] > sim.start[i] + 1e-12]
    assert stalls and all(i < first_bwd for i in stalls)
    assert max(sim.end[i] for i in stalls) == pytest.approx(max(ev.copy_out_end.values()))
    assert sim.step_time == pytest.approx(ev.time)


@pytest.mark.parametrize("lo, need, expected", [
    (10, 30, 20),  # CONVs at 12, 20, 25 before the use at 30: issued at the second-to-last
    (10, 21, 12),  # CONVs 12 and 20 before 21
    (10, 20, 10),  # only one CONV (12) before 20: issued as soon as allowed
    (21, 30, 21),  # CONVs 20 and 25 but 20 is before lo: only 25 counts -> lo
    (10, 40, 25),
])
def test_alg2_position(lo, need, expected):
    assert alg2_position([12, 20, 25, 33], lo, need) == expected


def test_prefetches_follow_alg2_when_memory_allows():
    *_, g = captured("resnet")
    result = plan_dymem(g, PolicyContext(cost=SlowLink()))
    ev, p = result.evaluation, result.profile
    convs = conv_positions(p)
    swapped = [x for x, c in ev.classes.items() if c == "swap"]
    assert swapped
    for x in swapped:
        lo = max(p.nf, ev.free_at[x])
        assert ev.issue_at[x] == alg2_position(convs, lo, ev.need_at[x])
    ins = result.schedule.instructions
    order = {op: j for j, op in enumerate(p.order)}
    for k, item in enumerate(ins):  # the Prefetch sits right before its position's op
        if isinstance(item, Prefetch):
            nxt = next(x for x in ins[k:] if isinstance(x, Compute) and not x.recompute)
            assert order[nxt.op] == ev.issue_at[item.tensor]


def test_budget_blocks_prefetches_and_forward():
    *_, g = captured("resnet")
    roomy = plan_dymem(g, PolicyContext(cost=SlowLink()))
    need = int(all_swap_minimum_for(roomy.profile, roomy.evaluation.classes))
    with pytest.raises(InfeasibleBudgetError) as err:
        get("dymem").fn(g, PolicyContext(budget=need - 1, cost=SlowLink()))
    assert err.value.required == need
    budget = int(need * 1.02)
    tight = plan_dymem(g, PolicyContext(budget=budget, cost=SlowLink()))
    tight_peak = predicted_peak(g, tight.schedule)
    assert tight_peak <= budget < predicted_peak(g, roomy.schedule)
    later = [x for x in tight.evaluation.issue_at
             if tight.evaluation.issue_at[x] > roomy.evaluation.issue_at[x]]
    assert later or tight.evaluation.forward_stall


@pytest.mark.parametrize("model", ["resnet", "inception"])
def test_gtbm_placement_of_the_schedule(model):
    *_, g = captured(model)
    schedule = get("dymem").fn(g, PolicyContext(cost=SlowLink())).schedule
    blocks = blocks_from_schedule(g, schedule)
    assert {b.mobility for b in blocks} >= {"static", "movable", "temporary"}
    gtbm = place(g, schedule, beta=0)
    check_placement(blocks, gtbm.offsets, gtbm.sizes, gtbm.pool_size)
    assert gtbm.pool_size >= gtbm.lower_bound == max(blocks_live(blocks))
    assert gtbm.info["main"] <= gtbm.info["init"] and gtbm.info["squeeze_gap"] > 0
    with_beta = place(g, schedule, beta=4096)
    assert with_beta.info["main"] >= gtbm.info["main"]
    best_fit = place(g, schedule, policy="best-fit")
    assert best_fit.policy == "best-fit" and best_fit.pool_size >= best_fit.lower_bound


def blocks_live(blocks):
    from outcore.pool import live_curve

    return live_curve(blocks)


@pytest.mark.parametrize("model", ["resnet", "inception", "densenet"])
def test_executor_matches_eager(model):
    m, loss_fn, batch = make(model)
    reference = copy.deepcopy(m)
    torch.manual_seed(5)
    loss_fn(reference(batch[0]), batch[1]).backward()
    trained = copy.deepcopy(m)
    g = capture(trained, loss_fn, batch)
    schedule = get("dymem").fn(g, PolicyContext(cost=SlowLink())).schedule
    assert schedule.count(Offload) > 0
    torch.manual_seed(5)
    step = Executor(g, schedule).run(batch)
    for (name, p), q in zip(trained.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
    for (name, b), c in zip(trained.named_buffers(), reference.buffers(), strict=True):
        assert torch.equal(b, c), name
    assert step.peak_bytes == predicted_peak(g, schedule)

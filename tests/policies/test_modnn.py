"""moDNN (DATE'18): the linked-list pool, eqs. 2-5 and Algorithm 1 on hand-made graphs, and
the executor running its schedules against eager PyTorch."""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph, Op, OpCategory
from outcore.graph.liveness import memory_per_step
from outcore.plan.memory import predicted_peak
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Wait
from outcore.plan.verify import verify
from outcore.policies import PolicyContext, get
from outcore.policies.modnn import (
    ModnnConfig,
    SegmentList,
    footprint,
    minimum_memory,
    plan_modnn,
    sub_batch,
)
from outcore.runtime.executor import Executor
from outcore.runtime.subbatch import run_sub_batches, split_batch
from outcore.sim import simulate
from outcore.sim.synthetic import residual_chain
from outcore.variants.meta import CONV

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
from models import make

UNIT, PARAM = 1000, 100


class TableCost:
    """Ops by category (conv 1 s, others 0.1 s), copies at ``bandwidth`` B/s both ways; a
    CONV-target op runs "fft" ``fft_speed`` times as fast with ``fft_ws`` bytes of workspace."""

    def __init__(self, bandwidth: float = 1e4, fft_speed: float = 1.0, fft_ws: int = 0,
                 engines: int = 2) -> None:
        self.bandwidth, self.fft_speed, self.fft_ws = bandwidth, fft_speed, fft_ws
        self.copy_engines = engines

    def op_time(self, op: Op) -> float:
        t = 1.0 if op.category is OpCategory.CONV else 0.1
        return t / self.fft_speed if op.variant == "fft" else t

    def transfer_time(self, nbytes: int, direction: str) -> float:
        return nbytes / self.bandwidth

    def bind(self, graph):  # needs nothing from the graph
        return self

    def workspace(self, op: Op) -> int:
        return self.fft_ws if op.variant == "fft" else 0


def chain(batch: int, units: int = 2) -> Graph:
    """A residual chain whose activations hold ``batch * UNIT`` bytes."""
    return residual_chain(units, activation_bytes=batch * UNIT, param_bytes=PARAM)


def ctx_for(budget: int, batch: int = 16, units: int = 2, recapture: bool = True,
            cost: object | None = None) -> PolicyContext:
    rec = (lambda k: chain(batch // k, units)) if recapture else None
    return PolicyContext(budget=budget, cost=cost or TableCost(), recapture=rec,
                         options={"batch_size": batch})


# ---- the linked list ---------------------------------------------------------------------

def test_fig4_offloading_schemes():
    """Blocks (1)..(6), (4) not offloadable: a request of 4 finds (1)(2) and (5)(6)."""
    mem = SegmentList(12)
    for owner, size in [(1, 2), (2, 2), (3, 1), (4, 3), (5, 2), (6, 2)]:
        mem.allocate(owner, size)
    schemes = list(mem.schemes(4, lambda o: o != 4))
    assert [s.owners for s in schemes] == [(1, 2), (5, 6)]
    assert [s.start for s in schemes] == [0, 8]
    mem.check()


def test_first_fit_and_merge():
    mem = SegmentList(10)
    assert [mem.allocate(o, s) for o, s in [(1, 3), (2, 2), (3, 3)]] == [0, 3, 5]
    mem.free(2)
    assert mem.allocate(4, 1) == 3  # first fit: the hole left by block 2
    mem.free(1)
    mem.free(4)  # merges with the free hole before it
    segments = [(s.start, s.size, s.owner) for s in mem.segments]
    assert segments == [(0, 5, None), (5, 3, 3), (8, 2, None)]
    assert mem.allocate(5, 6) is None and mem.largest_free() == 5
    mem.check()


# ---- eq. (2) and eq. (3) ----------------------------------------------------------------

def test_mmin_eq2_by_hand():
    """SW = x + 2 weights + tangent + loss + 2 weight gradients; the largest task (the second
    residual add, or a backward op: two activation-sized inputs, one output) holds 3 A."""
    mmin = minimum_memory(chain(16), ctx_for(10**9))
    sw = UNIT + 4 * PARAM + 4 + 4
    assert mmin.sw == sw
    assert mmin.largest_task == 3 * UNIT
    assert mmin.minimum == sw + 3 * UNIT


@pytest.mark.parametrize("budget, trace, size", [
    # b' = b (M - SW(b)) / 3 A(b) = (M - 1000 b - 408) / 3000 (SW grows with the batch input)
    (10**6, [(16, 327.86)], 16),  # everything fits: no sub-batches
    (30_000, [(16, 4.53), (4, 8.53), (8, 7.2)], 4),  # oscillates 4 -> 8 -> 4: keep 4
    (8_000, [(16, -2.8), (1, 2.2), (2, 1.86)], 1),  # below zero: restart from 1
])
def test_eq3_iterates_to_a_divisor(budget, trace, size):
    choice = sub_batch(chain(16), ctx_for(budget))
    assert [(b, round(p, 2)) for b, p in choice.iterations] == trace
    assert (choice.size, choice.parts) == (size, 16 // size)
    assert choice.footprint.minimum <= budget


def test_budget_below_mmin_names_it():
    mmin = minimum_memory(chain(16), ctx_for(10**9)).minimum
    with pytest.raises(InfeasibleBudgetError) as err:
        get("modnn").fn(chain(16), ctx_for(mmin - 1))
    assert err.value.required == mmin and err.value.policy == "modnn"
    message = str(err.value)
    assert "Mmin" in message and "'add1'" in message and f"({mmin} bytes)" in message
    get("modnn").fn(chain(16), ctx_for(mmin))  # exactly Mmin trains


def test_batchnorm1d_bound_is_taken_at_the_smallest_capturable_size():
    """BatchNorm1d needs two samples per channel in training: sub-batch size 1 does not
    capture, so Mmin is the footprint at size 2 and the error says so."""
    model, loss_fn, batch = make("mlp")
    graph = capture(model, loss_fn, batch)

    def rec(k):
        n = batch[0].shape[0] // k
        return capture(model, loss_fn, (batch[0][:n], batch[1][:n]))

    ctx = PolicyContext(budget=0, cost=TableCost(), recapture=rec,
                        options={"sub_batch_statistics": True})
    mmin = minimum_memory(graph, ctx)
    assert mmin == footprint(rec(4), ctx.cost, ModnnConfig())  # batch 8 / 4 sub-batches = size 2
    with pytest.raises(InfeasibleBudgetError, match=r"sub-batch size 2 \(the smallest size"):
        get("modnn").fn(graph, dataclasses.replace(ctx, budget=mmin.minimum - 1))
    out = get("modnn").fn(graph, dataclasses.replace(ctx, budget=mmin.minimum))
    assert out.schedule.sub_batches == batch[0].shape[0] // 2


def test_without_recapture_sub_batching_is_refused():
    full = sub_batch(chain(16), ctx_for(10**9)).footprint.minimum
    with pytest.raises(InfeasibleBudgetError, match=r"ctx\.recapture is None"):
        get("modnn").fn(chain(16), ctx_for(full - 1, recapture=False))


# ---- Algorithm 1 ---------------------------------------------------------------------------

def kinds(schedule) -> dict[type, int]:
    return {k: schedule.count(k) for k in (Offload, Prefetch, Compute, Free, Wait)}


def test_no_transfers_when_everything_fits():
    """SW is reserved up front and the list fragments, so "fits" means some slack above the
    liveness peak; then no allocation fails and the schedule frees at last use only."""
    g = chain(16)
    peak = max(memory_per_step(g))
    out = get("modnn").fn(g, ctx_for(2 * peak, recapture=False))
    assert out.schedule.count(Offload) == out.schedule.count(Prefetch) == 0
    assert predicted_peak(g, out.schedule) == peak


@pytest.mark.parametrize("units", [2, 4])
@pytest.mark.parametrize("fraction", [0.5, 0.7, 0.85])
def test_offloads_on_allocation_failure_within_budget(units, fraction):
    g = chain(16, units)
    full = sub_batch(g, ctx_for(10**9, units=units)).footprint.minimum
    peak = max(memory_per_step(g))
    budget = int(full + fraction * (peak - full))
    out = get("modnn").fn(g, ctx_for(budget, units=units, recapture=False))
    s = out.schedule
    verify(g, s)
    assert s.sub_batches == 1 and s.count(Offload) > 0
    assert predicted_peak(g, s) <= budget
    ins = s.instructions
    for i, item in enumerate(ins):  # criterion (a): never evict what the next task reads
        if isinstance(item, Free) and any(isinstance(p, Wait) and p.tensor == item.tensor
                                          and p.direction == "d2h" for p in ins[max(0, i - 3):i]):
            nxt = next(x for x in ins[i:] if isinstance(x, Compute))
            assert item.tensor not in g.ops[nxt.op].inputs


@pytest.mark.parametrize("bandwidth, ahead", [(1e9, 1), (1e5, 2), (1e4, 6)])
def test_eq4_prefetch_starts_when_waiting_would_delay(bandwidth, ahead):
    """One block (16 kB) comes back for the last backward tasks; tasks take 1 s (conv) or
    0.1 s. Eq. (4) starts its prefetch before task t as soon as T + T(t) + 16 kB / bandwidth
    > EST(reader). At 1e5 B/s (0.16 s): before conv_bwd1 (1 + 0.16 > 1 + 0.1, while before
    relu_bwd1 0.1 + 0.16 < 1.2), 2 tasks ahead. At 1e4 B/s (1.6 s): before conv_bwd2
    (2.6 > 2.4; one task earlier 1.7 < 2.5), 6 tasks ahead. At 1e9 B/s: the task before."""
    g = chain(16, 4)
    full = sub_batch(g, ctx_for(10**9, units=4)).footprint.minimum
    budget = full + 6 * 16 * UNIT
    out = get("modnn").fn(g, ctx_for(budget, units=4, recapture=False,
                                     cost=TableCost(bandwidth=bandwidth)))
    ins = out.schedule.instructions
    distances = []
    for i, item in enumerate(ins):
        if isinstance(item, Prefetch):
            reader = next(j for j in range(i, len(ins)) if isinstance(ins[j], Wait)
                          and ins[j].tensor == item.tensor and ins[j].direction == "h2d")
            distances.append(sum(isinstance(x, Compute) for x in ins[i:reader]))
    assert distances == [ahead]


def conv_graph(batch: int = 16) -> Graph:
    """The chain with its forward convolutions marked as aten convolutions (so they have
    algorithms: framework, im2col, fft)."""
    g = chain(batch)
    for op in g.ops:
        if op.name.startswith("conv") and "bwd" not in op.name:
            g.ops[op.id] = dataclasses.replace(op, target=CONV)
    return g


@pytest.mark.parametrize("fft_speed, fft_ws, budget_extra, chosen", [
    (2.0, 500, 10**6, "fft"),  # faster and the workspace fits: the gain is positive
    (0.5, 0, 10**6, "framework"),  # slower: negative gain
    (2.0, 10**7, 10**6, "framework"),  # the workspace cannot fit even after offloading
])
def test_eq5_algorithm_by_gain(fft_speed, fft_ws, budget_extra, chosen):
    g = conv_graph()
    cost = TableCost(fft_speed=fft_speed, fft_ws=fft_ws)
    peak = max(memory_per_step(g))
    out = get("modnn").fn(g, PolicyContext(budget=peak + budget_extra, cost=cost,
                                           options={"batch_size": 16}))
    convs = [op.id for op in g.ops if op.target == CONV]
    assert [out.schedule.variants.get(c, "framework") for c in convs] == [chosen] * len(convs)
    sim = simulate(g, out.schedule, cost)
    assert sim.peak_bytes <= peak + budget_extra


def test_eq5_offloads_for_a_workspace_worth_it():
    """With the data region nearly full, a 10x faster algorithm whose workspace needs an
    eviction is still chosen: the offload delay is far below the time saved."""
    g = conv_graph()
    peak = max(memory_per_step(g))
    cost = TableCost(bandwidth=1e6, fft_speed=10.0, fft_ws=3 * 16 * UNIT)
    out = get("modnn").fn(g, PolicyContext(budget=peak, cost=cost, options={"batch_size": 16}))
    assert set(out.schedule.variants.values()) == {"fft"}
    assert out.schedule.count(Offload) > 0
    assert simulate(g, out.schedule, cost).peak_bytes <= peak


@pytest.mark.parametrize("units", [1, 3])
def test_every_budget_from_mmin_up_is_scheduled(units):
    g = chain(16, units)
    ctx = ctx_for(0, units=units)
    mmin = minimum_memory(g, ctx).minimum
    peak = max(memory_per_step(g))
    for budget in range(mmin, peak + 2 * UNIT, max(1, (peak - mmin) // 23)):
        result = plan_modnn(g, dataclasses.replace(ctx, budget=budget))
        out = result
        verify(out.graph, out.schedule)
        sim = simulate(out.graph, out.schedule, ctx.cost)
        assert sim.peak_bytes <= budget, budget
        assert sim.step_time == pytest.approx(result.stats.finish_time * out.schedule.sub_batches)


# ---- on the executor -------------------------------------------------------------------------

def eager_grads(model, loss_fn, batch):
    model = copy.deepcopy(model)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def run_modnn(model, loss_fn, batch, budget_of, cost=None, recapture=True, **extra):
    trained = copy.deepcopy(model)
    graph = capture(trained, loss_fn, batch)

    def rec(k):  # sub-batches as the executor gets them: copies, not views of the batch
        return capture(trained, loss_fn, split_batch(batch, k)[0])

    from outcore.cost import AnalyticCostModel, get_profile
    # without a cost that prices algorithms, no variant: the kernels are eager's, bit for bit
    options = {} if cost is not None else {"variants": {}}
    options.update(extra)
    cost = cost or AnalyticCostModel(get_profile("k40c"))
    ctx = PolicyContext(budget=0, cost=cost, recapture=rec if recapture else None,
                        options=options)
    budget = budget_of(graph, ctx)
    out = get("modnn").fn(graph, dataclasses.replace(ctx, budget=budget))
    executor = Executor(out.graph, out.schedule)
    k = out.schedule.sub_batches
    result = executor.run(batch) if k == 1 else run_sub_batches(executor, batch, k)
    return out, result, trained, budget


def test_executor_offloading_at_full_batch_is_bit_exact():
    model, loss_fn, batch = make("inception")
    _, expected = eager_grads(model, loss_fn, batch)

    def budget_of(graph, ctx):
        full = sub_batch(graph, dataclasses.replace(ctx, budget=10**12)).footprint.minimum
        return (full + max(memory_per_step(graph))) // 2

    out, result, trained, budget = run_modnn(model, loss_fn, batch, budget_of, recapture=False)
    assert out.schedule.count(Offload) > 0 and out.schedule.sub_batches == 1
    for name, p in trained.named_parameters():
        assert torch.equal(p.grad, expected[name]), name
    assert result.peak_bytes == predicted_peak(out.graph, out.schedule) <= budget


def test_executor_sub_batches_give_the_full_batch_gradient():
    model, loss_fn, batch = make("inception")  # no batch statistics
    loss, expected = eager_grads(model, loss_fn, batch)
    out, result, trained, budget = run_modnn(
        model, loss_fn, batch, lambda g, ctx: minimum_memory(g, ctx).minimum)
    assert out.schedule.sub_batches == batch[0].shape[0]  # Mmin is reached at sub-batch size 1
    assert torch.allclose(result.loss, loss, atol=1e-6)
    for name, p in trained.named_parameters():
        assert torch.allclose(p.grad, expected[name], atol=1e-6), name
    assert result.peak_bytes == predicted_peak(out.graph, out.schedule) <= budget


def test_batchnorm_sub_batches_are_per_sub_batch_statistics():
    """With BatchNorm the accumulated gradient is that of the sub-batches (each normalised by
    its own statistics), which is not the full-batch gradient; running statistics are
    updated once per sub-batch."""
    model, loss_fn, batch = make("vgg")
    reference = copy.deepcopy(model)
    parts = split_batch(batch, 2)
    for sub in parts:
        loss = loss_fn(reference(sub[0]), sub[1]) / 2
        loss.backward()
    _, full = eager_grads(model, loss_fn, batch)

    def budget_of(graph, ctx):
        return sub_batch(graph, dataclasses.replace(ctx, budget=10**12)).footprint.minimum - 1

    out, _, trained, _ = run_modnn(model, loss_fn, batch, budget_of, sub_batch_statistics=True)
    assert out.schedule.sub_batches == 2
    params = dict(trained.named_parameters())
    for name, q in reference.named_parameters():
        assert torch.allclose(params[name].grad, q.grad, atol=1e-6), name
    assert not all(torch.allclose(params[n].grad, full[n], atol=1e-6) for n in full)
    for (name, b), c in zip(trained.named_buffers(), reference.buffers(), strict=True):
        assert torch.allclose(b.float(), c.float(), atol=1e-6), name


def test_executor_runs_the_algorithms_eq5_chose():
    """With convolution algorithms priced, eq. (5) picks some; the executor runs them and its
    measured peak (workspace included) is the predicted one."""
    from outcore.cost import AnalyticCostModel, get_profile
    from outcore.policies.modnn import ConvAlgorithmCost

    model, loss_fn, batch = make("inception")
    _, expected = eager_grads(model, loss_fn, batch)
    cost = ConvAlgorithmCost(AnalyticCostModel(get_profile("k40c")))
    out, result, trained, budget = run_modnn(
        model, loss_fn, batch, lambda g, ctx: max(memory_per_step(g)), cost=cost, recapture=False)
    assert set(out.schedule.variants.values()) & {"fft", "im2col"}
    assert result.peak_bytes == predicted_peak(out.graph, out.schedule) <= budget
    assert simulate(out.graph, out.schedule, cost).peak_bytes == result.peak_bytes
    for name, p in trained.named_parameters():
        assert torch.allclose(p.grad, expected[name], atol=1e-5), name

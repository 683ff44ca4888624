"""vDNN policies: the paper's rules on a hand-made CNN graph with known answers, and the
executor running them on small real models (gradients bit-equal to eager, measured peak equal
to the predicted peak)."""

from __future__ import annotations

import copy
from typing import ClassVar

import pytest
import torch

from outcore.capture import capture
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph, Op
from outcore.plan.memory import memory_curve, predicted_peak
from outcore.plan.plan import Decision
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Wait
from outcore.plan.verify import verify
from outcore.policies import registry
from outcore.policies.common import candidates
from outcore.policies.registry import PolicyContext
from outcore.policies.vdnn import (
    TARGETS,
    CudnnAlgorithms,
    VdnnConfig,
    offload_set,
    plan_dyn,
    plan_static,
    prefetch_points,
)
from outcore.runtime.executor import Executor
from outcore.sim import simulate
from outcore.variants import registry as variant_registry
from outcore.variants.select import downgrade_chain
from outcore.variants.torchmeta import arg_meta_of

from models import make


def names(graph: Graph, tids) -> set[str]:
    return {graph.tensors[t].name for t in tids}


def op_id(graph: Graph, name: str) -> int:
    return next(o.id for o in graph.ops if o.name == name)


class VariantCost:
    """Conv ops: framework 3 s (no workspace), im2col 2 s (+1500 B), fft 1 s (+3000 B)."""

    copy_engines = 2
    TIME: ClassVar[dict[str, float]] = {"framework": 3.0, "im2col": 2.0, "fft": 1.0}
    WORKSPACE: ClassVar[dict[str, int]] = {"framework": 0, "im2col": 1500, "fft": 3000}

    def op_time(self, op: Op) -> float:
        return self.TIME.get(op.variant, 1.0) if op.category.value == "conv" else 1.0

    def bind(self, graph):  # needs nothing from the graph
        return self

    def workspace(self, op: Op) -> int:
        return self.WORKSPACE.get(op.variant, 0) if op.category.value == "conv" else 0

    def transfer_time(self, nbytes: int, direction: str) -> float:
        return nbytes / 1000


def at(budget=None, cost=None, variants=None) -> PolicyContext:
    """A context for vDNN's entry points: budget, cost model and variants table."""
    return PolicyContext(budget=budget, cost=cost, config=VdnnConfig(variants=variants))


def conv_table(graph: Graph) -> dict[int, list[str]]:
    return {o.id: ["framework", "im2col", "fft"] for o in graph.ops if o.category.value == "conv"}


# ---- which tensors move ---------------------------------------------------------------------

def test_vdnn_conv_offloads_exactly_the_inputs_of_conv_layers(cnn):
    # conv0 reads the image (a graph input: stays), conv1 reads p0, conv2 reads p1.
    assert names(cnn, offload_set(cnn, "conv")) == {"p0", "p1"}


def test_vdnn_all_offloads_every_saved_feature_map_and_layer_state(cnn):
    assert names(cnn, offload_set(cnn, "all")) == {"r0", "p0", "idx0", "r1", "p1", "idx1",
                                                   "r2", "y"}
    assert offload_set(cnn, "none") == {}


def test_offloaded_input_is_released_right_after_its_last_forward_consumer(cnn):
    schedule = plan_static(cnn, at(), "all", "m").schedule
    seq = schedule.instructions
    for tid in offload_set(cnn, "all"):
        t = cnn.tensors[tid]
        produced = seq.index(Compute(t.producer))
        offload = seq.index(Offload(tid))
        assert produced < offload and not any(isinstance(i, Compute)
                                              for i in seq[produced + 1:offload]), \
            f"{t.name}: the offload starts as soon as its producer finishes"
        last = max((seq.index(Compute(c)) for c in t.consumers
                    if cnn.ops[c].phase == "forward"), default=produced)  # idx: no reader
        free = seq.index(Free(tid))
        assert seq[free - 1] == Wait(tid, "d2h"), f"{t.name}: synchronised before release"
        between = [i for i in seq[last + 1:free] if isinstance(i, Compute)]
        assert not between, f"{t.name} released after its last consumer, before any other layer"


# ---- Fig. 10 prefetch window ----------------------------------------------------------------

def test_prefetch_window_reaches_up_to_the_next_conv_layer_all(cnn):
    order = list(range(len(cnn.ops)))
    points = prefetch_points(cnn, order, offload_set(cnn, "all"))
    window = {cnn.tensors[t].name: cnn.ops[o].name for t, o in points.window.items()}
    assert window == {"r2": "dloss", "p1": "dfc", "r1": "dconv2", "idx1": "dconv2",
                      "p0": "dpool1", "r0": "dconv1", "idx0": "dconv1"}
    # y is read by the first backward layer: nothing looks for it before, fetched on demand
    assert {cnn.tensors[t].name: cnn.ops[o].name for t, o in points.demand.items()} == \
        {"y": "dloss"}


def test_prefetch_window_conv_only(cnn):
    order = list(range(len(cnn.ops)))
    points = prefetch_points(cnn, order, offload_set(cnn, "conv"))
    window = {cnn.tensors[t].name: cnn.ops[o].name for t, o in points.window.items()}
    # from dfc, drelu2: the closest offloaded layer (conv1) lies beyond CONV layer conv2
    assert window == {"p1": "dloss", "p0": "dconv2"}
    assert points.demand == {}


def test_prefetch_launches_before_its_layer_and_syncs_before_the_next(cnn):
    schedule = plan_static(cnn, at(), "all", "m").schedule
    seq = schedule.instructions
    verify(cnn, schedule)
    points = prefetch_points(cnn, list(range(len(cnn.ops))), offload_set(cnn, "all"))
    for tid, launcher in points.window.items():
        pre = seq.index(Prefetch(tid))
        first_compute_after = next(i for i in range(pre + 1, len(seq))
                                   if isinstance(seq[i], Compute))
        assert seq[first_compute_after] == Compute(launcher), "launched at its layer's start"
        wait = seq.index(Wait(tid, "h2d"))
        next_compute = next(i for i in range(first_compute_after + 1, len(seq))
                            if isinstance(seq[i], Compute))
        assert first_compute_after < wait < next_compute, \
            f"{cnn.tensors[tid].name}: the next layer waits for the prefetch"


# ---- algorithms and vDNN-dyn ----------------------------------------------------------------

def test_static_algorithm_settings_pick_memory_or_performance_optimal(cnn):
    cost, table = VariantCost(), conv_table(cnn)
    m = plan_static(cnn, at(cost=cost, variants=table), "conv", "m")
    p = plan_static(cnn, at(cost=cost, variants=table), "conv", "p")
    assert set(m.schedule.variants.values()) == {"framework"}
    assert set(p.schedule.variants.values()) == {"fft"}
    assert m.peak < p.peak <= m.peak + 3000, "workspace raises the peak by at most 3000 B"
    ws = candidates(cnn, cost, table).workspace_of(p.schedule.variants)
    assert p.peak == predicted_peak(cnn, p.schedule, ws)


def test_static_policy_over_budget_is_refused_with_its_need(cnn):
    r = plan_static(cnn, at(), "all", "m")
    with pytest.raises(InfeasibleBudgetError) as info:
        plan_static(cnn, at(budget=r.peak - 1), "all", "m", name="vdnn-all-m")
    err = info.value
    assert (err.policy, err.budget, err.required) == ("vdnn-all-m", r.peak - 1, r.peak)
    assert "vdnn-all-m" in str(err)
    plan_static(cnn, at(budget=r.peak), "all", "m")  # exactly enough works


def dyn_at(graph, budget):
    return plan_dyn(graph, at(budget=budget, cost=VariantCost(), variants=conv_table(graph)))


def test_vdnn_dyn_profiling_passes_in_the_papers_order(cnn):
    cost, table = VariantCost(), conv_table(cnn)
    fastest_none = plan_static(cnn, at(cost=cost, variants=table), "none", "p").peak
    safest = plan_static(cnn, at(cost=cost, variants=table), "all", "m").peak
    r = dyn_at(cnn, None)
    assert (r.mode, r.phase) == ("none", 2) and set(r.schedule.variants.values()) == {"fft"}
    assert (dyn_at(cnn, fastest_none).mode, dyn_at(cnn, fastest_none).phase) == ("none", 2)
    seen = set()
    for budget in range(safest, fastest_none, 10):
        r = dyn_at(cnn, budget)
        seen.add((r.mode, r.phase))
        assert r.peak <= budget
        if r.phase == 3:  # greedy: the fastest algorithm of its downgrade chain that fits
            check_greedy(cnn, r, budget)
        fits = {m: plan_static(cnn, at(cost=cost, variants=table), m, "p").peak <= budget
                for m in ("none", "conv", "all")}
        if r.phase == 2:
            first = next(m for m in ("none", "conv", "all") if fits[m])
            assert r.mode == first, "phase 2 tries none, then conv, then all"
        else:
            assert not any(fits.values())
    # with 3000 B of FFT workspace against 200-800 B maps, the sweep meets phase 2 on
    # vDNN-all and the greedy downgrade on both vDNN-conv and vDNN-all
    assert {("all", 3), ("conv", 3), ("all", 2)} <= seen
    assert all(phase in (2, 3) for _, phase in seen)


def check_greedy(graph, result, budget):
    table = candidates(graph, VariantCost(), conv_table(graph))
    live = memory_curve(graph, result.schedule).device
    at = {ins.op: live[i] for i, ins in enumerate(result.schedule.instructions)
          if isinstance(ins, Compute)}
    for op, chosen in result.schedule.variants.items():
        chain = downgrade_chain(table.by_op[op])
        names_ = [c.variant for c in chain]
        k = names_.index(chosen)
        assert at[op] + chain[k].workspace_bytes <= budget
        for faster in chain[:k]:
            assert at[op] + faster.workspace_bytes > budget, \
                f"{graph.ops[op].name}: {faster.variant} fits but {chosen} was chosen"


def test_vdnn_dyn_refuses_a_budget_below_vdnn_all_memory_optimal(cnn):
    need = plan_static(cnn, at(cost=VariantCost(), variants=conv_table(cnn)), "all", "m").peak
    with pytest.raises(InfeasibleBudgetError) as info:
        dyn_at(cnn, need - 1)
    assert (info.value.policy, info.value.budget, info.value.required) == \
        ("vdnn-dyn", need - 1, need)
    r = dyn_at(cnn, need)
    assert r.peak <= need


def test_simulator_runs_every_vdnn_schedule_at_its_predicted_peak(cnn):
    cost, table = VariantCost(), conv_table(cnn)
    for r in (plan_static(cnn, at(cost=cost, variants=table), "all", "p"),
              plan_static(cnn, at(cost=cost, variants=table), "conv", "m"),
              plan_static(cnn, at(cost=cost, variants=table), "base", "p"), dyn_at(cnn, None)):
        sim = simulate(cnn, r.schedule, cost)
        assert sim.peak_bytes == r.peak, r.plan.policy
        offloaded = sum(cnn.tensors[t].nbytes for t in r.plan.tensors_with(Decision.OFFLOAD))
        assert sim.bytes_d2h == offloaded


def test_baseline_keeps_every_feature_map_but_the_in_place_activation_inputs(cnn):
    schedule = plan_static(cnn, at(), "base", "p").schedule
    freed = {cnn.tensors[i.tensor].name for i in schedule.instructions if isinstance(i, Free)}
    forward = {"c0", "r0", "p0", "idx0", "c1", "r1", "p1", "idx1", "c2", "r2", "y"}
    assert freed & forward == {"c0", "c1", "c2"}  # ReLU runs in place in Torch
    assert "gc0" in freed and "gr2" in freed  # gradient maps are reused


def test_registered_names_and_algo_option(cnn):
    for name in ("vdnn-all", "vdnn-conv", "vdnn-dyn", "vdnn-base", "vdnn-all-m", "vdnn-all-p",
                 "vdnn-conv-m", "vdnn-conv-p"):
        assert name in registry.names()
    ctx = PolicyContext(cost=VariantCost(), options={"variants": conv_table(cnn), "algo": "m"})
    out = registry.get("vdnn-all").fn(cnn, ctx)
    assert set(out.schedule.variants.values()) == {"framework"}
    assert out.plan.tensors_with(Decision.OFFLOAD) == sorted(offload_set(cnn, "all"))
    with pytest.raises(ValueError, match="'m' or 'p'"):
        registry.get("vdnn-conv").fn(cnn, PolicyContext(options={"algo": "fast"}))
    for name in ("vdnn-conv-p", "vdnn-base", "vdnn-dyn"):
        with pytest.raises(InfeasibleBudgetError) as info:
            registry.get(name).fn(cnn, PolicyContext(budget=1000))
        assert info.value.policy == name and info.value.budget == 1000
        assert info.value.required > 1000 and name in str(info.value)


# ---- the executor runs the schedules --------------------------------------------------------

def eager_grads(model, loss_fn, batch, seed=3):
    torch.manual_seed(seed)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["vgg", "inception", "resnet"])
def test_executor_matches_eager_and_the_predicted_peak(name):
    model, loss_fn, batch = make(name)
    loss, grads = eager_grads(copy.deepcopy(model), loss_fn, batch)
    graph = capture(model, loss_fn, batch)
    for policy in ("vdnn-all-m", "vdnn-conv-m", "vdnn-dyn", "vdnn-base"):
        out = registry.get(policy).fn(graph, PolicyContext())
        torch.manual_seed(3)
        result = Executor(graph, out.schedule).run(batch, apply=False)
        assert torch.equal(result.loss, loss), policy
        for pname, g in grads.items():
            assert torch.equal(result.grads[pname], g), f"{policy}: grad {pname}"
        assert result.peak_bytes == predicted_peak(graph, out.schedule), policy


def test_executor_runs_performance_optimal_variants_with_their_workspace():
    model, loss_fn, batch = make("vgg")
    loss, grads = eager_grads(copy.deepcopy(model), loss_fn, batch)
    graph = capture(model, loss_fn, batch)
    meta = {o.id: arg_meta_of(n.args) for o, n in zip(graph.ops, graph.source.op_nodes, strict=True)
            if o.target in TARGETS}
    algos = CudnnAlgorithms.for_graph(graph, meta)
    cost = AnalyticCostModel(get_profile("titan-x-maxwell"), variants=algos)
    ctx = PolicyContext(cost=cost, options={"variants": algos.supported()})
    out = registry.get("vdnn-conv-p").fn(graph, ctx)
    chosen = {v for o, v in out.schedule.variants.items()}
    assert "fft" in chosen, "3x3 stride-1 convolutions run FFT, the fastest, under (p)"
    impls = {o: variant_registry.implementation(graph.ops[o].target, v)
             for o, v in out.schedule.variants.items()}
    result = Executor(graph, out.schedule, impls=impls).run(batch, apply=False)
    workspace = candidates(graph, cost, algos.supported()).workspace_of(out.schedule.variants)
    assert result.peak_bytes == predicted_peak(graph, out.schedule, workspace)
    assert any(workspace(o) > 0 for o in out.schedule.variants), "workspace was measured too"
    assert torch.allclose(result.loss, loss, atol=1e-5)
    for pname, g in grads.items():
        assert torch.allclose(result.grads[pname], g, rtol=1e-3, atol=1e-4), pname

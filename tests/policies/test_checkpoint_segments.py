"""outcore-checkpoint: recompute chains of any depth, planned as checkpoint segments.

Differential against eager PyTorch: a GPT with dropout (random ops recomputed, RNG replayed)
and a small ResNet give bit-equal loss and gradients under every plan, at the predicted peak.
"""

from __future__ import annotations

import copy

import pytest
import torch

from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve, predicted_peak
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Compute
from outcore.plan.verify import verify
from outcore.policies import registry
from outcore.policies.auto import find_cuts, plan_checkpoint, segment_plan
from outcore.policies.registry import PolicyContext
from outcore.runtime.executor import Executor

COST = cost_model_for("this-cpu")


def _gpt():
    return zoo.get("transformer", 8, small=True, n_layer=3, dropout=0.1, seq_len=32,
                   tie_weights=False)


def _resnet():
    return zoo.get("resnet20-cifar", 16, small=True)


@pytest.fixture(scope="module")
def gpt():
    w = _gpt()
    return w, capture(w.model, w.loss_fn, w.batch)


def _eager(w, seed=5):
    model = copy.deepcopy(w.model)
    torch.manual_seed(seed)
    loss = w.loss_fn(model(w.batch[0]), w.batch[1])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _run_equal(w, graph, schedule, seed=5):
    loss, grads = _eager(w, seed)
    torch.manual_seed(seed)
    result = Executor(graph, schedule).run(w.batch, apply=False)
    assert torch.equal(result.loss, loss)
    for name, g in grads.items():
        assert torch.equal(result.grads[name], g), name
    assert result.peak_bytes == predicted_peak(graph, schedule)


def test_cuts_are_the_residual_stream_between_blocks(gpt):
    _, graph = gpt
    cuts = find_cuts(graph)
    adds = [graph.producer_op(c.storage).name for c in cuts if "add" in
            graph.producer_op(c.storage).name]
    assert len(adds) >= 2 * 3, "two residual adds per block are cuts"


def test_full_segments_recompute_chains_and_dropout_bit_exact(gpt):
    w, graph = gpt
    plan = segment_plan(graph, [c.storage for c in find_cuts(graph)])
    schedule = lower(graph, plan)
    verify(graph, schedule)
    recomputed = [graph.ops[i.op] for i in schedule.instructions
                  if isinstance(i, Compute) and i.recompute]
    assert any(op.random for op in recomputed), "dropout is recomputed (RNG replayed)"
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    trace = memory_curve(graph, schedule)
    assert trace.peak - trace.static < 0.6 * (in_core.peak - in_core.static)
    _run_equal(w, graph, schedule)


def test_deep_chain_rebuilds_from_recomputed_tensors(gpt):
    """A recompute reads tensors that are themselves recomputed (depth > 1)."""
    _, graph = gpt
    plan = segment_plan(graph, [c.storage for c in find_cuts(graph)])
    schedule = lower(graph, plan)
    defined_by_recompute: set[int] = set()
    depth_two = False
    for ins in schedule.instructions:
        if isinstance(ins, Compute) and ins.recompute:
            op = graph.ops[ins.op]
            depth_two |= any(graph.tensors[i].storage in defined_by_recompute for i in op.inputs)
            defined_by_recompute.update(graph.tensors[o].storage for o in op.outputs)
    assert depth_two


@pytest.mark.parametrize("fraction", [0.95, 0.7, 0.45])
def test_plans_fit_every_budget_and_match_eager(gpt, fraction):
    w, graph = gpt
    in_core = memory_curve(graph, lower(graph, Plan("in-core"))).peak
    budget = int(in_core * fraction)
    try:
        plan, schedule = plan_checkpoint(graph, budget, COST)
    except InfeasibleBudgetError as exc:
        assert exc.required > budget
        return
    assert not plan.tensors_with(Decision.OFFLOAD)
    assert memory_curve(graph, schedule).peak <= budget
    _run_equal(w, graph, schedule)


def test_keep_back_uses_the_budget():
    """More budget never means more recomputation."""
    w = _resnet()
    graph = capture(w.model, w.loss_fn, w.batch)
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    counts = []
    for fraction in (0.5, 0.7, 0.9):
        budget = in_core.static + int((in_core.peak - in_core.static) * fraction)
        plan, schedule = plan_checkpoint(graph, budget, COST)
        counts.append(len(plan.tensors_with(Decision.RECOMPUTE)))
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    _run_equal(w, graph, schedule)


def test_registered_and_in_outcore_auto(gpt):
    _, graph = gpt
    in_core = memory_curve(graph, lower(graph, Plan("in-core"))).peak
    out = registry.get("outcore-checkpoint").fn(graph, PolicyContext(budget=in_core // 2,
                                                                      cost=COST))
    assert memory_curve(graph, out.schedule).peak <= in_core // 2
    with pytest.raises(InfeasibleBudgetError) as info:
        registry.get("outcore-checkpoint").fn(graph, PolicyContext(budget=1000, cost=COST))
    assert info.value.required > 1000


def test_outcore_auto_reaches_full_checkpointing_memory_on_this_cpu(gpt):
    """At the budget of full segments, outcore-auto (this CPU: no host copies) fits, without
    offloading, and its plan runs bit-equal to eager."""
    w, graph = gpt
    full = lower(graph, segment_plan(graph, [c.storage for c in find_cuts(graph)]))
    budget = memory_curve(graph, full).peak
    out = registry.get("outcore-auto").fn(graph, PolicyContext(budget=budget, cost=COST))
    trace = memory_curve(graph, out.schedule)
    assert trace.peak <= budget and max(trace.host, default=0) == 0
    assert not out.plan.tensors_with(Decision.OFFLOAD)
    _run_equal(w, graph, out.schedule)


class _MaskedBlocks(torch.nn.Module):
    """Blocks that all read one tensor built once in forward (a mask, as Hugging Face
    decoders build their causal mask once and hand it to every layer)."""

    def __init__(self, width: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, width)) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = (x > 0).to(x.dtype) * 0.5 + 0.5  # built once, read by every block
        for block in self.blocks:
            x = x + block(x) * mask
        return x


def _masked():
    torch.manual_seed(0)
    model = _MaskedBlocks()
    x = torch.randn(512, 32)  # activations, not parameter gradients, make the peak
    return zoo.Workload("masked-blocks", model, lambda out, y: (out - y).pow(2).mean(),
                        (x, torch.randn(512, 32)), "blocks reading one mask")


def test_a_tensor_every_block_reads_does_not_hide_the_cuts():
    """The mask crosses every block boundary; the residual stream beside it is still a cut,
    and the cut keeps both (as checkpointing keeps every input of a block)."""
    w = _masked()
    graph = capture(w.model, w.loss_fn, w.batch)
    cuts = find_cuts(graph)
    with_mask = [c for c in cuts if c.also]
    assert len(with_mask) >= 5, "a cut at every boundary between blocks"
    assert len({s for c in with_mask for s in c.also}) == 1, "the mask is kept beside each"
    plan = segment_plan(graph, [s for c in cuts for s in c.storages])
    schedule = lower(graph, plan)
    verify(graph, schedule)
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    trace = memory_curve(graph, schedule)
    assert trace.peak - trace.static < 0.6 * (in_core.peak - in_core.static)
    _run_equal(w, graph, schedule)


def test_checkpoint_policy_reaches_below_half_the_activations_with_a_shared_mask():
    w = _masked()
    graph = capture(w.model, w.loss_fn, w.batch)
    in_core = memory_curve(graph, lower(graph, Plan("in-core")))
    budget = in_core.static + (in_core.peak - in_core.static) // 2
    _, schedule = plan_checkpoint(graph, budget, COST)
    assert memory_curve(graph, schedule).peak <= budget
    _run_equal(w, graph, schedule)

"""Demo scale: a GPT whose parameters, gradients and AdamW state are four times the device
budget trains on cpu-emulated, with the user's optimizer, scheduler, clipping and scaler,
and ends bit-equal to eager PyTorch."""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from weights_helpers import make_gpt, token_loss

from outcore.cost.profiles import get_profile
from outcore.errors import InfeasibleBudgetError
from outcore.weights import compile as compile_weights
from outcore.weights.choose import choose_weights
from outcore.weights.optimizer import state_bytes

FAST = 2e9
A100 = get_profile("a100-40gb")


def batches(n, seed=5, vocab=64, shape=(2, 16)):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, shape, generator=gen),
             torch.randint(0, vocab, shape, generator=gen)) for _ in range(n)]


def weight_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_twenty_steps_at_a_quarter_of_the_weights_equal_eager():
    model, example = make_gpt()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5, 0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 5, 0.5)
    budget = weight_bytes(model)  # weights + grads + two AdamW moments = 4x this
    assert sum(state_bytes(opt, model).values()) >= 2 * budget
    with compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                         bandwidth=FAST) as trainer:
        assert trainer.held(), "at a quarter of the weights' bytes something must move"
        assert trainer.predicted_peak + trainer.choice.device_state <= budget
        for i, (x, y) in enumerate(batches(20)):
            loss = trainer.step(x, y)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
            opt.zero_grad()
            ref_loss = token_loss(ref(x), y)
            ref_loss.backward()
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            ref_opt.step()
            ref_sched.step()
            ref_opt.zero_grad()
            assert torch.equal(loss, ref_loss.detach()), f"step {i}"
            assert trainer.measured_peak == trainer.predicted_peak, f"step {i}"
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()


def test_slowed_copy_engine_with_grad_scaler_equals_eager():
    """Host copies are never read before they land: the copy engine slowed 100x (poisoned
    fresh buffers) changes nothing, with a GradScaler's scaled gradients."""
    model, example = make_gpt()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    budget = weight_bytes(model)
    with compile_weights(model, token_loss, example, optimizer=opt, budget=budget,
                         bandwidth=FAST, slowdown=100.0) as trainer:
        for x, y in batches(3, seed=9):
            loss = trainer.step(x, y, scaler=scaler)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            ref_loss = token_loss(ref(x), y)
            ref_scaler.scale(ref_loss).backward()
            ref_scaler.step(ref_opt)
            ref_scaler.update()
            ref_opt.zero_grad()
            assert torch.equal(loss, ref_loss.detach())
        stats = trainer.device.stats()
    assert stats.releases_during_copy == 0
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_roomy_budget_moves_nothing_and_a_tiny_one_is_refused(gpt):
    model, _, graph = gpt
    opt = torch.optim.AdamW(model.parameters())
    state = state_bytes(opt, model)
    roomy = choose_weights(graph, 1 << 30, None, state, planners=_liveness_only(),
                           profile=A100)
    assert not roomy.placement
    with pytest.raises(InfeasibleBudgetError):
        choose_weights(graph, 1024, None, state, planners=_liveness_only(), profile=A100)


def test_state_bytes_follow_the_optimizer(gpt):
    model = gpt[0]
    p = sum(q.numel() * 4 for q in model.parameters())
    n = len(list(model.parameters()))
    adam = state_bytes(torch.optim.AdamW(model.parameters(), amsgrad=True), model)
    assert sum(adam.values()) == 3 * p + 4 * n
    assert sum(state_bytes(torch.optim.SGD(model.parameters(), lr=0.1), model).values()) == 0
    sgd = state_bytes(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model)
    assert sum(sgd.values()) == p


def _liveness_only():
    from outcore.errors import InfeasibleBudgetError as Infeasible
    from outcore.plan.memory import predicted_peak
    from outcore.plan.plan import Plan

    def liveness(graph, room, cost, lowerer):
        plan = Plan(policy="liveness")
        schedule = lowerer(graph, plan)
        peak = predicted_peak(graph, schedule)
        if peak > room:
            raise Infeasible("liveness", room, peak)
        return plan, schedule

    return {"liveness": liveness}


def test_every_candidate_is_explained(gpt):
    model, _, graph = gpt
    state = state_bytes(torch.optim.AdamW(model.parameters()), model)
    budget = 2 * sum(p.numel() * 4 for p in model.parameters())  # liveness needs room
    choice = choose_weights(graph, budget, None, state, planners=_liveness_only(),
                            profile=A100)
    lines = choice.explain(graph)
    assert len(choice.tried) >= 2
    assert any("no plan" in ln for ln in lines[:len(choice.tried)])
    assert any(c.fits for c in choice.tried)
    assert choice.peak + choice.device_state <= budget
    assert sum("held in host memory" in ln for ln in lines) == len(choice.placement.params)

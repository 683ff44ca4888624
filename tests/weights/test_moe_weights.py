"""Fine-tuning a mixture of experts whose weights do not fit: Hugging Face's Mixtral and
Qwen2-MoE (experts stacked in 3D parameters, run by ``torch._grouped_mm``; a shared expert
in Qwen2-MoE) under a budget of the weights' own bytes, so that parameters, gradients and the
two AdamW moments (4x the budget) must move, train four AdamW steps bit-equal to eager."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realmodels"))

from outcore.weights import compile as compile_weights

from corpus import BY_NAME

FAST = 2e9  # link bytes/s: the test is about values, not the schedule's speed


@pytest.mark.parametrize("name", ["hf_mixtral", "hf_qwen2_moe"])
def test_moe_with_weights_moved_trains_as_eager(name: str) -> None:
    case = BY_NAME[name]
    model, batch = case.build(), case.batch()
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=3e-3)
    budget = sum(p.numel() * p.element_size() for p in model.parameters())
    with compile_weights(model, None, batch, optimizer=opt, budget=budget,
                         bandwidth=FAST) as trainer:
        assert trainer.held(), "at a quarter of the weights' state something must move"
        for step in range(4):
            torch.manual_seed(step)
            loss = trainer.step(batch)
            opt.step()
            opt.zero_grad()
            torch.manual_seed(step)
            expected = reference(**batch).loss
            expected.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            assert torch.equal(loss, expected.detach()), f"step {step}"
            assert trainer.measured_peak == trainer.predicted_peak <= budget, f"step {step}"
    for (pname, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q), pname

"""Models with their library's gradient checkpointing switched on (Hugging Face's
``gradient_checkpointing_enable()``, either ``use_reentrant``; timm's
``set_grad_checkpointing()``) train as eager does: their checkpoint calls are traced as plain
calls and outcore plans the recomputation (``outcore.capture.checkpoints``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from exact import assert_grads_equal
from torch import nn

import outcore

from corpus import _DEC, _hf, _timm, _tokens, images

TOKENS = _tokens()
IMAGES = images(n=16)  # activations well above the weights: room for a plan under a budget


def _grads_as_eager(model: nn.Module, batch: Any, loss_of: Any, budget: Any) -> None:
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, None if isinstance(batch, dict) else loss_of, batch,
                              budget=budget, device="cpu")
    torch.manual_seed(5)
    loss = trainer.step(batch) if isinstance(batch, dict) else trainer.step(*batch)
    torch.manual_seed(5)
    expected = (reference(**batch).loss if isinstance(batch, dict)
                else loss_of(reference(batch[0]), batch[1]))
    expected.backward()
    assert torch.equal(loss, expected.detach())
    assert_grads_equal(model, reference)
    assert trainer.planned.graph.meta.get("user_checkpoints") is True
    if budget is not None:
        assert trainer.stats.measured_peak <= budget


@pytest.mark.parametrize("reentrant", [True, False])
def test_hugging_face_gradient_checkpointing(reentrant):
    torch.manual_seed(0)
    model = _hf("LlamaForCausalLM", "LlamaConfig", **_DEC)()
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    torch.manual_seed(1)
    _grads_as_eager(model, TOKENS(), None, None)


def test_timm_grad_checkpointing_under_a_budget():
    torch.manual_seed(0)
    model = _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2,
                  drop_path_rate=0.1)()
    model.set_grad_checkpointing(True)
    torch.manual_seed(1)
    batch = IMAGES()
    in_core = outcore.compile(copy.deepcopy(model), nn.functional.cross_entropy, batch,
                              budget=None, device="cpu").stats.predicted_peak
    _grads_as_eager(model, batch, nn.functional.cross_entropy, int(in_core * 0.8))

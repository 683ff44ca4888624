"""Hugging Face's JetMoe routes tokens with ``expert_size.tolist()`` and splits by those
sizes: outcore specialises each step on the tokens per expert and captures again when they
change (``outcore.capture.specialize``); every step equals eager's.

The capture failed before: "split_with_sizes(): argument 'split_sizes' must be tuple of
ints, but found element of type list at pos 0" (a traced ``tolist`` read element by element
was answered with whole recorded lists)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from exact import assert_grads_equal

import outcore

from corpus import _DEC, _hf, _tokens

TOKENS = _tokens(seq=12)
_MOE = {"num_local_experts": 4, "num_experts_per_tok": 2, "kv_channels": 8}


def _zeroed(*models: torch.nn.Module) -> None:
    for model in models:
        for p in model.parameters():
            p.grad = None


def test_jetmoe_trains_as_eager_while_its_routing_changes() -> None:
    torch.manual_seed(0)
    model = _hf("JetMoeForCausalLM", "JetMoeConfig", **{**_DEC, **_MOE})()
    reference = copy.deepcopy(model)
    torch.manual_seed(1)
    batches: list[dict[str, Any]] = [TOKENS() for _ in range(3)]
    trainer = outcore.compile(model, None, batches[0], budget=None, device="cpu")
    for batch in batches:
        _zeroed(model, reference)
        loss = trainer.step(batch)
        expected = reference(**batch).loss
        expected.backward()
        assert torch.equal(loss, expected.detach())
        assert_grads_equal(model, reference)
    sizes = [g for g in trainer.planned.graph.source.guards if g.reader == "tolist"]
    # expert_size.tolist(): attention's and the MLP's router in each layer, one list each
    assert len(sizes) == 2 * _DEC["num_hidden_layers"]
    assert all(len(g.value) == _MOE["num_local_experts"] for g in sizes)
    assert trainer.stats.replans >= 1  # another batch, other tokens per expert

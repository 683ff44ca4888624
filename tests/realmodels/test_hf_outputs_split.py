"""A Hugging Face causal LM under sub-batches with ``outputs=True``: the step's
``ModelOutput`` (the model's own loss and its logits) is the whole batch's, as eager's
forward returns it, and the gradients equal eager's up to summation order. The model's own
loss (a mean over the shifted tokens, ignore_index -100) is kept as a copy of the loss, so
the kept ``loss`` is the step's weighted sum over the sub-batches."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import outcore

from corpus import _hf


@pytest.mark.parametrize("fraction", [0.6, 0.4])
def test_a_gpt2s_model_output_under_sub_batches_is_the_whole_batchs(fraction: float) -> None:
    build = _hf("GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=64, n_head=4,
                vocab_size=128, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = build()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 128, (16, 32), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    with pytest.raises(outcore.InfeasibleBudgetError) as info:
        outcore.compile(model, None, batch, budget=1, device="cpu-emulated", outputs=True)
    budget = int(fraction * info.value.lowest)  # below moDNN's unsplit floor too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = outcore.compile(model, None, batch, budget=budget, device="cpu-emulated",
                                  outputs=True, allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    loss = trainer.step(batch)
    want = reference(**batch)
    want.loss.backward()
    out = trainer.outputs
    assert type(out) is type(want)
    torch.testing.assert_close(loss, want.loss.detach())
    torch.testing.assert_close(out["loss"], want.loss.detach())
    torch.testing.assert_close(out["logits"], want.logits.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        if b.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)

"""Hugging Face models that session 30's sweeps found refused or silently changed:

* Wav2Vec2ForCTC's loss (``F.ctc_loss`` over labels concatenated by ``masked_select``) was
  refused at capture; it trains as eager (``tests/spine/test_ctc_loss.py``);
* with its default config (SpecAugment's ``mask_time_prob = 0.05``, drawn with NumPy) it
  would have trained on one fixed mask: refused with the way out
  (``tests/spine/test_host_random.py``);
* DeBERTa-v2's sequence-classification loss (``(labels >= 0).nonzero()``) was refused at
  capture; it trains as eager and is captured once (``tests/spine/test_mask_specialisation.py``);
* DETR's loss matches predictions to targets with SciPy's Hungarian solver on its cost matrix
  (``np.asarray`` of a tensor): refused at capture ("``.numpy()`` is not supported"); the
  read is specialised on now, so the step trains as eager and is captured again when the
  matching's inputs change (``tests/spine/test_value_reads.py``);
* LLaVA and PaliGemma format their image-token count into a check's message before reading
  the check's condition: the eager run recorded the formatting's read, the trace did not
  make it, and the condition got the count ("cond must be a bool, but got int"): refused at
  capture. Formatting reads nothing now (``tests/spine/test_value_reads.py``);
* Qwen2-VL reads 0-d tensors the trace holds as constants (its image grid's sizes): each
  guard became an output without a producer ("tensor '_tensor_constant7' of kind output has
  no producer"). A guard on a constant always holds and is dropped
  (``convert.NodeMap.constant_guards``);
* Qwen2.5-VL's window attention takes ``unique_consecutive`` of its window boundaries:
  refused at capture; recorded whole now, the boundaries being the guard
  (``tests/spine/test_mask_specialisation.py``);
* Mistral 3 (Pixtral) crops its patches with slices bounded by 0-d tensors and splits by a
  list of them, both read in C++: refused at capture; read in Python now;
* Qwen3-VL: a guard output that was a view of the image-token mask kept the mask alive to
  the step's end, and vdnn-dyn offloaded and prefetched it back while the view held it (an
  invalid schedule, which made outcore-auto fail). Guards are copies now, and a candidate
  whose schedule the verifier refuses is left out with a ``PlannerBugWarning``
  (``tests/policies/test_portfolio.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from exact import assert_grads_equal
from torch import nn

import outcore
from outcore.errors import HostRandomError

from corpus import _ENC, _hf
from tv_compat import import_torchvision

_SPEECH = {"vocab_size": 16, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 64, "conv_dim": (16,) * 7,
           "num_conv_pos_embeddings": 16, "num_conv_pos_embedding_groups": 4}
_OFF = {"mask_time_prob": 0.0, "mask_feature_prob": 0.0, "layerdrop": 0.0}


def _audio() -> dict[str, torch.Tensor]:
    return {"input_values": torch.randn(2, 4000),
            "labels": torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]])}


def _same_steps(model: nn.Module, batches: list[dict[str, Any]]) -> outcore.Trainer:
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, None, batches[0], budget=None, device="cpu-emulated")
    for batch in batches:
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        state = torch.get_rng_state()  # dropout: each side draws eager's masks
        loss = trainer.step(batch)
        torch.set_rng_state(state)
        expected = reference(**batch).loss
        expected.backward()
        assert torch.equal(loss, expected.detach())
        assert_grads_equal(model, reference)
        assert trainer.stats.measured_peak == trainer.stats.predicted_peak
    return trainer


def test_wav2vec2_ctc_trains_as_eager_with_specaugment_off() -> None:
    torch.manual_seed(0)
    model = _hf("Wav2Vec2ForCTC", "Wav2Vec2Config", **_SPEECH, **_OFF)()
    trainer = _same_steps(model, [_audio() for _ in range(2)])
    assert trainer.stats.captures == 1  # the same labels: the same lengths


def test_wav2vec2_with_its_default_specaugment_is_refused_with_the_way_out() -> None:
    torch.manual_seed(0)
    model = _hf("Wav2Vec2ForCTC", "Wav2Vec2Config", **_SPEECH)()
    assert model.config.mask_time_prob > 0
    try:
        outcore.compile(model, None, _audio(), budget=None, device="cpu-emulated")
    except HostRandomError as err:
        message = str(err)
    else:
        raise AssertionError("a SpecAugment mask drawn with NumPy was baked into the step")
    assert "modeling_wav2vec2.py" in message and "mask_time_prob = 0.0" in message
    assert all(p.grad is None for p in model.parameters())


def test_deberta_v2_sequence_classification_is_captured_once() -> None:
    torch.manual_seed(0)
    model = _hf("DebertaV2ForSequenceClassification", "DebertaV2Config", **_ENC)()
    batches = [{"input_ids": torch.randint(3, 60, (2, 12)), "labels": torch.randint(0, 2, (2,))}
               for _ in range(3)]
    trainer = _same_steps(model, batches)
    assert trainer.stats.captures == 1


def _detr() -> nn.Module:
    import transformers

    backbone = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 16, 32],
                                         depths=[1, 1, 1, 1], out_features=["stage4"])
    return _hf("DetrForObjectDetection", "DetrConfig", use_timm_backbone=False,
               backbone_config=backbone, use_pretrained_backbone=False, d_model=32,
               encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
               num_queries=10, num_labels=3)()


def _boxes() -> dict[str, Any]:
    return {"pixel_values": torch.randn(2, 3, 64, 64),
            "labels": [{"class_labels": torch.tensor([1, 2]),
                        "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.1, 0.2]])},
                       {"class_labels": torch.tensor([0]),
                        "boxes": torch.tensor([[0.4, 0.6, 0.3, 0.2]])}]}


def test_detr_hungarian_matching_trains_as_eager() -> None:
    torch.manual_seed(0)
    trainer = _same_steps(_detr(), [_boxes() for _ in range(2)])
    assert trainer.stats.captures == 2  # the cost matrix changes with the images


_TEXT = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
         "pad_token_id": 0}
_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "image_size": 32, "patch_size": 8}


def _qwen2_vl() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny Qwen2-VL: one 16 x 16 image per row in 4 x 4 patches, merged 2 x 2 into 4
    image tokens."""
    import transformers

    vision = {"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2,
              "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2}
    text = {**_TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}
    config = transformers.Qwen2VLConfig(vision_config=vision, text_config=text,
                                        image_token_id=60, vision_start_token_id=61,
                                        vision_end_token_id=62)
    ids = torch.randint(3, 50, (2, 24))
    ids[:, 2], ids[:, 3:7], ids[:, 7] = 61, 60, 62
    return transformers.Qwen2VLForConditionalGeneration(config), {
        "input_ids": ids, "pixel_values": torch.randn(32, 3 * 2 * 4 * 4),
        "image_grid_thw": torch.tensor([[1, 4, 4], [1, 4, 4]]), "labels": ids.clone(),
        "mm_token_type_ids": (ids == 60).long()}


def _qwen2_5_vl() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny Qwen2.5-VL (its window attention takes ``unique_consecutive`` of the window
    boundaries), on Qwen2-VL's batch."""
    import transformers

    _, batch = _qwen2_vl()
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4,
              "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
              "out_hidden_size": 32, "window_size": 8, "fullatt_block_indexes": [1]}
    text = {**_TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}
    config = transformers.Qwen2_5_VLConfig(vision_config=vision, text_config=text,
                                           image_token_id=60, vision_start_token_id=61,
                                           vision_end_token_id=62)
    return transformers.Qwen2_5_VLForConditionalGeneration(config), batch


def _mistral3() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny Mistral 3 (Pixtral's vision tower crops by the image's size, its patch merger
    splits by ``h * w`` per image: sizes read from tensors in C++)."""
    import transformers

    vision = transformers.PixtralVisionConfig(**_VISION, head_dim=8)
    config = transformers.Mistral3Config(vision_config=vision,
                                         text_config=transformers.MistralConfig(**_TEXT),
                                         image_token_index=60, spatial_merge_size=2,
                                         vision_feature_layer=-1)
    ids = torch.randint(3, 50, (2, 24))
    ids[:, 2:6] = 60
    return transformers.Mistral3ForConditionalGeneration(config), {
        "input_ids": ids, "pixel_values": torch.randn(2, 3, 32, 32),
        "image_sizes": torch.tensor([[32, 32], [32, 32]]), "labels": ids.clone()}


def _qwen3_vl() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny Qwen3-VL, on Qwen2-VL's batch."""
    import transformers

    _, batch = _qwen2_vl()
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4,
              "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2,
              "out_hidden_size": 32, "num_position_embeddings": 16,
              "deepstack_visual_indexes": [0]}
    rope = {"rope_type": "default", "mrope_section": [1, 1, 2], "mrope_interleaved": True,
            "rope_theta": 10000.0}
    config = transformers.Qwen3VLConfig(vision_config=vision,
                                        text_config={**_TEXT, "head_dim": 8,
                                                     "rope_parameters": rope},
                                        image_token_id=60, vision_start_token_id=61,
                                        vision_end_token_id=62)
    return transformers.Qwen3VLForConditionalGeneration(config), batch


def _llava_next() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny LLaVA-NeXT: a 32 x 64 image in any-resolution tiles (a base view and two
    32 x 32 tiles), its image tokens as many as the features the model makes of them."""
    import transformers

    vision = transformers.CLIPVisionConfig(**_VISION)
    config = transformers.LlavaNextConfig(vision_config=vision,
                                          text_config=transformers.LlamaConfig(**_TEXT),
                                          image_token_index=60, vision_feature_layer=-1,
                                          image_grid_pinpoints=[[32, 32], [32, 64]])
    model = transformers.LlavaNextForConditionalGeneration(config)
    pixels, sizes = torch.randn(2, 3, 3, 32, 32), torch.tensor([[32, 64], [32, 64]])
    with torch.no_grad():
        features = model.model.get_image_features(pixels, sizes).pooler_output
    tokens = sum(f.shape[0] for f in features) // 2
    ids = torch.randint(3, 50, (2, tokens + 8))
    ids[:, 2:2 + tokens] = 60
    return model, {"input_ids": ids, "pixel_values": pixels, "image_sizes": sizes,
                   "labels": ids.clone()}


def _four_tokens(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """Gemma 3, SmolVLM, Idefics3 and InternVL, tiny, each with 4 image tokens per row."""
    import transformers

    vision = dict(_VISION)
    if kind == "gemma3":
        config: Any = transformers.Gemma3Config(
            vision_config=transformers.SiglipVisionConfig(**vision),
            text_config=transformers.Gemma3TextConfig(**_TEXT, head_dim=8, sliding_window=16),
            image_token_index=60, mm_tokens_per_image=4, boi_token_index=61,
            eoi_token_index=62)
        model: nn.Module = transformers.Gemma3ForConditionalGeneration(config)
    elif kind in ("smolvlm", "idefics3"):
        name = "SmolVLM" if kind == "smolvlm" else "Idefics3"
        config = getattr(transformers, f"{name}Config")(
            vision_config=vision, text_config={**_TEXT, "model_type": "llama"},
            image_token_id=60, scale_factor=2)
        model = getattr(transformers, f"{name}ForConditionalGeneration")(config)
    else:
        config = transformers.InternVLConfig(
            vision_config=transformers.InternVLVisionConfig(**vision),
            text_config=transformers.Qwen2Config(**_TEXT), image_token_id=60,
            image_seq_length=4, downsample_ratio=0.5, vision_feature_layer=-1)
        model = transformers.InternVLForConditionalGeneration(config)
    ids = torch.randint(3, 50, (2, 24))
    ids[:, 2:6] = 60
    pixels = torch.randn(2, 3, 32, 32)
    batch = {"input_ids": ids, "labels": ids.clone(),
             "pixel_values": pixels[:, None] if kind in ("smolvlm", "idefics3") else pixels}
    if kind == "gemma3":
        batch["token_type_ids"] = (ids == 60).long()
    return model, batch


def _vision_language(kind: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A tiny LLaVA, PaliGemma or Qwen2-VL and a batch with its image tokens (LLaVA and
    PaliGemma: 16, 32 / 8 squared)."""
    import transformers

    if kind == "qwen2-vl":
        return _qwen2_vl()
    if kind == "qwen2.5-vl":
        return _qwen2_5_vl()
    if kind == "mistral3":
        return _mistral3()
    if kind == "qwen3-vl":
        return _qwen3_vl()
    if kind == "llava-next":
        return _llava_next()
    if kind in ("gemma3", "smolvlm", "idefics3", "internvl"):
        return _four_tokens(kind)
    ids = torch.randint(3, 50, (2, 24))
    if kind == "llava":
        config = transformers.LlavaConfig(
            vision_config=transformers.CLIPVisionConfig(**_VISION),
            text_config=transformers.LlamaConfig(**_TEXT), image_token_index=60,
            vision_feature_layer=-1)
        model: nn.Module = transformers.LlavaForConditionalGeneration(config)
        ids[:, 2:18] = 60
    else:
        config = transformers.PaliGemmaConfig(
            vision_config=transformers.SiglipVisionConfig(**_VISION),
            text_config=transformers.GemmaConfig(**_TEXT, head_dim=8), image_token_index=60,
            projection_dim=32)
        model = transformers.PaliGemmaForConditionalGeneration(config)
        ids[:, :16] = 60
    return model, {"input_ids": ids, "pixel_values": torch.randn(2, 3, 32, 32),
                   "labels": ids.clone()}


@pytest.mark.parametrize("kind", ["llava", "llava-next", "paligemma", "gemma3", "smolvlm",
                                  "idefics3", "internvl", "qwen2-vl", "qwen2.5-vl",
                                  "qwen3-vl", "mistral3"])
def test_vision_language_models_train_as_eager(kind: str) -> None:
    import_torchvision()
    torch.manual_seed(0)
    model, batch = _vision_language(kind)
    trainer = _same_steps(model, [batch, batch])
    assert trainer.stats.captures == 1

"""Tiny configs for ``hf_architectures.py``: the generic sizes and, per model type, what its
config needs beyond them.

``TINY`` is set on every config field of its names (the first try), ``LEAN`` only those (the
second); ``OVERRIDES`` (text) and ``VISION_OVERRIDES`` (images) change them per model type,
``DROP`` leaving a field out; ``TEXT_CONFIG`` names the text config of a composite whose
causal LM takes that. Each entry says why it is there; a type that already built with the
generic sizes is not listed, so its config stays the one it passed with.
"""

from __future__ import annotations

from typing import Any

#: tiny sizes, set on every config field of that name (the first try)
TINY: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "n_routed_experts": 4, "max_position_embeddings": 64,
    "d_model": 32, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64,
    "num_layers": 2, "num_heads": 4, "ffn_dim": 64, "d_ff": 64, "pad_token_id": 0,
    "bos_token_id": 1, "eos_token_id": 2, "layer_types": None,
    # encoder-decoders: T5's family reads the decoder's start token, BART's family sizes
    # each side apart, Marian and FSMT their vocabularies
    "decoder_start_token_id": 0, "num_decoder_layers": 2, "encoder_layers": 2,
    "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "decoder_vocab_size": 64,
    "src_vocab_size": 64, "tgt_vocab_size": 64, "d_kv": 8}
#: the second try: only these, and the config's own layer pattern cut to the layers kept
LEAN = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "head_dim", "pad_token_id", "bos_token_id", "eos_token_id",
        "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size")


#: an ``OVERRIDES`` value: leave this ``TINY`` key out (a config that refuses or misreads it)
DROP = object()
#: MLA attention (DeepSeek's family): low-rank q / kv, rope and no-rope parts of each head
#: (8 + 8 = the tiny head), one kv head per query head, expert groups that divide the experts
_MLA: dict[str, Any] = {
    "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 8, "head_dim": DROP, "num_key_value_heads": 4}
_DEEPSEEK: dict[str, Any] = {**_MLA, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1}
#: the text side of a composite config (TINY's top-level keys do not reach it)
_TEXT = {k: TINY[k] for k in LEAN} | {"num_hidden_layers": 2}
_BERT = {k: v for k, v in _TEXT.items() if k not in ("num_key_value_heads", "head_dim")}
#: Gemma's: one sliding, one full attention layer, a window below the 12 tokens
_GEMMA_TEXT = {**_TEXT, "layer_types": ["sliding_attention", "full_attention"],
               "sliding_window": 8}
_SIGLIP = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "image_size": 32, "patch_size": 16}
#: a speech encoder's sizes, under each family's names (Whisper's and BERT's)
_AUDIO_ENCODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                  "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
                  "d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 4,
                  "encoder_ffn_dim": 64}


def _speech_lm(audio: str | None = "audio_config") -> dict[str, Any]:
    """A speech LM's config: the tiny text model, the tiny encoder as ``audio``."""
    return {"text_config": _TEXT} | ({audio: _AUDIO_ENCODER} if audio else {})


_GRANITE_SPEECH = {**_speech_lm(None), "has_lora_adapter": False,
                   "encoder_config": {"num_layers": 1, "hidden_dim": 32, "num_heads": 4,
                                      "dim_head": 8},
                   "projector_config": {"hidden_size": 32, "num_hidden_layers": 1,
                                        "num_attention_heads": 4, "intermediate_size": 64,
                                        "encoder_hidden_size": 32}}
#: the first try for model types the generic sizes cannot build: ``TINY`` with these changes
#: (the previously buildable types are not listed, so they keep their configs)
OVERRIDES: dict[str, dict[str, Any]] = {
    "deepseek_v2": _DEEPSEEK, "deepseek_v3": _DEEPSEEK, "deepseek_v32": _DEEPSEEK,
    "axk1": _DEEPSEEK, "axk2": _DEEPSEEK, "glm4_moe_lite": _DEEPSEEK, "glm_moe_dsa": _DEEPSEEK,
    "youtu": _DEEPSEEK, "minicpm3": {**_MLA, "dim_model_base": 32},
    # its head_dim is the rope part; two layers of its double-block, few zero experts
    "longcat_flash": {**_MLA, "head_dim": 8, "zero_expert_num": 2, "num_layers": 1},
    # its sparse attention keeps 4 of the 12 tokens
    "hy_v4": {**_MLA, "index_topk": 4, "index_head_dim": 8, "index_n_heads": 2},
    "bailing_hybrid": {**_DEEPSEEK, "layer_types": ["linear_attention", "full_attention"],
                       "num_mtp_layers": 0},
    # its shared experts default to None
    "dots1": {"n_shared_experts": 1, "first_k_dense_replace": 1, "layer_types": DROP},
    "zaya": {"num_experts_per_tok": 1, "router_hidden_size": 16},  # it routes to one expert
    # one linear-attention (KDA) and one MLA layer: all-linear has no sequence length
    "kimi_linear": {**_MLA, "layer_types": ["linear_attention", "full_attention"],
                    "mlp_layer_types": ["dense", "sparse"], "linear_head_dim": 8,
                    "linear_num_heads": 4},
    # head_dim is derived, without a setter
    "falcon": {"head_dim": DROP},
    # rotary_dim defaults to 64, above the tiny head
    "gptj": {"rotary_dim": 4}, "codegen": {"rotary_dim": 4},
    # the attention pattern must cover the layers; a window below the 12 tokens
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 8},
    # Mamba-2 heads: num_heads * head_dim = expand * hidden_size; chunks below 12 tokens
    "mamba2": {"layer_types": DROP, "num_heads": 8, "head_dim": 8, "n_groups": 1,
               "state_size": 16, "chunk_size": 8},
    "bamba": {"layer_types": DROP, "attn_layer_indices": [1], "mamba_n_heads": 8,
              "mamba_d_head": 8, "mamba_d_state": 16, "mamba_chunk_size": 8},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"], "mamba_n_heads": 8,
                         "mamba_d_head": 8, "mamba_d_state": 16, "mamba_chunk_size": 8,
                         "shared_intermediate_size": 32},
    # a Mamba then an attention + experts layer; the CUDA kernels off
    "jamba": {"layer_types": DROP, "use_mamba_kernels": False, "attn_layer_period": 2,
              "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "mamba_d_state": 8},
    # the shared transformer block is tied across hybrid layers: two of them
    "zamba": {"layer_types": DROP, "num_hidden_layers": 3, "mamba_d_state": 8,
              "layers_block_type": ["hybrid", "mamba", "hybrid"], "use_mamba_kernels": False},
    "zamba2": {"layer_types": DROP, "layers_block_type": ["mamba", "hybrid"],
               "use_mamba_kernels": False, "mamba_d_state": 8, "n_mamba_heads": 4,
               "chunk_size": 8, "adapter_rank": 8},
    # text configs (``TEXT_CONFIG``): chunked attention below 12 tokens, a no-rope layer,
    # experts on every other layer
    "llama4": {"intermediate_size_mlp": 64, "attention_chunk_size": 8, "layer_types": DROP,
               "no_rope_layer_interval": 2, "floor_scale": 8, "interleave_moe_layer_step": 2},
    "qwen3_5": {"layer_types": ["linear_attention", "full_attention"],
                "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                "linear_num_key_heads": 2, "linear_num_value_heads": 4},
    "qwen3_5_moe": {"layer_types": ["linear_attention", "full_attention"],
                    "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                    "shared_expert_intermediate_size": 32},
    # two layers share the kv cache of the first two; a sparse (top-k by a Gaussian
    # quantile) first layer; small per-layer inputs and LAuReL
    "gemma3n_text": {"num_hidden_layers": 4, "num_kv_shared_layers": 2,
                     "layer_types": ["sliding_attention", "full_attention"] * 2,
                     "vocab_size_per_layer_input": 64, "hidden_size_per_layer_input": 8,
                     "laurel_rank": 8, "sliding_window": 8,
                     "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "gemma4_text": {"vocab_size_per_layer_input": 64, "hidden_size_per_layer_input": 8,
                    "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
    # rope parameters per layer type
    "cohere_compass_text": {"layer_types": ["sliding_attention", "full_attention"],
                            "sliding_window": 8, "rope_parameters": {
                                kind: {"rope_type": "default", "rope_theta": 10000.0}
                                for kind in ("full_attention", "sliding_attention")}},
    # text configs (``TEXT_CONFIG``) of a multimodal causal LM: one cross-attention layer
    "emu3": {}, "mllama": {"cross_attention_layers": [1]},
    # a composite config: TINY's top-level keys do not reach its text and vision parts; the
    # image tokens inside the tiny vocabulary (the batch has no image)
    "gemma3": {"text_config": {k: TINY[k] for k in LEAN} | {
                   "num_hidden_layers": 2, "sliding_window": 8,
                   "layer_types": ["sliding_attention", "full_attention"]},
               "vision_config": {"hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 1, "num_attention_heads": 4,
                                 "image_size": 32, "patch_size": 16},
               "mm_tokens_per_image": 4, "image_token_index": 63, "boi_token_index": 61,
               "eoi_token_index": 62},
    # ProphetNet refuses num_hidden_layers (and decoder_layers, which the decoder's text
    # config, ``get_text_config(decoder=True)``, copies there): each side apart
    "prophetnet": {"num_hidden_layers": DROP, "decoder_layers": DROP, "num_encoder_layers": 2,
                   "num_encoder_attention_heads": 4, "num_decoder_attention_heads": 4},
    # composite encoder-decoders: TINY's top-level keys do not reach the two sides
    "encoder-decoder": {"encoder": {"model_type": "bert", **_BERT},
                        "decoder": {"model_type": "bert", **_BERT, "is_decoder": True,
                                    "add_cross_attention": True}},
    "t5gemma": {"encoder": _GEMMA_TEXT, "decoder": _GEMMA_TEXT},
    # the encoder reads images too: a tiny SigLIP, its image tokens inside the vocabulary
    "t5gemma2": {"encoder": {"text_config": _GEMMA_TEXT, "vision_config": _SIGLIP,
                             "mm_tokens_per_image": 4, "image_token_index": 63,
                             "boi_token_index": 61, "eoi_token_index": 62},
                 "decoder": _GEMMA_TEXT},
    # speech LMs (trained on text alone here): a tiny text model and audio encoder
    "audioflamingo3": _speech_lm(), "glmasr": _speech_lm(), "voxtral": _speech_lm(),
    "moss_transcribe_diarize": _speech_lm(), "qwen2_audio": _speech_lm(),
    # its audio config must name its type
    "musicflamingo": {"text_config": _TEXT, "audio_config": {
        **_AUDIO_ENCODER, "model_type": "audioflamingo3_encoder"}},
    # the encoder's convolutional downsampling and output projection at the tiny width
    "qwen3_asr": {"text_config": _TEXT, "audio_config": {
        **_AUDIO_ENCODER, "output_dim": 32, "downsample_hidden_size": 16}},
    # a Conformer encoder and a Q-Former projector; no LoRA adapter (PEFT's)
    "granite_speech": _GRANITE_SPEECH, "granite_speech_plus": _GRANITE_SPEECH,
    # two convolutional tokenizer encoders: one block per stage, few filters
    "vibevoice_asr": _speech_lm(None) | {
        f"{kind}_tokenizer_encoder_config": {"hidden_size": 16, "num_filters": 4,
                                             "depths": [1] * 7}
        for kind in ("acoustic", "semantic")},
    # the LM head needs a decoder; small pronunciation and shape vocabularies
    "roc_bert": {"is_decoder": True, "pronunciation_embed_dim": 16,
                 "pronunciation_vocab_size": 16, "shape_embed_dim": 16, "shape_vocab_size": 16},
    "xmod": {"is_decoder": True, "default_language": "en_XX"},  # its adapters need a language
    # XLNet refuses max_position_embeddings; d_head = d_model / n_head
    "xlnet": {"max_position_embeddings": DROP, "d_inner": 64, "n_head": 4, "d_head": 8},
    # the attention reads attn_config.rope_theta, which its config class does not declare
    "dbrx": {"attn_config": {"kv_n_heads": 1, "clip_qkv": 8.0, "rope_theta": 10000.0},
             "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
             "max_seq_len": 64},
    # the LM head needs a decoder; the axial positions multiply to the 12 tokens, chunks
    # of 4 for the local and the LSH layer
    "reformer": {"is_decoder": True, "attn_layers": ["local", "lsh"], "axial_pos_shape": [3, 4],
                 "axial_pos_embds_dim": [16, 16], "attention_head_size": 8,
                 "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4, "num_buckets": 2,
                 "feed_forward_size": 64, "max_position_embeddings": 12},
    # its cache is sized by unrounded head dims (q / k round up to 64): no cache; the
    # chunkwise training kernel in float32, chunks below 12 tokens
    "xlstm": {"use_cache": False, "mode": "train", "chunk_size": 4,
              "autocast_kernel_dtype": "float32", "ffn_round_up_to_multiple_of": 16},
}
#: DETR's family: a tiny ResNet (the default is timm's ResNet-50) and transformer, few queries
_RESNET = {"model_type": "resnet", "embedding_size": 8, "hidden_sizes": [8, 16, 16, 32],
           "depths": [1, 1, 1, 1], "out_features": ["stage4"]}
_DETR: dict[str, Any] = {
    "backbone_config": _RESNET, "use_timm_backbone": False, "use_pretrained_backbone": False,
    "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_queries": 8}
#: RT-DETR's family: its hybrid encoder and decoder at the tiny width (its backbone's widths
#: shrink with ``vision_tiny``), few queries and denoising queries; two decoder layers (the
#: later box heads are tied to the first); the head size is derived (D-FINE: without a setter)
_RT_DETR: dict[str, Any] = {
    "d_model": 32, "encoder_hidden_dim": 32, "decoder_in_channels": [32] * 3,
    "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "decoder_layers": 2, "num_queries": 8, "num_denoising": 4,
    "head_dim": DROP}
_VIT = {"image_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_windows": 4, "out_indices": [1, 2]}
_DETR_HEAD = {"d_model": 32, "decoder_ffn_dim": 64, "decoder_layers": 2, "num_queries": 8,
              "decoder_self_attention_heads": 4, "decoder_cross_attention_heads": 4,
              "group_detr": 2}
_FOUR_LAYERS = {"num_hidden_layers": 4, "out_indices": [1, 2, 3, 4]}
_TINY_VIT = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
             "image_size": 64}
#: image model types ``vision_tiny``'s shrink cannot build or train: its fields with these
#: changes (``DROP``: the field left out), tried after the plain shrink (a type that several
#: tasks list, like BEiT's classifier and segmenter, keeps the plain config where it trains)
VISION_OVERRIDES: dict[str, dict[str, Any]] = {
    "detr": _DETR, "conditional_detr": _DETR, "table-transformer": _DETR,
    "dab-detr": {**_DETR, "d_model": DROP, "hidden_size": 32},
    # multi-scale: three backbone stages and one more level; two decoder layers (the later
    # box heads are tied to the first)
    "deformable_detr": {**_DETR, "decoder_layers": 2, "two_stage_num_proposals": 8,
                        "backbone_config": {**_RESNET, "out_features": ["stage2", "stage3",
                                                                        "stage4"]}},
    "rt_detr": _RT_DETR, "rt_detr_v2": _RT_DETR, "d_fine": _RT_DETR, "deimv2": _RT_DETR,
    # windowed ViT backbones: 2 x 2 windows of the 4 x 4 patches, two layers out; one projector
    # level (LW-DETR defaults to none; the fields it derives from it left out), two groups of
    # few queries
    "lw_detr": {**_DETR_HEAD, "projector_scale_factors": [1.0], "num_feature_levels": DROP,
                "projector_in_channels": DROP, "projector_out_channels": DROP, "backbone_config": {
        **_VIT, "model_type": "lw_detr_vit", "window_block_indices": [0]}},
    "rf_detr": {**_DETR_HEAD, "backbone_config": {
        **_VIT, "model_type": "rf_detr_dinov2", "patch_size": 16, "num_register_tokens": 0}},
    # its stages index their drop-path rates by the stage: at least stage + 1 blocks each
    "cvt": {"depth": [1, 2, 3]},
    # the block widths are its own (channels divided apart break the depthwise convs):
    # the width multiplier instead (the head's 1280 channels too), few repeats
    "efficientnet": {"in_channels": DROP, "out_channels": DROP, "width_coefficient": 0.25,
                     "depth_coefficient": 0.25, "hidden_dim": 320},
    # few latents of a tiny width, one self-attention; small images (a learned position per
    # pixel)
    "perceiver": {"num_latents": 8, "d_latents": 32, "num_self_attends_per_block": 1,
                  "num_self_attention_heads": 4, "num_cross_attention_heads": 4,
                  "image_size": 16},
    "timm_wrapper": {"architecture": "test_resnet"},  # timm's tiny test ResNet
    # the segmentation head reads four layers' features
    "beit": _FOUR_LAYERS, "data2vec-vision": _FOUR_LAYERS,
    # the fusion stages at the tiny width; the neck reads four layers
    "dpt": {"fusion_hidden_size": 32, "num_hidden_layers": 4, "backbone_out_indices": [0, 1, 2, 3]},
    "tipsv2_dpt": {"fusion_hidden_size": 32, "backbone_config": {
        "model_type": "tipsv2_vision_model", "apply_layernorm": True,
        "reshape_hidden_states": False, **_TINY_VIT, **_FOUR_LAYERS}},
    "mobilevitv2": {"width_multiplier": 0.5},  # just over the parameter cap at 1.0
}
#: model types whose causal LM takes a text config, not the composite one the mapping names
TEXT_CONFIG = {"llama4": "llama4_text", "qwen3_5": "qwen3_5_text",
               "qwen3_5_moe": "qwen3_5_moe_text", "emu3": "emu3_text_model",
               "mllama": "mllama_text_model"}


def overridden(model_type: str) -> dict[str, Any]:
    """``TINY`` with ``model_type``'s ``OVERRIDES`` (``DROP``: the key left out)."""
    fields = {**TINY, **OVERRIDES[model_type]}
    return {k: v for k, v in fields.items() if v is not DROP}

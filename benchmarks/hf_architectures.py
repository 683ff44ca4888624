"""Every causal-LM architecture of the installed transformers, at a tiny size, through outcore.

For each entry of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (``--mapping`` names another of
transformers' task mappings: those taking token ids and labels like the causal LMs,
``MODEL_FOR_MASKED_LM_MAPPING_NAMES``, ``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES``, ...,
and those of ``TASKS``: a label per sequence or per token, answer spans, multiple choice,
images, a class per pixel, speech)
the script builds a tiny config (text: three tries, the sizes below set on every field the
config has, then only the core sizes with the layer pattern cut to the layers kept, then the
first without ``num_hidden_layers``; images: ``vision_tiny``'s shrink of the default config,
at 64 pixels and then at the config's own size, widths divided by 8 and then also rounded up
to multiples of 8), runs one
eager step, and where eager trains, one step through ``outcore.compile`` on ``cpu-emulated``
under ``--policy`` (default outcore-auto), halfway between the layer-wise lower bound and
the in-core peak, compared with eager by the real-model corpus's harness
(``tests/realmodels/harness.py``: the loss and every gradient bit-exact, the measured peak
equal to the predicted one). The model runs one forward under ``no_grad`` when built, so
that first-call state (BigBird draws random numbers once) is set before the compared step in
both copies.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/hf_architectures.py [--only a,b] \\
        [--policy outcore-auto] [--timeout 300] [--mapping MODEL_FOR_MASKED_LM_MAPPING_NAMES]

Prints one Markdown row per architecture (``ok``, ``FAIL: ...`` for outcore, ``skip`` where
the tiny config does not train eagerly) and the counts. Exit status 1 if any row failed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))

import sweep_row
from sweep_row import Skip

from corpus import Case
from tv_compat import import_torchvision

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
#: model types whose causal LM takes a text config, not the composite one the mapping names
TEXT_CONFIG = {"llama4": "llama4_text", "qwen3_5": "qwen3_5_text",
               "qwen3_5_moe": "qwen3_5_moe_text", "emu3": "emu3_text_model",
               "mllama": "mllama_text_model"}


def _overridden(model_type: str) -> dict[str, Any]:
    """``TINY`` with ``model_type``'s ``OVERRIDES`` (``DROP``: the key left out)."""
    fields = {**TINY, **OVERRIDES[model_type]}
    return {k: v for k, v in fields.items() if v is not DROP}


MAX_PARAMETERS = 5_000_000


def _tokens(config: Any = None) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 60, (2, 12))
    return {"input_ids": ids, "labels": ids}


def _sequence_labels(config: Any) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, 60, (2, 12)), "labels": torch.randint(0, 2, (2,))}


def _token_labels(config: Any) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, 60, (2, 12)), "labels": torch.randint(0, 2, (2, 12))}


def _spans(config: Any) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, 60, (2, 12)),
            "start_positions": torch.randint(0, 12, (2,)),
            "end_positions": torch.randint(0, 12, (2,))}


def _choices(config: Any) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, 60, (2, 3, 12)), "labels": torch.randint(0, 3, (2,))}


def _images(config: Any) -> dict[str, torch.Tensor]:
    size = getattr(config, "image_size", 64)
    side = size[0] if isinstance(size, (list, tuple)) else size
    channels = getattr(config, "num_channels", 3)
    return {"pixel_values": torch.randn(2, channels, side, side),
            "labels": torch.randint(0, 2, (2,))}


#: backbone fields that name the stages of the default depth: left to the config to rebuild
_STAGE_FIELDS = ("stage_names", "out_features", "out_indices")


def _width(value: int, round_up: bool) -> int:
    """A channel width divided by 8 (widths below 16, like an image's 3 channels, kept);
    ``round_up``: to a multiple of 8, for models whose widths must divide by their heads."""
    if value < 16:
        return value
    small = max(1, value // 8)
    return -(-small // 8) * 8 if round_up else small


def _is_width(key: str) -> bool:
    return (key in ("hidden_size", "embed_dim", "embed_dims", "hidden_sizes",
                    "intermediate_size", "embedding_size")
            or key.endswith(("_channels", "_hidden_sizes")))


def vision_tiny(defaults: dict[str, Any], side: int | None,
                round_up: bool = False) -> dict[str, Any]:
    """A tiny image model's config fields from the default config's ``defaults`` (nested
    ``*_config`` dicts likewise): channel widths divided (``_width``), one block per stage, two
    layers, ``side``-pixel images (None keeps the config's own), the backbone's stage names
    rebuilt by the config."""
    out: dict[str, Any] = {}
    for key, value in defaults.items():
        if key in _STAGE_FIELDS and "stage_names" in defaults:
            out[key] = None
        elif key.endswith("_config") and isinstance(value, dict):
            out[key] = {**value, **vision_tiny(value, side, round_up)}
        elif _is_width(key) and isinstance(value, int) and not isinstance(value, bool):
            out[key] = _width(value, round_up)
        elif _is_width(key) and isinstance(value, list) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            out[key] = [_width(v, round_up) for v in value]
        elif key in ("depths", "depth") and isinstance(value, list):
            out[key] = [1] * len(value)
        elif key == "num_groups" and isinstance(value, int) and value > 8:
            out[key] = 8
        elif key == "num_hidden_layers" and isinstance(value, int) and value <= 24:
            out[key] = 2
        elif key == "image_size" and side is not None:
            out[key] = [side, side] if isinstance(value, list) else side
    return out


def _segments(config: Any) -> dict[str, torch.Tensor]:
    """Images with a class per pixel (255: ignored, as Hugging Face's segmentation losses
    read ``semantic_loss_ignore_index``)."""
    batch = _images(config)
    side = batch["pixel_values"].shape[-1]
    labels = torch.randint(0, 2, (2, side, side))
    labels[:, :2] = 255
    return {"pixel_values": batch["pixel_values"], "labels": labels}


def _audio_characters(config: Any) -> dict[str, torch.Tensor]:
    """A quarter second of 16 kHz audio; CTC labels padded with -100 (concatenated by the
    model's loss)."""
    return {"input_values": torch.randn(2, 4000),
            "labels": torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]])}


def _audio_labels(config: Any) -> dict[str, torch.Tensor]:
    return {"input_values": torch.randn(2, 4000), "labels": torch.randint(0, 2, (2,))}


#: speech models: SpecAugment and LayerDrop off (they draw with NumPy, which a captured step
#: cannot repeat: outcore refuses them, ``outcore.capture.host_random``), and a small
#: convolutional feature encoder where the config has Wav2Vec2's seven layers
AUDIO_OFF = {"mask_time_prob": 0.0, "mask_feature_prob": 0.0, "layerdrop": 0.0,
             "apply_spec_augment": False}
AUDIO = {**AUDIO_OFF, "conv_dim": (16,) * 7, "num_conv_pos_embeddings": 16,
         "num_conv_pos_embedding_groups": 4, "classifier_proj_size": 16, "tdnn_dim": (16,) * 5}

#: the inputs of each task mapping that does not take causal-LM tokens, and what its models
#: take ("text", "image": ``vision_tiny``'s configs, "audio": ``AUDIO`` on the text sizes)
TASKS: dict[str, tuple[Callable[[Any], dict[str, torch.Tensor]], str]] = {
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": (_sequence_labels, "text"),
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": (_token_labels, "text"),
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": (_spans, "text"),
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": (_choices, "text"),
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": (_images, "image"),
    "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES": (_segments, "image"),
    "MODEL_FOR_CTC_MAPPING_NAMES": (_audio_characters, "audio"),
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES": (_audio_labels, "audio"),
}


def _configs(model_type: str, kind: str = "text") -> list[Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    if kind == "image":
        return _vision_configs(cls)
    extra, lean_extra = (AUDIO, AUDIO_OFF) if kind == "audio" else ({}, {})
    tries: list[Callable[[], Any]] = [
        lambda: cls(**TINY, **extra),
        lambda: cls(**{k: TINY[k] for k in LEAN}, **extra, num_hidden_layers=4),
        lambda: cls(**{k: TINY[k] for k in LEAN}, **lean_extra, num_hidden_layers=4),
        # ProphetNet refuses ``num_hidden_layers`` and sizes each side apart
        lambda: cls(**{k: v for k, v in TINY.items() if k != "num_hidden_layers"},
                    num_encoder_layers=2)]
    if model_type in OVERRIDES:
        override_cls = CONFIG_MAPPING[TEXT_CONFIG.get(model_type, model_type)]
        tries.insert(0, lambda: override_cls(**_overridden(model_type), **extra))
    configs = []
    for make in tries:
        try:
            configs.append(make())
        except Exception:  # noqa: BLE001 - a config that refuses these sizes: next try
            continue
    return configs


def _vision_configs(cls: Any) -> list[Any]:
    try:
        defaults = cls().to_dict()
    except Exception:  # noqa: BLE001 - a config without defaults: no row
        return []
    configs = []
    for side in (64, None):
        for round_up in (False, True):
            try:
                configs.append(cls(**{**defaults, **vision_tiny(defaults, side, round_up)}))
            except Exception:  # noqa: BLE001 - refused: the next try
                continue
    return configs


def _tiny(model_cls: Any, config: Any) -> bool:
    """Whether the model has at most ``MAX_PARAMETERS`` parameters (built on the meta
    device, nothing allocated): a config whose sub-configs keep their full sizes (BLT's
    byte models) would fill this machine's memory."""
    try:
        with torch.device("meta"):
            model = model_cls(config)
    except Exception:  # noqa: BLE001 - the real build will say why
        return True
    return sum(p.numel() for p in model.parameters()) <= MAX_PARAMETERS


def _builder(model_cls: Any, config: Any,
             inputs: Callable[[Any], dict[str, torch.Tensor]]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        model = model_cls(config)
        with torch.no_grad():
            torch.manual_seed(2)
            model(**inputs(config))  # first-call state, in both copies (module doc)
        return model
    return build


def _case(model_type: str, class_name: str, mapping: str) -> Case | None:
    """A corpus Case for the first tiny config that trains one eager step, else None."""
    import transformers

    # a mapping entry may name several classes (a model with and without a teacher): the first
    model_cls = getattr(transformers, class_name if isinstance(class_name, str) else class_name[0])
    inputs, kind = TASKS.get(mapping, (_tokens, "text"))
    for config in _configs(model_type, kind):
        if not _tiny(model_cls, config):
            continue
        case = Case(f"hf_{model_type}", "hf", _builder(model_cls, config, inputs),
                    lambda config=config: inputs(config), None)
        try:
            model = case.build()
            model(**case.batch()).loss.backward()
            return case
        except Exception:  # noqa: BLE001 - eager fails at this config: next one
            continue
    return None


def _make(model_type: str, class_name: str, mapping: str) -> Callable[[], Case]:
    def make() -> Case:
        case = _case(model_type, class_name, mapping)
        if case is None:
            raise Skip("eager fails at the tiny sizes, or they are not tiny")
        return case
    return make


def main() -> None:
    parser = sweep_row.arguments(__doc__, "model types")
    parser.add_argument("--mapping", default="MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
                        help="a task mapping of transformers.models.auto.modeling_auto")
    args = parser.parse_args()
    import_torchvision()
    import logging

    import transformers
    from transformers.models.auto import modeling_auto

    logging.disable(logging.WARNING)
    only = set(args.only.split(",")) if args.only else None
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"policy {args.policy}, {args.mapping}\n")
    print("| model type | class | ops | result |\n|---|---|---|---|")
    mapping = sorted(getattr(modeling_auto, args.mapping).items())
    sweep_row.run_all(((f"| {model_type} | {class_name} |",
                        _make(model_type, class_name, args.mapping))
                       for model_type, class_name in mapping
                       if only is None or model_type in only),
                      args.policy, args.timeout, " (eager fails at the tiny sizes)")


if __name__ == "__main__":
    main()

"""The real-model corpus: tiny random-init torchvision, timm and Hugging Face models.

Each ``Case`` builds its model and an example batch (seeded, so two calls give equal models)
and names its calling convention: ``loss_fn`` for ``(x, y)`` batches, None for a model that
returns its own loss from a dict batch (Hugging Face with ``labels``). Sizes are tiny so one
step runs on the CPU in well under a second; the architectures are the real ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tv_compat import import_torchvision


@dataclass(frozen=True)
class Case:
    """One corpus model: ``build()`` and ``batch()`` are deterministic (seeded)."""

    name: str
    family: str  # "torchvision" | "timm" | "hf"
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[], Any]
    loss_fn: Callable[..., torch.Tensor] | None = F.cross_entropy

    def build(self) -> nn.Module:
        torch.manual_seed(0)
        return self.make_model()

    def batch(self) -> Any:
        torch.manual_seed(1)
        return self.make_batch()


def images(size: int = 32, n: int = 2, classes: int = 10) -> Callable[[], Any]:
    return lambda: (torch.randn(n, 3, size, size), torch.randint(0, classes, (n,)))


# -- torchvision -------------------------------------------------------------------------------
def _tv(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        tv = import_torchvision()
        return getattr(tv.models, name)(num_classes=10, **kwargs)
    return build


def _tv_vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                             hidden_dim=32, mlp_dim=64, num_classes=10, dropout=0.1,
                             attention_dropout=0.1)


def _tv_swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                           window_size=[4, 4], stochastic_depth_prob=0.1, num_classes=10)


def _tv_convnext() -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    return ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 2)],
                    stochastic_depth_prob=0.1, num_classes=10)


def _tv_densenet() -> nn.Module:
    from torchvision.models.densenet import DenseNet

    return DenseNet(growth_rate=8, block_config=(2, 2, 2), num_init_features=16,
                    num_classes=10, drop_rate=0.1)


def _with_tv(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def wrapped() -> nn.Module:
        import_torchvision()
        return build()
    return wrapped


TORCHVISION = [
    Case("tv_resnet18", "torchvision", _tv("resnet18"), images()),
    Case("tv_resnet50", "torchvision", _tv("resnet50"), images()),
    Case("tv_resnext", "torchvision", _tv("resnext50_32x4d"), images()),
    Case("tv_densenet", "torchvision", _with_tv(_tv_densenet), images()),
    Case("tv_mobilenet_v2", "torchvision", _tv("mobilenet_v2"), images()),
    Case("tv_mobilenet_v3", "torchvision", _tv("mobilenet_v3_small"), images()),
    Case("tv_efficientnet_b0", "torchvision", _tv("efficientnet_b0"), images()),
    Case("tv_convnext", "torchvision", _with_tv(_tv_convnext), images()),
    Case("tv_vit", "torchvision", _with_tv(_tv_vit), images()),
    Case("tv_swin", "torchvision", _with_tv(_tv_swin), images()),
    Case("tv_regnet", "torchvision", _tv("regnet_y_400mf"), images()),
    Case("tv_shufflenet", "torchvision", _tv("shufflenet_v2_x0_5"), images()),
    Case("tv_inception_v3", "torchvision",
         _tv("inception_v3", aux_logits=False, init_weights=False), images(75)),
    Case("tv_googlenet", "torchvision",
         _tv("googlenet", aux_logits=False, init_weights=False), images()),
    Case("tv_mnasnet", "torchvision", _tv("mnasnet0_5"), images()),
    Case("tv_squeezenet", "torchvision", _tv("squeezenet1_1"), images(64)),
]


# -- timm --------------------------------------------------------------------------------------
def _timm(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import_torchvision()  # timm imports torchvision
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    return build


def _timm_mixer() -> nn.Module:
    """MLP-Mixer at a tiny size: the registered ``mixer_*`` builders fix ``num_blocks`` and
    ``embed_dim`` (passing them again is a TypeError), so the class is built directly."""
    import_torchvision()
    from timm.models.mlp_mixer import MlpMixer

    return MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=32,
                    drop_path_rate=0.1)


_DP = {"drop_path_rate": 0.1}
TIMM = [
    Case("timm_vit_tiny", "timm", _timm("vit_tiny_patch16_224", img_size=32, patch_size=8,
                                        depth=2, **_DP), images()),
    Case("timm_deit_ls", "timm", _timm("vit_tiny_patch16_224", img_size=32, patch_size=8,
                                       depth=2, init_values=1e-5, **_DP), images()),
    Case("timm_cait", "timm", _timm("cait_xxs24_224", img_size=32, patch_size=8, depth=2,
                                    depth_token_only=1, **_DP), images()),
    Case("timm_convnext_atto", "timm", _timm("convnext_atto", ls_init_value=1e-6, **_DP),
         images()),
    Case("timm_coat_lite", "timm", _timm("coat_lite_tiny", img_size=32), images()),
    Case("timm_efficientnet", "timm", _timm("efficientnet_b0", **_DP), images()),
    Case("timm_mobilenetv3", "timm", _timm("mobilenetv3_small_050", **_DP), images()),
    Case("timm_resnet10t", "timm", _timm("resnet10t", **_DP), images()),
    Case("timm_regnetx", "timm", _timm("regnetx_002", **_DP), images()),
    Case("timm_mixer", "timm", _timm_mixer, images()),
    Case("timm_poolformer", "timm", _timm("poolformer_s12", **_DP), images()),
    Case("timm_swin", "timm", _timm("swin_tiny_patch4_window7_224", img_size=32,
                                    window_size=4, depths=(1, 1), num_heads=(1, 2),
                                    embed_dim=16, **_DP), images()),
    Case("timm_ghostnet", "timm", _timm("ghostnet_050"), images()),
    Case("timm_edgenext", "timm", _timm("edgenext_xx_small", **_DP), images(64)),
]


# -- Hugging Face transformers -----------------------------------------------------------------
VOCAB = 96


def _tokens(seq: int = 16, n: int = 2, labels: bool = True,
            mask: bool = True) -> Callable[[], Any]:
    def make() -> dict[str, torch.Tensor]:
        ids = torch.randint(1, VOCAB, (n, seq))
        batch = {"input_ids": ids}
        if mask:
            batch["attention_mask"] = torch.ones(n, seq, dtype=torch.long)
        if labels:
            batch["labels"] = ids.clone()
        return batch
    return make


def _seq2seq(seq: int = 12, n: int = 2) -> Callable[[], Any]:
    def make() -> dict[str, torch.Tensor]:
        return {"input_ids": torch.randint(3, VOCAB, (n, seq)),
                "attention_mask": torch.ones(n, seq, dtype=torch.long),
                "labels": torch.randint(3, VOCAB, (n, seq - 2))}
    return make


def _hf(model_cls: str, config_cls: str, **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import_torchvision()  # transformers imports torchvision when it is installed
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        return getattr(transformers, model_cls)(cfg)
    return build


_DEC = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 64, "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2}
_ENC = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
        "pad_token_id": 0}
_S2S = {"vocab_size": VOCAB, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64, "max_position_embeddings": 64, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}


#: Mixture-of-experts causal LMs: transformers 5 routes each token to its top-k experts and
#: runs them with ``torch._grouped_mm`` (float32 here: its fake-tensor rule refused that
#: before ``outcore.capture.eager_meta``). Qwen2-MoE adds a shared expert; the aux-loss
#: Mixtral returns the router's load-balancing loss in its loss; DeepSeek-V3 has latent
#: attention (MLA), a shared expert and group-limited routing.
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
MOE = [
    Case("hf_mixtral", "hf", _hf("MixtralForCausalLM", "MixtralConfig", num_local_experts=4,
                                 **_DEC, **_MOE), _tokens(), None),
    Case("hf_mixtral_aux", "hf", _hf("MixtralForCausalLM", "MixtralConfig", num_local_experts=4,
                                     output_router_logits=True, router_aux_loss_coef=0.02,
                                     **_DEC, **_MOE), _tokens(), None),
    Case("hf_qwen2_moe", "hf", _hf("Qwen2MoeForCausalLM", "Qwen2MoeConfig", num_experts=4,
                                   shared_expert_intermediate_size=32, **_DEC, **_MOE),
         _tokens(), None),
    Case("hf_qwen3_moe", "hf", _hf("Qwen3MoeForCausalLM", "Qwen3MoeConfig", num_experts=4,
                                   head_dim=8, **_DEC, **_MOE), _tokens(), None),
    Case("hf_olmoe", "hf", _hf("OlmoeForCausalLM", "OlmoeConfig", num_experts=4, **_DEC,
                               **_MOE), _tokens(), None),
    Case("hf_gpt_oss", "hf", _hf("GptOssForCausalLM", "GptOssConfig", num_local_experts=4,
                                 head_dim=8, **_DEC, **_MOE), _tokens(), None),
    Case("hf_deepseek_v3", "hf", _hf("DeepseekV3ForCausalLM", "DeepseekV3Config",
                                     n_routed_experts=4, n_shared_experts=1, n_group=1,
                                     topk_group=1, first_k_dense_replace=0, q_lora_rank=None,
                                     kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                     v_head_dim=8, **{**_DEC, "num_key_value_heads": 4},
                                     **_MOE), _tokens(), None),
]


def _audio_features() -> Any:
    return {"input_features": torch.randn(2, 16, 32),
            "labels": torch.randint(3, VOCAB, (2, 6))}


def _wave() -> Any:
    return {"input_values": torch.randn(2, 1600), "labels": torch.randint(0, 3, (2,))}


def _pixels() -> Any:
    return {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.randint(0, 10, (2,))}


HF = [
    Case("hf_gpt2", "hf", _hf("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_embd=32,
                              n_layer=2, n_head=2, n_positions=64, bos_token_id=1,
                              eos_token_id=2), _tokens(), None),
    Case("hf_llama", "hf", _hf("LlamaForCausalLM", "LlamaConfig", **_DEC), _tokens(), None),
    Case("hf_mistral", "hf", _hf("MistralForCausalLM", "MistralConfig", **_DEC), _tokens(),
         None),
    Case("hf_qwen2", "hf", _hf("Qwen2ForCausalLM", "Qwen2Config", **_DEC), _tokens(), None),
    Case("hf_gemma", "hf", _hf("GemmaForCausalLM", "GemmaConfig", head_dim=8, **_DEC),
         _tokens(), None),
    Case("hf_phi", "hf", _hf("PhiForCausalLM", "PhiConfig", **_DEC), _tokens(), None),
    Case("hf_gpt_neox", "hf", _hf("GPTNeoXForCausalLM", "GPTNeoXConfig", **{
        k: v for k, v in _DEC.items() if k != "num_key_value_heads"}), _tokens(), None),
    Case("hf_opt", "hf", _hf("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32,
                             ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
                             max_position_embeddings=64, word_embed_proj_dim=32,
                             pad_token_id=0, bos_token_id=1, eos_token_id=2), _tokens(),
         None),
    Case("hf_bert", "hf", _hf("BertForMaskedLM", "BertConfig", **_ENC), _tokens(), None),
    Case("hf_roberta", "hf", _hf("RobertaForMaskedLM", "RobertaConfig", **{
        **_ENC, "pad_token_id": 1, "max_position_embeddings": 66}), _tokens(), None),
    Case("hf_distilbert", "hf", _hf("DistilBertForMaskedLM", "DistilBertConfig",
                                    vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2,
                                    hidden_dim=64, max_position_embeddings=64, pad_token_id=0),
         _tokens(), None),
    Case("hf_albert", "hf", _hf("AlbertForMaskedLM", "AlbertConfig", embedding_size=16,
                                **_ENC), _tokens(), None),
    Case("hf_electra", "hf", _hf("ElectraForMaskedLM", "ElectraConfig", embedding_size=16,
                                 **_ENC), _tokens(), None),
    Case("hf_t5", "hf", _hf("T5ForConditionalGeneration", "T5Config", vocab_size=VOCAB,
                            d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16,
                            decoder_start_token_id=0, pad_token_id=0), _seq2seq(), None),
    Case("hf_bart", "hf", _hf("BartForConditionalGeneration", "BartConfig", **_S2S),
         _seq2seq(), None),
    Case("hf_vit", "hf", _hf("ViTForImageClassification", "ViTConfig", image_size=32,
                             patch_size=8, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=64, num_labels=10),
         _pixels, None),
    Case("hf_whisper", "hf", _hf("WhisperForConditionalGeneration", "WhisperConfig",
                                 vocab_size=VOCAB, d_model=32, encoder_layers=1,
                                 decoder_layers=1, encoder_attention_heads=2,
                                 decoder_attention_heads=2, encoder_ffn_dim=64,
                                 decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=16,
                                 max_target_positions=32, pad_token_id=0, bos_token_id=1,
                                 eos_token_id=2, decoder_start_token_id=1),
         _audio_features, None),
    Case("hf_wav2vec2", "hf", _hf("Wav2Vec2ForSequenceClassification", "Wav2Vec2Config",
                                  vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4),
                                  num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                                  num_labels=3, mask_time_prob=0.0, layerdrop=0.0),
         _wave, None),  # LayerDrop draws in Python (`if torch.rand(()) < p`): see the report
    *MOE,
]

CORPUS: list[Case] = [*TORCHVISION, *TIMM, *HF]
BY_NAME = {case.name: case for case in CORPUS}

# -- pairs known to fail ----------------------------------------------------------------------
#: (model, policy) -> cause, for pairs that fail today: each is an ``xfail(strict=True)`` in
#: ``test_corpus.py`` (passing turns it into a failure: remove the entry) and a ``xfail``
#: cell in ``benchmarks/realmodel_corpus.py``'s table. Each entry was seen failing in a corpus
#: run of the current code (the superneurons and moDNN columns, 2026-11-26).
KNOWN_FAILURES: dict[tuple[str, str], str] = {}

#: The default test run's slice: (model, policy) pairs chosen so that each capture class and
#: each policy runs at least once on a small model, and one pair of each known-failure cause
#: (an xfail(strict=True) that turns into a failure when its cause is fixed). The whole grid
#: is marked ``corpus``. Classes: BatchNorm and dropout replayed by a recompute (DenseNet),
#: lifted constants and stochastic depth (Swin), drop-path and layer scale (timm ViT), a model
#: returning its own loss from a dict batch whose mask torch.compile builds otherwise (Llama),
#: value specialisation of ``.item()`` checks (BART), an audio encoder (wav2vec2; its graph
#: breaks under torch.compile are covered by tests/api/test_backend.py, faster), mixture-of-
#: experts routing through ``torch._grouped_mm`` (Mixtral with its router loss, Qwen2-MoE's
#: shared expert, gpt-oss). Token ids are the integer inputs.
DEFAULT_PAIRS: list[tuple[str, str]] = [
    ("tv_densenet", "outcore-auto"), ("tv_densenet", "recompute-cheap"),
    ("tv_swin", "offload-all"), ("tv_swin", "backend"),
    ("timm_deit_ls", "pooch"), ("timm_deit_ls", "modnn"),
    ("tv_mobilenet_v3", "superneurons"), ("tv_mobilenet_v3", "modnn"),
    ("hf_llama", "outcore-auto"), ("hf_llama", "superneurons"), ("hf_llama", "backend"),
    ("hf_bart", "recompute-cheap"), ("hf_bart", "superneurons"),
    ("hf_wav2vec2", "offload-all"),
    ("hf_mixtral_aux", "outcore-auto"), ("hf_qwen2_moe", "offload-all"),
    ("hf_gpt_oss", "recompute-cheap"),
]

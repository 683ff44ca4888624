"""Every causal-LM architecture of the installed transformers, at a tiny size, through outcore.

For each entry of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (``--mapping`` names another of
transformers' task mappings: those taking token ids and labels like the causal LMs,
``MODEL_FOR_MASKED_LM_MAPPING_NAMES``, ``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES``, ...,
and those of ``TASKS``: a label per sequence or per token, answer spans, multiple choice,
images, a class per pixel, boxes per image, speech)
the script builds a tiny config (text: three tries, the sizes below set on every field the
config has, then only the core sizes with the layer pattern cut to the layers kept, then the
first without ``num_hidden_layers``; images: ``vision_tiny``'s shrink of the default config,
at 64 pixels and then at the config's own size, widths divided by 8 and then also rounded up
to multiples of 8, then each with ``VISION_OVERRIDES``), runs one
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
from hf_tiny_configs import (
    DROP,
    LEAN,
    OVERRIDES,
    TEXT_CONFIG,
    TINY,
    VISION_OVERRIDES,
    overridden,
)
from sweep_row import Skip

from corpus import Case
from tv_compat import import_torchvision

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
            out[key] = _sub_config(value, side, round_up)
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


def _sub_config(defaults: dict[str, Any], side: int | None, round_up: bool) -> dict[str, Any]:
    """``vision_tiny`` of a nested config: a backbone's stage names left out (a sub-config
    built from a dict keeps a None), its outputs kept where its stage count is (one block per
    stage keeps the stages; fewer layers do not)."""
    fields = {**defaults, **vision_tiny(defaults, side, round_up)}
    if "stage_names" in defaults:
        del fields["stage_names"]
        if "num_hidden_layers" not in fields or fields["num_hidden_layers"] == defaults.get(
                "num_hidden_layers"):
            fields |= {k: defaults[k] for k in ("out_features", "out_indices") if k in defaults}
    return fields


def _segments(config: Any) -> dict[str, torch.Tensor]:
    """Images with a class per pixel (255: ignored, as Hugging Face's segmentation losses
    read ``semantic_loss_ignore_index``)."""
    batch = _images(config)
    side = batch["pixel_values"].shape[-1]
    labels = torch.randint(0, 2, (2, side, side))
    labels[:, :2] = 255
    return {"pixel_values": batch["pixel_values"], "labels": labels}


def _detections(config: Any) -> dict[str, Any]:
    """Images with boxes, two in the first and one in the second: per image a dict of class
    labels and normalized (cx, cy, w, h) boxes, as Hugging Face's detection losses read them."""
    def image(k: int) -> dict[str, torch.Tensor]:
        centres, sizes = 0.3 + 0.4 * torch.rand(k, 2), 0.1 + 0.3 * torch.rand(k, 2)
        return {"class_labels": torch.randint(0, config.num_labels, (k,)),
                "boxes": torch.cat([centres, sizes], dim=1)}
    return {"pixel_values": _images(config)["pixel_values"], "labels": [image(2), image(1)]}


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
TASKS: dict[str, tuple[Callable[[Any], dict[str, Any]], str]] = {
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": (_sequence_labels, "text"),
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": (_token_labels, "text"),
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": (_spans, "text"),
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": (_choices, "text"),
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": (_images, "image"),
    "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES": (_segments, "image"),
    "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES": (_detections, "image"),
    "MODEL_FOR_CTC_MAPPING_NAMES": (_audio_characters, "audio"),
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES": (_audio_labels, "audio"),
}


def _configs(model_type: str, kind: str = "text") -> list[Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    if kind == "image":
        return _vision_configs(model_type)
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
        tries.insert(0, lambda: override_cls(**overridden(model_type), **extra))
    configs = []
    for make in tries:
        try:
            configs.append(make())
        except Exception:  # noqa: BLE001 - a config that refuses these sizes: next try
            continue
    return configs


def _vision_configs(model_type: str) -> list[Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    try:
        defaults = cls().to_dict()
    except Exception:  # noqa: BLE001 - a config without defaults: no row
        return []
    configs = []
    overrides = [{}, VISION_OVERRIDES[model_type]] if model_type in VISION_OVERRIDES else [{}]
    for override in overrides:
        for side in (64, None):
            for round_up in (False, True):
                try:
                    fields = {**defaults, **vision_tiny(defaults, side, round_up), **override}
                    configs.append(cls(**{k: v for k, v in fields.items() if v is not DROP}))
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
             inputs: Callable[[Any], dict[str, Any]]) -> Callable[[], nn.Module]:
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

"""Every causal-LM architecture of the installed transformers, at a tiny size, through outcore.

For each entry of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (``--mapping`` names another of
transformers' task mappings taking token ids and labels: ``MODEL_FOR_MASKED_LM_MAPPING_NAMES``,
``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES``, ...) the script builds a tiny config (three
tries: the sizes below set on every field the config has, then only the core sizes with the
layer pattern cut to the layers kept, then the first without ``num_hidden_layers``), runs one
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


MAX_PARAMETERS = 5_000_000


def _tokens() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 60, (2, 12))
    return {"input_ids": ids, "labels": ids}


def _configs(model_type: str) -> list[Any]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    tries: list[Callable[[], Any]] = [
        lambda: cls(**TINY),
        lambda: cls(**{k: TINY[k] for k in LEAN}, num_hidden_layers=4),
        # ProphetNet refuses ``num_hidden_layers`` and sizes each side apart
        lambda: cls(**{k: v for k, v in TINY.items() if k != "num_hidden_layers"},
                    num_encoder_layers=2)]
    configs = []
    for make in tries:
        try:
            configs.append(make())
        except Exception:  # noqa: BLE001 - a config that refuses these sizes: next try
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


def _builder(model_cls: Any, config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        model = model_cls(config)
        with torch.no_grad():
            torch.manual_seed(2)
            model(**_tokens())  # first-call state, in both copies (module doc)
        return model
    return build


def _case(model_type: str, class_name: str) -> Case | None:
    """A corpus Case for the first tiny config that trains one eager step, else None."""
    import transformers

    model_cls = getattr(transformers, class_name)
    for config in _configs(model_type):
        if not _tiny(model_cls, config):
            continue
        case = Case(f"hf_{model_type}", "hf", _builder(model_cls, config), _tokens, None)
        try:
            model = case.build()
            model(**case.batch()).loss.backward()
            return case
        except Exception:  # noqa: BLE001 - eager fails at this config: next one
            continue
    return None


def _make(model_type: str, class_name: str) -> Callable[[], Case]:
    def make() -> Case:
        case = _case(model_type, class_name)
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
    sweep_row.run_all(((f"| {model_type} | {class_name} |", _make(model_type, class_name))
                       for model_type, class_name in mapping
                       if only is None or model_type in only),
                      args.policy, args.timeout, " (eager fails at the tiny sizes)")


if __name__ == "__main__":
    main()

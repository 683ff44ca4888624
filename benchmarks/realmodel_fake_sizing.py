"""Paper-scale sizing of real models with fake tensors: capture, plan and simulate.

torchvision ResNet-50 and ViT-B/16 at batch 64 (224 px), GPT-2 124M, a Llama-style 1B
config at sequence 2048 (batch 1), and the mixture of experts OLMoE-1B-7B in bfloat16 at
batch 4: each model is built under ``FakeTensorMode`` (nothing is
allocated), captured, planned with outcore-auto at 50% of its in-core peak (or, when that is
below what any plan can reach, at the least budget outcore-auto names), and the plan is
simulated on the ``h100`` and ``a100`` profiles. Prints one row per (model, GPU).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/realmodel_fake_sizing.py [--small]

``--small`` runs the same pipeline at toy sizes (what tests/realmodels/test_fake_sizing.py
checks).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))

import outcore

from tv_compat import import_torchvision

GPUS = ("h100", "a100")


def _resnet50(small: bool) -> tuple[Any, Any, Any]:
    tv = import_torchvision()
    n, px = (2, 64) if small else (64, 224)
    model = tv.models.resnet18() if small else tv.models.resnet50()
    return model, (torch.randn(n, 3, px, px), torch.randint(0, 1000, (n,))), F.cross_entropy


def _vit(small: bool) -> tuple[Any, Any, Any]:
    tv = import_torchvision()
    from torchvision.models.vision_transformer import VisionTransformer

    if small:
        model = VisionTransformer(32, 8, 2, 2, 32, 64)
        return model, (torch.randn(2, 3, 32, 32), torch.randint(0, 1000, (2,))), F.cross_entropy
    model = tv.models.vit_b_16()
    return model, (torch.randn(64, 3, 224, 224), torch.randint(0, 1000, (64,))), F.cross_entropy


def _tokens(seq: int, vocab: int, batch: int = 1) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (batch, seq))
    return {"input_ids": ids, "labels": ids}


def _gpt2(small: bool) -> tuple[Any, Any, Any]:
    import_torchvision()
    import transformers

    cfg = (transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=128,
                                   n_positions=64) if small else
           transformers.GPT2Config(n_positions=2048))  # 124M: 12 layers, 768 wide
    seq = 32 if small else 2048
    return transformers.GPT2LMHeadModel(cfg), _tokens(seq, cfg.vocab_size), None


def _llama(small: bool) -> tuple[Any, Any, Any]:
    import_torchvision()
    import transformers

    if small:
        cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2)
        seq = 32
    else:  # a Llama-3.2-1B-style config
        cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=2048,
                                       intermediate_size=8192, num_hidden_layers=16,
                                       num_attention_heads=32, num_key_value_heads=8,
                                       max_position_embeddings=2048, tie_word_embeddings=True)
        seq = 2048
    return transformers.LlamaForCausalLM(cfg), _tokens(seq, cfg.vocab_size), None


def _olmoe(small: bool) -> tuple[Any, Any, Any]:
    import_torchvision()
    import transformers

    if small:
        cfg = transformers.OlmoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=4, num_experts=4,
                                       num_experts_per_tok=2, pad_token_id=0,
                                       eos_token_id=1)
        seq = 32
    else:  # OLMoE-1B-7B: 64 experts, 8 per token, 6.9B parameters (1.3B active)
        cfg = transformers.OlmoeConfig(vocab_size=50304, hidden_size=2048,
                                       intermediate_size=1024, num_hidden_layers=16,
                                       num_attention_heads=16, num_key_value_heads=16,
                                       num_experts=64, num_experts_per_tok=8,
                                       max_position_embeddings=4096, pad_token_id=1,
                                       eos_token_id=50279)
        seq = 2048
    # bfloat16 at batch 4: in float32 at batch 1 its parameters and gradients (51.4 GiB) are
    # all but 0.2 GiB of the peak, and no activation plan has anything to decide
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16 (``.to`` cannot swap fakes)
    try:
        model = transformers.OlmoeForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model, _tokens(seq, cfg.vocab_size, batch=1 if small else 4), None


MODELS: dict[str, Callable[[bool], tuple[Any, Any, Any]]] = {
    "resnet50 b64": _resnet50, "vit_b_16 b64": _vit, "gpt2-124M s2048": _gpt2,
    "llama-1B s2048": _llama, "olmoe-1B-7B bf16 b4 s2048": _olmoe}


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Initialisers become no-ops while a fake model is built: values do not matter for
    sizing, and some (``trunc_normal_``) read tensor values, which fake tensors cannot."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(nn.init, n) for n in names}
    try:
        for n in names:
            setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(nn.init, n, fn)


def size(name: str, small: bool) -> list[dict[str, Any]]:
    """Capture ``name`` with fake tensors, plan at 50% of its in-core peak, simulate."""
    start = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True), _no_init():
        model, batch, loss_fn = MODELS[name](small)
    graph = outcore.capture(model, loss_fn, batch, fake=True)
    captured = time.perf_counter() - start
    rows = []
    for gpu in GPUS:
        t0 = time.perf_counter()
        in_core = outcore.plan(graph, None, policy="liveness", gpu=gpu, simulate=False)
        budget = in_core.predicted_peak // 2
        planned = None
        while planned is None:
            try:
                planned = outcore.plan(graph, budget, policy="auto", gpu=gpu)
            except outcore.InfeasibleBudgetError as err:  # below the floor: plan at it
                budget = err.required
        sim = planned.simulation
        rows.append({"model": name, "gpu": gpu, "ops": len(graph.ops),
                     "in_core": in_core.predicted_peak, "budget": budget,
                     "peak": planned.predicted_peak, "sim_peak": sim.peak_bytes,
                     "step_s": sim.step_time, "capture_s": captured,
                     "total_s": captured + time.perf_counter() - t0})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(MODELS)
    print("| model | GPU | ops | in-core peak | budget | planned peak | simulated peak "
          "| simulated step | capture + plan + simulate |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for r in size(name, args.small):
            print(f"| {r['model']} | {r['gpu']} | {r['ops']} | {r['in_core'] / 2**30:.2f} GiB "
                  f"| {r['budget'] / 2**30:.2f} GiB ({r['budget'] / r['in_core']:.0%}) "
                  f"| {r['peak'] / 2**30:.2f} GiB "
                  f"| {r['sim_peak'] / 2**30:.2f} GiB | {r['step_s'] * 1e3:.0f} ms "
                  f"| {r['total_s']:.1f} s |", flush=True)


if __name__ == "__main__":
    main()

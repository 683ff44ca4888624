"""The workloads of ``vs_pytorch.py``: a GPT-style decoder, a ResNet-18, a Hugging Face GPT-2,
each at three sizes: ``quick`` (minutes on a CPU), ``full`` (the issue's sizes, on a CPU) and
``large`` (``bench_device.LARGE``: sizes for a datacentre GPU)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_device import LARGE
from torch import nn

import outcore


@dataclass
class Workload:
    name: str
    model: nn.Module
    loss_fn: Callable[..., torch.Tensor]
    batch: tuple[torch.Tensor, torch.Tensor]
    about: str


SIZES = ("quick", "full", "large")


def _size(size: str) -> str:
    if size not in SIZES:
        raise ValueError(f"size {size!r}: one of {', '.join(SIZES)}")
    return size


def gpt(size: str) -> Workload:
    cfg: dict[str, Any] = {
        "quick": {"seq_len": 64, "n_layer": 2, "n_head": 4, "d_model": 128, "batch": 4},
        "full": {"seq_len": 256, "n_layer": 6, "n_head": 4, "d_model": 256, "batch": 8},
    }.get(_size(size)) or dict(LARGE["gpt"])
    batch = cfg.pop("batch")
    w = outcore.zoo.get("transformer", batch, vocab=512, dropout=0.1, tie_weights=False, **cfg)
    return Workload("gpt", w.model, w.loss_fn, w.batch, f"GPT decoder {cfg}, vocab 512, "
                    f"dropout 0.1, batch {w.batch[0].shape[0]}")


def resnet(size: str) -> Workload:
    large = LARGE["resnet18"]
    image, batch = {"quick": (32, 8), "full": (64, 32)}.get(
        _size(size), (large["image_size"], large["batch"]))
    w = outcore.zoo.get("resnet18", batch, image_size=image, num_classes=100)
    return Workload("resnet18", w.model, w.loss_fn, w.batch,
                    f"ResNet-18 {image}x{image}, batch {batch}, 100 classes")


class _Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits


def hf_gpt2(size: str) -> Workload:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))
    from tv_compat import import_torchvision

    import_torchvision()  # transformers imports torchvision (see tv_compat)
    from transformers import GPT2Config, GPT2LMHeadModel

    large = LARGE["hf-gpt2"]
    sizes = {"quick": (2, 64, 4, 128, 4), "full": (4, 128, 8, 128, 4)}
    layers, seq, batch, width, heads = sizes.get(_size(size), (
        large["n_layer"], large["seq"], large["batch"], large["n_embd"], large["n_head"]))
    config = GPT2Config(vocab_size=1000, n_positions=seq, n_embd=width, n_layer=layers,
                        n_head=heads, attn_implementation="eager")
    torch.manual_seed(0)
    model = _Logits(GPT2LMHeadModel(config)).train()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (batch, seq), generator=gen)

    def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    return Workload("hf-gpt2", model, lm_loss, (ids, torch.roll(ids, -1, 1)),
                    f"transformers GPT2LMHeadModel, {layers} layers, d {width}, seq {seq}, "
                    f"batch {batch}")


WORKLOADS = {"gpt": gpt, "resnet18": resnet, "hf-gpt2": hf_gpt2}

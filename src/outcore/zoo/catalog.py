"""The zoo's table: every registered name, how to build it, and its paper-scale and small options.

An ``Entry`` holds a builder, a batch maker, a loss, the paper-scale defaults of every option a
user may pass, and the overrides that ``small=True`` applies (reduced width, resolution, and
for a few nets depth, keeping the topology). A builder is called with the options its
signature names; the batch maker reads the ones it needs (``image_size``, ``num_classes``, ...).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from outcore.zoo import (
    alexnet,
    densenet,
    fcn,
    googlenet,
    inception,
    llama,
    mlp,
    resnet,
    resnext3d,
    transformer,
    vgg,
)
from outcore.zoo.inputs import (
    Batch,
    clip_batch,
    cross_entropy,
    image_batch,
    lm_loss,
    segmentation_batch,
    token_batch,
    vector_batch,
)

BatchMaker = Callable[[Mapping[str, Any], int, torch.Generator], Batch]


@dataclass(frozen=True)
class Entry:
    """One registered network.

    Invariant: every key of ``defaults`` is read by ``build`` or ``make_batch``; ``small`` only
    overrides keys of ``defaults``.
    """

    name: str
    description: str
    build: Callable[..., nn.Module]
    make_batch: BatchMaker
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    defaults: Mapping[str, Any]
    small: Mapping[str, Any] = field(default_factory=dict)

    def build_model(self, opts: Mapping[str, Any]) -> nn.Module:
        """Call ``build`` with the options its signature names."""
        params = inspect.signature(self.build).parameters
        return self.build(**{k: v for k, v in opts.items() if k in params})


IMAGENET = {"image_size": 224, "num_classes": 1000, "width": 1.0}
SMALL = {"image_size": 32, "num_classes": 10}


def _image(name: str, description: str, build: Callable[..., nn.Module], defaults: dict[str, Any],
           small: dict[str, Any]) -> Entry:  # fmt: skip
    return Entry(name, description, build, image_batch, cross_entropy, defaults, small)


def _vgg_entries() -> list[Entry]:
    opts = {**IMAGENET, "batchnorm": False, "dropout": 0.5}
    small = {**SMALL, "width": 1 / 16}
    out = [
        _image(f"vgg{n}", f"VGG-{n} (Simonyan & Zisserman 2015), conv groups {groups}",
               partial(vgg.build_vgg, groups=groups), opts, small)
        for n, groups in vgg.CONFIGS.items()
    ]
    deep = [(101, 19, "moDNN's VGG-101, a deepened VGG-19")]
    deep += [(d, 16, f"vDNN's VGG-{d}, a deepened VGG-16") for d in (116, 216, 316, 416)]
    for depth, base, what in deep:
        groups = vgg.deep_groups(depth, base)
        build = partial(vgg.build_vgg, groups=groups)
        out.append(_image(f"vgg{depth}", f"{what}: conv groups {groups}", build, opts, small))
    out.append(_image("vgg-deep", "VGG of `depth` weight layers grown from VGG-`base` (vDNN §IV-C)",
                      vgg.build_vgg_deep, {"depth": 116, "base": 16, **opts}, small))  # fmt: skip
    return out


def _classic_entries() -> list[Entry]:
    return [
        _image("alexnet", "AlexNet (Krizhevsky et al. 2012), Caffe reference: LRN, 2-way groups",
               alexnet.build_alexnet,
               {**IMAGENET, "image_size": 227, "dropout": 0.5, "lrn": True, "grouped": True},
               {**SMALL, "image_size": 67, "width": 1 / 16}),
        _image("overfeat", "OverFeat fast (Sermanet et al. 2014, Table 1), as vDNN benchmarks it",
               partial(alexnet.build_overfeat, variant="fast"),
               {**IMAGENET, "image_size": 231, "dropout": 0.5},
               {**SMALL, "image_size": 71, "width": 1 / 16}),
        _image("overfeat-accurate", "OverFeat accurate (Sermanet et al. 2014, Table 3)",
               partial(alexnet.build_overfeat, variant="accurate"),
               {**IMAGENET, "image_size": 221, "dropout": 0.5},
               {**SMALL, "image_size": 83, "width": 1 / 16}),
        _image("googlenet", "GoogLeNet / Inception v1 (Szegedy et al. 2015), no auxiliary heads",
               googlenet.build_googlenet, {**IMAGENET, "dropout": 0.4, "lrn": True},
               {**SMALL, "width": 1 / 8}),
        Entry("fcn", "FCN-32s on VGG-16 (Long et al. 2015), per-pixel cross-entropy (moDNN)",
              fcn.build_fcn, segmentation_batch, cross_entropy,
              {"image_size": 224, "num_classes": 21, "width": 1.0, "dropout": 0.5},
              {"image_size": 32, "num_classes": 5, "width": 1 / 16}),
    ]  # fmt: skip


def _resnet_entries() -> list[Entry]:
    out = [
        _image(f"resnet{depth}", f"ResNet-{depth} (He et al. 2016), {block} blocks {stages}",
               partial(resnet.build_resnet, block=block, stages=stages), dict(IMAGENET),
               {**SMALL, "width": 1 / 8})
        for depth, (block, stages) in resnet.IMAGENET.items()
    ]
    cifar = {"image_size": 32, "num_classes": 10, "width": 1.0, "batchnorm": True}
    out.extend(_image(f"resnet{depth}-cifar",
                      f"CIFAR ResNet-{depth} (He et al. 2016 §4.2), option-A shortcuts",
                      partial(resnet.build_resnet_cifar, depth=depth), cifar,
                      {"image_size": 16, "width": 0.25})
               for depth in (20, 32, 56, 110))  # fmt: skip
    out.append(_image("resnet-units",
                      "bottleneck ResNet of `units` residual units, depth 3·units+2, stages "
                      "(6, 32, units-44, 6) (SuperNeurons Table 4); 833 units = its ResNet2500",
                      resnet.build_resnet_units, {"units": 833, **IMAGENET},
                      {**SMALL, "units": 4, "width": 1 / 8}))  # fmt: skip
    return out


def _dense_inception_entries() -> list[Entry]:
    return [
        _image("densenet121", "DenseNet-121 (Huang et al. 2017), k=32, blocks (6, 12, 24, 16)",
               partial(densenet.build_densenet, growth=32, stem="imagenet"),
               {**IMAGENET, "blocks": (6, 12, 24, 16)}, {**SMALL, "width": 1 / 8}),
        _image("densenet-bc100-cifar", "DenseNet-BC-100 for CIFAR (Huang et al. 2017), k=12",
               partial(densenet.build_densenet, growth=12, stem="cifar"),
               {"image_size": 32, "num_classes": 10, "width": 1.0, "blocks": (16, 16, 16)},
               {"image_size": 16, "width": 1 / 3}),
        _image("inception-v4", "Inception-v4 (Szegedy et al. 2017): stem, A x4, B x7, C x3",
               inception.build_inception_v4,
               {**IMAGENET, "image_size": 299, "dropout": 0.2, "blocks": (4, 7, 3)},
               {**SMALL, "image_size": 75, "width": 1 / 8}),
        _image("inception-small", "small Inception for CIFAR (Zhang et al. 2017, Fig. 3)",
               inception.build_inception_small,
               {"image_size": 28, "num_classes": 10, "width": 1.0},
               {"image_size": 16, "width": 1 / 8}),
    ]  # fmt: skip


def _other_entries() -> list[Entry]:
    return [
        Entry("mlp", "multi-layer perceptron: (Linear → ReLU) x depth → Linear",
              mlp.build_mlp, vector_batch, cross_entropy,
              {"in_features": 784, "num_classes": 10, "hidden": 1024, "depth": 3, "widths": ()},
              {"in_features": 32, "hidden": 64}),
        Entry("transformer", "GPT-style decoder (GPT-2 small by default): pre-LN causal attention",
              transformer.build_transformer, token_batch, lm_loss,
              {"vocab": 50257, "seq_len": 1024, "n_layer": 12, "n_head": 12, "d_model": 768,
               "dropout": 0.1, "tie_weights": True, "attention": "math"},
              {"vocab": 64, "seq_len": 16, "n_layer": 2, "n_head": 2, "d_model": 32}),
        Entry("llama-1b", "Llama-style decoder, Llama 3.2 1B's shape: RMSNorm, RoPE, grouped-"
              "query attention (SDPA), SwiGLU; bf16 parameters (for fine-tuning plans)",
              llama.build_llama, token_batch, lm_loss, dict(llama.LLAMA_1B), dict(llama.SMALL)),
        Entry("llama-7b", "Llama-style decoder, Llama 2 7B's shape: RMSNorm, RoPE, SDPA, "
              "SwiGLU; bf16 parameters (for fine-tuning plans)",
              llama.build_llama, token_batch, lm_loss, dict(llama.LLAMA_7B), dict(llama.SMALL)),
        Entry("resnext101-3d", "ResNeXt-101 3D (Hara et al. 2018): grouped 3x3x3 bottlenecks, "
              "cardinality 32, stages (3, 4, 23, 3), 16-frame 112x112 clips",
              resnext3d.build_resnext3d, clip_batch, cross_entropy,
              {"stages": (3, 4, 23, 3), "cardinality": 32, "num_classes": 400, "width": 1.0,
               "frames": 16, "image_size": 112},
              {"stages": (1, 1, 2, 1), "num_classes": 10, "width": 0.5, "frames": 4,
               "image_size": 16}),
    ]  # fmt: skip


ENTRIES: tuple[Entry, ...] = tuple(
    _other_entries() + _vgg_entries() + _classic_entries() + _resnet_entries()
    + _dense_inception_entries()
)  # fmt: skip

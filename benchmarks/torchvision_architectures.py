"""One small model of every torchvision family, through outcore, against eager.

torchvision's classification, semantic-segmentation and video-classification builders
(``torchvision.models.list_models``), the smallest of each family (the builder's name up to
its first digit or underscore) when it has at most ``--max-parameters`` parameters (its
pretrained weights' count) and trains one eager step at batch 2 with 10 classes: images of
64 px (the model's own size where it fixes one: ViT 224, MaxViT 224, Inception-v3 299), segmentation
maps of 64 px (the loss of ``out`` plus half that of ``aux`` where the model has an auxiliary
head), clips of 8 frames of 64 px (MViT and S3D 16 of 224). Segmentation backbones are built
without their pretrained weights too (``weights_backbone=None``). Then one step through
``outcore.compile`` on ``cpu-emulated`` under ``--policy`` (default outcore-auto), halfway
between the layer-wise lower bound and the in-core peak, compared with eager by the
real-model corpus's harness (``tests/realmodels/harness.py``: the loss, every gradient and
every buffer bit-exact, the measured peak equal to the predicted).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/torchvision_architectures.py \\
        [--only a,b] [--policy outcore-auto] [--timeout 300] [--max-parameters 40000000]

Prints one Markdown row per family and the counts; exit status 1 if any row failed.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))

import sweep_row

from corpus import Case
from tv_compat import import_torchvision

#: image or clip sizes the builders whose names start so fix (the rest take 64 px images,
#: 8 x 64 px clips)
SIZES: dict[str, tuple[int, ...]] = {
    "vit": (224, 224), "maxvit": (224, 224), "inception": (299, 299),
    "mvit": (16, 224, 224), "s3d": (16, 224, 224),
}
KINDS = ("classification", "segmentation", "video")


def family(name: str) -> str:
    """The builder's name up to its first digit or underscore (``resnet18`` -> ``resnet``,
    ``deeplabv3_resnet50`` -> ``deeplabv``, ``swin_v2_t`` -> ``swin``)."""
    return re.split(r"[\d_]", name, maxsplit=1)[0]


def _segmentation_loss(out: Any, target: torch.Tensor) -> torch.Tensor:
    loss = F.cross_entropy(out["out"], target)
    if "aux" in out:
        loss = loss + 0.5 * F.cross_entropy(out["aux"], target)
    return loss


def _classification_loss(out: Any, target: torch.Tensor) -> torch.Tensor:
    if isinstance(out, tuple):  # GoogLeNet's and Inception-v3's auxiliary logits in training
        logits, *aux = (o for o in out if isinstance(o, torch.Tensor))
        return F.cross_entropy(logits, target) + sum(
            (0.3 * F.cross_entropy(a, target) for a in aux), torch.zeros(()))
    return F.cross_entropy(out, target)


def _batch(kind: str, name: str) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    fixed = next((size for prefix, size in SIZES.items() if name.startswith(prefix)), None)
    if kind == "video":
        frames, height, width = fixed or (8, 64, 64)
        return lambda: (torch.randn(2, 3, frames, height, width), torch.randint(0, 10, (2,)))
    height, width = fixed or (64, 64)
    if kind == "segmentation":
        return lambda: (torch.randn(2, 3, height, width),
                        torch.randint(0, 10, (2, height, width)))
    return lambda: (torch.randn(2, 3, height, width), torch.randint(0, 10, (2,)))


def _case(kind: str, name: str, max_parameters: int) -> Case | None:
    """A corpus Case for ``name`` when it is small enough and trains one eager step."""
    tv = import_torchvision()

    extra = {"weights_backbone": None} if kind == "segmentation" else {}

    def build() -> nn.Module:
        return tv.models.get_model(name, weights=None, num_classes=10, **extra)

    if _parameters(name) > max_parameters:
        return None
    loss_fn = _segmentation_loss if kind == "segmentation" else _classification_loss
    case = Case(f"tv_{name}", "torchvision", build, _batch(kind, name), loss_fn)
    x, y = case.batch()
    model = case.build()
    model.train()
    loss_fn(model(x), y).backward()
    return case


def _parameters(name: str) -> int:
    """The builder's parameter count as its pretrained weights' metadata gives it (1,000
    classes; a meta build fails for RegNet, which sizes its stages with ``.tolist()``)."""
    tv = import_torchvision()
    weights = list(tv.models.get_model_weights(name))
    return int(weights[0].meta["num_params"]) if weights else 0


def models() -> list[tuple[str, str]]:
    """(kind, builder name): the smallest builder of each family, per kind."""
    tv = import_torchvision()
    modules = {"classification": tv.models, "segmentation": tv.models.segmentation,
               "video": tv.models.video}
    chosen: list[tuple[str, str]] = []
    for kind in KINDS:
        smallest: dict[str, tuple[int, str]] = {}
        for name in sorted(tv.models.list_models(module=modules[kind])):
            size = (_parameters(name), name)
            smallest[family(name)] = min(smallest.get(family(name), size), size)
        chosen += [(kind, name) for _, name in sorted(smallest.values(), key=lambda s: s[1])]
    return chosen


def main() -> None:
    args = sweep_row.arguments(__doc__, "builder names", max_parameters=40_000_000).parse_args()
    tv = import_torchvision()
    chosen = models()
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [(k, n) for k, n in chosen if n in wanted] + [
            ("classification", n) for n in sorted(wanted - {n for _, n in chosen})]
    print(f"torchvision {tv.__version__}, torch {torch.__version__}, policy {args.policy}\n")
    print("| model | kind | ops | result |\n|---|---|---|---|")
    too_big = f"over {args.max_parameters} parameters"
    sweep_row.run_all(((f"| {name} | {kind} |", sweep_row.eager_or_skip(
        functools.partial(_case, kind, name, args.max_parameters), too_big))
        for kind, name in chosen), args.policy, args.timeout)


if __name__ == "__main__":
    main()

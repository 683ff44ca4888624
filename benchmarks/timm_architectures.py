"""One small model of every timm family, through outcore, against eager.

timm's models whose names say they are small (``*atto*``, ``*femto*``, ``*pico*``, ``*nano*``,
``*tiny*``), the first of each family (the name's first word) that trains one eager step at
batch 2, 10 classes, on 64 px images (the model's own size where its patch embedding fixes
one, or where the model refuses 64 px); then one step through ``outcore.compile`` on
``cpu-emulated`` under ``--policy`` (default outcore-auto), halfway between the layer-wise
lower bound and the in-core peak, compared with eager by the real-model corpus's harness
(``tests/realmodels/harness.py``: the loss, every gradient and every buffer bit-exact, the
measured peak equal to the predicted).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/timm_architectures.py [--only a,b] \\
        [--policy outcore-auto] [--timeout 300] [--max-parameters 30000000] [--every-family]

``--every-family``: the smallest model of every family instead (``smallest_of_each_family``).

Prints one Markdown row per family and the counts; exit status 1 if any row failed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))

import sweep_row

from corpus import Case
from tv_compat import import_torchvision

PATTERNS = ("*atto*", "*femto*", "*pico*", "*nano*", "*tiny*")


def _case(name: str, max_parameters: int) -> Case | None:
    """A corpus Case for ``name`` when it is small enough and trains one eager step."""
    import timm

    with torch.device("meta"):
        meta = timm.create_model(name, num_classes=10)
    if sum(p.numel() for p in meta.parameters()) > max_parameters:
        return None
    channels, height, width = meta.pretrained_cfg.get("input_size", (3, 224, 224))
    embed = getattr(meta, "patch_embed", None)
    fixed = embed is not None and getattr(embed, "strict_img_size", False)
    # 64 px unless the patch embedding fixes the size; then the model's own size, where the
    # model asserts it otherwise (halo and bottleneck attention, MLP-Mixers, LeViT)
    sizes = [(height, width)] if fixed else [(64, 64), (height, width)]

    def build() -> nn.Module:
        return timm.create_model(name, num_classes=10)

    for size in sizes:
        def batch(size: tuple[int, int] = size) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(2, channels, *size), torch.randint(0, 10, (2,))

        case = Case(f"timm_{name}", "timm", build, batch, F.cross_entropy)
        x, y = case.batch()
        try:
            F.cross_entropy(case.build()(x), y).backward()
        except (AssertionError, RuntimeError):
            if size == sizes[-1]:
                raise
            continue
        return case
    return None


def smallest_of_each_family(names: list[str], max_parameters: int) -> list[str]:
    """The model with the fewest parameters of each family (the name's first word), at most
    ``max_parameters``; sized on the meta device (nothing allocated)."""
    import timm

    best: dict[str, tuple[int, str]] = {}
    for name in names:
        try:
            with torch.device("meta"):
                size = sum(p.numel() for p in timm.create_model(name, num_classes=10).parameters())
        except Exception:  # noqa: BLE001 - a model that cannot be built here: not swept
            continue
        family = name.split("_", maxsplit=1)[0]
        if size <= max_parameters and size < best.get(family, (size + 1, ""))[0]:
            best[family] = (size, name)
    return sorted(name for _, name in best.values())


def families(names: list[str]) -> Callable[[str], bool]:
    """A filter passing the first name of each family (the name's first word)."""
    seen: set[str] = set()

    def first(name: str) -> bool:
        family = name.split("_", maxsplit=1)[0]
        if family in seen:
            return False
        seen.add(family)
        return True
    return first


def main() -> None:
    parser = sweep_row.arguments(__doc__, "model names", max_parameters=30_000_000)
    parser.add_argument("--every-family", action="store_true",
                        help="the smallest model of every family (the name's first word), "
                             "not only the small-named ones (minutes to size them all)")
    args = parser.parse_args()
    import_torchvision()
    import timm

    if args.only:
        names = args.only.split(",")
    elif args.every_family:
        names = smallest_of_each_family(timm.list_models(), args.max_parameters)
    else:
        names = sorted({n for pattern in PATTERNS for n in timm.list_models(pattern)})
    print(f"timm {timm.__version__}, torch {torch.__version__}, policy {args.policy}\n")
    print("| model | ops | result |\n|---|---|---|")
    first = families(names)
    too_big = f"over {args.max_parameters} parameters"
    sweep_row.run_all(((f"| {name} |", sweep_row.eager_or_skip(
        functools.partial(_case, name, args.max_parameters), too_big))
        for name in names if args.only or first(name)), args.policy, args.timeout)


if __name__ == "__main__":
    main()

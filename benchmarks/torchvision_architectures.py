"""One small model of every torchvision family, through outcore, against eager.

torchvision's classification, semantic-segmentation and video-classification builders
(``torchvision.models.list_models``), the smallest of each family (the builder's name up to
its first digit or underscore) when it has at most ``--max-parameters`` parameters (its
pretrained weights' count) and trains one eager step at batch 2 with 10 classes: images of
64 px (the model's own size where it fixes one: ViT 224, MaxViT 224, Inception-v3 299), segmentation
maps of 64 px (the loss of ``out`` plus half that of ``aux`` where the model has an auxiliary
head), clips of 8 frames of 64 px (MViT 16 of 224, S3D 16 of 112). Then one step through
``outcore.compile`` on ``cpu-emulated`` under ``--policy`` (default outcore-auto), halfway
between the layer-wise lower bound and the in-core peak, compared with eager by the
real-model corpus's harness (``tests/realmodels/harness.py``: the loss, every gradient and
every buffer bit-exact, the measured peak equal to the predicted).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/torchvision_architectures.py \\
        [--only a,b] [--policy outcore-auto] [--timeout 300] [--max-parameters 30000000]

Prints one Markdown row per family and the counts; exit status 1 if any row failed.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))

from corpus import Case
from harness import check, in_core_peak
from tv_compat import import_torchvision

#: image or clip sizes a builder fixes (the rest take 64 px images, 8 x 64 px clips)
SIZES: dict[str, tuple[int, ...]] = {
    "vit": (224, 224), "maxvit": (224, 224), "inception": (299, 299),
    "mvit": (16, 224, 224), "s3d": (16, 112, 112),
}
KINDS = ("classification", "segmentation", "video")


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


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
    fixed = SIZES.get(family(name))
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

    def build() -> nn.Module:
        return tv.models.get_model(name, weights=None, num_classes=10)

    if _parameters(name) > max_parameters:
        return None
    loss_fn = _segmentation_loss if kind == "segmentation" else _classification_loss
    case = Case(f"tv_{name}", "torchvision", build, _batch(kind, name), loss_fn)
    x, y = case.batch()
    model = case.build()
    model.train()
    loss_fn(model(x), y).backward()
    return case


def run(kind: str, name: str, policy: str, timeout: int,
        max_parameters: int) -> tuple[str, str]:
    """(status, row) for one model: "ok", "fail" or "skip"."""
    start = time.perf_counter()
    signal.alarm(timeout)
    try:
        try:
            case = _case(kind, name, max_parameters)
        except _Timeout:
            return "skip", f"| {name} | {kind} | - | skip (eager over {timeout} s) |"
        except Exception as exc:  # noqa: BLE001 - eager fails: not outcore's row
            return "skip", f"| {name} | {kind} | - | skip (eager: {type(exc).__name__}) |"
        if case is None:
            return "skip", f"| {name} | {kind} | - | skip (over {max_parameters} parameters) |"
        ops, _, budget = in_core_peak(case)
        outcome = check(case, policy, budget)
    except _Timeout:
        return "fail", f"| {name} | {kind} | - | FAIL: over {timeout} s |"
    except Exception as exc:  # noqa: BLE001 - a failure of outcore is the row's result
        return "fail", f"| {name} | {kind} | - | FAIL: {type(exc).__name__}: {str(exc)[:200]} |"
    finally:
        signal.alarm(0)
    if outcome.ok:
        return "ok", f"| {name} | {kind} | {ops} | ok ({time.perf_counter() - start:.1f} s) |"
    return "fail", f"| {name} | {kind} | {ops} | FAIL: {'; '.join(outcome.problems)[:200]} |"


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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="builder names, comma-separated")
    parser.add_argument("--policy", default="outcore-auto")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per model")
    parser.add_argument("--max-parameters", type=int, default=30_000_000)
    args = parser.parse_args()
    tv = import_torchvision()
    signal.signal(signal.SIGALRM, _alarm)
    chosen = models()
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [(k, n) for k, n in chosen if n in wanted] + [
            ("classification", n) for n in sorted(wanted - {n for _, n in chosen})]
    print(f"torchvision {tv.__version__}, torch {torch.__version__}, policy {args.policy}\n")
    print("| model | kind | ops | result |\n|---|---|---|---|")
    counts = {"ok": 0, "fail": 0, "skip": 0}
    for kind, name in chosen:
        status, row = run(kind, name, args.policy, args.timeout, args.max_parameters)
        counts[status] += 1
        print(row, flush=True)
    print(f"\n{counts['ok']} ok, {counts['fail']} failed, {counts['skip']} skipped")
    sys.exit(1 if counts["fail"] else 0)


if __name__ == "__main__":
    main()

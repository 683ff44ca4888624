"""One small model of every timm family, through outcore, against eager.

timm's models whose names say they are small (``*atto*``, ``*femto*``, ``*pico*``, ``*nano*``,
``*tiny*``), the first of each family (the name's first word) that trains one eager step at
batch 2, 10 classes, on 64 px images (the model's own size where its patch embedding fixes
one); then one step through ``outcore.compile`` on ``cpu-emulated`` under ``--policy``
(default outcore-auto), halfway between the layer-wise lower bound and the in-core peak,
compared with eager by the real-model corpus's harness (``tests/realmodels/harness.py``: the
loss, every gradient and every buffer bit-exact, the measured peak equal to the predicted).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/timm_architectures.py [--only a,b] \\
        [--policy outcore-auto] [--timeout 300] [--max-parameters 30000000]

Prints one Markdown row per family and the counts; exit status 1 if any row failed.
"""

from __future__ import annotations

import argparse
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

PATTERNS = ("*atto*", "*femto*", "*pico*", "*nano*", "*tiny*")


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


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
    size = (height, width) if fixed else (64, 64)

    def build() -> nn.Module:
        return timm.create_model(name, num_classes=10)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(2, channels, *size), torch.randint(0, 10, (2,))

    case = Case(f"timm_{name}", "timm", build, batch, F.cross_entropy)
    x, y = case.batch()
    F.cross_entropy(case.build()(x), y).backward()
    return case


def run(name: str, policy: str, timeout: int, max_parameters: int) -> tuple[str, str]:
    """(status, row) for one model: "ok", "fail" or "skip"."""
    start = time.perf_counter()
    signal.alarm(timeout)
    try:
        try:
            case = _case(name, max_parameters)
        except _Timeout:
            return "skip", f"| {name} | - | skip (eager over {timeout} s) |"
        except Exception as exc:  # noqa: BLE001 - eager fails: not outcore's row
            return "skip", f"| {name} | - | skip (eager: {type(exc).__name__}) |"
        if case is None:
            return "skip", f"| {name} | - | skip (over {max_parameters} parameters) |"
        ops, _, budget = in_core_peak(case)
        outcome = check(case, policy, budget)
    except _Timeout:
        return "fail", f"| {name} | - | FAIL: over {timeout} s |"
    except Exception as exc:  # noqa: BLE001 - a failure of outcore is the row's result
        return "fail", f"| {name} | - | FAIL: {type(exc).__name__}: {str(exc)[:200]} |"
    finally:
        signal.alarm(0)
    if outcome.ok:
        return "ok", f"| {name} | {ops} | ok ({time.perf_counter() - start:.1f} s) |"
    return "fail", f"| {name} | {ops} | FAIL: {'; '.join(outcome.problems)[:200]} |"


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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="model names, comma-separated")
    parser.add_argument("--policy", default="outcore-auto")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per model")
    parser.add_argument("--max-parameters", type=int, default=30_000_000)
    args = parser.parse_args()
    import_torchvision()
    import timm

    signal.signal(signal.SIGALRM, _alarm)
    names = (args.only.split(",") if args.only else
             sorted({n for pattern in PATTERNS for n in timm.list_models(pattern)}))
    print(f"timm {timm.__version__}, torch {torch.__version__}, policy {args.policy}\n")
    print("| model | ops | result |\n|---|---|---|")
    counts = {"ok": 0, "fail": 0, "skip": 0}
    first = families(names)
    for name in names:
        if not args.only and not first(name):
            continue
        status, row = run(name, args.policy, args.timeout, args.max_parameters)
        counts[status] += 1
        print(row, flush=True)
    print(f"\n{counts['ok']} ok, {counts['fail']} failed, {counts['skip']} skipped")
    sys.exit(1 if counts["fail"] else 0)


if __name__ == "__main__":
    main()

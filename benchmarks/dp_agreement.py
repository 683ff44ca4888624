"""Data parallel: the per-step cost of the step's agreement (``RankContext.agree``).

Every training step of a ``DataParallelTrainer`` enters one all-reduce of a one-element
status flag after its checks and re-plan, so that a refusal on one rank reaches the others
at once (``tests/distributed/test_one_sided_refusals.py``). This measures what it costs on
2 CPU processes with gloo (each with one thread):

* ``agree``: the agreement alone, called back to back (median over ``--calls``), and
  ``all_reduce``: a bare ``dist.all_reduce`` of the same one-element tensor;
* ``step``: a whole training step of an MLP (share of 32 x ``--width``, ``keep-all``, the
  CPU-emulated device) with the agreement and with it replaced by a no-op on both ranks, in
  alternating blocks of ``--block`` steps (median step time of each; their difference is
  the overhead per step, within the noise of a shared machine).

Run: ``PYTHONPATH=src python benchmarks/dp_agreement.py [--calls 2000] [--blocks 10]``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "distributed"))


def rank_main(rank: int, world: int, calls: int, blocks: int, block: int,
              width: int) -> dict[str, Any]:
    """This rank's measurements (module doc)."""
    import torch.distributed as dist

    import outcore
    from outcore.distributed.trainer import STEP_CHECKS

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.ReLU(),
                                torch.nn.Linear(2 * width, width))
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, width, generator=g), torch.randn(32, width, generator=g)
    trainer = outcore.compile(model, torch.nn.functional.mse_loss, (x, y), budget=None,
                              policy="keep-all", device="cpu-emulated", distributed=True,
                              timeout=datetime.timedelta(seconds=60))
    ctx = trainer.ctx
    for _ in range(20):
        trainer.step(x, y)
    agree = []
    for _ in range(calls):
        t = time.perf_counter()
        ctx.agree(STEP_CHECKS)
        agree.append(time.perf_counter() - t)
    flag = torch.zeros(1, dtype=torch.int32)
    bare = []
    for _ in range(calls):
        t = time.perf_counter()
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.group)
        bare.append(time.perf_counter() - t)
    real = ctx.agree
    with_agree: list[float] = []
    without: list[float] = []
    first = 1  # the blocks without the agreement first (--with-first: with it first)
    inside: list[float] = []

    def timed(what: str, failure: BaseException | None = None) -> None:
        t = time.perf_counter()
        real(what, failure)
        inside.append(time.perf_counter() - t)

    for b in range(2 * blocks):
        on = b % 2 == first
        ctx.agree = timed if on else (lambda what, failure=None: None)  # type: ignore[method-assign]
        for _ in range(block):
            t = time.perf_counter()
            trainer.step(x, y)
            (with_agree if on else without).append(time.perf_counter() - t)
    ctx.agree = real  # type: ignore[method-assign]
    trainer.close()
    return {"agree": statistics.median(agree), "bare": statistics.median(bare),
            "inside": statistics.median(inside), "inside_mean": statistics.mean(inside),
            "with": statistics.median(with_agree),
            "without": statistics.median(without), "steps": len(with_agree)}


def main() -> None:
    import dp_workers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    results = dp_workers.launch(rank_main, 2, args.calls, args.blocks, args.block, args.width,
                                deadline=900.0)
    for rank, r in enumerate(results):
        if isinstance(r, tuple):
            raise SystemExit(f"rank {rank}: {r}")
        print(f"rank {rank}: agree {r['agree'] * 1e6:.0f} us, all_reduce "
              f"{r['bare'] * 1e6:.0f} us (medians of {args.calls}); "
              f"step {r['with'] * 1e3:.3f} ms with it, {r['without'] * 1e3:.3f} ms without "
              f"(medians of {r['steps']} each): {(r['with'] - r['without']) * 1e6:+.0f} us "
              f"per step ({(r['with'] / r['without'] - 1) * 100:+.1f}%); in the steps the "
              f"agreement took {r['inside'] * 1e6:.0f} us (median), "
              f"{r['inside_mean'] * 1e6:.0f} us (mean)")


if __name__ == "__main__":
    main()

"""How fast the offline planner assigns offsets (issue #5: 100,000 tensors in under 2 s).

Random training-step-like lifetimes (``outcore.pool.synthetic.random_blocks``): most blocks
short-lived, 10% long-lived, sizes log-uniform 256 B .. 64 MiB. Prints wall-clock and CPU
seconds of ``plan_offsets`` (the default ``auto`` method) per size, the method it chose and
the pool it needs over the lower bound, and the online best-fit pool for comparison.
Timings are printed, never asserted; CPU seconds are the fairer figure on a shared machine.

Run:  .venv/bin/python benchmarks/pool_speed.py [--sizes 10000 30000 100000] [--seed 0]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

from rich.console import Console
from rich.table import Table

from outcore.pool import BestFitPool, lower_bound, plan_offsets
from outcore.pool.placement import replay
from outcore.pool.synthetic import random_blocks


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 30_000, 100_000])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table = Table(title="Offline planning time (plan_offsets, method=auto)")
    for col in ("blocks", "wall s", "CPU s", "method", "planned / bound", "best-fit / bound",
                "best-fit CPU s"):
        table.add_column(col, justify="right")
    for n in args.sizes:
        blocks = random_blocks(n, seed=args.seed)
        bound = lower_bound(blocks)
        (offsets, sizes, method), wall, cpu = _timed(partial(plan_offsets, blocks))
        planned = max(offsets[i] + sizes[i] for i in offsets)
        pool = BestFitPool()
        _, _, bf_cpu = _timed(partial(replay, pool, blocks))
        table.add_row(f"{n:,}", f"{wall:.2f}", f"{cpu:.2f}", method, f"{planned / bound:.3f}",
                      f"{pool.pool_size / bound:.3f}", f"{bf_cpu:.2f}")
    console = Console()
    console.print(table)
    console.print("Re-run: .venv/bin/python benchmarks/pool_speed.py "
                  + " ".join(["--sizes", *map(str, args.sizes), "--seed", str(args.seed)]))


if __name__ == "__main__":
    main()

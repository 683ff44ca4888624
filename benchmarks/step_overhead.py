"""A Trainer's whole step against eager PyTorch on small models (``device="cpu"``, in-core).

What a practitioner's training loop pays per step beyond the kernels: ``trainer.step`` (the
step's checks, the plan cache's signature, the generated code, the gradients applied) with
every step counted by the memory tracker (``Executor.measure_every_step``, as every step
was before session 27) and with the default (the first step of each batch shape counted, the
later ones run without the tracker and report its proven peak), beside eager
``loss_fn(model(x), y).backward()``. Medians of interleaved repeats, one thread; the ratios
are against eager in the same run.

    PYTHONPATH=src python benchmarks/step_overhead.py [--repeats 30] [--rows transformer,...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import outcore
from outcore import zoo

#: (zoo name, batch, small config): the zoo's own small configurations, as in the tests
ROWS: dict[str, tuple[str, int, bool]] = {
    "transformer": ("transformer", 8, True),
    "llama": ("llama-1b", 2, True),
    "resnet18": ("resnet18", 8, True),
    "resnet32-cifar": ("resnet32-cifar", 32, False),
}


def medians(row: str, repeats: int) -> tuple[dict[str, float], int]:
    """Median seconds of each way to take the step, and the graph's op count."""
    name, batch_size, small = ROWS[row]
    torch.manual_seed(0)
    work = zoo.get(name, batch_size, small=small)
    model, loss_fn, batch = work.model, work.loss_fn, work.batch
    args: tuple[Any, ...] = batch if isinstance(batch, tuple) else (batch,)
    counted = outcore.compile(model, loss_fn, batch, budget=None, device="cpu")
    counted.executor.measure_every_step = True
    default = outcore.compile(model, loss_fn, batch, budget=None, device="cpu")

    def eager() -> None:
        loss_fn(model(args[0]), args[1]).backward()

    ways: dict[str, Callable[[], Any]] = {
        "eager": eager,
        "counted every step": lambda: counted.step(*args),
        "counted once": lambda: default.step(*args),
    }
    for fn in [*ways.values(), *ways.values()]:  # warm-up: the first step counts
        fn()
    samples: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(repeats):
        for key, fn in ways.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in samples.items()}, len(default.planned.graph.ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rows", default=",".join(ROWS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = Table(title="Trainer.step against eager (device cpu, in-core, medians)")
    for column in ("model", "ops", "eager ms", "counted every step ms", "ratio",
                   "counted once ms", "ratio"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in args.rows.split(","):
        times, ops = medians(row, args.repeats)
        base = times["eager"]
        table.add_row(row, str(ops), f"{base * 1e3:.2f}",
                      f"{times['counted every step'] * 1e3:.2f}",
                      f"{times['counted every step'] / base:.2f}",
                      f"{times['counted once'] * 1e3:.2f}", f"{times['counted once'] / base:.2f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()

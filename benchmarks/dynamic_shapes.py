"""Training on batches of changing sequence length: plans carried across shapes or searched.

Run: ``python benchmarks/dynamic_shapes.py [--steps 40] [--min-len 32] [--max-len 128]
[--width 128] [--layers 4] [--batch 8] [--share 0.6] [--device cpu-emulated] [--phases]``.

Dynamic padding gives nearly every batch another sequence length. A small pre-norm
Transformer language model (``--layers`` encoder layers of ``--width``, dropout 0.1) trains
``--steps`` SGD steps on lengths drawn uniformly from ``[--min-len, --max-len]`` (fixed
seed), compiled with the longest batch as the example, under a budget ``--share`` of the way
from the longest batch's layer-wise bound to its in-core peak. Three runs over the same
lengths, in one process, each on a fresh copy of the model:

* ``carried``: ``outcore.compile`` as shipped (``transfer_plans=True``: a new length near a
  planned one runs that plan, ``outcore.plan_transfer``);
* ``searched``: ``transfer_plans=False`` (every new length captured and searched);
* ``eager``: plain PyTorch, no budget (the reference).

``--phases``: instead of the runs, the three costs of a new length, timed apart: capturing
it, carrying the longest length's plan to it (``plan_transfer.best_carry``: replay and
simulation) and searching it (``outcore.plan`` with outcore-auto, no plan cache), with both
plans' simulated steps, for two lengths near the longest.

Printed per run: total wall seconds, the seconds of steps that met a new shape and of the
others (a planned shape reused), captures, searches (captures less carried plans), carried
plans, promotions (a carried shape planned for its own sizes after ``PROMOTE_AFTER`` steps),
and whether every measured peak stayed within the budget. Everything is ``time.perf_counter``
wall time on this machine: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.graph.bounds import reference_peaks

VOCAB = 1000


class LM(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.head = nn.Linear(width, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def batch(length: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(length)
    return (torch.randint(0, VOCAB, (size, length), generator=gen),
            torch.randint(0, VOCAB, (size, length), generator=gen))


def run(model: nn.Module, lengths: list[int], args: argparse.Namespace, budget: int,
        transfer: bool | None) -> dict[str, Any]:
    """One run over ``lengths``; ``transfer=None`` is eager PyTorch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = time.perf_counter()
    trainer = None
    if transfer is not None:
        trainer = outcore.compile(model, lm_loss, batch(max(lengths), args.batch),
                                  budget=budget, device=args.device, transfer_plans=transfer)
    new_s = reused_s = 0.0
    fits = True
    seen: set[int] = set()
    for length in lengths:
        t = time.perf_counter()
        opt.zero_grad()
        if trainer is None:
            lm_loss(model(batch(length, args.batch)[0]), batch(length, args.batch)[1]).backward()
        else:
            trainer.step(*batch(length, args.batch))
            fits = fits and trainer.stats.measured_peak <= budget
        opt.step()
        dt = time.perf_counter() - t
        if length in seen:
            reused_s += dt
        else:
            new_s += dt
        seen.add(length)
    row: dict[str, Any] = {"total s": time.perf_counter() - start, "new-shape steps s": new_s,
                           "reused-shape steps s": reused_s}
    if trainer is not None:
        s = trainer.stats
        row.update({"captures": s.captures, "searches": s.captures - s.transfers,
                    "carried": s.transfers, "promotions": s.promotions,
                    "peaks within budget": fits})
        trainer.close()
    return row


def phases(base: nn.Module, args: argparse.Namespace, budget: int) -> None:
    """``--phases`` (module doc)."""
    from outcore.plan_transfer import best_carry
    from outcore.planned import cost_model_for

    gpu = "v100-pcie"
    source = outcore.plan(outcore.capture(base, lm_loss, batch(args.max_len, args.batch)),
                          budget, simulate=False, cache=False, gpu=gpu)
    print("| length | capture s | carry s | carried sim ms | search s | searched sim ms |")
    print("|---|---|---|---|---|---|")
    for length in (args.max_len - args.max_len // 20, args.max_len - args.max_len // 10):
        t = time.perf_counter()
        graph = outcore.capture(base, lm_loss, batch(length, args.batch))
        captured = time.perf_counter() - t
        t = time.perf_counter()
        got = best_carry([(str(args.max_len), source)], graph, budget,
                         cost_model_for(gpu, graph))
        carried = time.perf_counter() - t
        t = time.perf_counter()
        own = outcore.plan(graph, budget, simulate=True, cache=False, gpu=gpu)
        searched = time.perf_counter() - t
        sim = "refused" if got is None else f"{got[0].simulation.step_time * 1e3:.1f}"
        print(f"| {length} | {captured:.2f} | {carried:.2f} | {sim} | {searched:.2f} | "
              f"{own.simulation.step_time * 1e3:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--share", type=float, default=0.6)
    parser.add_argument("--device", default="cpu-emulated")
    parser.add_argument("--phases", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    gen = torch.Generator().manual_seed(7)
    lengths = [int(v) for v in torch.randint(args.min_len, args.max_len + 1, (args.steps,),
                                             generator=gen)]
    base = LM(args.width, args.layers)
    peaks = reference_peaks(outcore.capture(base, lm_loss, batch(max(lengths), args.batch)))
    budget = int(peaks.layer_lower_bound
                 + args.share * (peaks.liveness - peaks.layer_lower_bound))
    print(f"{args.steps} steps, {len(set(lengths))} distinct lengths in "
          f"[{min(lengths)}, {max(lengths)}], batch {args.batch}, width {args.width}, "
          f"{args.layers} layers, budget {budget / 2**20:.2f} MiB (in-core peak of the "
          f"longest {peaks.liveness / 2**20:.2f} MiB), device {args.device}")
    if args.phases:
        graph = outcore.capture(base, lm_loss, batch(args.max_len, args.batch))
        print(f"{len(graph.ops)} ops, {len(graph.activations())} activations")
        phases(base, args, budget)
        return
    rows = {name: run(copy.deepcopy(base), lengths, args, budget, transfer)
            for name, transfer in (("carried", True), ("searched", False), ("eager", None))}
    keys = list(rows["carried"])
    print("| run | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, row in rows.items():
        cells = [f"{row[k]:.2f}" if isinstance(row.get(k), float) else str(row.get(k, "-"))
                 for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

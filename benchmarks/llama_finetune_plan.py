"""Can I fine-tune this model on this GPU, and how fast? Llama-style 1B and 7B, planned.

For each model (the zoo's ``llama-1b``, Llama 3.2 1B's shape with its tied embedding, and
``llama-7b``, Llama 2 7B's), sequence 2048, batch 1-8, captured with fake tensors (nothing
is allocated), ``outcore.plan(graph, budget, optimizer="adamw", gpu=...)`` plans the
parameters, gradients and AdamW state (bf16 weights, fp32 moments and masters: 16 bytes per
parameter) with the activations against one device budget, on 24 GB, 40 GB and 80 GB. The
24 GiB row is the a100-40gb profile given a 24 GiB budget (outcore has no 24 GB profile; the
compute and link rates are an A100's). Printed per row: whether it fits, how many
parameters are held in host memory, the simulated forward+backward, what the optimizer step
adds after it (host AdamW at ``--host-adam-rate``, each parameter's host step overlapped
with backward as soon as its gradient has landed: ``outcore.sim.host_steps``; the chooser
decides by this overlapped step), tokens per second, the host memory the step needs, the pinned
bytes and their ratio to the host copies (checked <= 1.05), and the joint lower bound's gap.

    PYTHONPATH=src python benchmarks/llama_finetune_plan.py            # the whole table
    PYTHONPATH=src python benchmarks/llama_finetune_plan.py --models llama-1b --batches 1
    PYTHONPATH=src python benchmarks/llama_finetune_plan.py --models llama-7b \
        --policy outcore-checkpoint      # each placement's activations by checkpointing alone

``--policy outcore-checkpoint`` plans each candidate placement with outcore-checkpoint
alone instead of outcore-auto's two planners: much faster on the 6447-op 7B graph, never a
faster plan.
"""

from __future__ import annotations

import argparse
import time

import outcore
from outcore import zoo
from outcore.errors import InfeasibleBudgetError
from outcore.units import format_bytes, parse_bytes
from outcore.weights.spec import HOST_ADAM_RATE

TARGETS = ("24GiB:a100-40gb", "40GiB:a100-40gb", "80GiB:a100-80gb")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["llama-1b", "llama-7b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), metavar="BUDGET:GPU")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--host-adam-rate", type=float, default=HOST_ADAM_RATE)
    ap.add_argument("--policy", default="auto", choices=("auto", "outcore-checkpoint"),
                    help="activation planner(s) per placement: outcore-auto's two (default) "
                         "or outcore-checkpoint alone (faster to plan)")
    args = ap.parse_args()
    print(f"host AdamW {args.host_adam_rate / 1e9:.2f} G parameters/s; sequence {args.seq}; "
          f"policy {args.policy}\n")
    print("| model | batch | budget (profile) | fits | held on host | step (sim) s | "
          "optimizer s | total s | tokens/s | host memory | pinned (ratio) | gap to bound "
          "| planned in |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for name in args.models:
        for batch in args.batches:
            w = zoo.get(name, batch, fake=True, seq_len=args.seq)
            graph = outcore.capture(w.model, w.loss_fn, w.batch, fake=True, name=name)
            for target in args.targets:
                budget, _, gpu = target.partition(":")
                ratio = _row(graph, name, batch, parse_bytes(budget), gpu, args)
                worst = max(worst, ratio)
    print(f"\nlargest pinned / host-copy ratio: {worst:.4f} (must be <= 1.05)")
    if worst > 1.05:
        raise SystemExit("pinned bytes exceed 1.05x the host copies")


def _row(graph, name, batch, budget, gpu, args) -> float:
    start = time.perf_counter()
    label = f"| {name} | {batch} | {format_bytes(budget)} ({gpu}) "
    try:
        planned = outcore.plan(graph, budget, optimizer="adamw", gpu=gpu, cache=False,
                               policy=args.policy, host_adam_rate=args.host_adam_rate)
    except InfeasibleBudgetError as exc:
        print(f"{label}| no: needs {format_bytes(exc.required)} | - | - | - | - | - | - | - "
              f"| - | {time.perf_counter() - start:.0f} s |", flush=True)
        return 0.0
    w = planned.weights
    tokens = batch * args.seq
    gap = "-" if planned.gap is None else f"{planned.gap * 100:.0f}%"
    print(f"{label}| yes | {len(w.held)}/{w.parameters} ({format_bytes(w.held_weights)}) "
          f"| {w.step_seconds:.3f} | {w.optimizer_seconds:.2f} | {w.total_seconds:.2f} "
          f"| {tokens / w.total_seconds:.0f} | {format_bytes(w.host_bytes)} "
          f"| {format_bytes(w.pinned)} ({w.pinned_ratio:.4f}) | {gap} "
          f"| {time.perf_counter() - start:.0f} s |", flush=True)
    return w.pinned_ratio


if __name__ == "__main__":
    main()

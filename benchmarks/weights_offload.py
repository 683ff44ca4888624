"""Fine-tuning a model larger than the GPU: three schedules side by side, one simulator run.

Run: ``python benchmarks/weights_offload.py [--layers 8 --d-model 1024 --seq 1024 --batch 2
--gpu a100-40gb --budget-fraction 0.25]``. A GPT-style model (outcore.zoo's transformer) is
captured with fake tensors; its weights + gradients + AdamW state (16 bytes per fp32
parameter) are ``1 / budget-fraction`` times the device budget. Every schedule is simulated
on the same analytic cost model; the optimizer step is added at ``--host-adam`` parameters
per second on the host (measured on this CPU with ``--measure``) and
``outcore.weights.choose.DEVICE_ADAM_RATE`` on the device.

* ZeRO-Offload style: fp32 master weights and AdamW state in host memory, step on the CPU;
  the weights stay on the device, every gradient is sent to host as backward makes it,
  full activation checkpointing (every block boundary kept, the rest recomputed); after the
  step the updated weights are copied back (H2D of the weights' bytes, not overlapped).
* FSDP2 ``CPUOffloadPolicy`` style: weights, gradients and AdamW state in host memory;
  every weight brought in before its forward and backward use, every gradient sent out;
  the step on the CPU; activations kept (no checkpointing).
* outcore-auto: ``outcore.weights.choose.choose_weights``, which weights go to host,
  planned with outcore-auto / outcore-checkpoint for the activations against one budget.

A "-" is a schedule that does not fit the budget.
"""

from __future__ import annotations

import argparse
import time

from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.plan.lower import lower
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Plan
from outcore.plan.weights import WeightPlacement, gradients, parameters
from outcore.policies.auto import find_cuts, segment_plan
from outcore.sim import simulate
from outcore.weights.choose import (
    HOST_ADAM_RATE,
    adam_state_bytes,
    choose_weights,
)

GiB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--gpu", default="a100-40gb")
    ap.add_argument("--budget-fraction", type=float, default=0.25)
    ap.add_argument("--host-adam", type=float, default=HOST_ADAM_RATE)
    ap.add_argument("--measure", action="store_true", help="measure this CPU's AdamW rate")
    args = ap.parse_args()
    host_rate = args.host_adam
    if args.measure:
        from outcore.weights.optimizer import measure_host_adam

        host_rate = measure_host_adam()
    w = zoo.get("transformer", args.batch, fake=True, n_layer=args.layers,
                d_model=args.d_model, n_head=max(1, args.d_model // 64), seq_len=args.seq,
                vocab=args.vocab, dropout=0.0, tie_weights=False)
    start = time.perf_counter()
    graph = capture(w.model, w.loss_fn, w.batch, fake=True)
    cost = cost_model_for(args.gpu, graph)
    state = adam_state_bytes(graph)
    params, grads = parameters(graph), gradients(graph)
    weights = sum(graph.tensors[t].nbytes for t in params.values())
    numel = weights // 4
    budget = int((2 * weights + sum(state.values())) * args.budget_fraction)
    print(f"GPT {args.layers}x{args.d_model}, seq {args.seq}, batch {args.batch}: "
          f"{numel / 1e6:.0f}M parameters, weights+grads+AdamW "
          f"{(2 * weights + sum(state.values())) / GiB:.2f} GiB, budget {budget / GiB:.2f} GiB "
          f"on {args.gpu}; host AdamW {host_rate / 1e6:.0f} Mparam/s "
          f"(captured in {time.perf_counter() - start:.1f} s)")
    h2d = cost.transfer_time(weights, "h2d")
    rows = []
    every = WeightPlacement(frozenset(), frozenset(grads.values()))
    ckpt = segment_plan(graph, [c.storage for c in find_cuts(graph)])
    rows.append(("ZeRO-Offload style", _run(graph, cost, ckpt, every, 0, budget),
                 numel / host_rate + h2d, weights + sum(state.values())))
    held = WeightPlacement(frozenset(params.values()), frozenset(grads.values()))
    rows.append(("FSDP2 CPUOffloadPolicy style", _run(graph, cost, Plan("keep"), held, 0,
                                                      budget),
                 numel / host_rate, weights + sum(state.values())))
    t0 = time.perf_counter()
    try:
        choice = choose_weights(graph, budget, cost, state, host_adam_rate=host_rate,
                                simulate=lambda g, s: simulate(g, s, cost).step_time)
        auto = (choice.step_seconds, choice.peak + choice.device_state)
        rows.append((f"outcore-auto ({len(choice.placement.params)}/{len(params)} held)",
                     auto, choice.optimizer_seconds, choice.host_bytes))
    except InfeasibleBudgetError as exc:
        rows.append(("outcore-auto", None, 0.0, 0))
        print(f"outcore-auto: {exc}")
    print(f"(outcore-auto planned in {time.perf_counter() - t0:.1f} s)\n")
    tokens = args.batch * args.seq
    print("| schedule | device peak GiB | step s (sim) | optimizer s | total s | tokens/s "
          "| host GiB |")
    print("|---|---|---|---|---|---|---|")
    for name, result, opt_s, host in rows:
        if result is None:
            print(f"| {name} | - | - | - | - | - | - |")
            continue
        step, peak = result
        total = step + opt_s
        print(f"| {name} | {peak / GiB:.2f} | {step:.3f} | {opt_s:.3f} | {total:.3f} "
              f"| {tokens / total:.0f} | {host / GiB:.2f} |")


def _run(graph, cost, plan, placement, device_state, budget):
    """(simulated step seconds, device peak) of ``plan`` lowered with ``placement``, or None
    when it does not fit ``budget``."""
    schedule = lower(graph, plan, weights=placement)
    peak = predicted_peak(graph, schedule) + device_state
    if peak > budget:
        return None
    return simulate(graph, schedule, cost).step_time, peak


if __name__ == "__main__":
    main()

"""Fine-tuning a model larger than the GPU: three schedules side by side, one simulator run.

Run: ``python benchmarks/weights_offload.py [--layers 8 --d-model 1024 --seq 1024 --batch 2
--gpu a100-40gb --budget-fraction 0.25]``. A GPT-style model (outcore.zoo's transformer) is
captured with fake tensors; its weights + gradients + AdamW state (16 bytes per fp32
parameter) are ``1 / budget-fraction`` times the device budget. Every schedule is simulated
on the same analytic cost model, with the same optimizer-step model
(``outcore.weights.step_cost.host_steps`` -> ``simulate(..., optimizer=)``): a parameter
whose gradient is sent to host memory is stepped on the CPU as soon as that gradient has
landed, overlapped with the rest of backward, one CPU step at a time; a held parameter's
step also waits for its last prefetch; a weight the device keeps is copied back h2d after
its host step; device-held parameters step on the device after backward. The CPU's AdamW
rate is measured on this machine (``outcore.cost.measure_host.measure_adam_rate``: the
faster of torch's fused and foreach CPU AdamW) unless ``--catalogue`` takes the GPU
profile's host figure (gpus.json) or ``--host-adam`` gives one. ``--clip`` makes every
schedule clip gradients (a barrier: no step before the last gradient has landed).

* ZeRO-Offload style: fp32 master weights and AdamW state in host memory, step on the CPU;
  the weights stay on the device, every gradient is sent to host as backward makes it,
  full activation checkpointing (every block boundary kept, the rest recomputed); the
  updated weights are copied back to the device after their host step.
* FSDP2 ``CPUOffloadPolicy`` style: weights, gradients and AdamW state in host memory;
  every weight brought in before its forward and backward use, every gradient sent out;
  the step on the CPU; activations kept (no checkpointing).
* outcore-auto: ``outcore.weights.choose.choose_weights``, which weights go to host,
  planned with outcore-auto / outcore-checkpoint for the activations against one budget,
  then simulated with the same optimizer-step model.

A "-" is a schedule that does not fit the budget.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from outcore.weights.choose import adam_state_bytes, choose_weights
from outcore.weights.step_cost import host_steps

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
    ap.add_argument("--host-adam", type=float, default=None,
                    help="host AdamW parameters/s (default: measured on this CPU)")
    ap.add_argument("--catalogue", action="store_true",
                    help="use the GPU profile's catalogued host AdamW rate")
    ap.add_argument("--clip", action="store_true", help="gradient clipping (a barrier)")
    args = ap.parse_args()
    w = zoo.get("transformer", args.batch, fake=True, n_layer=args.layers,
                d_model=args.d_model, n_head=max(1, args.d_model // 64), seq_len=args.seq,
                vocab=args.vocab, dropout=0.0, tie_weights=False)
    start = time.perf_counter()
    graph = capture(w.model, w.loss_fn, w.batch, fake=True)
    cost = cost_model_for(args.gpu, graph)
    profile, source = _host_profile(cost.profile, args)
    state = adam_state_bytes(graph)
    params, grads = parameters(graph), gradients(graph)
    weights = sum(graph.tensors[t].nbytes for t in params.values())
    numel = weights // 4
    budget = int((2 * weights + sum(state.values())) * args.budget_fraction)
    print(f"GPT {args.layers}x{args.d_model}, seq {args.seq}, batch {args.batch}: "
          f"{numel / 1e6:.0f}M parameters, weights+grads+AdamW "
          f"{(2 * weights + sum(state.values())) / GiB:.2f} GiB, budget {budget / GiB:.2f} GiB "
          f"on {args.gpu}; host AdamW {profile.host_adam_rate / 1e6:.0f} Mparam/s ({source})"
          f"{', clipping' if args.clip else ''} (captured in {time.perf_counter() - start:.1f} s)")

    def run(plan_or_schedule, placement=None):
        schedule = (plan_or_schedule if placement is None
                    else lower(graph, plan_or_schedule, weights=placement))
        peak = predicted_peak(graph, schedule)
        if peak > budget:
            return None
        work = host_steps(graph, schedule, profile, barrier=args.clip)
        return simulate(graph, schedule, cost, optimizer=work), peak

    rows = []
    every = WeightPlacement(frozenset(), frozenset(grads.values()))
    ckpt = segment_plan(graph, [c.storage for c in find_cuts(graph)])
    rows.append(("ZeRO-Offload style", run(ckpt, every), weights + sum(state.values())))
    held = WeightPlacement(frozenset(params.values()), frozenset(grads.values()))
    rows.append(("FSDP2 CPUOffloadPolicy style", run(Plan("keep"), held),
                 weights + sum(state.values())))
    t0 = time.perf_counter()
    try:
        choice = choose_weights(graph, budget, cost, state, profile=profile,
                                simulate=lambda g, s: simulate(g, s, cost).step_time)
        result = run(choice.schedule)
        if result is not None:
            result = (result[0], result[1] + choice.device_state)
        rows.append((f"outcore-auto ({len(choice.placement.params)}/{len(params)} held)",
                     result, choice.host_resident))
    except InfeasibleBudgetError as exc:
        rows.append(("outcore-auto", None, 0))
        print(f"outcore-auto: {exc}")
    print(f"(outcore-auto planned in {time.perf_counter() - t0:.1f} s)\n")
    tokens = args.batch * args.seq
    print("| schedule | device peak GiB | fwd+bwd s | CPU step s | exposed optimizer s "
          "| step s | tokens/s | host GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, result, host in rows:
        if result is None:
            print(f"| {name} | - | - | - | - | - | - | - |")
            continue
        sim, peak = result
        print(f"| {name} | {peak / GiB:.2f} | {sim.pass_time:.3f} | {sim.host_step_time:.3f} "
              f"| {sim.optimizer_time:.3f} | {sim.step_time:.3f} "
              f"| {tokens / sim.step_time:.0f} | {host / GiB:.2f} |")


def _host_profile(profile, args):
    """The GPU profile with the host AdamW rate this run uses, and where it came from."""
    if args.host_adam is not None:
        return dataclasses.replace(profile, host_adam_rate=args.host_adam), "given"
    if args.catalogue:
        return profile, f"{profile.name}'s catalogued host"
    from outcore.cost.measure_host import measure_adam_rate

    rate, impl = measure_adam_rate()
    return (dataclasses.replace(profile, host_adam_rate=rate),
            f"measured on this CPU, torch AdamW {impl}=True")


if __name__ == "__main__":
    main()

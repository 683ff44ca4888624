"""``outcore.inductor_backend`` on a GPU: what it computes, its peak against the plan's, its
speed beside ``torch.compile``'s own ``activation_memory_budget``.

One compile per row (a fresh deep copy of the model each), the vs_pytorch GPT (``--size``):

* ``eager``: the reference (``loss.backward()``);
* ``compile``: Inductor (``compile_fx``) with ``activation_memory_budget`` 1.0, PyTorch's
  default;
* ``compile@B``: the same with ``activation_memory_budget`` = B, for each B of
  ``--compile-budgets``. Each peer is compiled with a backend of its own, a function that
  sets the budget around ``compile_fx``, where ``torch.compile``'s own
  ``backend="inductor"`` would let dynamo hand the second model the first one's compiled
  code (the same code object, an equal backend: the first GPU run's ``compile@0.5`` was
  ``compile``'s, compiled in 0 s); AOTAutograd's cache is off, as the budget may not be in
  its key;
* ``outcore+inductor``: ``outcore.inductor_backend(None)`` (unbounded: the fastest plan);
* ``outcore+inductor@compile@B``: ``outcore.inductor_backend(A, scope="activations")`` with A
  the activation peak ``compile@B`` measured: one compile, no budget search (vs_pytorch's
  ``InductorMatcher`` searches; each try is a compile, too dear for a device lease).

Every row draws dropout from eager's generator (Inductor's ``fallback_random``), so at one seed
every row draws eager's masks and computes eager's step up to rounding. Matmuls run in full
float32 (TF32 off) so that the error printed is the kernels' rounding, not TF32's.

Per row: the loss's and gradients' relative error against eager (the largest
``||g - g_eager|| / ||g_eager||`` over the parameters), the step peak and activation peak
(``bench_device.Target.step_peaks``: CUDA's caching allocator over the step), for outcore's
rows the plan's prediction of the step peak (``caching_allocator_bound`` of the partition's
plan less what the step finds allocated: the bound the CUDA suite checks for the executor)
and whether the measured peak is within it; the median step time over ``--rounds``
interleaved rounds and the paired ratio of each outcore row to ``compile@B``.

    PYTHONPATH=src python3 benchmarks/cuda_inductor_check.py --device cuda --size large
    PYTHONPATH=src python benchmarks/cuda_inductor_check.py --device cpu --size quick --rounds 3

``--device cpu`` runs the same rows on this CPU (the check of the script itself; peaks from
the CPU allocator's events, predictions without the caching allocator's blocks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import outcore
from outcore.compiled import InductorRoundingWarning

sys.path.insert(0, str(Path(__file__).parent))
import vs_pytorch as vs  # sibling modules of this script
from bench_device import Target
from paired import paired_ratio, round_order
from peer_gradients import budget_compile, relative_error, seeded_run
from vs_workloads import WORKLOADS, Workload


def gpt(size: str, dropout: float) -> Workload:
    """vs_pytorch's GPT (``vs_workloads.gpt``) with ``dropout``."""
    w = WORKLOADS["gpt"](size)
    if dropout != 0.1:
        for mod in w.model.modules():
            if isinstance(mod, nn.Dropout):
                mod.p = dropout
        w.about = w.about.replace("dropout 0.1", f"dropout {dropout}")
    return w


#: the peers' Inductor ``fallback_random`` (``--peer-random``): True = eager's generator
PEER_FALLBACK = [True]


def compiled_peer(w: Workload, budget: float) -> tuple[Callable[[], Any], nn.Module]:
    """Inductor on a fresh copy at ``activation_memory_budget`` = ``budget``, a backend of its
    own (``peer_gradients.budget_compile``); the compile runs here (first step)."""
    cm = budget_compile(w.model, budget, PEER_FALLBACK[0])
    step = vs.eager_step(cm, w)
    step()
    return step, cm


def outcore_row(w: Workload, budget: int | None,
                scope: str) -> tuple[Callable[[], Any], nn.Module, int, str]:
    """A fresh copy under ``outcore.inductor_backend(budget, scope=scope)``, compiled; returns
    the step, the copy, the plan's predicted step peak over the step (what the step finds
    allocated left out) and a note."""
    from outcore.plan.allocator_rounding import caching_allocator_bound
    from outcore.runtime.devices.allocator_peak import held_before

    vs.SCOPE[0] = scope
    step, m, part = vs.inductor_step(w, budget)
    parts = getattr(part, "parts", [part])
    predicted = 0
    for p in parts:
        g, s = p.planned.graph, p.planned.schedule
        rule = caching_allocator_bound(g, s) if vs.TARGET[0].cuda else p.predicted_peak
        predicted = max(predicted, rule - held_before(g))
    note = vs._inductor_note(budget, part)
    return step, m, predicted, note


def run(w: Workload, compile_budgets: list[float], rounds: int,
        log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    steps: dict[str, tuple[Callable[[], Any], nn.Module]] = {}
    eager = vs.eager_step(w.model, w)
    refs = {"eager": seeded_run(eager, w.model, 0)}
    steps["eager"] = (eager, w.model)
    rows["eager"] = {"note": ""}

    def add(name: str, make: Callable[[], tuple[Callable[[], Any], nn.Module, int | None, str]]
            ) -> None:
        t0 = time.perf_counter()
        try:
            step, model, predicted, note = make()
        except Exception as exc:  # noqa: BLE001 (a failed row is reported, the rest still run)
            log(f"  {name}: FAILED {type(exc).__name__}: {exc}")
            rows[name] = {"note": f"FAILED {type(exc).__name__}: {str(exc)[:200]}"}
            return
        took = time.perf_counter() - t0
        loss, grads = seeded_run(step, model, 0)
        # a peer on Inductor's own generator draws other masks than eager: its reference is
        # the budget-1.0 peer on the same generator at the same seed (same draws)
        # the reference on the row's own generator: eager's, or the 1.0 peer on Inductor's
        on_eager = PEER_FALLBACK[0] if name.startswith("compile") else vs.FALLBACK_RANDOM[0]
        own = not on_eager
        ref = "compile" if own else "eager"
        if own and "compile" not in refs and name != "compile":
            log(f"  {name}: no reference on Inductor's generator (run --peer-random inductor)")
            ref = "eager"
        if own and name == "compile" and "compile" not in refs:
            refs["compile"] = (loss, grads)
        r_loss, r_grads = refs[ref]
        rows[name] = {"note": note, "compile_s": took, "predicted": predicted, "vs": ref,
                      "loss_err": abs(loss - r_loss) / max(abs(r_loss), 1e-30),
                      "grad_err": relative_error(grads, r_grads)}
        steps[name] = (step, model)
        log(f"  {name}: compiled in {took:.0f} s, against {ref}: loss error "
            f"{rows[name]['loss_err']:.2e}, gradient error {rows[name]['grad_err']:.2e}")

    def peer(b: float) -> tuple[Callable[[], Any], nn.Module, None, str]:
        s, m = compiled_peer(w, b)
        return s, m, None, f"activation_memory_budget {b}"

    add("compile", lambda: peer(1.0))
    for b in compile_budgets:
        add(f"compile@{b}", lambda b=b: peer(b))  # type: ignore[misc]
    add("outcore+inductor", lambda: outcore_row(w, None, "step"))
    for name, (step, model) in steps.items():
        rows[name]["activation"], rows[name]["step_peak"] = vs.peaks(step, model)
    for b in compile_budgets:
        target = rows.get(f"compile@{b}", {}).get("activation")
        if not target:
            continue
        name = f"outcore+inductor@compile@{b}"
        add(name, lambda t=target: outcore_row(w, int(t), "activations"))  # type: ignore[misc]
        if name in steps:
            rows[name]["activation"], rows[name]["step_peak"] = vs.peaks(*steps[name])
    for name in steps:
        rows[name]["seconds"] = []
    for _ in range(rounds):
        for name in round_order(list(steps)):
            step, model = steps[name]
            vs.zero_grad(model)
            rows[name]["seconds"].append(vs.TARGET[0].timed(step))
    return [{"tool": k, **v} for k, v in rows.items()]


def report(rows: list[dict[str, Any]]) -> str:
    by = {r["tool"]: r for r in rows}
    e = by["eager"]
    out = [("| tool | against | loss err | grad err | step peak MiB | activation MiB | "
            "predicted step peak MiB | within | step ms (median) | / eager | note |"),
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "seconds" not in r:
            out.append(f"| {r['tool']} | | | | | | | | | | {r['note']} |")
            continue
        ms = statistics.median(r["seconds"]) * 1e3
        pred = r.get("predicted")
        within = "" if pred is None else ("yes" if r["step_peak"] <= pred else
                                          f"NO (+{r['step_peak'] - pred:,} B)")
        out.append(
            f"| {r['tool']} | {r.get('vs', '')} | {r.get('loss_err', 0):.1e} | "
            f"{r.get('grad_err', 0):.1e} | "
            f"{r['step_peak'] / 2**20:.1f} | {r['activation'] / 2**20:.1f} | "
            f"{'' if pred is None else f'{pred / 2**20:.1f}'} | {within} | {ms:.2f} | "
            f"{ms / (statistics.median(e['seconds']) * 1e3):.2f} | {r['note']} |")
    for r in rows:  # each outcore row against its peer (the unbounded one: compile's default)
        if not r["tool"].startswith("outcore") or "seconds" not in r:
            continue
        peer = by.get(r["tool"].partition("@")[2] or "compile", {})
        if "seconds" in peer:
            p = paired_ratio(r["seconds"], peer["seconds"])
            out.append(f"* {r['tool']} / {peer['tool']}: paired {p.verdict}: {p.text()}; "
                       f"activation {r['activation'] / 2**20:.1f} vs "
                       f"{peer['activation'] / 2**20:.1f} MiB")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--size", choices=["quick", "full", "large"], default="large")
    parser.add_argument("--compile-budgets", type=float, nargs="+", default=[0.5, 0.2])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--outcore-random", choices=["eager", "inductor"], default="eager",
                        help="outcore's rows' dropout: eager's generator (the backend's "
                             "default, masks kept) or Inductor's (fallback_random=False; "
                             "compared with the budget-1.0 peer: pass --peer-random inductor)")
    parser.add_argument("--peer-random", choices=["eager", "inductor"], default="eager",
                        help="the compile peers' dropout: eager's generator (fallback_random, "
                             "as outcore's rows) or Inductor's own (PyTorch's default; its "
                             "masks are not eager's, so its gradient error is not rounding)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    vs.TARGET[0] = Target.of(args.device)
    warnings.simplefilter("ignore", InductorRoundingWarning)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    PEER_FALLBACK[0] = args.peer_random == "eager"
    vs.FALLBACK_RANDOM[0] = args.outcore_random == "eager"
    w = gpt(args.size, args.dropout)
    w.model, w.batch = vs.TARGET[0].move(w.model, w.batch)
    where = (f"{torch.cuda.get_device_name()} (profile {vs.TARGET[0].gpu})"
             if vs.TARGET[0].cuda else "this CPU")
    log(f"{w.about}; torch {torch.__version__}, {where}; outcore {outcore.__version__}")
    rows = run(w, args.compile_budgets, args.rounds, log)
    print(f"torch {torch.__version__}, {where}, {args.rounds} rounds, {w.about}; compile "
          f"peers' dropout on {args.peer_random}'s generator, outcore's on "
          f"{args.outcore_random}'s\n")
    print(report(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

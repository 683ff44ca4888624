"""Re-simulate a GPU speed run on this CPU, under other links (issue 17, point 4).

``cuda_speed.py --measured-ops --save-ops DIR --json SPEED`` on a GPU keeps every measured
row and each workload's per-op seconds measured in a step there. This script, with no GPU:

1. captures each workload here (the CPU capture has the CUDA one's op count; the per-op
   seconds are taken by position, so the graph digest is re-keyed), and checks the proxy:
   planned and simulated with the GPU run's link it must give the GPU run's simulated step
   (``--check-tolerance``, default 1%) on every row, or the script stops;
2. measures the copy engines' rate inside the steps: for the rows whose plan offloads and
   prefetches every activation (``offload-all``, ``vdnn-all``), the bytes each way over the
   copy-busy seconds the GPU measured with CUDA events;
3. plans and simulates every measured outcore row again under each ``--link H2D/D2H``
   (GB/s; ``in-step``: the rate of step 2) and prints the simulator's error against the
   measured step, with how many rows are within 10%;
4. with ``--fit``: fits the analytic model (``cuda_calibrate.fit_efficiency`` on
   ``--base``: efficiencies, launch overhead, fill time) to the per-op seconds, writes it as
   a profile file (``--fit`` names it) with the in-step link, and simulates each row's
   schedule (planned on the measured per-op profile, in-step link) on the analytic
   ``--base`` profile and on the fitted one.

    PYTHONPATH=src python benchmarks/cuda_resimulate.py                 # session 32's run
    PYTHONPATH=src python benchmarks/cuda_resimulate.py --links 44.7/50.7 in-step
    PYTHONPATH=src python benchmarks/cuda_resimulate.py --fit \
        benchmarks/profiles/h200-s32.fitted.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import outcore
import outcore.api
from outcore import zoo
from outcore.cost.measured import MeasuredProfile, graph_digest
from outcore.graph.bounds import reference_peaks
from outcore.plan.schedule import Offload, Prefetch
from outcore.sim import simulate

HERE = Path(__file__).parent / "profiles"
#: cuda_speed.py's workloads: name -> (zoo entry, batch)
WORKLOADS = {"resnet50": ("resnet50", 64), "gpt2": ("transformer", 4)}
WHOLE = ("offload-all", "vdnn-all")  # plans that move every activation both ways
TARGET = 0.10


def _policy(method: str) -> str:
    """``outcore outcore-auto (outcore-optimal)`` -> ``outcore-auto``."""
    return method.removeprefix("outcore ").split(" (")[0]


def _copied(planned: Any) -> tuple[int, int]:
    ins = planned.schedule.instructions
    return (sum(planned.graph.storage_bytes(i.tensor) for i in ins if isinstance(i, Prefetch)),
            sum(planned.graph.storage_bytes(i.tensor) for i in ins if isinstance(i, Offload)))


class Plans:
    """Each measured row planned and simulated once per link, on the per-op profile of its
    workload (``loaded``: workload -> (graph, profile, in-core peak)); asked again, the same
    plan (outcore-auto's take minutes, and --fit reuses the in-step ones)."""

    def __init__(self, loaded: dict[str, tuple[Any, MeasuredProfile, int]]) -> None:
        self.loaded = loaded
        self._done: dict[tuple[Any, ...], tuple[Any, float]] = {}

    def of(self, row: dict[str, Any], link: tuple[float, float] | None = None
           ) -> tuple[Any, float]:
        """(planned step, simulated seconds) of ``row`` with copies priced at ``link`` (h2d,
        d2h bytes/s; None: the link the GPU run priced)."""
        graph, measured, in_core = self.loaded[row["workload"]]
        cost = measured if link is None else measured.with_link(
            *link, copy_engines=measured.copy_engines)
        key = (row["workload"], row["fraction"], row["method"], cost.h2d_bandwidth,
               cost.d2h_bandwidth)
        if key not in self._done:
            planned = outcore.api.plan(graph, int(in_core * row["fraction"]),
                                       policy=_policy(row["method"]), cost=cost,
                                       simulate=False)
            self._done[key] = (planned,
                               simulate(planned.graph, planned.schedule, cost).step_time)
        return self._done[key]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speed", default=str(HERE / "h200-s32.speed.json"))
    parser.add_argument("--ops", default=str(HERE / "h200-s32.{workload}.ops.json"),
                        help="per-op profile of each workload ({workload} is replaced)")
    parser.add_argument("--links", nargs="+", default=["in-step"],
                        help="H2D/D2H in GB/s, or in-step (the rate measured in the steps)")
    parser.add_argument("--check-tolerance", type=float, default=0.01)
    parser.add_argument("--fit", help="fit the analytic model and write the profile here")
    parser.add_argument("--base", default=str(HERE / "h200-datasheet.json"),
                        help="the analytic profile --fit starts from: a name, or a profile "
                             "file (default: the h200 profile before session 32's fit)")
    args = parser.parse_args(argv)
    doc = json.loads(Path(args.speed).read_text())
    rows = [r for r in doc["rows"] if r["method"].startswith("outcore ") and r["step_s"]]
    rates: list[tuple[float, float]] = []
    loaded = {}
    for key in dict.fromkeys(r["workload"] for r in rows):
        name, batch = WORKLOADS[key]
        work = zoo.get(name, batch)
        graph = outcore.capture(work.model, work.loss_fn, work.batch)
        measured = MeasuredProfile.load(args.ops.format(workload=key))
        if measured.op_count != len(graph.ops):
            raise SystemExit(f"{key}: the GPU graph had {measured.op_count} ops, this capture "
                             f"{len(graph.ops)}: the per-op seconds cannot be placed")
        measured = dataclasses.replace(measured, graph_name=graph.name,
                                       op_digest=graph_digest(graph))
        loaded[key] = (graph, measured, reference_peaks(graph).liveness)
    plans = Plans(loaded)
    # 1 and 2: the proxy reproduces the GPU run's plans; the copy rate inside the steps
    for r in rows:
        planned, sim = plans.of(r)
        if abs(sim / r["simulated_s"] - 1) > args.check_tolerance:
            raise SystemExit(f"{r['workload']} {r['method']} at {r['fraction']}: simulated "
                             f"{sim * 1e3:.1f} ms here, {r['simulated_s'] * 1e3:.1f} on the GPU "
                             "run: this capture does not stand for the GPU's")
        if _policy(r["method"]) in WHOLE and r["d2h_busy_s"]:
            h2d, d2h = _copied(planned)
            rates.append((h2d / r["h2d_busy_s"], d2h / r["d2h_busy_s"]))
    in_step = (statistics.median(h for h, _ in rates), statistics.median(d for _, d in rates))
    print(f"copy rate inside the steps ({len(rates)} whole-offload rows): h2d "
          f"{in_step[0] / 1e9:.1f} GB/s, d2h {in_step[1] / 1e9:.1f} GB/s (the GPU run priced "
          f"{measured.h2d_bandwidth / 1e9:.1f} / {measured.d2h_bandwidth / 1e9:.1f})")
    report(args, rows, plans, in_step)
    return 0


def report(args: argparse.Namespace, rows: list[dict[str, Any]], plans: Plans,
           in_step: tuple[float, float]) -> None:
    """Steps 3 and 4 of the module docstring: every row's error under each link, and with
    ``--fit`` on the analytic profiles; the table, then a summary line per link."""
    errors: dict[str, list[float]] = {}
    lines: list[str] = []
    # 3: every row under each link
    for link in args.links:
        h2d, d2h = in_step if link == "in-step" else (
            float(x) * 1e9 for x in link.split("/"))
        label = f"{link} ({h2d / 1e9:.1f}/{d2h / 1e9:.1f} GB/s)"
        for r in rows:
            _, sim = plans.of(r, (h2d, d2h))
            err = sim / r["step_s"] - 1
            errors.setdefault(label, []).append(err)
            lines.append(f"| {r['workload']} | {r['fraction']:.0%} | {r['method']} | {label} | "
                         f"{r['step_s'] * 1e3:.1f} | {sim * 1e3:.1f} | {err * 100:+.1f} |")
    if args.fit:
        fitted_rows(args, rows, plans, in_step, lines, errors)
    print("\n| workload | budget | method | link | measured ms | simulated ms | error % |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    for label, errs in errors.items():
        within = sum(abs(e) <= TARGET for e in errs)
        print(f"{label}: {within} of {len(errs)} rows within {TARGET:.0%}; mean |error| "
              f"{statistics.mean(abs(e) for e in errs) * 100:.1f}%, worst "
              f"{max(errs, key=abs) * 100:+.1f}%")


def fitted_rows(args: argparse.Namespace, rows: list[dict[str, Any]], plans: Plans,
                in_step: tuple[float, float], lines: list[str],
                errors: dict[str, list[float]]) -> None:
    """Step 4 of the module docstring: fit, write the profile, and add each row's error on
    the ``--base`` analytic profile and on the fitted one to ``lines`` and ``errors``."""
    from dataclasses import replace

    from outcore.cost.model import AnalyticCostModel
    from outcore.cost.profiles import get_profile, load_profiles

    from cuda_calibrate import fit_efficiency, profile_document

    base = (next(iter(load_profiles(Path(args.base).read_text()).values()))
            if args.base.endswith(".json") else get_profile(args.base))
    loaded = plans.loaded
    measured = [(graph, list(cost.op_seconds)) for graph, cost, _ in loaded.values()]
    fitted, rms = fit_efficiency(base, measured)
    fitted = replace(fitted, name=f"{base.name}-fitted", aliases=(), h2d_bandwidth=in_step[0],
                     d2h_bandwidth=in_step[1])
    print(f"fitted {base.name}: RMS log error {rms:.3f} (the base: see --fit's table); "
          f"efficiency { {k: round(v, 3) for k, v in fitted.efficiency.items()} }, launch "
          f"{fitted.launch_overhead * 1e6:.1f} us, fill {(fitted.fill_time or 0) * 1e6:.1f} us")
    for key, (graph, cost, _) in loaded.items():
        totals = [sum(AnalyticCostModel(p).bind(graph).op_time(op) for op in graph.ops)
                  for p in (base, fitted)]
        print(f"  {key}: per-op sum measured {sum(cost.op_seconds) * 1e3:.1f} ms, analytic "
              f"{base.name} {totals[0] * 1e3:.1f}, fitted {totals[1] * 1e3:.1f}")
    Path(args.fit).write_text(json.dumps(profile_document(fitted, {
        "fitted_to": [f"{k}: {Path(args.ops.format(workload=k)).name}" for k in loaded],
        "rms_log_error": rms, "speed": Path(args.speed).name}), indent=1))
    for profile, label in ((base, f"analytic {base.name}"), (fitted, "fitted analytic")):
        for r in rows:
            planned, _ = plans.of(r, in_step)
            sim = simulate(planned.graph, planned.schedule, AnalyticCostModel(profile)).step_time
            err = sim / r["step_s"] - 1
            errors.setdefault(label, []).append(err)
            lines.append(f"| {r['workload']} | {r['fraction']:.0%} | {r['method']} | {label} | "
                         f"{r['step_s'] * 1e3:.1f} | {sim * 1e3:.1f} | {err * 100:+.1f} |")


if __name__ == "__main__":
    raise SystemExit(main())

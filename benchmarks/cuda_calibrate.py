"""Calibrate the GPU you run on (issue 17, item 4): measure, fit, write a profile file.

1. The host link: pinned host buffers (``pin_exact``, page-locked for exactly their size)
   and device buffers of ``--sizes``; each size copied device->host alone, host->device
   alone, and both at once on two streams; seconds from CUDA events. ``t = latency + n / bw``
   is fitted per direction, alone and concurrent (least squares); the profile takes the
   alone fit, the rate copies ran at inside steps on an H200 (``cuda_resimulate.py``).
2. Per-op seconds inside a real step of each workload (ResNet-50 b64, GPT-2 small b4, as in
   ``cuda_speed.py``): the joint graph's ops run in order on one stream with an event after
   each, so an op's time is the gap between its event and the previous one (launch gaps
   included, as in a step). Saved as a ``MeasuredProfile`` per workload.
3. The analytic model fitted to those op times: per-category efficiency of conv, matmul and
   attention, one for every other compute category, the memory efficiency, the launch
   overhead and the fill time per heavy kernel (float32 convolutions priced at the TF32
   peak, as cuDNN runs them: ``outcore.cost.model``), minimising the time-weighted squared
   log error (``fit_efficiency``); the link is the *concurrent* fit here, but
   ``cuda_resimulate.py`` found the rate inside steps closer (offloads and prefetches
   seldom overlap).
4. The host side: this machine's DRAM bandwidth and torch's CPU AdamW rate (the faster of
   fused and foreach; ``outcore.cost.measure_host``), the profile's ``host_memory_bandwidth``
   and ``host_adam_rate`` (what the optimizer step of host-held parameters costs).
5. The profile file, in gpus.json's format (``load_profiles`` reads it; ``cuda_speed.py
   --profile FILE`` uses it), with the raw measurements beside it:
   ``benchmarks/profiles/<gpu>.json`` by default.

``--speed SPEED.json`` (from ``cuda_speed.py --profile THIS_FILE --json``) prints the
simulator's step-time error against every measured outcore row instead (target: 10%).

    python benchmarks/cuda_calibrate.py                       # on the GPU machine
    python benchmarks/cuda_calibrate.py --speed speed.json    # point 4's error table
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from outcore.cost.model import DEFAULT_FILL_TIME, AnalyticCostModel
from outcore.cost.profiles import HardwareProfile, get_profile
from outcore.graph.ir import Graph, OpCategory

SIZES = [1 << 16, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
#: Categories fitted one by one; every other compute category shares one efficiency.
OWN = (OpCategory.CONV, OpCategory.MATMUL, OpCategory.ATTENTION)
TARGET = 0.10


@dataclass(frozen=True)
class LinkSample:
    direction: str  # "d2h" or "h2d"
    nbytes: int
    seconds: float
    concurrent: bool


@dataclass(frozen=True)
class LinkFit:
    latency_s: float
    bandwidth: float  # bytes/s


def fit_link(samples: Sequence[LinkSample]) -> dict[str, LinkFit]:
    """``t = latency + n / bandwidth`` by least squares per direction, alone ("d2h", "h2d")
    and with the other direction copying at the same time ("d2h concurrent", ...)."""
    groups: dict[str, list[LinkSample]] = {}
    for s in samples:
        key = s.direction + (" concurrent" if s.concurrent else "")
        groups.setdefault(key, []).append(s)
    fits = {}
    for key, group in groups.items():
        if len({s.nbytes for s in group}) < 2:
            raise ValueError(f"{key}: need at least two sizes to fit a latency and a bandwidth")
        a = np.array([[1.0, s.nbytes] for s in group])
        t = np.array([s.seconds for s in group])
        (latency, per_byte), *_ = np.linalg.lstsq(a, t, rcond=None)
        if per_byte <= 0:
            raise ValueError(f"{key}: copy time does not grow with size; measure larger sizes")
        fits[key] = LinkFit(max(0.0, float(latency)), 1.0 / float(per_byte))
    return fits


def _efficiency_keys() -> list[str]:
    return [c.value for c in OWN] + ["other", "memory"]


def _model(base: HardwareProfile, params: np.ndarray) -> AnalyticCostModel:
    """params: the efficiencies' logits, then log launch overhead and log fill time."""
    keys = _efficiency_keys()
    eff = {k: 1 / (1 + math.exp(-p)) for k, p in zip(keys, params[:-2], strict=True)}
    other = eff.pop("other")
    full = {c.value: other for c in OpCategory if c not in OWN and c is not OpCategory.VIEW}
    full.update(eff)
    profile = replace(base, efficiency=full, launch_overhead=math.exp(params[-2]),
                      fill_time=math.exp(params[-1]))
    return AnalyticCostModel(profile)


def fit_efficiency(base: HardwareProfile, measured: Sequence[tuple[Graph, Sequence[float]]]
                   ) -> tuple[HardwareProfile, float]:
    """``base`` with efficiencies, launch overhead and fill time fitted to per-op seconds of
    graphs, and the fit's time-weighted RMS log error. Views and ops measured at 0 are left
    out; a heavy category with no op measured keeps the model's default efficiency."""
    from scipy.optimize import minimize

    points = [(g, op, s) for g, seconds in measured
              for op, s in zip(g.ops, seconds, strict=True)
              if s > 0 and op.category is not OpCategory.VIEW]
    if not points:
        raise ValueError("no op with a measured time to fit")
    total = sum(s for *_, s in points)
    weights = np.array([s / total for *_, s in points])
    logs = np.log([s for *_, s in points])

    def loss(params: np.ndarray) -> float:
        model = _model(base, params)
        bound = {id(g): model.bind(g) for g in {id(g): g for g, _, _ in points}.values()}
        pred = np.log([bound[id(g)].op_time(op) for g, op, _ in points])
        return float(np.sum(weights * (pred - logs) ** 2))

    fill = base.fill_time if base.fill_time is not None else DEFAULT_FILL_TIME
    start = np.array([0.0] * len(_efficiency_keys())
                     + [math.log(max(base.launch_overhead, 1e-6)), math.log(max(fill, 1e-7))])
    best = minimize(loss, start, method="Nelder-Mead",
                    options={"maxiter": 8000, "maxfev": 8000, "xatol": 1e-4, "fatol": 1e-10})
    fitted = _model(base, best.x).profile
    seen = {op.category.value for _, op, _ in points}
    unseen = [c.value for c in OWN if c.value not in seen]  # no op to fit it: not written
    if unseen:
        fitted = replace(fitted, efficiency={k: v for k, v in fitted.efficiency.items()
                                             if k not in unseen})
    return fitted, math.sqrt(best.fun)


def profile_document(fitted: HardwareProfile, measurements: dict[str, Any]) -> dict[str, Any]:
    """The JSON written: gpus.json's format plus the raw measurements under their own key."""
    return {"format": "outcore.hardware-profiles/1", "profiles": [fitted.to_dict()],
            "measurements": measurements}


def error_table(rows: Sequence[dict[str, Any]], target: float = TARGET) -> tuple[str, bool]:
    """Markdown of simulated vs measured step time for every outcore row of a cuda_speed
    JSON, and whether every row is within ``target``."""
    lines = ["| workload | budget | method | measured ms | simulated ms | error % | within |",
             "|---|---|---|---|---|---|---|"]
    ok = True
    for r in rows:
        if not r["method"].startswith("outcore") or not r.get("step_s") or not r.get(
                "simulated_s"):
            continue
        err = r["simulated_s"] / r["step_s"] - 1
        within = abs(err) <= target
        ok = ok and within
        lines.append(f"| {r['workload']} | {r['fraction']:.0%} | {r['method']} | "
                     f"{r['step_s'] * 1e3:.1f} | {r['simulated_s'] * 1e3:.1f} | "
                     f"{err * 100:+.1f} | {'yes' if within else 'NO'} |")
    return "\n".join(lines), ok


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# -- measuring (GPU) ------------------------------------------------------------------------
def measure_link(sizes: Sequence[int], repeats: int) -> list[LinkSample]:
    """Copy seconds per size: each direction alone, then both at once (CUDA events)."""
    import torch

    from outcore.runtime.devices.cuda import pin_exact, unpin_exact

    streams = {"d2h": torch.cuda.Stream(), "h2d": torch.cuda.Stream()}
    samples = []
    for n in sizes:
        host = {d: pin_exact(n) for d in streams}
        dev = {d: torch.empty(n, dtype=torch.uint8, device="cuda") for d in streams}
        for rep in range(repeats + 1):  # round 0 of each size warms up
            for concurrent in (False, True):
                runs = [list(streams)] if concurrent else [[d] for d in streams]
                for group in runs:
                    events = {}
                    for d in group:
                        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                        with torch.cuda.stream(streams[d]):
                            start.record()
                            if d == "d2h":
                                host[d].copy_(dev[d], non_blocking=True)
                            else:
                                dev[d].copy_(host[d], non_blocking=True)
                            end.record()
                        events[d] = (start, end)
                    torch.cuda.synchronize()
                    if rep:
                        samples += [LinkSample(d, n, s.elapsed_time(e) / 1e3, concurrent)
                                    for d, (s, e) in events.items()]
        for buffer in host.values():
            unpin_exact(buffer)
    return samples


def calibrate(args: argparse.Namespace) -> None:
    import torch

    import outcore
    from outcore import zoo
    from outcore.cost.measure_ops import measure_ops

    gpu = torch.cuda.get_device_name()
    name = args.name or f"{slug(gpu)}-measured"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    link = fit_link(samples := measure_link(args.sizes, args.repeats))
    for key, fit in sorted(link.items()):
        print(f"link {key:16s} latency {fit.latency_s * 1e6:7.1f} us, "
              f"{fit.bandwidth / 1e9:6.2f} GB/s")
    measured = []
    workloads = {"resnet50": ("resnet50", 64), "gpt2": ("transformer", 4)}
    for key, (zoo_name, batch_size) in workloads.items():
        work = zoo.get(zoo_name, batch_size)
        model = work.model.cuda()
        batch = tuple(b.cuda() for b in work.batch)
        graph = outcore.capture(model, work.loss_fn, batch)
        ops = measure_ops(graph, batch, repeats=args.repeats, warmup=2, device=gpu)
        seconds = ops.op_seconds
        print(f"{key}: {len(graph.ops)} ops, {sum(seconds) * 1e3:.1f} ms in-step op time")
        ops.with_link(link["h2d"].bandwidth, link["d2h"].bandwidth,
                      latency=link["h2d"].latency_s).save(
                          out_dir / f"{name}.{key}.ops.json")
        measured.append((graph, seconds))
        del model, batch, work
    fitted, rms = fit_efficiency(get_profile(args.base), measured)
    from outcore.cost.measure_host import measure_adam_rate, measure_this_cpu

    host_bw = measure_this_cpu().host_memory_bandwidth
    adam, impl = measure_adam_rate()
    print(f"host: DRAM {host_bw / 1e9:.1f} GB/s, CPU AdamW ({impl}) {adam / 1e6:.0f} Mparam/s")
    fitted = replace(
        fitted, name=name, aliases=(), description=f"{gpu}, measured by cuda_calibrate.py",
        h2d_bandwidth=link["h2d"].bandwidth,
        d2h_bandwidth=link["d2h"].bandwidth,
        host_memory_bandwidth=host_bw, host_adam_rate=adam,
        sources=((f"benchmarks/cuda_calibrate.py on {gpu}, torch {torch.__version__}: "
                 f"efficiencies, launch overhead and fill time fitted to per-op times (RMS "
                 f"log error {rms:.3f}); link: pinned copies one direction at a time (a "
                 "step's offloads and prefetches seldom overlap: cuda_resimulate.py)"),
                 (f"host side measured on this machine's CPU: DRAM copy bandwidth, torch "
                 f"CPU AdamW {impl}=True")))
    doc = profile_document(fitted, {"gpu": gpu, "torch": torch.__version__,
                                    "link_samples": [asdict(s) for s in samples],
                                    "link_fit": {k: asdict(v) for k, v in link.items()},
                                    "rms_log_error": rms})
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"fitted {name}: RMS log error {rms:.3f}; efficiency {dict(fitted.efficiency)}; "
          f"launch {fitted.launch_overhead * 1e6:.1f} us, fill {fitted.fill_time or 0:.2e} s "
          f"-> {path}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=SIZES)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--base", default="h100", help="datasheet profile to start from")
    parser.add_argument("--name", help="profile name (default: the GPU's name + -measured)")
    parser.add_argument("--out", default="benchmarks/profiles")
    parser.add_argument("--speed", help="a cuda_speed.py JSON: print the simulator's errors")
    args = parser.parse_args(argv)
    if args.speed:
        doc = json.loads(Path(args.speed).read_text())
        table, ok = error_table(doc["rows"])
        print(f"simulated vs measured step time on {doc['gpu']} (profile {doc['profile']}):")
        print(table)
        print(f"every row within {TARGET:.0%}: {'yes' if ok else 'NO'}")
        return
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    calibrate(args)


if __name__ == "__main__":
    main()

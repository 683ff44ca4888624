"""Stress: many steps under random budgets and a copy engine of random speed (issue 19, 5).

A small CNN with BatchNorm and dropout trains with SGD. Every ``--replan`` steps a budget is
drawn at random between the lowest outcore-auto accepts and the in-core peak, and the step
is re-planned and run on a fresh CPU-emulated device whose capacity is that budget; before
every step the copy engines' slowdown is drawn at random (0.2x to 20x). Checked:

* every step: loss and gradients finite, measured peak == planned peak <= budget, nothing
  left on the host or in flight after the step;
* every ``--check`` steps: gradients equal eager PyTorch's on the same parameters, batch and
  RNG state (bit-exact kernels: ``torch.equal``; tolerance 1e-6 otherwise);
* leaks: after a warm-up, the number of live tensors and the bytes of their storages (every
  object the garbage collector sees) must not grow by the end, nor the process's resident
  memory by more than ``--rss-slack`` MB;
* threads: when done, no copy-engine thread is left.

    .venv/bin/python benchmarks/stress.py [--steps 1000] [--seed 0]

The default test suite runs ``run_stress`` for a few dozen steps (tests/faults/test_stress.py).
"""

from __future__ import annotations

import argparse
import copy
import gc
import math
import random
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.runtime.devices import EmulatedDevice
from outcore.runtime.executor import Executor

LINK = 2e9  # bytes/s before the random slowdown


def model_and_batches(seed: int, n: int = 3) -> tuple[nn.Module, list[tuple[torch.Tensor, ...]]]:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Dropout(0.1), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
    batches = [(torch.randn(4, 3, 12, 12, generator=gen), torch.randint(0, 5, (4,), generator=gen))
               for _ in range(n)]
    return model, batches


@dataclass
class StressReport:
    steps: int = 0
    replans: int = 0
    checked: int = 0
    budgets: list[int] = field(default_factory=list)
    tensors: tuple[int, int] = (0, 0)        # live tensors after warm-up, at the end
    tensor_bytes: tuple[int, int] = (0, 0)   # their storages' bytes
    rss_mb: tuple[float, float] = (0.0, 0.0)
    threads_left: int = 0
    seconds: float = 0.0


def live_tensors() -> tuple[int, int]:
    """(count, storage bytes) of every tensor the garbage collector sees."""
    gc.collect()
    count, storages = 0, {}
    with warnings.catch_warnings():  # isinstance on deprecated torch module attributes warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                count += 1
                s = obj.untyped_storage()
                storages[s._cdata] = s.nbytes()
    return count, sum(storages.values())


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def lowest_budget(graph, high: int) -> int:
    lo, hi = 0, high
    while hi - lo > max(64, high // 1000):
        mid = (lo + hi) // 2
        try:
            outcore.plan(graph, mid, simulate=False)
            hi = mid
        except InfeasibleBudgetError:  # infeasibility only; any other error is a bug
            lo = mid
    return hi


def eager_grads(model: nn.Module, batch, rng: torch.Tensor) -> dict[str, torch.Tensor]:
    ref = copy.deepcopy(model)
    ref.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)
    F.cross_entropy(ref(batch[0]), batch[1]).backward()
    return {n: p.grad for n, p in ref.named_parameters()}


def run_stress(steps: int, seed: int = 0, replan: int = 10, check: int = 10,
               warmup: int = 20) -> StressReport:
    """Run the stress loop; raises AssertionError naming the step on the first failure."""
    rnd = random.Random(seed)
    threads_before = {t.ident for t in threading.enumerate()}
    model, batches = model_and_batches(seed)
    graph = capture(model, F.cross_entropy, batches[0])
    in_core = outcore.plan(graph, None, policy="keep-all", simulate=False).predicted_peak
    low = lowest_budget(graph, in_core)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    report = StressReport()
    device: EmulatedDevice | None = None
    executor: Executor | None = None
    planned = None
    start = time.perf_counter()
    try:
        for step in range(steps):
            if step % replan == 0:
                if device is not None:
                    device.close()
                budget = rnd.randint(low, in_core)
                planned = outcore.plan(graph, budget, simulate=False)
                device = EmulatedDevice(budget, LINK, LINK)
                executor = Executor(planned.graph, planned.schedule, device)
                report.replans += 1
                report.budgets.append(budget)
            assert device is not None and executor is not None and planned is not None
            device.set_slowdown(math.exp(rnd.uniform(math.log(0.2), math.log(20.0))))
            batch = batches[step % len(batches)]
            checked = step % check == 0
            rng = torch.get_rng_state()
            expected = eager_grads(model, batch, rng) if checked else None
            torch.set_rng_state(rng)
            opt.zero_grad(set_to_none=True)
            result = executor.run(batch)
            where = f"step {step} (budget {planned.budget} B)"
            assert torch.isfinite(result.loss), f"{where}: loss {result.loss}"
            assert result.peak_bytes == planned.predicted_peak <= planned.budget, where
            assert device.in_flight() == 0 and device.host_bytes() == 0, where
            for n, p in model.named_parameters():
                assert p.grad is not None and torch.isfinite(p.grad).all(), f"{where}: {n}"
                if expected is not None:
                    assert torch.allclose(p.grad, expected[n], rtol=0, atol=1e-6), f"{where}: {n}"
            report.checked += checked
            opt.step()
            report.steps += 1
            if step + 1 == min(warmup, steps):
                report.tensors = (*live_tensors()[:1], 0)
                report.tensor_bytes = (live_tensors()[1], 0)
                report.rss_mb = (rss_mb(), 0.0)
    finally:
        if device is not None:
            device.close()
    del executor, device
    count, nbytes = live_tensors()
    report.tensors = (report.tensors[0], count)
    report.tensor_bytes = (report.tensor_bytes[0], nbytes)
    report.rss_mb = (report.rss_mb[0], rss_mb())
    report.seconds = time.perf_counter() - start
    report.threads_left = sum(1 for t in threading.enumerate()
                              if t.ident not in threads_before and t.name.startswith("outcore"))
    return report


def check_leaks(report: StressReport, rss_slack_mb: float) -> list[str]:
    """Growth of live tensors, their bytes, resident memory, or threads left: the failures."""
    out = []
    if report.tensors[1] > report.tensors[0]:
        out.append(f"live tensors grew from {report.tensors[0]} to {report.tensors[1]}")
    if report.tensor_bytes[1] > report.tensor_bytes[0]:
        out.append(f"live tensor bytes grew from {report.tensor_bytes[0]} to "
                   f"{report.tensor_bytes[1]}")
    if report.rss_mb[1] - report.rss_mb[0] > rss_slack_mb:
        out.append(f"resident memory grew by {report.rss_mb[1] - report.rss_mb[0]:.1f} MB")
    if report.threads_left:
        out.append(f"{report.threads_left} copy-engine threads left")
    return out


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--steps", type=int, default=1000)
    args.add_argument("--seed", type=int, default=0)
    args.add_argument("--replan", type=int, default=10)
    args.add_argument("--check", type=int, default=10)
    args.add_argument("--rss-slack", type=float, default=32.0)
    opts = args.parse_args(argv)
    report = run_stress(opts.steps, opts.seed, opts.replan, opts.check)
    problems = check_leaks(report, opts.rss_slack)
    print(f"steps {report.steps}, re-plans {report.replans} (budgets {min(report.budgets)}.."
          f"{max(report.budgets)} B), gradients checked against eager at {report.checked} "
          f"steps, {report.seconds:.1f} s")
    print(f"live tensors {report.tensors[0]} -> {report.tensors[1]}, their bytes "
          f"{report.tensor_bytes[0]} -> {report.tensor_bytes[1]}, resident memory "
          f"{report.rss_mb[0]:.1f} -> {report.rss_mb[1]:.1f} MB, copy threads left "
          f"{report.threads_left}")
    print("problems: " + ("; ".join(problems) if problems else "none"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Inductor's buffer reuse and the plan's predicted peak (``inductor_backend(buffer_reuse=...)``).

With ``allow_buffer_reuse`` on, Inductor's generated code holds a freed buffer until a later
one of the same size reuses it, up to its own peak estimate, which counts views of one
storage once per view: the step's allocator peak then exceeds the plan's prediction. Off (the
backend's default) every buffer is freed after its last use, as outcore's memory rule frees
it. Differential: the same plan compiled both ways; the allocator's peak against the
prediction. The ``slow`` tests run the quick models of ``benchmarks/vs_pytorch.py`` and its
budget search against Inductor's min-cut (minutes: each budget is a compile).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch._functorch import config as functorch_config

import outcore
from outcore.compiled import InductorRoundingWarning
from outcore.compiled.heavy import MinCutRecorder
from outcore.runtime.devices.allocator_peak import allocator_peak, held_before

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import vs_pytorch  # a benchmarks/ module, not a package
from test_inductor_backend import _compiled_step, _lowest_recompute_budget, _workload, _zero

#: one thread, as the benchmark runs (the fused model measured below its prediction with two
#: threads even with reuse on); ``one_thread`` in conftest.py
pytestmark = pytest.mark.usefixtures("one_thread")


def _compiled_tiny_gpt(buffer_reuse: bool) -> tuple[int, int, list[str]]:
    """(allocator peak of one step, the plan's predicted peak less what is held before the
    step, the saved set) of the tiny GPT compiled at a budget that forces recomputation."""
    torch._dynamo.reset()
    w = _workload(0.0)
    budget = _lowest_recompute_budget(w)
    be = outcore.inductor_backend(budget=budget, gpu="this-cpu", buffer_reuse=buffer_reuse)
    step = _compiled_step(w, be)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InductorRoundingWarning)
        step()
    _zero(w.model)
    measured = allocator_peak(step).peak
    [part] = be.partitions
    return measured, part.predicted_peak - held_before(part.planned.graph), part.saved


def _both_ways() -> dict[str, object]:
    """The tiny GPT compiled without reuse, then with it (the same plan)."""
    measured, predicted, saved = _compiled_tiny_gpt(buffer_reuse=False)
    reused, predicted_again, saved_again = _compiled_tiny_gpt(buffer_reuse=True)
    return {"measured": measured, "predicted": predicted, "reused": reused,
            "same_plan": (predicted_again, saved_again) == (predicted, saved)}


def test_without_buffer_reuse_the_fused_plan_bounds_the_allocator_peak():
    """The default: the fused model's prediction bounds the step; Inductor's reuse, on,
    holds freed buffers beyond it (the same plan: the same saved set). Run in a fresh
    interpreter: in the whole suite's process (CI, 2026-11-27) both compiles measured the
    same peak, 2,156,556 B, so Inductor's choices there depend on what earlier tests left
    in the process (not found which); alone, and in tests/compiled alone, reuse adds ~80 KB."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env,
                         timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["same_plan"]
    assert 0 < got["measured"] <= got["predicted"]
    assert got["reused"] > got["measured"]


# ---- the quick models of benchmarks/vs_pytorch.py (slow) ----------------------------------

def _min_cut(w: vs_pytorch.Workload, eager_draws: bool) -> tuple[int, int]:
    """(step peak, recomputed heavy flops) of plain torch.compile at
    ``activation_memory_budget=0.5``, the benchmark's compile level, dropout drawn with
    eager's generator (Inductor's ``fallback_random``) or Inductor's own."""
    recorder = MinCutRecorder()
    model = copy.deepcopy(w.model)
    before = functorch_config.activation_memory_budget
    functorch_config.activation_memory_budget = 0.5
    try:
        step = vs_pytorch.eager_step(torch.compile(
            model, options={"custom_partitioner_fn": recorder, "fallback_random": eager_draws},
            dynamic=False), w)
        step()
        peak = vs_pytorch.peaks(step, model)[1]
    finally:
        functorch_config.activation_memory_budget = before
    return peak, sum(recorder.heavy_flops)


@pytest.mark.slow
@pytest.mark.parametrize("eager_draws", [True, False], ids=["eager-rng", "inductor-rng"])
@pytest.mark.parametrize("name", ["gpt", "hf-gpt2"])
def test_at_min_cuts_memory_the_plan_bounds_the_step_and_recomputes_no_more(
        name: str, eager_draws: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every compile of the benchmark's budget search measures at most its prediction, and
    the compile it picks at min-cut's step peak recomputes at most min-cut's heavy flops,
    both drawing dropout with the same generator (eager's: the backend's default; a mask is
    then kept, never re-drawn, by both; Inductor's: both may re-draw it from its seed)."""
    w = vs_pytorch.WORKLOADS[name]("quick")
    monkeypatch.setattr(vs_pytorch, "FALLBACK_RANDOM", [eager_draws])
    target, min_cut_flops = _min_cut(w, eager_draws)
    compiles: list[tuple[object, object]] = []  # (step, partition) of each compile
    original = vs_pytorch.inductor_step

    def recorded(workload, budget):
        step, model, part = original(workload, budget)
        compiles.append((step, part))
        return step, model, part

    monkeypatch.setattr(vs_pytorch, "inductor_step", recorded)
    # each compile is a new dynamo cache entry for the same code: as vs_pytorch.main, keep
    # them all (past the default limit dynamo would run the model eagerly, unpartitioned)
    with warnings.catch_warnings(), torch._dynamo.config.patch(
            recompile_limit=256, accumulated_recompile_limit=4096):
        warnings.simplefilter("ignore", InductorRoundingWarning)
        matcher = vs_pytorch.InductorMatcher(w, vs_pytorch.MATCH["step"], lambda _: None)
        (chosen, peaks, note), _ = matcher.at(target)
    tools = {id(tool[0]): tool[1] for tool, _ in [matcher.top, *matcher.tried.values()]}
    for step, part in compiles:
        predicted = part.predicted_peak - held_before(part.planned.graph)
        assert tools[id(step)][1] <= predicted, (name, part.planned.budget)
    assert peaks[1] <= target, note
    [part] = [p for s, p in compiles if s is chosen]
    assert part.recomputed_heavy_flops <= min_cut_flops, (note, part.recomputed_targets)


if __name__ == "__main__":  # the fresh interpreter of the first test
    torch.set_num_threads(1)
    print(json.dumps(_both_ways()))

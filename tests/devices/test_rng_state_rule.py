"""The saved RNG states of recomputed random ops are in the memory rule: held from the op's
first run to its last recompute (plus a copy of the current state during each recompute),
sized by the device's allocator (``measure_temporaries`` sets it: 5,056 B on the CPU, none
on CUDA, where the states are host tensors), so that the trainer's prediction on
``device="cpu"`` equals the allocator's peak on a dropout model that recomputes dropout."""

from __future__ import annotations

import pytest
import torch

import outcore
from outcore import zoo
from outcore.capture import capture
from outcore.cost.measure_temporaries import measure_temporaries, rng_state_bytes
from outcore.plan.memory import memory_curve
from outcore.plan.residency import RNG_STATE_BYTES, no_workspace
from outcore.plan.schedule import Compute
from outcore.policies import registry
from outcore.policies.registry import PolicyContext


@pytest.fixture(scope="module")
def transformer():
    w = zoo.get("transformer", 4, small=True, tie_weights=False)
    graph = capture(w.model, w.loss_fn, w.batch)
    measure_temporaries(graph, w.batch)
    return w, graph


def held_states(graph, schedule) -> list[int]:
    """Per instruction, the states the executor holds (re-derived from the schedule alone)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, ins in enumerate(schedule.instructions):
        if isinstance(ins, Compute) and graph.ops[ins.op].random:
            if ins.recompute:
                last[ins.op] = i
            else:
                first.setdefault(ins.op, i)
    out = []
    for i, ins in enumerate(schedule.instructions):
        n = sum(1 for op, end in last.items() if first[op] <= i <= end)
        if isinstance(ins, Compute) and ins.recompute and ins.op in last:
            n += 1  # the copy of the current state during the replay
        out.append(n)
    return out


def test_the_state_size_comes_from_the_device(transformer):
    _, graph = transformer
    assert graph.meta[RNG_STATE_BYTES] == rng_state_bytes("cpu") == torch.get_rng_state().numel()
    assert rng_state_bytes("cpu") == 5056  # the Mersenne Twister's state
    assert rng_state_bytes("cuda") == 0  # saved as host tensors: none in the device allocator


def test_the_rule_holds_each_state_from_first_run_to_last_recompute(transformer):
    _, graph = transformer
    out = registry.get("recompute-cheap").fn(graph, PolicyContext(budget=None))
    schedule = out.schedule
    held = held_states(out.graph, schedule)
    assert max(held) >= 2 and held[-1] == 0  # several at once; none after the last replay
    with_states = memory_curve(out.graph, schedule)
    tensors_only = memory_curve(out.graph, schedule, no_workspace)
    saved = out.graph.meta.pop(RNG_STATE_BYTES)
    try:
        without = memory_curve(out.graph, schedule)
        assert memory_curve(out.graph, schedule, no_workspace) == tensors_only  # tensors alone
    finally:
        out.graph.meta[RNG_STATE_BYTES] = saved
    assert [a - b for a, b in zip(with_states.device, without.device, strict=True)] == \
        [n * saved for n in held]
    assert with_states.peak > without.peak


def test_trainer_on_cpu_predicts_the_allocators_peak_with_recomputed_dropout(transformer):
    w, _ = transformer
    trainer = outcore.compile(w.model, w.loss_fn, w.batch, budget=None, device="cpu",
                              policy="recompute-cheap")
    graph, schedule = trainer.planned.graph, trainer.planned.schedule
    recomputed = {i.op for i in schedule.instructions if isinstance(i, Compute) and i.recompute}
    assert sum(1 for op in graph.ops if op.random and op.id in recomputed) >= 2
    trainer.step(*w.batch)
    stats = trainer.stats
    assert stats.measured_peak == stats.predicted_peak  # the allocator's peak, to the byte
    graph.meta[RNG_STATE_BYTES] = 0  # the rule without the states falls short of it
    assert memory_curve(graph, schedule).peak < stats.measured_peak

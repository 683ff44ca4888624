"""Gradient buckets (plain data): order, cap, dtypes, and their memory on top of the rule."""

from __future__ import annotations

import pytest
from dp_graphs import three_layers

from outcore.plan.grad_buckets import (
    assign_buckets,
    bucket_bytes_after,
    final_at,
    gradient_tensors,
    peak_with_buckets,
)
from outcore.plan.memory import memory_curve
from outcore.plan.residency import residency_steps
from outcore.plan.schedule import Compute, Schedule


def names(graph, bucket):
    return [graph.tensors[t].name for t in bucket.tensors]


@pytest.mark.parametrize(("cap", "expected"), [
    (40, [["gw2"], ["gw1"], ["gw0"]]),  # one gradient per bucket
    (80, [["gw2", "gw1"], ["gw0"]]),  # in the order backward makes them
    (10, [["gw2"], ["gw1"], ["gw0"]]),  # a gradient over the cap gets a bucket alone
    (1 << 20, [["gw2", "gw1", "gw0"]]),
])
def test_buckets_follow_backward_order_up_to_the_cap(cap, expected):
    graph = three_layers()
    schedule = Schedule([Compute(op.id) for op in graph.ops], keep_at_end=graph.outputs)
    buckets = assign_buckets(graph, schedule, cap)
    assert [names(graph, b) for b in buckets] == expected
    # ready after the instruction of its last gradient: b2 is instruction 3, b0 is 5
    last = {"gw2": 3, "gw1": 4, "gw0": 5}
    assert [b.ready_at for b in buckets] == [last[names(graph, b)[-1]] for b in buckets]
    for b in buckets:
        assert b.offsets == tuple(sum(graph.tensors[t].nbytes // 4 for t in b.tensors[:i])
                                  for i in range(len(b.tensors)))
        assert b.nbytes == sum(graph.tensors[t].nbytes for t in b.tensors)


def test_a_dtype_change_closes_the_bucket():
    graph = three_layers(dtypes=("float32", "float16", "float32"))
    schedule = Schedule([Compute(op.id) for op in graph.ops], keep_at_end=graph.outputs)
    buckets = assign_buckets(graph, schedule, 1 << 20)
    assert [names(graph, b) for b in buckets] == [["gw2"], ["gw1"], ["gw0"]]
    assert [b.dtype for b in buckets] == ["float32", "float16", "float32"]
    assert buckets[1].numel == 20 and buckets[1].nbytes == 40


def test_gradients_are_found_by_their_source_and_must_all_be_made():
    graph = three_layers()
    assert [graph.tensors[t].name for t in gradient_tensors(graph)] == ["gw0", "gw1", "gw2"]
    partial = Schedule([Compute(op.id) for op in graph.ops[:5]])
    with pytest.raises(ValueError, match="gw0"):
        final_at(graph, partial)


def test_bucket_bytes_accumulate_to_the_end():
    graph = three_layers()
    schedule = Schedule([Compute(op.id) for op in graph.ops], keep_at_end=graph.outputs)
    buckets = assign_buckets(graph, schedule, 40)
    assert bucket_bytes_after(buckets, 6) == [0, 0, 0, 40, 80, 120]


@pytest.mark.parametrize("workspace", [0, 1000])
def test_peak_with_buckets_is_the_rule_plus_the_buckets(workspace):
    """Brute force: the buckets ready before an instruction count during it (with its
    transients); those ready at it count after it (transients gone)."""
    graph = three_layers()
    schedule = Schedule([Compute(op.id) for op in graph.ops], keep_at_end=graph.outputs)
    buckets = assign_buckets(graph, schedule, 40)

    def ws(op: int) -> int:  # b1's workspace: b1 runs after gw2's bucket is ready
        return workspace if op == 4 else 0

    after = bucket_bytes_after(buckets, len(schedule))
    steps = list(residency_steps(graph, schedule, ws))
    expected = steps[0].device
    for s in steps[1:]:
        before = after[s.at - 1] if s.at else 0
        expected = max(expected, s.device + before, s.device - s.transient + after[s.at])
    assert peak_with_buckets(graph, schedule, buckets, ws) == expected
    base = memory_curve(graph, schedule, ws)
    # the end of the step holds every bucket beside the gradients
    assert peak_with_buckets(graph, schedule, buckets, ws) >= base.device[-1] + 120
    if workspace:
        # during b1: its workspace and gw2's bucket (ready before it) are both held
        assert peak_with_buckets(graph, schedule, buckets, ws) == base.device[4] + 40
    assert peak_with_buckets(graph, schedule, [], ws) == base.peak


def test_a_tied_group_takes_one_slot_under_its_last_made_member():
    """Tied weights: one parameter, one gradient output per name. Grouped, they take one
    slot (the runtime sums them into it), under the member backward makes last, ready then;
    the other member's bytes are not in any bucket."""
    graph = three_layers()
    schedule = Schedule([Compute(op.id) for op in graph.ops], keep_at_end=graph.outputs)
    ids = {graph.tensors[t].name: t for t in gradient_tensors(graph)}
    tied = [(ids["gw2"], ids["gw0"])]  # as if layers 2 and 0 shared their weight
    buckets = assign_buckets(graph, schedule, 1 << 20, tied)
    assert [names(graph, b) for b in buckets] == [["gw1", "gw0"]]
    assert buckets[0].ready_at == 5  # gw0's instruction: the group is final then
    assert buckets[0].numel == sum(graph.tensors[ids[n]].nbytes // 4 for n in ("gw1", "gw0"))
    untied = assign_buckets(graph, schedule, 1 << 20)
    assert untied[0].nbytes - buckets[0].nbytes == graph.tensors[ids["gw2"]].nbytes

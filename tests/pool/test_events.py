"""Block lifetimes of a Schedule follow outcore.plan.memory exactly, step by step."""

from __future__ import annotations

import pytest

from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.schedule import Compute, Free, Offload, Prefetch, Schedule, Wait
from outcore.policies.baseline import keep_all, liveness, offload_all, recompute_cheap
from outcore.pool import blocks_from_schedule, live_curve, lower_bound, place

from pool_graphs import Layer, residual_net, training_graph


def _tiny() -> tuple[Graph, Schedule]:
    """x, w -> a = conv -> r = relu -> v = view(r) -> loss; backward g_v, g_a, g_w.
    ``a`` is offloaded in forward and prefetched for the weight gradient."""
    spec = [  # name, nbytes, kind, storage (None = own)
        ("x", 100, TensorKind.INPUT, None), ("w", 40, TensorKind.PARAMETER, None),
        ("a", 400, TensorKind.ACTIVATION, None), ("r", 400, TensorKind.ACTIVATION, None),
        ("v", 0, TensorKind.ACTIVATION, 3), ("loss", 4, TensorKind.OUTPUT, None),
        ("g_v", 400, TensorKind.ACTIVATION, None), ("g_a", 400, TensorKind.ACTIVATION, None),
        ("g_w", 40, TensorKind.GRADIENT, None),
    ]
    tensors = [Tensor(id=i, name=n, shape=(1,), dtype="float32", nbytes=b, kind=k,
                      storage=i if s is None else s) for i, (n, b, k, s) in enumerate(spec)]
    ops_spec = [  # name, category, phase, inputs, outputs
        ("conv", OpCategory.CONV, Phase.FORWARD, [0, 1], [2]),
        ("relu", OpCategory.ELEMENTWISE, Phase.FORWARD, [2], [3]),
        ("view", OpCategory.VIEW, Phase.FORWARD, [3], [4]),
        ("loss", OpCategory.LOSS, Phase.FORWARD, [4], [5]),
        ("loss_bw", OpCategory.LOSS, Phase.BACKWARD, [4], [6]),
        ("relu_bw", OpCategory.ELEMENTWISE, Phase.BACKWARD, [6, 3], [7]),
        ("conv_bw", OpCategory.CONV, Phase.BACKWARD, [7, 2], [8]),
    ]
    ops = []
    for i, (n, c, p, ins, outs) in enumerate(ops_spec):
        ops.append(Op(id=i, name=n, target=f"aten.{n}.default", phase=p, category=c,
                      inputs=ins, outputs=outs))
        for t in outs:
            tensors[t].producer = i
        for t in ins:
            tensors[t].consumers.append(i)
    graph = Graph(tensors=tensors, ops=ops, outputs=[5, 8], name="tiny")
    graph.validate()
    schedule = Schedule([
        Compute(0), Compute(1), Offload(2), Wait(2, "d2h"), Free(2),      # 0-4
        Compute(2), Compute(3), Free(4), Compute(4), Compute(5),          # 5-9
        Free(6), Free(3), Prefetch(2), Wait(2, "h2d"), Compute(6),        # 10-14
        Free(7), Free(2),                                                 # 15-16
    ], keep_at_end=[5, 8])
    return graph, schedule


def test_tiny_schedule_gives_the_expected_blocks():
    graph, schedule = _tiny()
    blocks = blocks_from_schedule(graph, schedule)
    got = [(b.name, b.size, b.start, b.end, b.mobility) for b in blocks]
    assert got == [
        ("x", 100, 0, 16, "static"),
        ("w", 40, 0, 16, "static"),
        ("a", 400, 0, 3, "movable"),        # offloaded: freed by instruction 4
        ("r", 400, 1, 10, "temporary"),     # read by the view and by relu_bw (two readers)
        ("loss", 4, 6, 16, "reclaimed"),    # loss op output, nobody reads it
        ("g_v", 400, 8, 9, "movable"),      # read once, by the very next compute
        ("g_a", 400, 9, 14, "movable"),     # read once, by the next compute (after the prefetch)
        ("a", 400, 12, 15, "movable"),      # prefetched residency
        ("g_w", 40, 14, 16, "temporary"),   # kept to the end, read by no op
    ]
    assert live_curve(blocks_from_schedule(graph, schedule)) == memory_curve(graph, schedule).device


def test_recompute_duplicates_and_variant_workspace_are_one_step_blocks():
    graph, _ = _tiny()
    graph.ops[0].variant_options = {"fft": {"workspace": 1000}}
    schedule = Schedule([Compute(0), Compute(1), Compute(1, recompute=True), Free(2), Free(3)],
                        variants={0: "fft"})
    blocks = blocks_from_schedule(graph, schedule)
    transient = [(b.name, b.size, b.start, b.end) for b in blocks if b.storage < 0]
    assert transient == [("workspace:conv", 1000, 0, 0), ("duplicate:r", 400, 2, 2)]
    assert live_curve(blocks) == memory_curve(graph, schedule).device
    no_workspace = blocks_from_schedule(graph, schedule, workspace=lambda op: 0)
    assert live_curve(no_workspace) == memory_curve(graph, schedule, lambda op: 0).device
    assert [b.name for b in no_workspace if b.storage < 0] == ["duplicate:r"]


GRAPHS = {
    "chain": [Layer("l0", ["x"], 3000, OpCategory.CONV, param=500), Layer("l1", ["l0"], 3000),
              Layer("l2", ["l1"], 1000, OpCategory.MATMUL, param=900),
              Layer("loss", ["l2"], 4, OpCategory.LOSS)],
    "resnet": residual_net(3, width=5000),
    "fork": [Layer("stem", ["x"], 2000, OpCategory.CONV, param=100),
             Layer("b1", ["stem"], 1000, OpCategory.CONV, param=100),
             Layer("b2", ["stem"], 1500, OpCategory.CONV, param=100),
             Layer("b3", ["stem"], 700, OpCategory.POOL),
             Layer("cat", ["b1", "b2", "b3"], 3200, OpCategory.CONCAT),
             Layer("drop", ["cat"], 3200, OpCategory.DROPOUT),
             Layer("flat", ["drop"], 0, OpCategory.VIEW, view=True),
             Layer("fc", ["flat"], 40, OpCategory.MATMUL, param=3000),
             Layer("loss", ["fc"], 4, OpCategory.LOSS)],
}


@pytest.mark.parametrize("policy", [keep_all, liveness, offload_all, recompute_cheap])
@pytest.mark.parametrize("net", sorted(GRAPHS))
def test_live_bytes_equal_the_memory_rule_at_every_step(net, policy):
    graph = training_graph(GRAPHS[net])
    schedule = lower(graph, policy(graph))
    blocks = blocks_from_schedule(graph, schedule)
    trace = memory_curve(graph, schedule)
    assert live_curve(blocks) == trace.device
    assert lower_bound(blocks) == trace.peak
    assert len({b.id for b in blocks}) == len(blocks)
    if policy is offload_all:  # offloaded storages get two residencies, both movable
        moved = [b for b in blocks if b.storage in {b2.storage for b2 in blocks if b2 is not b}]
        assert moved and all(b.mobility == "movable" for b in moved if b.mobility != "static")
    for placement in (place(blocks), place(blocks, "gtbm"), place(blocks, "heap")):
        assert placement.pool_size >= trace.peak


def test_static_storages_live_the_whole_step_and_views_add_no_block():
    graph = training_graph(GRAPHS["fork"])
    schedule = lower(graph, liveness(graph))
    blocks = blocks_from_schedule(graph, schedule)
    last = len(schedule) - 1
    static = [b for b in blocks if b.mobility == "static"]
    assert {b.name for b in static} == {"x", "stem.weight", "b1.weight", "b2.weight", "fc.weight"}
    assert all((b.start, b.end) == (0, last) for b in static)
    assert "flat" not in {b.name for b in blocks}
    assert {b.name: b.mobility for b in blocks}["fc"] == "reclaimed"
    assert {b.name: b.mobility for b in blocks}["stem"] == "temporary"  # a fork


def test_empty_schedule_keeps_static_memory():
    graph = training_graph(GRAPHS["chain"])
    blocks = blocks_from_schedule(graph, Schedule([]))
    assert lower_bound(blocks) == graph.static_bytes() == memory_curve(graph, Schedule([])).peak

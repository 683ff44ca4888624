"""Measuring each op of a graph on this CPU (torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from outcore.cost.measure_ops import measure_ops, time_node
from outcore.errors import ProfileError
from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind


@dataclass
class Handle:
    """Stands in for a CapturedStep: op id -> FX node."""

    op_nodes: list[fx.Node]


def traced() -> tuple[fx.GraphModule, list[fx.Node]]:
    def step(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten.mm.default(x, w)
        z = torch.ops.aten.t.default(y)                   # a view with transposed strides
        g = torch.ops.aten.index_select.default(z, 0, idx)  # integer input: zeros stay in range
        return torch.ops.aten.relu.default(g)

    gm = make_fx(step, tracing_mode="fake")(torch.randn(8, 16), torch.randn(16, 4),
                                            torch.tensor([3, 1]))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    return gm, nodes


def ir_for(nodes: list[fx.Node]) -> Graph:
    """A minimal IR graph with one op per node (shapes do not matter to the profiler)."""
    tensors = [Tensor(0, "in", (1,), "float32", 4, TensorKind.INPUT, 0)]
    ops = []
    for i, node in enumerate(nodes):
        tensors.append(Tensor(i + 1, node.name, (1,), "float32", 4, TensorKind.ACTIVATION,
                              i + 1, producer=i))
        ops.append(Op(i, node.name, str(node.target), Phase.FORWARD, OpCategory.OTHER,
                      [i], [i + 1]))
    return Graph(tensors, ops, outputs=[len(nodes)], name="handmade")


def test_measures_every_op_of_a_hand_made_fx_graph() -> None:
    _, nodes = traced()
    graph = ir_for(nodes)
    graph.source = Handle(nodes)
    profile = measure_ops(graph, repeats=3, threads=1, h2d_bandwidth=1e9)
    assert profile.op_count == len(nodes) == 4
    assert all(math.isfinite(t) and t > 0 for t in profile.op_seconds)
    assert profile.bind(graph) is profile and profile.transfer_time(10**9, "d2h") == 1.0


def test_inputs_follow_the_fake_layout() -> None:
    from outcore.cost.measure_ops import _materialize

    _, nodes = traced()
    view = nodes[1].meta["val"]  # the transposed mm output
    real = _materialize(view, torch.Generator().manual_seed(0))
    assert real.shape == view.shape and real.stride() == view.stride() == (1, 4)
    assert real.dtype == view.dtype
    idx = _materialize(nodes[2].args[2].meta["val"], torch.Generator())
    assert idx.dtype == torch.int64 and not idx.any()


def test_node_count_must_match_the_graph() -> None:
    _, nodes = traced()
    graph = ir_for(nodes)
    with pytest.raises(ProfileError, match="4 ops but 0 FX nodes"):
        measure_ops(graph)
    with pytest.raises(ProfileError, match="3 FX nodes"):
        measure_ops(graph, op_nodes=nodes[:3])


def test_an_input_without_a_shape_is_named() -> None:
    _, nodes = traced()
    mm = nodes[0]
    for arg in mm.all_input_nodes:
        del arg.meta["val"]
    with pytest.raises(ProfileError, match="has no meta"):
        time_node(mm)


def test_an_op_torch_refuses_names_the_op() -> None:
    _, nodes = traced()
    mm = nodes[0]
    mm.args[0].meta["val"] = torch.empty(3, 5)  # mm(3x5, 16x4) cannot run
    with pytest.raises(ProfileError, match="cannot measure op 'mm'"):
        time_node(mm)


def test_measures_a_captured_step_and_simulates_it() -> None:
    from outcore.capture import capture
    from outcore.plan.lower import lower
    from outcore.plan.plan import Plan
    from outcore.sim import simulate

    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                              torch.nn.Linear(32, 4))
    graph = capture(net, torch.nn.functional.cross_entropy,
                    (torch.randn(8, 16), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])))
    profile = measure_ops(graph, repeats=2, threads=1, h2d_bandwidth=1e9)
    assert profile.op_count == len(graph.ops)
    schedule = lower(graph, Plan(policy="keep"))
    result = simulate(graph, schedule, profile)
    assert result.step_time == pytest.approx(sum(profile.op_seconds[c.op] for c in schedule
                                                 if hasattr(c, "op")))

    batch = (torch.randn(8, 16), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3]))
    entered = []

    class Counting:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return None

    in_step = measure_ops(graph, batch, repeats=3, warmup=1, threads=1, context=Counting)
    assert len(entered) == 4  # one pass per warm-up and repeat
    assert in_step.op_count == len(graph.ops) and in_step.op_digest == profile.op_digest
    assert all(math.isfinite(t) and t > 0 for t in in_step.op_seconds)


def test_a_fake_capture_cannot_be_measured_in_the_step() -> None:
    from outcore.capture import capture

    net = torch.nn.Linear(4, 2)
    batch = (torch.randn(3, 4), torch.tensor([0, 1, 1]))
    graph = capture(net, torch.nn.functional.cross_entropy, batch, fake=True)
    with pytest.raises(ProfileError, match="real tensors"):
        measure_ops(graph, batch)
    assert measure_ops(graph, repeats=1).op_count == len(graph.ops)  # alone works

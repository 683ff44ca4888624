"""Orders, liveness and the three reference peaks, on fan/join graphs and hand-made tables."""

import pytest

from outcore.capture import capture
from outcore.graph.bounds import layer_bytes, reference_peaks
from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind
from outcore.graph.liveness import memory_per_step, tensor_uses
from outcore.graph.order import STRATEGIES, execution_order, is_topological
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.schedule import Compute
from outcore.policies import baseline

from models import MODELS, make


@pytest.fixture(scope="module", params=MODELS)
def graph(request):
    model, loss_fn, batch = make(request.param)
    return capture(model, loss_fn, batch)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_route_is_topological(graph, strategy):
    order = execution_order(graph, strategy)
    assert is_topological(graph, order)
    phases = [graph.ops[o].phase for o in order]
    assert phases == sorted(phases, key=lambda p: p is not Phase.FORWARD)


def test_liveness_curve_equals_liveness_schedule(graph):
    schedule = lower(graph, baseline.liveness(graph))
    trace = memory_curve(graph, schedule)
    at_computes = [trace.device[i] for i, ins in enumerate(schedule.instructions)
                   if isinstance(ins, Compute)]
    assert at_computes == memory_per_step(graph)


def test_reference_peaks_are_ordered(graph):
    peaks = reference_peaks(graph)
    keep_all = memory_curve(graph, lower(graph, baseline.keep_all(graph))).peak
    assert peaks.network_wide == keep_all
    assert peaks.network_wide >= peaks.liveness >= peaks.layer_lower_bound > peaks.static


def chain(n=4, size=100):
    """Hand-made chain: x -> a1 -> ... -> an (forward only) with a param."""
    tensors = [Tensor(0, "x", (size,), "float32", 4 * size, TensorKind.INPUT, 0)]
    ops = []
    for i in range(n):
        tid = len(tensors)
        tensors.append(Tensor(tid, f"a{i}", (size,), "float32", 4 * size,
                              TensorKind.ACTIVATION, tid, producer=i))
        tensors[tid - 1].consumers.append(i)
        ops.append(Op(i, f"op{i}", "aten.relu.default", Phase.FORWARD,
                      OpCategory.ELEMENTWISE, [tid - 1], [tid]))
    return Graph(tensors, ops, outputs=[len(tensors) - 1])


def test_chain_liveness_table():
    g = chain()
    assert tensor_uses(g, [0, 1, 2, 3]) == {0: (-1, 0), 1: (0, 1), 2: (1, 2), 3: (2, 3), 4: (3, 3)}
    # x is static (400) ; at each step the input and output activations are live
    assert memory_per_step(g) == [800, 1200, 1200, 1200]
    assert layer_bytes(g, 0) == 400 and layer_bytes(g, 1) == 800
    peaks = reference_peaks(g)
    assert (peaks.network_wide, peaks.liveness, peaks.layer_lower_bound) == (2000, 1200, 1200)


def test_dfs_routes_finish_a_branch_before_the_next():
    """Fork op0 -> branch A (op1 -> op3) and branch B (op2) -> join op4. Capture order
    interleaves the branches (op1, op2, op3); both DFS routes finish branch A first."""
    tensors = [Tensor(0, "x", (1,), "float32", 4, TensorKind.INPUT, 0)]
    spec = [([0], 1), ([1], 2), ([1], 3), ([2], 4), ([4, 3], 5)]  # (inputs, output) per op
    ops = []
    for oid, (ins, out) in enumerate(spec):
        tensors.append(Tensor(out, f"t{out}", (1,), "float32", 4, TensorKind.ACTIVATION, out,
                              producer=oid))
        for i in ins:
            tensors[i].consumers.append(oid)
        ops.append(Op(oid, f"op{oid}", "aten.add.Tensor", Phase.FORWARD,
                      OpCategory.ELEMENTWISE, ins, [out]))
    g = Graph(tensors, ops, outputs=[5])
    g.validate()
    assert execution_order(g, "capture") == [0, 1, 2, 3, 4]
    assert execution_order(g, "superneurons") == [0, 1, 3, 2, 4]
    assert execution_order(g, "dfs") == [0, 1, 3, 2, 4]
    with pytest.raises(ValueError, match="unknown order"):
        execution_order(g, "bfs")

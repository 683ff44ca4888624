"""A hand-made training step with three parameter gradients (plain data, no torch)."""

from __future__ import annotations

from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind
from outcore.plan.schedule import Compute, Schedule

P, IN, A, G = (TensorKind.PARAMETER, TensorKind.INPUT, TensorKind.ACTIVATION,
               TensorKind.GRADIENT)


def three_layers(grad_bytes: int = 40, act_bytes: int = 400, dtypes: tuple[str, ...] = (
        "float32", "float32", "float32")) -> Graph:
    """x, w0..w2 -> f0 -> a0 -> f1 -> a1 -> f2 -> a2; backward b2 -> gw2 (+ d2), b1 -> gw1
    (+ d1), b0 -> gw0. ``gw_i`` are the parameter gradients (``source="grad:w_i"``)."""
    spec: list[tuple[str, int, TensorKind, str]] = [
        ("x", act_bytes, IN, "float32"),
        *((f"w{i}", grad_bytes, P, dtypes[i]) for i in range(3)),
        *((f"a{i}", act_bytes, A, "float32") for i in range(3)),
        ("d2", act_bytes, A, "float32"), ("d1", act_bytes, A, "float32"),
        *((f"gw{i}", grad_bytes, G, dtypes[i]) for i in range(3)),
    ]
    ids = {name: i for i, (name, *_rest) in enumerate(spec)}
    tensors = []
    for i, (name, nbytes, kind, dtype) in enumerate(spec):
        item = 2 if dtype in ("float16", "bfloat16") else 4
        t = Tensor(i, name, (nbytes // item,), dtype, nbytes, kind, i)
        if name.startswith("gw"):
            t.source = f"grad:w{name[2:]}"
        tensors.append(t)
    ops_spec = [("f0", Phase.FORWARD, ["x", "w0"], ["a0"]),
                ("f1", Phase.FORWARD, ["a0", "w1"], ["a1"]),
                ("f2", Phase.FORWARD, ["a1", "w2"], ["a2"]),
                ("b2", Phase.BACKWARD, ["a2", "a1", "w2"], ["gw2", "d2"]),
                ("b1", Phase.BACKWARD, ["d2", "a0", "w1"], ["gw1", "d1"]),
                ("b0", Phase.BACKWARD, ["d1", "x"], ["gw0"])]
    ops = []
    for oid, (name, phase, ins, outs) in enumerate(ops_spec):
        ops.append(Op(oid, name, f"test.{name}", phase, OpCategory.ELEMENTWISE,
                      [ids[t] for t in ins], [ids[t] for t in outs], flops=1.0,
                      bytes_touched=4))
        for t in ins:
            tensors[ids[t]].consumers.append(oid)
        for t in outs:
            tensors[ids[t]].producer = oid
    outputs = [ids[f"gw{i}"] for i in range(3)]
    graph = Graph(tensors, ops, outputs, name="three-layers")
    graph.validate()
    return graph


def keep_all(graph: Graph) -> Schedule:
    """Every op in order, nothing freed; the gradients kept to the end."""
    return Schedule([Compute(op.id) for op in graph.ops], keep_at_end=list(graph.outputs))

"""Shared by the policy tests: the spine's small models, and a builder of hand-made graphs
whose ops carry the categories and ATen targets the paper policies look at."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind

sys.path.insert(0, str(Path(__file__).parent.parent / "spine"))

#: short op kind -> (category, ATen-like target)
KINDS: dict[str, tuple[OpCategory, str]] = {
    "conv": (OpCategory.CONV, "aten.convolution.default"),
    "convbwd": (OpCategory.CONV, "aten.convolution_backward.default"),
    "relu": (OpCategory.ELEMENTWISE, "aten.relu.default"),
    "relubwd": (OpCategory.ELEMENTWISE, "aten.threshold_backward.default"),
    "pool": (OpCategory.POOL, "aten.max_pool2d_with_indices.default"),
    "poolbwd": (OpCategory.POOL, "aten.max_pool2d_with_indices_backward.default"),
    "mm": (OpCategory.MATMUL, "aten.mm.default"),
    "loss": (OpCategory.LOSS, "aten.nll_loss_forward.default"),
    "lossbwd": (OpCategory.LOSS, "aten.nll_loss_backward.default"),
    "add": (OpCategory.ELEMENTWISE, "aten.add.Tensor"),
}


def build_graph(tensors: list[tuple[str, int, TensorKind]],
                ops: list[tuple[str, Phase, str, list[str], list[str]]],
                outputs: list[str], name: str = "hand") -> Graph:
    """Tensors (name, bytes, kind) and ops (name, phase, kind from KINDS, inputs, outputs)."""
    ids = {n: i for i, (n, _, _) in enumerate(tensors)}
    ts = [Tensor(i, n, (max(b, 4) // 4,), "float32", b, k, i)
          for i, (n, b, k) in enumerate(tensors)]
    op_list = []
    for oid, (n, phase, kind, ins, outs) in enumerate(ops):
        category, target = KINDS[kind]
        op_list.append(Op(oid, n, target, phase, category, [ids[i] for i in ins],
                          [ids[o] for o in outs], flops=1.0, bytes_touched=4))
        for i in ins:
            ts[ids[i]].consumers.append(oid)
        for o in outs:
            ts[ids[o]].producer = oid
    graph = Graph(ts, op_list, [ids[o] for o in outputs], name=name)
    graph.validate()
    return graph


F, B = Phase.FORWARD, Phase.BACKWARD
P, ACT, GRAD = TensorKind.PARAMETER, TensorKind.ACTIVATION, TensorKind.GRADIENT


def cnn_graph() -> Graph:
    """conv0-relu0-pool0 - conv1-relu1-pool1 - conv2-relu2 - fc - loss, and its backward.

    Saved for backward: r0, idx0, p0 (X of conv1), r1, idx1, p1 (X of conv2), r2, y.
    Backward order: dloss dfc drelu2 dconv2 dpool1 drelu1 dconv1 dpool0 drelu0 dconv0.
    Every gradient map has the size of the map it is the gradient of.
    """
    sizes = {"c0": 200, "r0": 200, "p0": 100, "idx0": 800, "c1": 200, "r1": 200, "p1": 100,
             "idx1": 200, "c2": 200, "r2": 200, "y": 40}
    grads = {"gy": "y", "gr2": "r2", "gc2": "c2", "gp1": "p1", "gr1": "r1", "gc1": "c1",
             "gp0": "p0", "gr0": "r0", "gc0": "c0"}
    return build_graph(
        [("x", 100, TensorKind.INPUT), ("w0", 10, P), ("w1", 10, P), ("w2", 10, P),
         ("w3", 10, P), ("g", 4, TensorKind.TANGENT)]
        + [(n, b, ACT) for n, b in sizes.items()] + [("L", 4, TensorKind.OUTPUT)]
        + [(n, sizes[of], GRAD) for n, of in grads.items()]
        + [(f"gw{i}", 10, GRAD) for i in range(4)],
        [("conv0", F, "conv", ["x", "w0"], ["c0"]), ("relu0", F, "relu", ["c0"], ["r0"]),
         ("pool0", F, "pool", ["r0"], ["p0", "idx0"]),
         ("conv1", F, "conv", ["p0", "w1"], ["c1"]), ("relu1", F, "relu", ["c1"], ["r1"]),
         ("pool1", F, "pool", ["r1"], ["p1", "idx1"]),
         ("conv2", F, "conv", ["p1", "w2"], ["c2"]), ("relu2", F, "relu", ["c2"], ["r2"]),
         ("fc", F, "mm", ["r2", "w3"], ["y"]), ("loss", F, "loss", ["y"], ["L"]),
         ("dloss", B, "lossbwd", ["g", "y"], ["gy"]),
         ("dfc", B, "mm", ["gy", "r2", "w3"], ["gr2", "gw3"]),
         ("drelu2", B, "relubwd", ["gr2", "r2"], ["gc2"]),
         ("dconv2", B, "convbwd", ["gc2", "p1", "w2"], ["gp1", "gw2"]),
         ("dpool1", B, "poolbwd", ["gp1", "r1", "idx1"], ["gr1"]),
         ("drelu1", B, "relubwd", ["gr1", "r1"], ["gc1"]),
         ("dconv1", B, "convbwd", ["gc1", "p0", "w1"], ["gp0", "gw1"]),
         ("dpool0", B, "poolbwd", ["gp0", "r0", "idx0"], ["gr0"]),
         ("drelu0", B, "relubwd", ["gr0", "r0"], ["gc0"]),
         ("dconv0", B, "convbwd", ["gc0", "x", "w0"], ["gw0"])],
        outputs=["L", "gw0", "gw1", "gw2", "gw3"], name="cnn")


def chain_graph(n: int = 6, size: int = 400) -> Graph:
    """n conv-relu layers of ``size`` bytes each, then fc and loss: every relu output is
    saved, so keeping them all costs n * size while one layer needs about 3 * size."""
    tensors = [("x", 100, TensorKind.INPUT), ("g", 4, TensorKind.TANGENT), ("wf", 10, P),
               ("y", 40, ACT), ("L", 4, TensorKind.OUTPUT), ("gy", 40, GRAD), ("gwf", 10, GRAD)]
    ops: list[tuple[str, Phase, str, list[str], list[str]]] = []
    prev = "x"
    for i in range(1, n + 1):
        tensors += [(f"w{i}", 10, P), (f"c{i}", size, ACT), (f"r{i}", size, ACT),
                    (f"gr{i}", size, GRAD), (f"gc{i}", size, GRAD), (f"gw{i}", 10, GRAD)]
        ops += [(f"conv{i}", F, "conv", [prev, f"w{i}"], [f"c{i}"]),
                (f"relu{i}", F, "relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
    ops += [("fc", F, "mm", [prev, "wf"], ["y"]), ("loss", F, "loss", ["y"], ["L"]),
            ("dloss", B, "lossbwd", ["g", "y"], ["gy"]),
            ("dfc", B, "mm", ["gy", prev, "wf"], [f"gr{n}", "gwf"])]
    for i in range(n, 0, -1):
        x_in = f"r{i - 1}" if i > 1 else "x"
        outs = ([f"gr{i - 1}"] if i > 1 else []) + [f"gw{i}"]
        ops += [(f"drelu{i}", B, "relubwd", [f"gr{i}", f"r{i}"], [f"gc{i}"]),
                (f"dconv{i}", B, "convbwd", [f"gc{i}", x_in, f"w{i}"], outs)]
    return build_graph(tensors, ops, ["L", "gwf"] + [f"gw{i}" for i in range(1, n + 1)],
                       name=f"chain{n}")


@pytest.fixture
def cnn() -> Graph:
    return cnn_graph()


@pytest.fixture
def chain() -> Graph:
    return chain_graph()

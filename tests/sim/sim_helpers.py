"""Hand-made graphs and a table-driven cost model with known answers."""

from __future__ import annotations

from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind


class TableCost:
    """Op time by op name, copies at a fixed bandwidth per direction (bytes/s), no latency."""

    def __init__(self, times: dict[str, float], *, d2h: float = 1.0, h2d: float = 1.0,
                 engines: int = 2, workspace: dict[str, int] | None = None,
                 default: float = 1.0) -> None:
        self.times = times
        self.bandwidth = {"d2h": d2h, "h2d": h2d}
        self.copy_engines = engines
        self.ws = workspace or {}
        self.default = default

    def op_time(self, op: Op) -> float:
        return self.times.get(op.name, self.default)

    def transfer_time(self, nbytes: int, direction: str) -> float:
        return nbytes / self.bandwidth[direction]

    def bind(self, graph):  # needs nothing from the graph
        return self

    def workspace(self, op: Op) -> int:
        return self.ws.get(op.name, 0)


def make_graph(tensors: list[tuple[str, int, TensorKind]],
               ops: list[tuple[str, Phase, list[str], list[str]]],
               outputs: list[str], *, views: dict[str, str] | None = None,
               name: str = "hand") -> Graph:
    """Build a Graph from names: tensors (name, bytes, kind), ops (name, phase, inputs,
    outputs); ``views`` maps a view tensor's name to its base's name (views carry 0 bytes)."""
    views = views or {}
    ids = {n: i for i, (n, _, _) in enumerate(tensors)}
    ts = [Tensor(i, n, (max(b, 4) // 4,), "float32", 0 if n in views else b, k,
                 ids[views[n]] if n in views else i)
          for i, (n, b, k) in enumerate(tensors)]
    op_list = []
    for oid, (n, phase, ins, outs) in enumerate(ops):
        category = OpCategory.VIEW if any(o in views for o in outs) else OpCategory.ELEMENTWISE
        op_list.append(Op(oid, n, f"test.{n}", phase, category, [ids[i] for i in ins],
                          [ids[o] for o in outs], flops=1.0, bytes_touched=4))
        for i in ins:
            ts[ids[i]].consumers.append(oid)
        for o in outs:
            ts[ids[o]].producer = oid
    graph = Graph(ts, op_list, [ids[o] for o in outputs], name=name)
    graph.validate()
    return graph


F, B = Phase.FORWARD, Phase.BACKWARD
ACT, GRAD, INPUT = TensorKind.ACTIVATION, TensorKind.GRADIENT, TensorKind.INPUT


def chain3(sizes: tuple[int, int, int, int] = (100, 200, 300, 400)) -> Graph:
    """x -> f0 -> a0 -> f1 -> a1 -> f2 -> a2 ; b2(a2) -> g2 ; b1(g2, a1) -> g1 ; b0(g1, a0) -> g0.

    a0 is read by f1 (forward) and b0 (backward): the natural tensor to offload.
    Sizes: x, a0, a1, a2; every gradient is 10 bytes.
    """
    x, a0, a1, a2 = sizes
    return make_graph(
        [("x", x, INPUT), ("a0", a0, ACT), ("a1", a1, ACT), ("a2", a2, ACT),
         ("g2", 10, GRAD), ("g1", 10, GRAD), ("g0", 10, GRAD)],
        [("f0", F, ["x"], ["a0"]), ("f1", F, ["a0"], ["a1"]), ("f2", F, ["a1"], ["a2"]),
         ("b2", B, ["a2"], ["g2"]), ("b1", B, ["g2", "a1"], ["g1"]),
         ("b0", B, ["g1", "a0"], ["g0"])],
        outputs=["g0"], name="chain3")

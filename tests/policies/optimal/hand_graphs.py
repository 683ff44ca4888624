"""A builder of small hand-made Graphs for the exact-model tests (tensors and ops in order,
producers and consumers wired, ``bytes_touched`` the bytes of an op's inputs and outputs)."""

from __future__ import annotations

from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind


class HandGraph:
    """Add tensors, then ops reading and writing them; ``graph`` validates the result."""

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []

    def tensor(self, name: str, nbytes: int, kind: TensorKind) -> int:
        """A new float32 base tensor of ``nbytes``; returns its id."""
        tid = len(self.tensors)
        self.tensors.append(Tensor(tid, name, (nbytes // 4,), "float32", nbytes, kind, tid))
        return tid

    def op(self, name: str, cat: OpCategory, phase: Phase, ins: list[int], outs: list[int],
           flops: float) -> None:
        """A new op reading ``ins`` and producing ``outs``."""
        oid = len(self.ops)
        for i in ins:
            self.tensors[i].consumers.append(oid)
        for o in outs:
            self.tensors[o].producer = oid
        touched = sum(self.tensors[x].nbytes for x in (*ins, *outs))
        self.ops.append(Op(oid, name, f"synthetic.{cat.value}", phase, cat, ins, outs,
                           flops=flops, bytes_touched=touched))

    def graph(self, outputs: list[int], name: str) -> Graph:
        """The Graph, validated."""
        graph = Graph(self.tensors, self.ops, outputs=outputs, name=name)
        graph.validate()
        return graph

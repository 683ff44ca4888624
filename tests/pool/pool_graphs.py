"""Hand-made training graphs (forward + backward) for the pool tests, from outcore's IR types.

``training_graph(layers)`` builds a forward chain/DAG from layer specs and derives the
backward the way autograd would: one backward op per forward op (reading the output's
gradient and the forward inputs it saves), partial input gradients summed by an ``add``
when a tensor feeds several layers, parameter gradients kept to the end of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind


@dataclass
class Layer:
    """A forward layer: reads ``inputs`` (names of earlier layers, or "x"), writes ``nbytes``.

    ``param`` > 0 adds a parameter of that many bytes; ``view`` makes the output a view of
    the first input (0 bytes of its own).
    """

    name: str
    inputs: list[str]
    nbytes: int
    category: OpCategory = OpCategory.ELEMENTWISE
    param: int = 0
    view: bool = False


@dataclass
class _Builder:
    tensors: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)

    def tensor(self, name: str, nbytes: int, kind: TensorKind, producer: int | None = None,
               view_of: int | None = None) -> int:
        tid = len(self.tensors)
        storage = tid if view_of is None else self.tensors[view_of].storage
        self.tensors.append(Tensor(id=tid, name=name, shape=(max(nbytes, 4) // 4,),
                                   dtype="float32", nbytes=0 if view_of is not None else nbytes,
                                   kind=kind, storage=storage, producer=producer))
        return tid

    def op(self, name: str, category: OpCategory, phase: Phase, inputs: list[int],
           outputs: list[tuple[str, int, TensorKind, int | None]]) -> list[int]:
        oid = len(self.ops)
        outs = [self.tensor(n, b, k, producer=oid, view_of=v) for n, b, k, v in outputs]
        self.ops.append(Op(id=oid, name=name, target=f"aten.{name}.default", phase=phase,
                           category=category, inputs=list(inputs), outputs=outs))
        for tid in inputs:
            self.tensors[tid].consumers.append(oid)
        return outs


def training_graph(layers: list[Layer], input_bytes: int = 4096, name: str = "handmade") -> Graph:
    """A forward + backward graph for ``layers`` (the last layer is the loss)."""
    b = _Builder()
    act: dict[str, int] = {"x": b.tensor("x", input_bytes, TensorKind.INPUT)}
    params: dict[str, int] = {}
    for layer in layers:
        inputs = [act[i] for i in layer.inputs]
        if layer.param:
            params[layer.name] = b.tensor(f"{layer.name}.weight", layer.param, TensorKind.PARAMETER)
            inputs.append(params[layer.name])
        view_of = inputs[0] if layer.view else None
        kind = TensorKind.OUTPUT if layer is layers[-1] else TensorKind.ACTIVATION
        (act[layer.name],) = b.op(layer.name, layer.category, Phase.FORWARD, inputs,
                                  [(layer.name, layer.nbytes, kind, view_of)])
    outputs = [act[layers[-1].name]]
    grads: dict[str, int] = {}
    for layer in reversed(layers):
        g_out = grads.get(layer.name)
        fwd_inputs = [act[i] for i in layer.inputs] + ([params[layer.name]] if layer.param else [])
        reads = fwd_inputs + ([g_out] if g_out is not None else [])
        specs = [(f"g_{i}_from_{layer.name}", b.tensors[b.tensors[act[i]].storage].nbytes,
                  TensorKind.ACTIVATION, None) for i in layer.inputs if i != "x"]
        if layer.param:
            specs.append((f"grad:{layer.name}.weight", layer.param, TensorKind.GRADIENT, None))
        if not specs:
            continue
        outs = b.op(f"{layer.name}_backward", layer.category, Phase.BACKWARD, reads, specs)
        if layer.param:
            outputs.append(outs[-1])
        for i, g in zip([i for i in layer.inputs if i != "x"], outs, strict=False):
            if i in grads:
                (grads[i],) = b.op(f"add_grad_{i}", OpCategory.ELEMENTWISE, Phase.BACKWARD,
                                   [grads[i], g], [(f"g_{i}", b.tensors[g].nbytes,
                                                    TensorKind.ACTIVATION, None)])
            else:
                grads[i] = g
    graph = Graph(tensors=b.tensors, ops=b.ops, outputs=outputs, name=name)
    graph.validate()
    return graph


def residual_net(blocks: int, width: int = 1 << 20, batch_scale: int = 1) -> list[Layer]:
    """A ResNet-like stack: conv-relu-conv, add the shortcut, relu; then an FC and a loss."""
    w = width * batch_scale
    layers = [Layer("stem", ["x"], w, OpCategory.CONV, param=4096)]
    prev = "stem"
    for k in range(blocks):
        layers += [
            Layer(f"c{k}a", [prev], w, OpCategory.CONV, param=9 * 4096),
            Layer(f"r{k}a", [f"c{k}a"], w),
            Layer(f"c{k}b", [f"r{k}a"], w, OpCategory.CONV, param=9 * 4096),
            Layer(f"add{k}", [f"c{k}b", prev], w),
            Layer(f"r{k}", [f"add{k}"], w),
        ]
        prev = f"r{k}"
    layers += [
        Layer("pool", [prev], w // 64, OpCategory.POOL),
        Layer("flat", ["pool"], 0, OpCategory.VIEW, view=True),
        Layer("fc", ["flat"], 4000, OpCategory.MATMUL, param=40_000),
        Layer("loss", ["fc"], 4, OpCategory.LOSS),
    ]
    return layers

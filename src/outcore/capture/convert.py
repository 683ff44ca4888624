"""Convert an exported joint ATen FX graph into the plain-data IR.

* ``getitem`` nodes are folded: a multi-output op owns one Tensor per tensor it returns
  (also the ones nobody reads: they are allocated all the same).
* Aliasing comes from the fake storages in ``node.meta['val']``: every meta value stays alive
  with the graph, so equal StorageImpl pointers mean shared memory. The first tensor of a
  storage is its base and carries the bytes; later ones are views with 0 bytes.
* Kinds come from the export's descriptors: parameters, buffers, plain inputs, the tangent;
  gradients of parameters, the loss, buffer updates and specialisation guards (plain outputs
  after the loss) from the output descriptors.
* ``get_attr`` nodes are tensor constants the export lifted (masks, position tables, a
  ``torch.tensor(...)`` built in forward): static tensors of kind BUFFER with source
  ``const:<attribute>``, read from the GraphModule when the step runs.
* A node outcore cannot hold raises CaptureError naming the node, the module it came from
  (``nn_module_stack``) and what to do; never a bare ValueError.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from outcore.capture.effect_tokens import TOKEN_INPUTS, TOKEN_OUTPUTS, strip_effect_tokens
from outcore.errors import CaptureError
from outcore.graph.categories import categorize
from outcore.graph.dtypes import itemsize
from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind

_RANDOM_MARKERS = ("dropout", "bernoulli", "rand", "normal", "multinomial", "uniform")


@dataclass
class NodeMap:
    """How the FX graph maps onto the IR (kept beside the Graph for the executor)."""

    op_nodes: list[fx.Node] = field(default_factory=list)
    node_tensors: dict[fx.Node, int] = field(default_factory=dict)  # single-tensor nodes
    op_outputs: dict[fx.Node, list[int | None]] = field(default_factory=dict)  # per return slot
    placeholders: dict[int, Any] = field(default_factory=dict)  # tensor id -> descriptor
    constants: dict[int, str] = field(default_factory=dict)  # tensor id -> get_attr target
    output_roles: list[tuple[str, int, str]] = field(default_factory=list)  # role, tid, name
    #: guards on a tensor constant (a value the forward built and read back: Qwen2-VL's
    #: image grid sizes): (guard index, get_attr target); not outputs, since a constant never
    #: changes. A user's tensor held outside the step is no such constant: its read is a
    #: traced op (``tests/spine/test_value_reads.py``)
    constant_guards: list[tuple[int, str]] = field(default_factory=list)


def target_name(target: Any) -> str:
    """An op's name as the graph records it (``Op.target``): ``aten.<overload>`` for ATen ops."""
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_BACKWARD_KINDS = frozenset({TensorKind.TANGENT, TensorKind.GRADIENT})


def _phase(node: fx.Node, input_kinds: list[TensorKind]) -> Phase:
    """BACKWARD when aot_autograd tagged the node so (``partitioner_tag``), or when it reads
    a tangent or a backward op's output: only the backward has those. aot_autograd leaves
    the ops a user's ``torch.autograd.Function.backward`` runs untagged when the step comes
    through dynamo (a gradient-reversal layer's ``-lam * g``), and lowering runs every
    FORWARD op before the backward, so such an op ran before its input existed."""
    tag = node.meta.get("partitioner_tag", "is_forward")
    if tag == "is_backward" or any(k in _BACKWARD_KINDS for k in input_kinds):
        return Phase.BACKWARD
    return Phase.FORWARD


class _Builder:
    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.storage_owner: dict[Any, int] = {}
        self.on_cpu: list[bool] = []  # per tensor id: its value lives in host memory
        # The device type the step computes on, decided once from the traced values: the
        # first accelerator among them (placeholders come first in the joint graph, so every
        # op is walked after it is known), else "cpu". See ``first_accelerator``.
        self.step_device = "cpu"
        self.map = NodeMap()
        self.kept = 0  # the model's outputs kept, the last forward outputs (``build_graph``)

    def add_tensor(self, val: torch.Tensor, name: str, kind: TensorKind,
                   producer: int | None, source: str = "", storage_key: Any = None) -> int:
        """``storage_key``: what identifies the storage (default: ``val``'s own storage)."""
        tid = len(self.tensors)
        if val.layout != torch.strided:
            raise CaptureError(
                f"the step makes {name!r}, a {val.layout} tensor; outcore plans dense (strided) "
                "tensors only. nn.Embedding(sparse=True) / nn.EmbeddingBag(sparse=True) and "
                "F.embedding(..., sparse=True) make sparse gradients: use sparse=False (the "
                "gradient is then dense; SGD's update is the same)")
        key = val.untyped_storage()._cdata if storage_key is None else storage_key
        base = self.storage_owner.setdefault(key, tid)
        nbytes = val.untyped_storage().nbytes() if base == tid else 0
        self.on_cpu.append(val.device.type == "cpu")
        if self.step_device == "cpu" and first_accelerator([val]) is not None:
            self.step_device = val.device.type
        self.tensors.append(Tensor(id=tid, name=name, shape=tuple(int(s) for s in val.shape),
                                   dtype=_dtype_name(val.dtype), nbytes=int(nbytes), kind=kind,
                                   storage=base, producer=producer, source=source))
        return tid

    def placeholder(self, node: fx.Node) -> None:
        desc = node.meta.get("desc")
        kind, source = (TensorKind.INPUT, "") if desc is None else _placeholder_role(desc)
        tid = self.add_tensor(node.meta["val"], node.name, kind, None, source)
        self.map.node_tensors[node] = tid
        self.map.placeholders[tid] = desc

    def constant(self, node: fx.Node) -> None:
        """A lifted tensor constant (``get_attr``): static, owned by the captured module."""
        value = attribute(self.gm, str(node.target))
        if isinstance(value, torch.Generator):
            raise CaptureError(
                "the step draws random numbers with its own torch.Generator (generator=...), "
                "which a captured step cannot carry from step to step. Draw from torch's "
                "default generator (leave out generator=; outcore repeats its draws as "
                "eager does, seeded by torch.manual_seed), or "
                "draw in the data loader and pass the numbers in the batch.")
        if not isinstance(value, torch.Tensor):
            raise _node_error(node, f"reads the attribute {node.target!r}, a "
                              f"{type(value).__name__}, where a tensor constant was expected")
        val = node.meta.get("val", value)
        # several get_attr nodes may read one constant (the forward's and the backward's
        # uses): each its own fake value, but one real tensor, so one storage
        tid = self.add_tensor(val, node.name, TensorKind.BUFFER, None, f"const:{node.target}",
                              storage_key=("constant", str(node.target)))
        self.map.node_tensors[node] = tid
        self.map.constants[tid] = str(node.target)

    def call(self, node: fx.Node) -> None:
        if node.target is operator.getitem:
            parent, index = node.args
            if not isinstance(parent, fx.Node) or not isinstance(index, int):
                raise _node_error(node, f"reads ({type(parent).__name__}, "
                                  f"{type(index).__name__}); a getitem must read (node, int)")
            slot = self.map.op_outputs[parent][index]
            if slot is not None:
                self.map.node_tensors[node] = slot
                self.tensors[slot].name = node.name
            return
        oid = len(self.ops)
        inputs = self._inputs(node)
        phase = _phase(node, [self.tensors[t].kind for t in inputs])
        kind = TensorKind.ACTIVATION if phase is Phase.FORWARD else TensorKind.GRADIENT
        if "val" not in node.meta and not _returns_nothing(node):
            raise _node_error(node, "has no traced value (meta['val']), so its size is unknown")
        val = node.meta.get("val")  # None: an op run for its effect (``_assert_async``)
        outputs: list[int] = []
        scratch = 0
        if isinstance(val, (tuple, list)):
            scratch = _scratch_bytes(node, val)
            slots: list[int | None] = []
            masked = _masked_outputs(node)
            for i, v in enumerate(val):
                if isinstance(v, torch.Tensor) and i not in masked:
                    tid = self.add_tensor(v, f"{node.name}.{i}", kind, oid)
                    outputs.append(tid)
                    slots.append(tid)
                else:
                    slots.append(None)
            self.map.op_outputs[node] = slots
        elif isinstance(val, torch.Tensor):
            tid = self.add_tensor(val, node.name, kind, oid)
            outputs.append(tid)
            self.map.node_tensors[node] = tid
        target = target_name(node.target)
        category = categorize(target)
        for tid in inputs:
            if oid not in self.tensors[tid].consumers:
                self.tensors[tid].consumers.append(oid)
        self.ops.append(Op(id=oid, name=node.name, target=target, phase=phase,
                           category=category, inputs=inputs, outputs=outputs,
                           flops=fx_flops(node), bytes_touched=self._bytes(inputs, outputs),
                           random=_is_random(node, target), temporaries=scratch,
                           variant_options=_variant_options(node, target,
                                                                            self.step_device)))
        self.map.op_nodes.append(node)

    def _inputs(self, node: fx.Node) -> list[int]:
        seen: list[int] = []
        for arg in node.all_input_nodes:
            tid = self.map.node_tensors.get(arg)
            if tid is None:
                raise _node_error(node, f"reads {arg.name} ({arg.op}), which holds no tensor")
            if tid not in seen:
                seen.append(tid)
        return seen

    def _bytes(self, inputs: list[int], outputs: list[int]) -> int:
        total = 0
        for tid in inputs + outputs:
            t = self.tensors[tid]
            numel = 1
            for s in t.shape:
                numel *= s
            total += numel * itemsize(t.dtype)
        return total

    def output(self, node: fx.Node) -> list[int]:
        descs = node.meta.get("desc") or []
        values = node.args[0]
        if not isinstance(values, (tuple, list)):
            raise _node_error(node, f"returns a {type(values).__name__}, not a tuple or list")
        result: list[int] = []
        plain = [d.idx for d in descs if type(d).__name__ == "PlainAOTOutput"]
        first_kept = (max(plain) + 1 - self.kept) if self.kept and plain else None
        for value, desc in zip(values, descs, strict=False):
            if not isinstance(value, fx.Node):
                continue
            tid = self.map.node_tensors[value]
            cls = type(desc).__name__
            if first_kept is not None and cls == "PlainAOTOutput" and desc.idx >= first_kept:
                role, name = "output", str(desc.idx - first_kept)  # the model's, kept
                self.tensors[tid].kind = TensorKind.OUTPUT
                self.tensors[tid].source = f"output:{name}"
            elif cls == "GradAOTOutput":
                fallback = f"input:{getattr(desc.grad_of, 'idx', '?')}"
                role, name = "grad", getattr(desc.grad_of, "target", fallback)
                self.tensors[tid].source = f"grad:{name}"
            elif cls in TOKEN_OUTPUTS:  # the token placeholder itself (``effect_tokens``)
                role, name = "token", "token"
            elif cls == "InputMutationAOTOutput":
                role, name = "buffer", getattr(desc.mutated_input, "target",
                                               f"input:{getattr(desc.mutated_input, 'idx', '?')}")
                self.tensors[tid].kind = TensorKind.OUTPUT
                self.tensors[tid].source = f"update:{name}"
            elif getattr(desc, "idx", 0) > 0 and value.op == "get_attr":
                self.map.constant_guards.append((desc.idx - 1, str(value.target)))
                continue
            elif getattr(desc, "idx", 0) > 0:  # a specialisation guard (after the loss)
                role, name = "guard", str(desc.idx - 1)
                self.tensors[tid].kind = TensorKind.OUTPUT
                self.tensors[tid].source = f"guard:{name}"
            else:
                role, name = "loss", "loss"
                self.tensors[tid].kind = TensorKind.OUTPUT
                self.tensors[tid].source = "loss"
            self.map.output_roles.append((role, tid, name))
            result.append(tid)
        return result


def _returns_nothing(node: fx.Node) -> bool:
    """An ATen op whose schema returns nothing (``aten._assert_async``: a check, kept so
    that the step raises where eager does)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and not schema.returns


#: ``node.meta`` key: positions of a multi-output op's outputs that nothing reads, marked so
#: by a graph rewrite (``outcore.compiled.dropout``): the kernel allocates them and they are
#: dropped when it returns, so they are the op's scratch (``Op.temporaries``), not tensors.
SCRATCH_OUTPUTS = "outcore_scratch_outputs"


def _scratch_bytes(node: fx.Node, val: Any) -> int:
    """Bytes of ``node``'s outputs marked ``SCRATCH_OUTPUTS`` (0 when none are)."""
    marked = node.meta.get(SCRATCH_OUTPUTS, ())
    return sum(int(v.untyped_storage().nbytes()) for i, v in enumerate(val)
               if i in marked and isinstance(v, torch.Tensor))


def _masked_outputs(node: fx.Node) -> set[int]:
    """Output positions an ``output_mask`` argument turns off (``native_batch_norm_backward``
    with ``[False, True, True]``): the real kernel returns no tensor there, although the fake
    one may, so the graph must not count one (it over-predicted the peak by that tensor);
    and those marked ``SCRATCH_OUTPUTS`` (counted as the op's temporaries instead)."""
    scratch = set(node.meta.get(SCRATCH_OUTPUTS, ()))
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return scratch
    for k, arg in enumerate(schema.arguments):
        if arg.name == "output_mask":
            mask = node.args[k] if k < len(node.args) else node.kwargs.get("output_mask")
            if isinstance(mask, (list, tuple)):
                return scratch | {i for i, on in enumerate(mask) if on is False}
    return scratch


def _placeholder_role(desc: Any) -> tuple[TensorKind, str]:
    """Kind and source of a placeholder from its AOT input descriptor.

    Descriptors are matched by class name: their module (torch._functorch) is private.
    """
    cls = type(desc).__name__
    if cls == "ParamAOTInput":
        return TensorKind.PARAMETER, desc.target
    if cls == "BufferAOTInput":
        return TensorKind.BUFFER, desc.target
    if cls == "TangentAOTInput":
        return TensorKind.TANGENT, ""
    if cls in TOKEN_INPUTS:  # an effect token: 0 bytes, never read (``effect_tokens``)
        return TensorKind.BUFFER, "token"
    if cls == "PlainAOTInput":
        return TensorKind.INPUT, f"input:{desc.idx}"
    return TensorKind.INPUT, ""


def _variant_options(node: fx.Node, target: str,
                     device: str) -> dict[str, dict[str, Any]]:
    """Every operator algorithm outcore has for this op: workspace, speed relative to the
    framework kernel measured on this CPU ("speed") and assumed on a GPU for this op's
    own kernel and stride ("gpu_speed", ``outcore.cost.gpu_variants``), or the reason it
    cannot run it (groups, dilation, dtype, ...; on a step computing on ``device`` other
    than the CPU, every variant but the framework's)."""
    from outcore.cost.gpu_variants import gpu_time_factor_for
    from outcore.variants import registry, support
    from outcore.variants.names import is_framework
    from outcore.variants.speeds import relative_speed
    from outcore.variants.torchmeta import arg_meta_of, kwarg_meta_of

    names = registry.variants_for(target)
    if len(names) <= 1:
        return {}
    args, kwargs = arg_meta_of(node.args), kwarg_meta_of(node.kwargs)
    options: dict[str, dict[str, Any]] = {}
    for variant in names:
        reason = (support.refusal(target, variant, args, kwargs) if device == "cpu" else
                  None if is_framework(variant) else
                  f"the step runs on {device}, where PyTorch's kernel library chooses the "
                  "algorithm itself (cuDNN's convolution algorithms, fused attention); "
                  "outcore's variants run on the CPU devices only (on a GPU their "
                  "frequency-major layouts need copies no plan counts, and eager convolution "
                  "there runs TF32)")
        if reason is not None:
            options[variant] = {"refused": reason}
            continue
        options[variant] = {"workspace": registry.workspace_bytes(target, variant, args, kwargs),
                            "speed": relative_speed(target, variant, args, kwargs),
                            "gpu_speed": gpu_time_factor_for(target, variant, args)}
    return options


def _mark_host(builder: _Builder) -> None:
    """On an accelerator step, flag ``Tensor.host`` on what ops return in host memory: outputs
    whose traced value is on the CPU, and the 0-dim int64 outputs of fused attention (its
    philox seed and offset, CPU tensors when eager runs it although tracing may describe them
    on the device)."""
    for t, on_cpu in zip(builder.tensors, builder.on_cpu, strict=True):
        t.host = on_cpu and t.producer is not None
    for op in builder.ops:
        if "scaled_dot_product" in op.target and "backward" not in op.target:
            for tid in op.outputs:
                t = builder.tensors[tid]
                t.host = t.host or (t.shape == () and t.dtype == "int64")


def first_accelerator(values: Any) -> torch.device | None:
    """The device of the first tensor among ``values`` that is on an accelerator (neither the
    CPU nor meta), or None. The one rule for "the device a step computes on", for traced
    values at capture and real ones at binding: parameters held in host memory
    (``outcore.weights``) are CPU tensors of an accelerator step, hence "first accelerator",
    not "first tensor"."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta"):
            return value.device
    return None


def _is_random(node: fx.Node, target: str) -> bool:
    """Ops that draw from the RNG: those ATen tags ``nondeterministic_seeded`` (dropout,
    bernoulli, rand*, randn*, randint*, normal, multinomial, ...), by name the ones it does
    not tag, and attention with a dropout probability above 0; never a backward."""
    if "backward" in target:
        return False
    tags = getattr(node.target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags:
        return True
    if any(m in target for m in _RANDOM_MARKERS):
        return True
    dropout = _argument(node, "dropout_p")
    return isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and dropout > 0


def _argument(node: fx.Node, name: str) -> Any:
    """The value of the argument ``name`` of an ATen call (by its schema), or None."""
    if name in node.kwargs:
        return node.kwargs[name]
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) else None
    return None


def attribute(gm: fx.GraphModule, target: str) -> Any:
    """What ``gm`` holds at the dotted ``get_attr`` target (``"sub._tensor_constant0"``)."""
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _module_of(node: fx.Node) -> str:
    """The module a node came from, from ``nn_module_stack`` (innermost last)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "no module (the loss or top-level code)"
    path, cls = list(stack.values())[-1]
    name = getattr(cls, "__name__", str(cls))
    return f"{path} ({name})"


def _node_error(node: fx.Node, what: str) -> CaptureError:
    return CaptureError(
        f"cannot capture node {node.name} ({node.op} {target_name(node.target)}) from module "
        f"{_module_of(node)}: it {what}. Way out: run that part outside the model (e.g. in the "
        "data loader), rewrite it with plain torch operations, or report the node kind to "
        "outcore with this message.")


def _grouped_mm_flops(mat_a: torch.Tensor, mat_b: torch.Tensor, *args: Any,
                      out_val: torch.Tensor, **kwargs: Any) -> float:
    """FLOPs of ``aten._grouped_mm`` (torch's registry has no formula: a mixture of experts'
    matmuls would count one per output element). Each output element is a dot product over
    ``mat_a``'s last dimension, except for two 2D operands, whose groups split that
    dimension: ``(M, K) x (K, N)`` makes ``(groups, M, N)`` from ``2 M K N`` FLOPs."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        return 2.0 * mat_a.size(0) * mat_a.size(1) * mat_b.size(1)
    return 2.0 * out_val.numel() * mat_a.size(-1)


#: FLOP formulas for ops torch's ``flop_registry`` lacks, keyed like it (overload packets).
_MORE_FLOPS: dict[Any, Callable[..., float]] = {torch.ops.aten._grouped_mm: _grouped_mm_flops}


def fx_flops(node: fx.Node) -> float:
    """FLOPs of an FX call node from torch's flop registry (matmul, conv, attention) or
    ``_MORE_FLOPS``, read off its arguments' ``meta["val"]``; else one per output element."""
    from torch.utils.flop_counter import flop_registry

    packet = getattr(node.target, "overloadpacket", None)
    args = fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: n.meta.get("val"))
    if packet in _MORE_FLOPS:
        return float(_MORE_FLOPS[packet](*args, **kwargs, out_val=node.meta["val"]))
    if packet in flop_registry:
        try:
            return float(flop_registry[packet](*args, **kwargs, out_val=node.meta["val"]))
        except Exception:  # noqa: BLE001 - a formula not covering this overload: fall back
            pass
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return float(sum(v.numel() for v in vals if isinstance(v, torch.Tensor)))


def build_graph(gm: fx.GraphModule, name: str, kept: int = 0) -> tuple[Graph, NodeMap]:
    """Walk ``gm`` once and return the IR and its node map. The graph is validated.
    ``kept``: the last ``kept`` forward outputs are the model's output, kept for the user
    (``TrainingStep.keep_outputs``: role "output")."""
    strip_effect_tokens(gm)  # an ordered side effect (linalg's error check) runs plainly
    builder = _Builder(gm)
    builder.kept = kept
    outputs: list[int] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            builder.placeholder(node)
        elif node.op == "call_function":
            builder.call(node)
        elif node.op == "get_attr":
            builder.constant(node)
        elif node.op == "output":
            outputs = builder.output(node)
        else:
            raise _node_error(node, f"is a {node.op} node, which the joint graph should not "
                              "contain")
    if builder.step_device != "cpu":  # mark what its ops return in host memory
        _mark_host(builder)
    graph = Graph(tensors=builder.tensors, ops=builder.ops, outputs=outputs, name=name)
    graph.validate()
    _mark_categories(graph)
    return graph, builder.map


def _mark_categories(graph: Graph) -> None:
    """Ops whose every output is a view of an input are VIEW, whatever their name says."""
    for op in graph.ops:
        if op.outputs and all(graph.tensors[t].is_view for t in op.outputs) and any(
                graph.tensors[t].storage in {graph.tensors[i].storage for i in op.inputs}
                for t in op.outputs):
            op.category = OpCategory.VIEW
            op.flops = 0.0

"""The dataflow graph of one training step, as plain data (no torch import).

A Graph holds Tensors and Ops. Ops are stored in capture order, which is a valid
topological order. Invariants (checked by ``Graph.validate``):

* every tensor id is its index in ``Graph.tensors``; every op id its index in ``Graph.ops``;
* a tensor has at most one producer; graph inputs (parameters, buffers, inputs, tangents)
  have none, every other tensor has one;
* ``storage`` groups tensors that share memory: a view's storage is its base's storage, and
  only the base (``tensor.id == tensor.storage``) carries the storage's bytes;
* an op's inputs are produced by earlier ops (or are graph inputs).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from outcore.errors import GraphError
from outcore.variants.names import is_framework


class TensorKind(StrEnum):
    """What a tensor is for; decides who owns it and whether a policy may move it."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    INPUT = "input"
    TANGENT = "tangent"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    WORKSPACE = "workspace"
    OUTPUT = "output"


#: Kinds that exist before the step starts and are owned by the user (never freed by a plan).
STATIC_KINDS = frozenset({TensorKind.PARAMETER, TensorKind.BUFFER, TensorKind.INPUT,
                          TensorKind.TANGENT})


class Phase(StrEnum):
    """Which part of the training step an op belongs to."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


class OpCategory(StrEnum):
    """Coarse op families, used by the cost model and by policies (vDNN-conv, cheap ops)."""

    CONV = "conv"
    MATMUL = "matmul"
    NORM = "norm"
    POOL = "pool"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    VIEW = "view"
    DROPOUT = "dropout"
    LOSS = "loss"
    ATTENTION = "attention"
    CONCAT = "concat"
    OTHER = "other"


@dataclass
class Tensor:
    """One value of the graph.

    ``nbytes`` is the bytes of the storage this tensor owns: 0 for a view (its base owns
    them). ``storage`` is the id of the base tensor whose storage this one lives in.
    ``host`` marks a tensor an op returns in host memory although the step runs on an
    accelerator (the RNG seed and offset of CUDA's fused attention): no policy may offload
    or recompute it (it is never among ``Graph.activations``); its bytes still count, as the
    executor's tracker counts every output. ``outcore.compiled`` flags the same way the
    outputs of random ops its compiled backward cannot draw again (eager dropout masks).
    """

    id: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    kind: TensorKind
    storage: int
    producer: int | None = None
    consumers: list[int] = field(default_factory=list)
    source: str = ""  # parameter/buffer name, or "grad:<param>" for gradients
    host: bool = False  # returned in host memory on an accelerator step (see above)

    @property
    def is_view(self) -> bool:
        """True when the tensor aliases another tensor's storage."""
        return self.storage != self.id


@dataclass
class Op:
    """One operator call. ``outputs`` lists every tensor it returns, in return order."""

    id: int
    name: str
    target: str
    phase: Phase
    category: OpCategory
    inputs: list[int]
    outputs: list[int]
    flops: float = 0.0
    bytes_touched: int = 0
    random: bool = False  # consumes RNG state (dropout); recompute must replay it
    variant: str = ""  # operator algorithm chosen (see outcore.variants); "" = framework default
    # operator algorithms this op could run: name -> {"workspace": bytes, "speed": time
    # relative to the framework kernel measured on this CPU} or {"refused": reason}
    variant_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # bytes the kernel allocates for itself and frees before it returns (convolution
    # backward's column buffers, a norm's scratch), measured per op by the allocator
    # (``outcore.cost.measure_temporaries``); 0 when not measured. The memory rule holds
    # them during each Compute of the op (``outcore.plan.residency``).
    temporaries: int = 0

    def variant_workspace(self, variant: str) -> int:
        """Workspace bytes of ``variant`` on this op (0 for the framework kernel)."""
        if is_framework(variant):
            return 0
        return int(self.variant_options.get(variant, {}).get("workspace", 0))


@dataclass
class Graph:
    """A captured training step. ``source`` is an opaque handle to the torch artifact the
    executor needs (an FX GraphModule); it is never serialised."""

    tensors: list[Tensor]
    ops: list[Op]
    outputs: list[int]
    name: str = "graph"
    meta: dict[str, Any] = field(default_factory=dict)
    source: Any = field(default=None, repr=False, compare=False)

    # ---- queries -------------------------------------------------------------------------
    def tensor(self, tid: int) -> Tensor:
        return self.tensors[tid]

    def op(self, oid: int) -> Op:
        return self.ops[oid]

    def producer_op(self, tid: int) -> Op:
        """The op that produces tensor ``tid``.

        Raises GraphError when the tensor has no producer (a parameter, buffer, input or
        tangent): callers ask this only of tensors made during the step.
        """
        t = self.tensors[tid]
        if t.producer is None:
            raise GraphError(f"tensor {t.name!r} ({t.kind}) has no producer op in graph "
                             f"{self.name!r}; only tensors made during the step have one")
        return self.ops[t.producer]

    def by_name(self, name: str) -> Tensor:
        """The tensor called ``name``; raises KeyError naming it."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in graph {self.name!r}")

    def storage_bytes(self, tid: int) -> int:
        """Bytes of the storage tensor ``tid`` lives in."""
        return self.tensors[self.tensors[tid].storage].nbytes

    def aliases(self) -> dict[int, list[int]]:
        """Storage id -> every tensor living in that storage (base first)."""
        groups: dict[int, list[int]] = {}
        for t in self.tensors:
            groups.setdefault(t.storage, []).append(t.id)
        return groups

    def static_bytes(self) -> int:
        """Bytes resident before the step starts: parameters, buffers, inputs, tangents."""
        return sum(t.nbytes for t in self.tensors if t.kind in STATIC_KINDS and not t.is_view)

    def activations(self) -> list[Tensor]:
        """Forward-produced base tensors whose storage is read in backward.

        These are the tensors a policy decides about (keep, offload or recompute).
        """
        tensors, ops, backward = self.tensors, self.ops, Phase.BACKWARD
        read_back = {t.storage for t in tensors  # storages a backward op reads, via any alias
                     if any(ops[c].phase is backward for c in t.consumers)}
        return [t for t in tensors
                if t.id in read_back and not t.is_view and not t.host and t.producer is not None
                and ops[t.producer].phase is Phase.FORWARD]

    # ---- checks --------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise GraphError naming the first broken invariant."""
        for i, t in enumerate(self.tensors):
            if t.id != i:
                raise GraphError(f"tensor {t.name!r} has id {t.id} but sits at index {i}")
            if not 0 <= t.storage < len(self.tensors):
                raise GraphError(f"tensor {t.name!r} names unknown storage {t.storage}")
            if t.is_view and t.nbytes != 0:
                raise GraphError(f"view {t.name!r} must carry 0 bytes, not {t.nbytes}")
            if t.producer is None and t.kind not in STATIC_KINDS:
                raise GraphError(f"tensor {t.name!r} of kind {t.kind} has no producer")
        produced_at: dict[int, int] = {}
        for i, o in enumerate(self.ops):
            if o.id != i:
                raise GraphError(f"op {o.name!r} has id {o.id} but sits at index {i}")
            for tid in o.inputs:
                if not 0 <= tid < len(self.tensors):
                    raise GraphError(f"op {o.name!r} reads unknown tensor {tid}")
                t = self.tensors[tid]
                if t.producer is not None and produced_at.get(tid, i) >= i:
                    raise GraphError(f"op {o.name!r} reads {t.name!r} before it is produced")
            for tid in o.outputs:
                if self.tensors[tid].producer != o.id:
                    raise GraphError(f"op {o.name!r} outputs {self.tensors[tid].name!r} "
                                     "whose producer is another op")
                produced_at[tid] = i

    # ---- serialisation -------------------------------------------------------------------
    def to_json(self) -> str:
        """A JSON document holding everything but ``source``."""
        meta = {k: v for k, v in self.meta.items() if not k.startswith("_")}
        doc = {
            "name": self.name,
            "meta": meta,
            "outputs": self.outputs,
            "tensors": [asdict(t) for t in self.tensors],
            "ops": [asdict(o) for o in self.ops],
        }
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> Graph:
        """Inverse of ``to_json``; raises GraphError on a malformed document."""
        try:
            doc = json.loads(text)
            tensors = [
                Tensor(**{**t, "shape": tuple(t["shape"]), "kind": TensorKind(t["kind"])})
                for t in doc["tensors"]
            ]
            ops = [
                Op(**{**o, "phase": Phase(o["phase"]), "category": OpCategory(o["category"])})
                for o in doc["ops"]
            ]
            graph = cls(tensors=tensors, ops=ops, outputs=list(doc["outputs"]),
                        name=doc.get("name", "graph"), meta=doc.get("meta", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise GraphError(f"not a valid outcore graph document: {exc}") from exc
        graph.validate()
        return graph

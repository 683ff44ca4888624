"""Convolution algorithms for moDNN: candidates per task, and a cost model that prices them.

moDNN profiles "the workspace size and performance of all CONV algorithms for each task"
(DATE'18 §IV-A) and picks one per task by eq. (5). In outcore an algorithm is an operator
variant (``outcore.variants``) and the profile is the cost model:

* ``candidates(graph, cost, options)`` prices, for every op with a choice, each variant on a
  copy of the op with ``variant`` set: ``cost.op_time(op)`` and ``cost.workspace(op)``. Which
  variants: ``options["variants"]`` (op id -> names, or a callable ``graph -> that table``,
  the same convention as the vDNN and SuperNeurons policies); by default every variant the
  registry lists for the op's target. "framework" (zero workspace, the role of cuDNN's
  implicit GEMM, the paper's baseline) always comes first. A cost model that does not price
  variants gives every candidate the same time and no workspace, so the baseline wins.
* ``ConvAlgorithmCost`` wraps any cost model and prices convolution variants from the graph's
  shapes alone (no torch), for paper-scale fake captures and for graphs re-captured at a
  sub-batch size (it re-binds per graph, unlike a table keyed by op id): support and
  workspace from what capture recorded in ``op.variant_options`` (else from
  ``outcore.variants.registry`` on the inferred arguments; both are the formulas the
  executor's tracker matches), time = the wrapped model's time times a relative factor. The
  default factor is the assumed GPU speed every GPU cost shares
  (``outcore.cost.gpu_variants.conv_gpu_time_factor``: implicit GEMM about twice as slow as
  the best algorithm on 3x3 layers, FFT slower than it on 1x1 ones; that module cites its
  sources), not a measurement; pass your own ``relative_time``.

This shape-only path serves graphs without capture's record (hand-built or paper-scale
graphs made without it); a captured graph's ``op.variant_options`` hold support and workspace
from the op's real arguments, checked against each variant's declaration
(``outcore.variants.capability``), and take precedence. On the shape-only path stride and
padding are inferred from the input, weight and output shapes (the smallest stride, then the
smallest padding, that give the output size; only the output size matters for im2col's
workspace, FFT uses the padded plane); dilation is assumed 1 and only 2-d, ungrouped
convolutions are described, so other convolutions keep the framework kernel there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from outcore.cost.gpu_variants import KNOWN_VARIANTS, conv_gpu_time_factor
from outcore.graph.ir import Graph, Op
from outcore.policies.common.costs import bound
from outcore.policies.common.variant_spec import runnable
from outcore.policies.common.variant_spec import variant_table as resolve_variants
from outcore.policies.modnn.config import ModnnConfig
from outcore.variants import registry
from outcore.variants.meta import CONV, CONV_BACKWARD
from outcore.variants.names import is_framework
from outcore.variants.select import Candidate

FRAMEWORK = registry.FRAMEWORK

RelativeTime = Callable[[str, str, Sequence[Any]], float]


def variant_table(graph: Graph, config: ModnnConfig) -> dict[int, list[str]]:
    """Op id -> variant names to consider (see the module docstring)."""
    # a variant capture refused for an op (outside what it declares it computes) is never
    # offered: priced at 0 workspace and then run, it broke the step (bmm size error on
    # depthwise convolutions, OOM from unpriced workspace)
    if config.variants is not None and config.variants is not True:
        return resolve_variants(graph, config.variants)  # False: {}, PyTorch's kernels only
    table = {}
    for op in graph.ops:
        names = runnable(op, registry.variants_for(op.target))
        if len(names) > 1:
            table[op.id] = names
    return table


def candidates(graph: Graph, cost: Any,
               config: ModnnConfig) -> dict[int, tuple[Candidate, ...]]:
    """Op id -> priced candidates, framework first, for every op with a real choice."""
    if cost is None:
        return {}
    model = bound(graph, cost)
    result: dict[int, tuple[Candidate, ...]] = {}
    for op_id, names in variant_table(graph, config).items():
        ordered = list(dict.fromkeys([FRAMEWORK, *names]))
        if len(ordered) < 2:
            continue
        op = graph.ops[op_id]
        rows = []
        for name in ordered:
            priced = dataclasses.replace(op, variant=name)
            rows.append(Candidate(name, float(model.op_time(priced)), int(model.workspace(priced))))
        result[op_id] = tuple(rows)
    return result


# ---- shape-based pricing -------------------------------------------------------------------

def _infer_geometry(h: int, k: int, out: int) -> tuple[int, int] | None:
    """(stride, padding) giving ``out`` from input ``h`` and kernel ``k`` (dilation 1)."""
    for stride in range(1, max(k, 2) + 2):
        for pad in range(k + 1):
            if (h + 2 * pad - k) // stride + 1 == out and h + 2 * pad >= k:
                return stride, pad
    return None


def conv_arg_meta(graph: Graph, op: Op) -> tuple[Any, ...] | None:
    """The ``arg_meta`` of a convolution op rebuilt from shapes, or None if it is not one
    the variants can describe (not 2-d, grouped, or geometry not inferable)."""
    t = graph.tensors
    if op.target == CONV:
        if len(op.inputs) < 2 or len(op.outputs) != 1:
            return None
        x, w = t[op.inputs[0]], t[op.inputs[1]]
        b = t[op.inputs[2]] if len(op.inputs) > 2 else None
        y = t[op.outputs[0]]
    elif op.target == CONV_BACKWARD:
        if len(op.inputs) < 3:
            return None
        y, x, w = t[op.inputs[0]], t[op.inputs[1]], t[op.inputs[2]]
        b = None
    else:
        return None
    if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4 or w.shape[1] != x.shape[1]:
        return None
    geo = [_infer_geometry(x.shape[2 + d], w.shape[2 + d], y.shape[2 + d]) for d in (0, 1)]
    if geo[0] is None or geo[1] is None:
        return None
    stride = [geo[0][0], geo[1][0]]
    padding = [geo[0][1], geo[1][1]]

    def meta(tensor: Any) -> tuple[tuple[int, ...], str]:
        return (tensor.shape, tensor.dtype)

    if op.target == CONV:
        return (meta(x), meta(w), meta(b) if b is not None else None, stride, padding, [1, 1],
                False, [0, 0], 1)
    shapes = [t[o].shape for o in op.outputs]
    mask = [x.shape in shapes, w.shape in shapes, any(len(s) == 1 for s in shapes)]
    bias_sizes = [w.shape[0]] if mask[2] else None
    return (meta(y), meta(x), meta(w), bias_sizes, stride, padding, [1, 1], False, [0, 0], 1, mask)


def default_relative_time(target: str, variant: str, arg_meta: Sequence[Any]) -> float:
    """Assumed time of ``variant`` over the framework kernel's: the shared GPU rule
    (``outcore.cost.gpu_variants``); a variant it does not know costs 1.0."""
    if variant not in KNOWN_VARIANTS:
        return 1.0
    return conv_gpu_time_factor(target, variant, arg_meta)

class ConvAlgorithmCost:
    """A cost model pricing convolution variants from shapes (see the module docstring).

    Args:
        base: the cost model of every op's default kernel, of transfers and copy engines.
        relative_time: ``(target, variant, arg_meta) -> time over the framework kernel's``
            (default ``default_relative_time``; ``outcore.policies.vdnn.cudnn.relative_time``
            is the vDNN reproduction's cuDNN-era table).
        normalise: when True, ``base`` times are those of the *fastest* supported variant (an
            analytic model calibrated on cuDNN's fastest algorithms) and the others are
            priced relative to it; when False, ``base`` is the framework kernel's time.

    An op without a variant runs the framework kernel. Every other op costs what ``base``
    says. Call ``bind(graph)`` (the simulator and the policies do) before pricing.
    """

    def __init__(self, base: Any, relative_time: RelativeTime | None = None,
                 normalise: bool = True, graph: Graph | None = None) -> None:
        self.base = base
        self.relative_time = relative_time or default_relative_time
        self.normalise = normalise
        self.graph = graph
        self.copy_engines = base.copy_engines
        self._table: dict[int, dict[str, tuple[float, int]]] = {}

    def __repr__(self) -> str:
        return f"ConvAlgorithmCost({self.base!r})"

    def bind(self, graph: Graph) -> ConvAlgorithmCost:
        if self.graph is graph:
            return self
        return ConvAlgorithmCost(bound(graph, self.base), self.relative_time, self.normalise, graph)

    def table(self, op: Op) -> dict[str, tuple[float, int]]:
        """Variant -> (time factor over ``base``, workspace bytes) for ``op``'s supported
        variants ({} for an op without a choice)."""
        if self.graph is None:
            raise ValueError("ConvAlgorithmCost prices variants only once bound: call bind(graph)")
        if op.id not in self._table:
            graph_op = self.graph.ops[op.id]
            meta = conv_arg_meta(self.graph, graph_op)
            if graph_op.variant_options:  # recorded at capture: exact support and workspace
                ws = {v: int(o.get("workspace", 0)) for v, o in graph_op.variant_options.items()
                      if "refused" not in o}
            else:
                ws = registry.supported_variants(op.target, meta) if meta is not None else {}
            rows: dict[str, tuple[float, int]] = {}
            if ws:
                rel = {v: (self.relative_time(op.target, v, meta) if meta is not None else 1.0)
                       for v in ws}
                scale = min(rel.values()) if self.normalise else 1.0
                rows = {v: (rel[v] / scale, ws[v]) for v in ws}
            self._table[op.id] = rows
        return self._table[op.id]

    def op_time(self, op: Op) -> float:
        plain = dataclasses.replace(op, variant="") if op.variant else op
        rows = self.table(op) if op.target in (CONV, CONV_BACKWARD) else {}
        factor = rows.get(op.variant or FRAMEWORK, rows.get(FRAMEWORK, (1.0, 0)))[0]
        return self.base.op_time(plain) * factor

    def transfer_time(self, nbytes: int, direction: str) -> float:
        return self.base.transfer_time(nbytes, direction)

    def workspace(self, op: Op) -> int:
        if is_framework(op.variant) or op.target not in (CONV, CONV_BACKWARD):
            return 0
        return int(self.table(op).get(op.variant, (1.0, 0))[1])

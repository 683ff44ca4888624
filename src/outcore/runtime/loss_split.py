"""How much each sub-batch's gradient weighs, read from the loss as it was traced.

Under sub-batching (``outcore.runtime.subbatch``) the step graph is captured for ``b = N / k``
samples and run ``k`` times; the full batch's gradient is ``sum_i w_i * grad(L_i)`` only for
the right weights ``w_i``, and they depend on how the loss reduces over samples:

* a **mean** over samples (``reduction="mean"`` of an elementwise loss, ``aten.mean``):
  ``w_i = 1 / k`` (the sub-batches are equal);
* a **sum** (``reduction="sum"``, ``aten.sum``): ``w_i = 1``;
* a **ratio** ``S / D`` of a sum over samples by a sum that depends on the batch: NLL and
  cross entropy with ``ignore_index`` (the mean over the *non-ignored* targets) or class
  weights (divided by the sum of the targets' weights), and the label-smoothing term that
  cross entropy adds (divided by the same count or weight): ``w_i = D_i / sum_j D_j``, with
  ``D_i`` evaluated on sub-batch ``i``'s labels before anything runs.

* a **sum divided by the batch size**, traced as a number (``loss.sum() / x.shape[0]``, cross
  entropy with class-probability targets, ``kl_div(..., reduction="batchmean")``): the
  sub-batch's graph has its own size baked in, so it is a mean, ``w_i = 1 / k``. Told apart
  from a sum scaled by some other number by the full batch's capture: the loss is one
  reduction whose scale at the full batch is ``1 / q`` of the sub-batch's, where ``q`` is how
  many times more elements the full batch's reduction sums (``checked_sub_batch`` marks the
  sub-batch graph, ``SUM_AS_MEAN``, for the weights read from it alone).

``loss_form(step, graph)`` walks back from the traced loss through ``add``/``sub``, products
with constants and ``neg`` down to those reductions and returns their *terms*; anything else
(a loss divided by a number the trace cannot tie to the batch, a ``max`` over samples, ...)
raises ``LossSplitError`` at compile time, so sub-batching is refused rather than wrong. A
loss that mixes a sum with a mean or a ratio (``cross_entropy(...) + 1e-3 * out.pow(2).sum()``)
is refused there too; terms that may disagree on a sub-batch's weight depending on the labels
(a plain mean beside a mean over non-ignored targets, on a batch with ignored targets) are
refused by ``sub_batch_weights`` before the step runs, naming the terms.

Invariant: ``sum_i w_i * L_i`` is the full batch's loss, and a sub-batch with ``w_i = 0``
(every target ignored) contributes nothing (its own loss is 0 / 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from outcore.capture.convert import target_name
from outcore.capture.step import CapturedStep
from outcore.errors import CaptureError
from outcore.graph.ir import Graph

#: Loss ops whose ``reduction`` argument (1 mean, 2 sum) sits at this position.
REDUCTION_ARG = {
    "aten.mse_loss.default": 2, "aten.l1_loss.default": 2, "aten.smooth_l1_loss.default": 2,
    "aten.huber_loss.default": 2, "aten.binary_cross_entropy.default": 3,
    "aten.binary_cross_entropy_with_logits.default": 4, "aten.soft_margin_loss.default": 2,
    "aten.kl_div.default": 2,
}
_NLL = ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
_LINEAR = ("aten.add.Tensor", "aten.sub.Tensor")
_SCALED = ("aten.mul.Scalar", "aten.div.Scalar", "aten.neg.default", "aten.mul.Tensor",
           "aten.div.Tensor", "aten.clone.default", "aten.alias.default",
           "aten.view.default", "aten._to_copy.default")
_MEAN = ("aten.mean.default", "aten.mean.dim")
_SUM = ("aten.sum.default", "aten.sum.dim_IntList")
#: ``Graph.meta`` key of a sub-batch graph whose loss, a sum over its samples divided by its
#: own batch size, ``checked_sub_batch`` proved to be a mean (the reduction's node name);
#: transient (a leading "_": not serialised).
SUM_AS_MEAN = "_loss_sum_as_mean"


class LossSplitError(CaptureError):
    """The loss cannot be split into sub-batches exactly; the message says why and what to do."""


@dataclass(frozen=True)
class Term:
    """One reduction over samples in the loss.

    ``kind``: "mean" (weight 1/k), "sum" (weight 1) or "ratio" (weight ``D_i / sum D``).
    For "ratio" ``denominator`` is the FX node of ``D``, or, for NLL, the ``nll`` node itself
    (``D`` is then its total weight, computed from the target, class weights and
    ``ignore_index``). ``name``: the node the term was read from, for messages.
    """

    kind: str
    name: str
    denominator: fx.Node | None = None
    #: a "mean" proven from a sum divided by the batch size (``SUM_AS_MEAN``)
    sum_as_mean: bool = False


def _refuse(why: str) -> LossSplitError:
    return LossSplitError(
        f"the loss cannot be split into sub-batches exactly: {why}. Sub-batching would change "
        "its gradient; raise the budget so the whole batch fits (one sub-batch), or leave "
        "sub-batching off (no allow_sub_batches=True, a policy other than 'modnn')")


class _Walk:
    """Reads the terms of the loss (module docstring); ``batch`` holds the FX nodes that
    depend on the batch's tensors."""

    def __init__(self, step: CapturedStep) -> None:
        self.step = step
        leaves = {tid for tid, desc in step.nodes.placeholders.items()
                  if type(desc).__name__ == "PlainAOTInput"}
        self.constants: list[int | float] = []  # numbers the loss is scaled by, walk order
        self.scale = 1.0  # their product (a division divides): the loss's factor, one term
        self.reductions: list[fx.Node] = []  # the reductions reached, walk order
        self.batch: set[fx.Node] = set()
        for node in step.gm.graph.nodes:
            if (node.op == "placeholder" and step.nodes.node_tensors.get(node) in leaves) \
                    or any(a in self.batch for a in node.all_input_nodes):
                self.batch.add(node)

    def terms(self, node: fx.Node) -> list[Term]:
        target = target_name(node.target)
        args = node.args
        if target in _LINEAR:
            return [t for a in args[:2] if isinstance(a, fx.Node) and a in self.batch
                    for t in self.terms(a)]
        if target == "getitem" and isinstance(args[0], fx.Node) \
                and target_name(args[0].target) in _NLL and args[1] == 0:
            return [self._nll(args[0])]
        if target in _SCALED:
            for i, a in enumerate(args):
                if isinstance(a, (int, float)):
                    self.constants.append(a)
                    divides = target.startswith("aten.div") and i == 1
                    self.scale = self.scale / a if divides else self.scale * a
            if target == "aten.neg.default":
                self.scale = -self.scale
            batch_args = [a for a in args if isinstance(a, fx.Node) and a in self.batch]
            if len(batch_args) == 1 and (target != "aten.div.Tensor" or batch_args[0] is args[0]):
                return self.terms(batch_args[0])
            if target == "aten.div.Tensor" and len(batch_args) == 2:
                return self._ratio(node)
            raise _refuse(f"{node.name!r} ({target}) combines two batch-dependent values")
        if target in _MEAN or target in _SUM:
            if _numel(node) != 1:
                raise _refuse(f"{node.name!r} reduces to a {tuple(_val(node).shape)} tensor, "
                              "not a scalar over samples")
            self.reductions.append(node)
            return [Term("mean" if target in _MEAN else "sum", node.name)]
        position = REDUCTION_ARG.get(target)
        if position is not None:
            reduction = args[position] if len(args) > position else 1
            if reduction in (1, 2):
                self.reductions.append(node)
                return [Term("mean" if reduction == 1 else "sum", node.name)]
        raise _refuse(f"it is computed by {target} ({node.name!r}), which is not a mean, a sum "
                      "or a ratio of sums over samples")

    def _nll(self, nll: fx.Node) -> Term:
        reduction = nll.args[3] if len(nll.args) > 3 else 1
        if reduction == 2:
            self.reductions.append(nll)
            return Term("sum", nll.name)
        if reduction != 1:
            raise _refuse(f"{nll.name!r} has reduction {reduction!r}")
        return Term("ratio", nll.name, nll)

    def _ratio(self, node: fx.Node) -> list[Term]:
        top, bottom = node.args[0], node.args[1]
        assert isinstance(top, fx.Node) and isinstance(bottom, fx.Node)
        if any(t.kind != "sum" for t in self.terms(top)) or _numel(bottom) != 1:
            raise _refuse(f"{node.name!r} divides by a batch-dependent value, but not a sum "
                          "over samples by a scalar")
        return [Term("ratio", node.name, bottom)]


def _val(node: fx.Node) -> Any:
    return node.meta.get("val")


def _numel(node: fx.Node) -> int:
    val = _val(node)
    return int(val.numel()) if isinstance(val, torch.Tensor) else 1


def loss_node(step: CapturedStep, graph: Graph) -> fx.Node:
    """The FX node of the traced loss."""
    tid = next((tid for role, tid, _ in step.nodes.output_roles if role == "loss"), None)
    if tid is None:
        raise _refuse("the step has no loss output")
    for node in step.gm.graph.nodes:
        if step.nodes.node_tensors.get(node) == tid:
            return node
    raise _refuse(f"the loss tensor {graph.tensors[tid].name!r} has no FX node")


def loss_form(graph: Graph, full: Graph | None = None) -> list[Term]:
    """The loss's reductions over samples (module docstring); LossSplitError otherwise.

    ``full``: the same step captured at the full batch; a number the loss is scaled by that
    differs between the two (``loss.sum() / x.shape[0]``, ``reduction="batchmean"``) is
    refused, since the sub-batch graph has the sub-batch's number baked in."""
    step = graph.source
    if not isinstance(step, CapturedStep):
        raise CaptureError("this graph has no captured step to read the loss from")
    walk = _Walk(step)
    terms = walk.terms(loss_node(step, graph))
    if len(terms) == 1 and terms[0].kind == "sum" and graph.meta.get(SUM_AS_MEAN) == terms[0].name:
        terms = [Term("mean", terms[0].name, sum_as_mean=True)]
    if full is not None and isinstance(full.source, CapturedStep):
        at_full = _Walk(full.source)
        at_full.terms(loss_node(full.source, full))
        if at_full.constants != walk.constants:
            if not _sum_over_batch_size(walk, at_full, terms):
                raise _refuse(f"it is scaled by numbers that change with the batch size "
                              f"({at_full.constants} at the full batch, {walk.constants} at a "
                              "sub-batch) other than by dividing one sum over samples by the "
                              "batch size; use a mean over samples")
            terms = [Term("mean", terms[0].name, sum_as_mean=True)]
    kinds = {t.kind for t in terms}
    if "sum" in kinds and len(kinds) > 1:
        summed = next(t for t in terms if t.kind == "sum")
        other = next(t for t in terms if t.kind != "sum")
        raise _refuse(f"it adds a sum over samples ({summed.name!r}) to a mean "
                      f"({other.name!r}), which sub-batches weigh differently")
    return terms


# -- per-sub-batch weights -------------------------------------------------------------------
def checked_sub_batch(sub: Graph, full: Graph) -> Graph:
    """``sub`` (the step captured at one sub-batch of ``full``'s batch) once its loss is
    proven to split exactly (``loss_form(sub, full)``: LossSplitError otherwise, which
    planning reports as a size it cannot use), marked where its loss is a sum divided by its
    own batch size. ``outcore.plan`` passes every recapture through it: without the full
    batch's capture such a loss reads as a plain sum, weighed 1 per sub-batch (k times too
    much)."""
    for term in loss_form(sub, full):
        if term.sum_as_mean:
            sub.meta[SUM_AS_MEAN] = term.name
    return sub


def _sum_over_batch_size(sub: _Walk, full: _Walk, terms: Sequence[Term]) -> bool:
    """The loss is one sum over samples (``terms``, read at the sub-batch) scaled by numbers
    that make it a mean: the full batch's scale is ``1 / q`` of the sub-batch's, where the
    full batch's reduction sums ``q > 1`` times as many elements (module docstring)."""
    if len(terms) != 1 or terms[0].kind != "sum" or len(sub.reductions) != 1 \
            or len(full.reductions) != 1 or sub.scale == 0.0:
        return False
    summed = [_numel_of_input(r) for r in (full.reductions[0], sub.reductions[0])]
    if summed[1] == 0 or summed[0] % summed[1]:
        return False
    q = summed[0] // summed[1]
    return q > 1 and math.isclose(full.scale / sub.scale * q, 1.0, rel_tol=1e-9)


def _numel_of_input(reduction: fx.Node) -> int:
    """Elements of the tensor ``reduction`` reduces (its first argument)."""
    first = reduction.args[0]
    return _numel(first) if isinstance(first, fx.Node) else 1


def _evaluate(step: CapturedStep, graph: Graph, node: fx.Node, batch: Any) -> torch.Tensor:
    """The value of ``node`` on ``batch``, computing only the nodes it depends on."""
    statics = step.static_values(graph, batch)
    cone: list[fx.Node] = []
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        cone.append(n)
        stack.extend(n.all_input_nodes)
    values: dict[fx.Node, Any] = {}
    for n in sorted(cone, key=_position(step)):
        tid = step.nodes.node_tensors.get(n)
        if n.op in ("placeholder", "get_attr"):
            values[n] = statics[tid] if tid is not None else None
            continue
        args = fx.node.map_arg(n.args, values.__getitem__)
        kwargs = fx.node.map_arg(n.kwargs, values.__getitem__)
        values[n] = n.target(*args, **kwargs)  # type: ignore[operator]
    return values[node]


def _position(step: CapturedStep) -> Any:
    order = {n: i for i, n in enumerate(step.gm.graph.nodes)}
    return order.__getitem__


def _denominator(step: CapturedStep, graph: Graph, term: Term, batch: Any) -> float:
    node = term.denominator
    assert node is not None
    if target_name(node.target) not in _NLL:
        return float(_evaluate(step, graph, node, batch))
    target_node, weight_node = node.args[1], node.args[2]
    ignore = int(node.args[4]) if len(node.args) > 4 else -100  # type: ignore[arg-type]
    assert isinstance(target_node, fx.Node)
    target = _evaluate(step, graph, target_node, batch)
    kept = torch.ne(target, ignore)
    if not isinstance(weight_node, fx.Node):
        return float(kept.sum())
    weight = _evaluate(step, graph, weight_node, batch)
    return float(weight[target[kept]].sum())


def sub_batch_weights(graph: Graph, subs: Sequence[Any]) -> list[float]:
    """The weight of each sub-batch's loss and gradient (module docstring).

    Raises LossSplitError when the loss's terms give one sub-batch different weights."""
    terms = loss_form(graph)
    step = graph.source
    assert isinstance(step, CapturedStep)
    k = len(subs)
    per_term: list[list[float]] = []
    for term in terms:
        if term.kind == "mean":
            per_term.append([1.0 / k] * k)
        elif term.kind == "sum":
            per_term.append([1.0] * k)
        else:
            with torch.no_grad():
                parts = [_denominator(step, graph, term, sub) for sub in subs]
            total = sum(parts)
            per_term.append([p / total if total else 1.0 / k for p in parts])
    weights = per_term[0]
    for term, other in zip(terms[1:], per_term[1:], strict=True):
        for i, (a, b) in enumerate(zip(weights, other, strict=True)):
            if abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-30):
                raise _refuse(f"its terms weigh sub-batch {i} differently ({terms[0].kind} "
                              f"{terms[0].name!r}: {a:.6g}, {term.kind} {term.name!r}: "
                              f"{b:.6g}; e.g. label smoothing divides by every target while "
                              "NLL divides by the non-ignored ones)")
    return weights

"""The sub-batching rule: splitting the batch is an explicit opt-in.

moDNN (and outcore-auto, when it takes moDNN's plan) can run one step as ``k`` sub-batches
with gradient accumulation. That changes what the step computes wherever the samples of a
batch are coupled: BatchNorm normalises each sub-batch with its own statistics and updates
its running statistics ``k`` times (``num_batches_tracked`` grows by ``k``); any other
buffer the forward updates (a step counter, an EMA of the inputs) is updated once per
sub-batch too, ``k`` times per step, and a forward that reads it computes otherwise
(``updated_buffers``: the note names them). Without batch-coupled layers and updated buffers
the accumulated gradients equal the full batch's only up to the order
of the floating-point sums, for a loss whose reduction over samples is read from the trace
(``outcore.runtime.loss_split``: mean, sum, a sum divided by the batch size, NLL/cross
entropy with ``ignore_index``, class weights or label smoothing; another loss is refused),
and random ops draw eager's numbers
only where the full batch's draw fits (``outcore.runtime.sub_batch_rng``); so outcore
never splits unless asked:

* ``allow_sub_batches=True`` (``outcore.plan``/``compile``/``backend``, or the CLI's
  ``--allow-sub-batches``), or naming ``policy="modnn"``, opts in;
* without it, policies get no way to re-capture a smaller batch, and a budget under the
  layer-wise lower bound is refused with the bound and the way out;
* every split is announced (a ``SubBatchWarning`` and the ``outcore`` logger) and shown in
  ``explain()`` notes and ``trainer.stats.notes``.
"""

from __future__ import annotations

from outcore.errors import InfeasibleBudgetError, SubBatchWarning
from outcore.graph.batch_dims import INPUT_UPDATE
from outcore.graph.ir import Graph, Phase
from outcore.log import announce
from outcore.units import format_bytes

#: ATen targets whose result couples the samples of a batch (statistics over dim 0).
BATCH_COUPLED = ("batch_norm", "_native_batch_norm_legit", "native_batch_norm")


def batch_coupled_ops(graph: Graph) -> list[str]:
    """Forward ops of BatchNorm-like targets: their output depends on the other samples of
    the batch, and they update running statistics."""
    return [op.name for op in graph.ops
            if op.phase is Phase.FORWARD and any(k in op.target for k in BATCH_COUPLED)]


def proven_coupled_ops(sub_graph: Graph | None) -> list[str]:
    """Every op ``outcore.graph.batch_dims.follow`` proved to couple samples when
    ``sub_graph`` was captured (``meta["coupled_ops"]``: BatchNorm, a ``x - x.mean(0)``,
    any statistic over the batch read back into the samples)."""
    return list(sub_graph.meta.get("coupled_ops", [])) if sub_graph is not None else []


#: the buffers ``torch.nn`` normalisation layers update (told apart by ``BATCH_COUPLED``)
_NORM_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def updated_buffers(graph: Graph) -> list[str]:
    """The buffers the step updates in place, but those of BatchNorm-like layers (their
    running statistics): a step counter, an EMA, anything a forward changes with ``+=``. A
    batch tensor the forward changes is not one: each sub-batch writes its own rows
    (``runtime.sub_batch_assembly``)."""
    names = [t.source.removeprefix("update:model.") for t in graph.tensors
             if t.source.startswith("update:") and not t.source.startswith(INPUT_UPDATE)]
    return [n for n in names if n.rsplit(".", 1)[-1] not in _NORM_BUFFERS]


def allowed(policy: str, allow_sub_batches: bool | None) -> bool:
    """True when the user opted in: ``allow_sub_batches=True`` or the moDNN policy by name."""
    if allow_sub_batches is not None:
        return bool(allow_sub_batches)
    return policy == "modnn"


def refuse_below_bound(policy: str, limit: int, bound: int, can_split: bool) -> None:
    """Raise InfeasibleBudgetError for a budget under the layer-wise bound, with the way out."""
    if can_split:
        way_out = (", or pass allow_sub_batches=True (CLI: --allow-sub-batches) or "
                   "policy='modnn' to split the batch into sub-batches, which changes what "
                   "BatchNorm computes.")
    else:
        way_out = " or shrink the batch."
    raise InfeasibleBudgetError(
        policy, limit, bound,
        f"That is the layer-wise lower bound (parameters, inputs and the largest single op's "
        f"tensors); no policy goes below it at this batch. Raise the budget to at least "
        f"{format_bytes(bound)}{', shrink the batch' if can_split else ''}{way_out}")


def note(graph: Graph, parts: int, sub_graph: Graph | None = None) -> str:
    """What splitting into ``parts`` sub-batches changes, for this graph (and the sub-batch
    graph it runs as: ``proven_coupled_ops``)."""
    norms = batch_coupled_ops(graph)  # BatchNorm-like: running statistics too
    coupled = norms + [n for n in proven_coupled_ops(sub_graph) if n not in norms]
    updated = updated_buffers(graph)
    they, them = ("they", "them") if len(updated) > 1 else ("it", "it")
    others = (f"; the forward updates {_listed(updated, 'buffer')} once per sub-batch "
              f"({parts} times per step), so {they} and the gradients of what reads {them} "
              "differ from eager PyTorch's") if updated else ""
    if coupled:
        what = (f"compute their statistics per sub-batch and update running statistics "
                f"{parts} times per step, so gradients and BatchNorm buffers differ"
                if norms else "read statistics of the sub-batch instead of the whole batch, "
                "so what the forward computes and the gradients differ")
        return (f"the batch is split into {parts} sub-batches (opted in): {len(coupled)} "
                f"batch-coupled ops ({_listed(coupled, '')}) {what} from eager "
                f"PyTorch's{others}")
    if updated:
        return (f"the batch is split into {parts} sub-batches (opted in): the model has no "
                f"batch-coupled layers, but{others.removeprefix(';')}")
    return (f"the batch is split into {parts} sub-batches (opted in): the model has no "
            "batch-coupled layers, so gradients equal the full batch's up to summation order "
            "(each sub-batch weighted as the traced loss reduces: 1/k for a mean, 1 for a "
            "sum, its share of the targets' count or weight for NLL/cross entropy)")


def _listed(names: list[str], what: str) -> str:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{what}{'s' if what and len(names) > 1 else ''} {shown}".strip()


def announce_split(graph: Graph, parts: int, sub_graph: Graph | None = None) -> str:
    """Warn and log that the batch is split; returns the note."""
    text = note(graph, parts, sub_graph)
    announce(text, SubBatchWarning, stacklevel=4)
    return text

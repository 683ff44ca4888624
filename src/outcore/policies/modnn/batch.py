"""moDNN's lower bound and sub-batch size selection (DATE'18 §IV-A, eqs. 1-3).

Terms, on an outcore Graph captured at (sub-)batch size b:

* **SW** ("the total weight memory size"): bytes that stay on the device for the whole step
  and are never offloaded: parameters, buffers, the batch itself, the tangent, and the
  step's outputs (parameter gradients ΔW, the loss, buffer updates). moDNN keeps Ws and
  ΔWs resident; the batch and the loss are resident in outcore's executor too, so they are
  counted here. The scheduler reserves SW up front.
* **Mmin(t, b)** (eq. 1): the data bytes task t needs at once, its distinct input and output
  storages that are not in SW, plus the workspace of its algorithm and the kernel's own
  temporaries (``Op.temporaries``, measured by the allocator on "cpu" and "cuda").
* **Mmin** (eq. 2): ``SW + max_t Mmin(t, 1)`` with the baseline (zero-workspace) algorithm,
  on the graph captured at sub-batch size 1. Every budget >= Mmin can be scheduled: at
  sub-batch size 1 each task's data fits beside SW, and Alg. 1 can always make room by
  offloading everything else (defragmentation).

Eq. (3) reads ``b = (M - SW) / max_t Mmin(t, b)``; since Mmin(t, b) is in bytes, we read it
as the per-sample form ``b' = b (M - SW) / max_t Mmin(t, b)`` (bytes grow linearly with the
sub-batch size), with Mmin(t, b) using the *fastest* algorithm's workspace, and we round b'
down to a divisor of the batch size (sub-batches are equal, so gradient accumulation gives
the full-batch gradient). Iteration: start at the full batch, re-capture ("profile") at the
new size, repeat until b stops changing (or revisits a size, then the smaller one is kept).
If the chosen size still cannot hold SW plus the largest task with baseline algorithms, the
next smaller divisor is tried, down to 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outcore.errors import CaptureError, InfeasibleBudgetError, InvalidArgumentError
from outcore.graph.batch_dims import BatchDimError, follow, graph_batch, random_scales
from outcore.graph.ir import STATIC_KINDS, Graph, TensorKind
from outcore.policies.modnn.algos import candidates
from outcore.policies.modnn.config import ModnnConfig
from outcore.units import format_bytes


@dataclass(frozen=True)
class Footprint:
    """SW and per-task data bytes of one graph (eq. 1), baseline and fastest algorithms."""

    sw: int
    task_bytes: tuple[int, ...]  # Mmin(t, b) with the baseline algorithm, by op id
    fastest_workspace: tuple[int, ...]  # workspace of the fastest candidate, by op id

    @property
    def worst_task(self) -> int:
        """The op id with the largest baseline need."""
        return max(range(len(self.task_bytes)), key=self.task_bytes.__getitem__, default=0)

    @property
    def largest_task(self) -> int:
        return max(self.task_bytes, default=0)

    @property
    def largest_task_fastest(self) -> int:
        pairs = zip(self.task_bytes, self.fastest_workspace, strict=True)
        return max((b + w for b, w in pairs), default=0)

    @property
    def minimum(self) -> int:
        """SW + the largest task with baseline algorithms: the least budget at this size."""
        return self.sw + self.largest_task


def reserved_storages(graph: Graph) -> set[int]:
    """Storages that belong to SW: static ones and those of the step's outputs."""
    reserved = {t.storage for t in graph.tensors if t.kind in STATIC_KINDS}
    reserved |= {graph.tensors[t].storage for t in graph.outputs}
    reserved |= {t.storage for t in graph.tensors if t.kind is TensorKind.OUTPUT}
    return reserved


def footprint(graph: Graph, cost: Any, config: ModnnConfig) -> Footprint:
    """SW and eq. (1) for every task of ``graph``."""
    reserved = reserved_storages(graph)
    sw = sum(graph.tensors[s].nbytes for s in reserved)
    cands = candidates(graph, cost, config)
    task, fastest = [], []
    for op in graph.ops:
        storages = {graph.tensors[t].storage for t in op.inputs + op.outputs} - reserved
        # the kernel's own scratch (measured on real devices; the memory rule holds it
        # during the op): without it a size that cannot fit was chosen on "cpu" and "cuda"
        task.append(sum(graph.tensors[s].nbytes for s in storages) + op.temporaries)
        rows = cands.get(op.id)
        fastest.append(min(rows, key=lambda c: (c.time_s, c.workspace_bytes)).workspace_bytes
                       if rows else 0)
    return Footprint(sw, tuple(task), tuple(fastest))


def batch_size(graph: Graph, config: ModnnConfig, *, split: bool = True) -> int:
    """The mini-batch size: ``config.batch_size``, else the size every input shares
    (``outcore.graph.batch_dims.graph_batch``: dimension 0 in the batch-first layout, the
    one common size otherwise; ``BatchDimError`` names the options when it is ambiguous).
    When the batch will not be split (``split=False``: no recapture) and cannot be told, 1:
    the graph is then planned as it is, one sub-batch."""
    if config.batch_size is not None and config.batch_dims is None:
        return int(config.batch_size)
    try:
        return graph_batch(graph, config.batch_options()).size
    except (ValueError, BatchDimError):  # not provable: fine when nothing is split
        if not split:
            return 1
        raise


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class Recaptures:
    """Graphs at sub-batch sizes, re-captured on demand and cached (b = B / k).

    A size the model cannot run at (``CaptureError``: e.g. BatchNorm needs two samples per
    channel in training, so sub-batch size 1 does not capture) is remembered as unavailable.
    """

    graph: Graph
    batch: int
    recapture: Callable[[int], Graph] | None
    cache: dict[int, Graph] = field(default_factory=dict)
    unavailable: dict[int, str] = field(default_factory=dict)
    #: sub-batches may change the gradient through batch statistics (options
    #: ``sub_batch_statistics=True``); otherwise a size whose graph couples samples is refused
    allow_coupled: bool = False
    #: each input's batch dimension (leaf order), recorded on sub-batch graphs for the split
    split_dims: tuple[int, ...] | None = None

    def at(self, b: int) -> Graph:
        """The graph at sub-batch size ``b`` (a divisor of the batch); ``CaptureError`` if
        the model cannot be captured at that size."""
        if b == self.batch:
            return self.graph
        if b in self.unavailable:
            raise CaptureError(self.unavailable[b])
        if b not in self.cache:
            if self.recapture is None:
                raise InvalidArgumentError(None, "a context with recapture (a captured step)",
                                           "moDNN's sub-batching re-captures the step.")
            try:
                sub = self.recapture(self.batch // b)
                self._check_split(sub, b)
            except CaptureError as exc:
                self.unavailable[b] = f"sub-batch size {b} cannot be captured: {exc}"
                raise
            self.cache[b] = sub
        return self.cache[b]

    def _check_split(self, sub: Graph, b: int) -> None:
        """Prove that ``sub`` is the step on ``b`` samples (``batch_dims.follow``) and that
        splitting keeps each sample's gradient, unless batch statistics are allowed."""
        if self.split_dims is None:
            return  # a hand-made graph (no torch source): planned, never split for real
        dims = follow(self.graph, sub, self.batch // b)
        if dims.coupled and not self.allow_coupled:
            names = ", ".join(repr(self.graph.ops[o].name) for o in dims.coupled[:3])
            raise BatchDimError(
                f"ops {names} compute statistics over the batch (e.g. BatchNorm), so "
                "sub-batches would train with other gradients than the full batch; pass "
                "options sub_batch_statistics=True to accept per-sub-batch statistics")
        if self.split_dims is not None:
            sub.meta["batch_dims"] = list(self.split_dims)
        # the runtime draws random ops' numbers for the full batch and cuts these dims
        sub.meta["random_scales"] = random_scales(self.graph, dims)
        # every op proven to couple samples, for the split's note (sub_batching.note)
        sub.meta["coupled_ops"] = [self.graph.ops[o].name for o in dims.coupled]
        if dims.outputs:  # the runtime assembles the kept model outputs (runtime.subbatch)
            sub.meta["output_dims"] = {str(k): d for k, d in dims.outputs.items()}

    def available(self, b: int) -> bool:
        """True when the graph at sub-batch size ``b`` can be captured."""
        try:
            self.at(b)
            return True
        except CaptureError:
            return False


@dataclass(frozen=True)
class SubBatchChoice:
    """The chosen sub-batch size, its graph and footprint, and the eq. (3) iterations."""

    size: int
    parts: int
    graph: Graph
    footprint: Footprint
    iterations: tuple[tuple[int, float], ...]  # (b, b' before rounding)


def smallest_size(graphs: Recaptures) -> int:
    """The smallest sub-batch size the model can be captured at (1 unless, e.g., BatchNorm
    needs two samples per channel)."""
    return next(b for b in divisors(graphs.batch) if graphs.available(b))


def lower_bound(graphs: Recaptures, cost: Any, config: ModnnConfig) -> Footprint:
    """Eq. (2): the footprint at sub-batch size 1 (``.minimum`` is Mmin), or at the smallest
    size the model can be captured at."""
    return footprint(graphs.at(smallest_size(graphs)), cost, config)


def infeasible(budget: int, mmin: Footprint, graph: Graph, size: int = 1,
               note: str = "") -> InfeasibleBudgetError:
    """The error for a budget below Mmin, naming the bound and its parts (and ``note``: why
    smaller sub-batch sizes were not used)."""
    op = graph.ops[mmin.worst_task]
    why = "" if size == 1 else " (the smallest size this model can be captured at)"
    hint = (f"Mmin = SW {format_bytes(mmin.sw)} (weights, their gradients, {size} sample(s), the "
            f"loss) + the largest task at sub-batch size {size}{why}, {op.name!r} ({op.target}), "
            "which needs "
            f"{format_bytes(mmin.largest_task)} of inputs and outputs (moDNN eq. 2). Raise the "
            f"budget to at least {format_bytes(mmin.minimum)}, or shrink the model (weights "
            "always stay on the device)." + (f" {note}" if note else ""))
    error = InfeasibleBudgetError("modnn", budget, mmin.minimum, hint)
    error.split_refused = note
    return error


def select_sub_batch(graphs: Recaptures, budget: int, cost: Any,
                     config: ModnnConfig) -> SubBatchChoice:
    """Eq. (3), iterated with re-capture (see the module docstring)."""
    sizes = divisors(graphs.batch)
    allowed = list(sizes) if graphs.recapture is not None else [graphs.batch]
    b = graphs.batch
    seen: set[int] = set()
    trace: list[tuple[int, float]] = []
    while True:
        if not graphs.available(b):  # e.g. BatchNorm at sub-batch size 1: go one size up
            allowed = [d for d in allowed if d != b]
            b = min(d for d in allowed if d > b)
            continue
        fp = footprint(graphs.at(b), cost, config)
        need = fp.largest_task_fastest
        proposal = b * (budget - fp.sw) / need if need > 0 else float(graphs.batch)
        trace.append((b, proposal))
        seen.add(b)
        nxt = max((d for d in allowed if d <= proposal), default=1 if 1 in allowed else b)
        if nxt == b:
            break
        if nxt in seen:
            b = min(b, nxt)
            break
        b = nxt
    tried: tuple[int, Footprint] | None = None
    for size in reversed([d for d in allowed if d <= b]):
        if not graphs.available(size):
            continue
        fp = footprint(graphs.at(size), cost, config)
        if fp.minimum <= budget:
            return SubBatchChoice(size, graphs.batch // size, graphs.at(size), fp, tuple(trace))
        tried = (size, fp)
    assert tried is not None, "the full batch is always available"
    smallest, fp = tried
    if graphs.recapture is None:
        op = graphs.graph.ops[fp.worst_task]
        raise InfeasibleBudgetError(
            "modnn", budget, fp.minimum,
            f"At the full batch of {graphs.batch}, SW {format_bytes(fp.sw)} plus the largest "
            f"task {op.name!r} ({format_bytes(fp.largest_task)}) does not fit, and sub-batching "
            "is off because this graph cannot be re-captured at a smaller batch (ctx.recapture "
            "is None, e.g. a graph loaded from JSON). Capture the model with outcore.capture "
            "so moDNN can split the batch, or raise the budget.")
    sizes_of: dict[str, list[int]] = {}  # one reason, the sizes it refused
    for b, why in sorted(graphs.unavailable.items()):
        sizes_of.setdefault(why.split("cannot be captured: ", 1)[-1], []).append(b)
    refused = "; ".join(f"size{'s' if len(bs) > 1 else ''} {', '.join(map(str, bs))} "
                        f"cannot be captured: {why}" for why, bs in sizes_of.items())
    raise infeasible(budget, fp, graphs.at(smallest), smallest,
                     f"Smaller sub-batch sizes were not used ({refused})." if refused else "")

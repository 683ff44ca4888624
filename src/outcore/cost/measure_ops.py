"""Measure every op of a captured graph on this machine (as PoocH and moDNN profile). Torch.

Two ways, both under ``torch.no_grad()``, each op's time the median of ``repeats`` runs
after ``warmup`` runs, the result a ``MeasuredProfile`` keyed to the graph:

* in the step (``batch`` given, graph captured with real tensors): the joint graph is run
  node by node on the real parameters and batch, as PoocH and moDNN profile whole
  iterations, so caches and memory traffic are those of a real step. An op's time runs
  from the end of the previous op to its own end: it includes the host's per-op overhead
  (argument handling, dispatch, frees), which a CPU run pays in series with the kernels,
  so the times add up to the pass's wall time. ``context`` wraps each pass (e.g. the
  executor's ``MemoryTracker``, so its per-op dispatch cost is in the profile as it is in
  the executor's time). On a graph whose tensors live on a CUDA GPU the marks are CUDA
  events instead (GPU time from the previous op's end, launch gaps included), read after
  the pass is synchronized.
* alone (no ``batch``, or a fake capture): op ``i``'s FX node ``graph.source.op_nodes[i]``
  runs on its own with fresh inputs of the right shape, stride, storage offset and dtype
  (floating inputs random normal, integer and bool inputs zeros, so indices stay in range).
  Repeating one op on the same inputs keeps them in cache: on small tensors this measures
  less than the op costs inside a step. Inputs of a CUDA capture are made on its GPU (where
  one is visible) and each run is timed from a synchronized start to its kernels' end.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
from torch import fx
from torch.utils._pytree import tree_leaves

from outcore.cost.measured import MeasuredProfile
from outcore.errors import ProfileError
from outcore.graph.ir import Graph


def _on_gpu(val: torch.Tensor) -> bool:
    """Whether a tensor shaped like ``val`` is made on its CUDA device (one is visible)."""
    return val.device.type == "cuda" and torch.cuda.is_available()


def _materialize(val: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A real tensor laid out like the (fake) ``val``, on ``val``'s CUDA device where it has
    one and a GPU is visible, else on the CPU (values drawn on the CPU either way, so a
    seed gives the same inputs on both)."""
    shape, stride, offset = tuple(val.shape), tuple(val.stride()), int(val.storage_offset())
    numel = 1
    for s in shape:
        numel *= s
    extent = 1 + sum((s - 1) * st for s, st in zip(shape, stride, strict=True))
    span = offset + (extent if numel else 0)
    if val.dtype.is_floating_point or val.dtype.is_complex:
        base = torch.randn(max(span, 1), dtype=val.dtype, generator=generator)
    else:
        base = torch.zeros(max(span, 1), dtype=val.dtype)
    if _on_gpu(val):
        base = base.to(val.device)
    return base.as_strided(shape, stride, offset)


def _arguments(node: fx.Node, generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    made: dict[fx.Node, Any] = {}

    def value(arg: fx.Node) -> Any:
        if arg not in made:
            val = arg.meta.get("val")
            if val is None:
                raise ProfileError(f"cannot measure op {node.name!r}: its input {arg.name!r} "
                                   "has no meta['val'] (shape unknown)")
            made[arg] = _materialize(val, generator) if isinstance(val, torch.Tensor) else val
        return made[arg]

    args = fx.node.map_arg(node.args, value)
    kwargs = fx.node.map_arg(node.kwargs, value)
    return tuple(args), dict(kwargs)


def _no_sync() -> None:
    """Nothing to wait for: a CPU op has finished when it returns."""


def time_node(node: fx.Node, *, repeats: int = 5, warmup: int = 1, seed: int = 0) -> float:
    """Median seconds of running ``node.target`` alone on inputs shaped like its arguments
    (on its CUDA device, timed to the kernels' end, where its inputs live on one)."""
    generator = torch.Generator().manual_seed(seed)
    args, kwargs = _arguments(node, generator)
    fn = cast(Callable[..., Any], node.target)
    leaves = tree_leaves((args, kwargs))
    on_gpu = any((isinstance(a, torch.Tensor) and a.device.type == "cuda")
                 or (isinstance(a, torch.device) and a.type == "cuda") for a in leaves)
    sync = torch.cuda.synchronize if on_gpu else _no_sync
    samples: list[float] = []
    try:
        with torch.no_grad():
            for _ in range(warmup):
                fn(*args, **kwargs)
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                fn(*args, **kwargs)
                sync()
                samples.append(time.perf_counter() - t0)
    except Exception as exc:  # torch raises many types; name the op and keep its reason
        raise ProfileError(f"cannot measure op {node.name!r} ({fn}): {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return statistics.median(samples)


def _last_users(nodes: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """node -> the values whose last reader it is (so a pass frees them as it goes)."""
    last: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        for arg in node.all_input_nodes:
            last[arg] = node
    result: dict[fx.Node, list[fx.Node]] = {}
    for value, user in last.items():
        result.setdefault(user, []).append(value)
    return result


class _HostClock:
    """Marks on the host's clock: an op's time is the wall time between its mark and the
    previous one (``start``'s first)."""

    def __init__(self) -> None:
        self._marks: list[float] = []

    def start(self) -> None:
        self._marks = [time.perf_counter()]

    def mark(self) -> None:
        self._marks.append(time.perf_counter())

    def finish(self) -> list[float]:
        m = self._marks
        return [m[k] - m[k - 1] for k in range(1, len(m))]


class _CudaClock:
    """Marks as CUDA events on the current stream: an op's time is the GPU time between its
    event and the previous one (launch gaps included, as in a step), read once the pass has
    been synchronized, so timing does not serialize the host with the GPU."""

    def __init__(self) -> None:
        self._events: list[torch.cuda.Event] = []

    def _record(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._events.append(event)

    def start(self) -> None:
        self._events = []
        self._record()

    def mark(self) -> None:
        self._record()

    def finish(self) -> list[float]:
        torch.cuda.synchronize()
        ev = self._events
        return [ev[k - 1].elapsed_time(ev[k]) / 1e3 for k in range(1, len(ev))]


def _in_step(graph: Graph, batch: Any, repeats: int, warmup: int,
             context: Callable[[], AbstractContextManager[Any]] | None) -> list[float]:
    """Per-op median seconds from running the whole joint graph ``warmup + repeats`` times
    (on a CUDA graph, GPU time between events; module docstring)."""
    step = graph.source
    gm: fx.GraphModule = step.gm
    values = step.static_values(graph, batch)
    placeholders = {n: values[step.nodes.node_tensors[n]] for n in gm.graph.nodes
                    if n.op == "placeholder"}
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    op_of = {node: i for i, node in enumerate(step.op_nodes)}
    last = _last_users(nodes)
    # a CUDA clock, under the step's device, when the step's tensors live on a CUDA GPU
    gpu = next((v.device for v in placeholders.values()
                if isinstance(v, torch.Tensor) and v.device.type == "cuda"), None)
    clock = _CudaClock() if gpu is not None else _HostClock()
    samples: list[list[float]] = [[] for _ in graph.ops]
    for rep in range(warmup + repeats):
        env: dict[fx.Node, Any] = dict(placeholders)
        marked: list[int] = []
        with torch.no_grad(), (context() if context else contextlib.nullcontext()), \
                (torch.cuda.device(gpu) if gpu is not None else contextlib.nullcontext()):
            clock.start()
            for node in nodes:
                args = fx.node.map_arg(node.args, env.__getitem__)
                kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
                env[node] = cast(Callable[..., Any], node.target)(*args, **kwargs)
                for dead in last.get(node, ()):
                    if dead.op != "placeholder":
                        env.pop(dead, None)
                i = op_of.get(node)
                if i is not None:
                    clock.mark()
                    marked.append(i)
            seconds = clock.finish()  # one per mark, read after the pass
        if rep >= warmup:
            for i, s in zip(marked, seconds, strict=True):
                samples[i].append(s)
        del env
    missing = [graph.ops[i].name for i, s in enumerate(samples) if not s]
    if missing:
        raise ProfileError(f"graph {graph.name!r}: {len(missing)} ops were never run by the "
                           f"step's FX graph (first: {missing[0]}); capture it again")
    return [statistics.median(s) for s in samples]


def measure_ops(graph: Graph, batch: Any = None, *, repeats: int = 5, warmup: int = 1,
                context: Callable[[], AbstractContextManager[Any]] | None = None,
                op_nodes: Sequence[fx.Node] | None = None, device: str = "this-cpu",
                h2d_bandwidth: float | None = None, d2h_bandwidth: float | None = None,
                copy_engines: int = 2, threads: int | None = None,
                temporaries: bool = False) -> MeasuredProfile:
    """Measure each op of ``graph`` and return its ``MeasuredProfile``.

    Args:
        graph: a captured graph (``graph.source.op_nodes`` gives the FX node of each op);
            or pass ``op_nodes`` explicitly (op id -> node).
        batch: ``(x, y)`` to measure in the step (see the module docstring); the graph must
            have been captured with real tensors. Without it each op is measured alone.
        context: in the step only: a factory of a context manager entered around each pass.
        repeats, warmup: timed and untimed runs per op; the median is kept.
        h2d_bandwidth, d2h_bandwidth, copy_engines: the link to price copies with (e.g. the
            emulated device's), stored in the profile.
        threads: torch intra-op threads while measuring (restored after); use the count the
            executor will run with, or timings will not transfer.
        temporaries: also measure each op's kernel temporaries with the allocator
            (``outcore.cost.measure_temporaries``), stored in the profile and on the graph.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    nodes = list(op_nodes) if op_nodes is not None else list(getattr(graph.source, "op_nodes", []))
    if len(nodes) != len(graph.ops):
        raise ProfileError(f"graph {graph.name!r} has {len(graph.ops)} ops but {len(nodes)} FX "
                           "nodes were found; measure a graph from outcore.capture (not one "
                           "loaded from JSON) or pass op_nodes")
    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        if batch is not None:
            if getattr(graph.source, "fake", True) or op_nodes is not None:
                raise ProfileError(f"graph {graph.name!r} cannot be measured in the step: it "
                                   "needs a capture with real tensors (fake=False); measure its "
                                   "ops alone by leaving batch out")
            seconds = _in_step(graph, batch, repeats, warmup, context)
        else:
            seconds = [time_node(node, repeats=repeats, warmup=warmup, seed=i)
                       for i, node in enumerate(nodes)]
        temps: list[int] = []
        if temporaries:
            from outcore.cost.measure_temporaries import measure_temporaries

            temps = measure_temporaries(graph, None if op_nodes is not None else batch)
    finally:
        torch.set_num_threads(saved_threads)
    return MeasuredProfile.for_graph(
        graph, seconds, device=device, repeats=repeats, h2d_bandwidth=h2d_bandwidth,
        d2h_bandwidth=d2h_bandwidth if d2h_bandwidth is not None else h2d_bandwidth,
        copy_engines=copy_engines, temporaries=temps)

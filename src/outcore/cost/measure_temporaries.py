"""Kernel temporaries per op, measured with the CPU allocator's events. Imports torch.

A tensor count (``plan.memory``) sees an op's inputs and outputs; the allocator also sees
what the kernel allocates for itself and frees before returning: convolution backward's
column buffers, a norm's or a loss's scratch, attention's intermediate products. For op
``i``, ``temporaries[i]`` is the most bytes its call held at once beyond what it returned
(its allocator peak during the call minus the bytes still allocated when it returns), run
alone under ``torch.no_grad()`` on inputs laid out like its arguments (as
``outcore.cost.measure_ops`` times ops alone). Views and ops that allocate nothing measure 0.

``measure_temporaries`` writes them to ``op.temporaries`` (and the size of a saved RNG
state on the device, ``rng_state_bytes``, to ``graph.meta[RNG_STATE_BYTES]``); the memory rule
(``outcore.plan.residency``) holds them during every Compute of the op, on top of its
inputs and outputs and as an operator variant's workspace is held, so every planner, the
simulator and ``outcore.plan``'s budget check count them. A measured profile carries them
too (``MeasuredProfile.temporaries``, written onto the graph by ``bind``). On CUDA
(``device="cuda"``) the same per-op figure comes from ``torch.cuda.max_memory_allocated``
(written, not run here: no GPU on the machine this was built on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from outcore.cost.measure_ops import _arguments
from outcore.errors import ProfileError
from outcore.graph.ir import Graph
from outcore.plan.residency import RNG_STATE_BYTES
from outcore.runtime.devices.allocator_peak import allocation_events

#: ``graph.meta`` key of the measured temporaries (a list, one int per op).
TEMPORARIES = "op_temporaries"


def _transient(sizes: list[int]) -> int:
    """Peak of the running sum minus its final value (bytes held beyond the results)."""
    live = peak = 0
    for size in sizes:
        live += size
        peak = max(peak, live)
    return max(0, peak - max(live, 0))


def _run_alone(nodes: list[Any], seed: int, scope: Callable[[str], Any] | None = None) -> None:
    from torch.profiler import record_function

    mark = scope or record_function
    generator = torch.Generator().manual_seed(seed)
    for i, node in enumerate(nodes):
        args, kwargs = _arguments(node, generator)
        with mark(f"outcore_op_{i}"):
            cast(Callable[..., Any], node.target)(*args, **kwargs)


def _in_step(graph: Graph, batch: Any,
             scope: Callable[[str], Any] | None = None) -> Callable[[], None]:
    """A run of the step's in-core schedule by the executor (its generated code: the
    layouts, constants and kernels of a real step) on ``batch``, each op's kernel inside
    its own ``scope`` (default: a profiler ``record_function``); nothing is applied."""
    from torch.profiler import record_function

    from outcore.plan.lower import lower
    from outcore.plan.plan import Plan
    from outcore.runtime.executor import Executor

    mark = scope or record_function
    probe = Executor(graph, lower(graph, Plan("in-core")), check=False)

    def marked(oid: int) -> Callable[..., Any]:
        kernel = probe.kernel(oid)

        def run(*args: Any, **kwargs: Any) -> Any:
            with mark(f"outcore_op_{oid}"):
                return kernel(*args, **kwargs)

        return run

    probe.replace_ops({oid: marked(oid) for oid in range(len(graph.ops))})

    def step() -> None:
        probe.run(batch, apply=False, measure=False)

    return step


def _profiled(run: Callable[[], None], ops: int) -> list[int]:
    """Per op: the CPU allocator's transient bytes of its record_function (module doc)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    result = [0] * ops
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        name = node.name
        if name.startswith("outcore_op_"):
            sizes = [size for _, _, size in allocation_events([node])]
            op = int(name.removeprefix("outcore_op_"))
            if op >= 0:
                result[op] = max(result[op], _transient(sizes))
            continue
        stack.extend(node.children)
    return result


class _CudaPeaks:
    """``record_function`` stand-in on CUDA: per op, ``torch.cuda.max_memory_allocated``
    during the op minus ``memory_allocated`` after it (the caching allocator's own counters,
    which see cuDNN's and cuBLAS's workspaces). Not exercised on a machine without a GPU."""

    def __init__(self, ops: int) -> None:
        self.result = [0] * ops

    def __call__(self, name: str) -> Any:
        import contextlib

        op = int(name.removeprefix("outcore_op_"))

        @contextlib.contextmanager
        def scope() -> Any:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            yield
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated()
            if op >= 0:
                extra = max(0, torch.cuda.max_memory_allocated() - held)
                self.result[op] = max(self.result[op], extra)

        return scope()


def measure_temporaries(graph: Graph, batch: Any = None, *, seed: int = 0,
                        device: str = "cpu", rng_state: torch.Tensor | None = None
                        ) -> list[int]:
    """Bytes of kernel temporaries of every op of ``graph`` (module docstring), written to
    each ``op.temporaries`` (so the memory rule holds them) and to
    ``graph.meta[TEMPORARIES]``. The graph must come from ``outcore.capture``. With
    ``batch`` the ops run in the step, on its real values, as the executor runs the
    in-core schedule (the kernels a step picks for its layouts); without, each alone on
    fresh inputs. ``device="cuda"`` measures with CUDA's
    allocator counters instead of the CPU profiler (the batch and model on the GPU).
    ``rng_state``: the CPU generator's state the capture started from; each run of the step
    starts from it, so values the capture specialised on (a draw in Python, such as
    LayerDrop's) come out the same. The caller's generator is left as it was either way."""
    nodes = list(getattr(graph.source, "op_nodes", []))
    if len(nodes) != len(graph.ops):
        raise ProfileError(f"graph {graph.name!r} has no FX node per op; measure a graph from "
                           "outcore.capture (not one loaded from JSON)")
    in_step = batch is not None and not getattr(graph.source, "fake", True)
    cuda = _CudaPeaks(len(graph.ops)) if device == "cuda" else None

    step = _in_step(graph, batch, cuda) if in_step else None

    def run() -> None:
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        if step is not None:
            step()
        else:
            _run_alone(nodes, seed, cuda)

    rng_devices = [torch.cuda.current_device()] if device == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=rng_devices):  # random ops draw as eager's
        run()  # warm up: lazy initialisations are not temporaries
        if cuda is not None:
            cuda.result = [0] * len(graph.ops)
            run()
            result = cuda.result
        else:
            result = _profiled(run, len(graph.ops))
    set_temporaries(graph, result)
    graph.meta[RNG_STATE_BYTES] = rng_state_bytes(device)
    return result


def set_temporaries(graph: Graph, temporaries: list[int]) -> None:
    """Write measured temporaries (one int >= 0 per op) onto ``graph``'s ops and meta."""
    if len(temporaries) != len(graph.ops) or any(t < 0 for t in temporaries):
        raise ProfileError(f"temporaries must list {len(graph.ops)} byte counts >= 0 (one per "
                           f"op of {graph.name!r}), got {len(temporaries)}")
    for op, nbytes in zip(graph.ops, temporaries, strict=True):
        op.temporaries = int(nbytes)
    graph.meta[TEMPORARIES] = [int(t) for t in temporaries]


def rng_state_bytes(device: str = "cpu") -> int:
    """Bytes one saved RNG state takes in the allocator of ``device`` (the executor saves one
    per recomputed random op at its first run and replays it in the recompute,
    ``outcore.runtime.executor``): on ``"cpu"``, ``torch.get_rng_state()``'s ByteTensor (the
    Mersenne Twister's 5,056 bytes); on ``"cuda"`` 0, since both the CPU's and the GPU's
    saved states are host tensors (``torch.cuda.get_rng_state()`` returns a CPU tensor), so
    the device's allocator holds none of them. The memory rule reads it from
    ``graph.meta[RNG_STATE_BYTES]`` (``outcore.plan.residency``)."""
    return int(torch.get_rng_state().numel()) if device == "cpu" else 0


def allocator_peak_bound(graph: Graph, schedule: Any) -> int:
    """What the CPU allocator may hold at most during a step of ``schedule`` on the plain
    CPU device beyond what was allocated before it (parameters, the batch): the memory
    rule's most device plus host bytes at once (every op's ``temporaries`` on top of its
    Compute, its variant's workspace; host copies share the CPU's allocator), less the
    static bytes, plus the backward's seed (the loss tangent the executor makes for each
    step). The saved RNG states of recomputed random ops are in the rule (held from the
    op's first run to its last recompute) once ``measure_temporaries`` has set their size
    on the graph."""
    from outcore.graph.ir import TensorKind
    from outcore.plan.memory import memory_curve

    trace = memory_curve(graph, schedule)
    most = max((d + h for d, h in zip(trace.device, trace.host, strict=True)),
               default=trace.static)
    seeds = sum(t.nbytes for t in graph.tensors if t.kind is TensorKind.TANGENT)
    return most - trace.static + seeds

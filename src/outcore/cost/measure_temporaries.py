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
from torch.utils._pytree import tree_map

from outcore.cost.measure_ops import _arguments
from outcore.errors import ProfileError
from outcore.graph.ir import Graph
from outcore.plan.residency import RNG_STATE_BYTES
from outcore.plan.scope import SCRATCH
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
            # held past the window: outputs freed inside it would count as temporaries
            result = cast(Callable[..., Any], node.target)(*args, **kwargs)
        del result


class RealOutputs:
    """What a step's kernels really return beyond the graph's declared outputs (the graph's
    sizes come from fake tensors), seen per op in one run of the step:

    * ``dropped[op]``: bytes of fresh storages the kernel returns in a slot the graph does
      not bind (convolution backward returns grad_weight even when its output mask says
      False): they live from the kernel's return to the end of its instruction, so the
      memory rule charges them with the op's temporaries;
    * ``storage[tid]``: the real bytes of a base output's storage where they exceed the
      declared ``nbytes`` (``_embedding_bag``'s offset2bag is allocated one element long
      and shrunk, its storage kept): the graph's ``nbytes`` is its storage's bytes, so it
      is raised to them.

    Storages shared with the op's inputs (in-place and aliasing outputs) are not counted."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.dropped = [0] * len(graph.ops)
        self.storage: dict[int, int] = {}
        source = graph.source
        self.nodes = list(getattr(source, "op_nodes", []))
        self.slots = getattr(getattr(source, "nodes", None), "op_outputs", {})

    def see(self, oid: int, args: Any, kwargs: Any, result: Any) -> None:
        """Compare what op ``oid``'s kernel returned on ``args``/``kwargs`` to its outputs."""
        op = self.graph.ops[oid]
        slots = self.slots.get(self.nodes[oid])
        if slots is None:
            slots = list(op.outputs[:1])
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        real = list(result) if isinstance(result, (tuple, list)) else [result]
        dropped = 0
        for idx, value in enumerate(real):
            if not isinstance(value, torch.Tensor):
                continue
            storage = value.untyped_storage()
            nbytes, ptr = storage.nbytes(), storage.data_ptr()
            if not nbytes or ptr in inputs:
                continue
            inputs.add(ptr)  # a storage returned twice counts once
            slot = slots[idx] if idx < len(slots) else None
            if slot is None:
                dropped += nbytes
                continue
            declared = self.graph.tensors[slot]
            if not declared.is_view and nbytes > declared.nbytes:
                self.storage[slot] = max(nbytes, self.storage.get(slot, 0))
        self.dropped[oid] = max(self.dropped[oid], dropped)

    def apply(self) -> None:
        """Raise the graph's storage sizes to the real ones (``storage``)."""
        for tid, nbytes in self.storage.items():
            self.graph.tensors[tid].nbytes = nbytes


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _in_step(graph: Graph, batch: Any, scope: Callable[[str], Any] | None = None,
             outputs: RealOutputs | None = None) -> Callable[[], None]:
    """A run of the step's in-core schedule by the executor (its generated code: the
    layouts, constants and kernels of a real step) on ``batch``, each op's kernel inside
    its own ``scope`` (default: a profiler ``record_function``), its results shown to
    ``outputs`` when given; nothing is applied."""
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
                result = kernel(*args, **kwargs)
            if outputs is not None:
                outputs.see(oid, args, kwargs, result)
            return result

        return run

    probe.replace_ops({oid: marked(oid) for oid in range(len(graph.ops))})

    from torch.utils._pytree import tree_map

    # leaves of the same values: a batch tensor that autograd computed (which the executor
    # refuses, with a message about the step) measures as the leaf it is detached to
    leaves = tree_map(lambda t: t.detach().requires_grad_(t.requires_grad)
                      if isinstance(t, torch.Tensor) else t, batch)

    def step() -> None:
        probe.run(leaves, apply=False, measure=False)

    return step


def _scratch(events: list[tuple[int, int, int]]) -> int:
    """Peak of the bytes the call allocated and freed again before returning (its results,
    blocks still allocated at its end, left out; frees of older blocks ignored)."""
    open_at: dict[int, int] = {}
    for i, (_, ptr, size) in enumerate(events):
        if size > 0:
            open_at[ptr] = i
        elif size < 0:
            open_at.pop(ptr, None)
    results = set(open_at.values())
    mine: set[int] = set()
    live = peak = 0
    for i, (_, ptr, size) in enumerate(events):
        if size > 0 and i not in results:
            mine.add(ptr)
            live += size
        elif size < 0 and ptr in mine:
            mine.discard(ptr)
            live += size
        peak = max(peak, live)
    return peak


def _profiled(run: Callable[[], None], ops: int) -> tuple[list[int], list[int]]:
    """Per op: the CPU allocator's transient bytes of its record_function (module doc), and
    its scratch (``_scratch``)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    result = [0] * ops
    scratch = [0] * ops
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        name = node.name
        if name.startswith("outcore_op_"):
            events = allocation_events([node])
            op = int(name.removeprefix("outcore_op_"))
            if op >= 0:
                result[op] = max(result[op], _transient([size for _, _, size in events]))
                scratch[op] = max(scratch[op], _scratch(events))
            continue
        stack.extend(node.children)
    return result, scratch


def _no_scope(name: str) -> Any:
    import contextlib

    return contextlib.nullcontext()


class _CudaPeaks:
    """``record_function`` stand-in on CUDA: per op, ``torch.cuda.max_memory_allocated``
    during the op minus ``memory_allocated`` after it, on the current device (the caching
    allocator's own counters, which see cuDNN's and cuBLAS's workspaces), the same
    definition as the CPU's ``_transient``.

    * ``reset_peak_memory_stats`` at the op's start makes the peak the bytes allocated
      then; the op's inputs are in both the peak and ``held``, so they cancel. ``held`` is
      at least that start: a block of an earlier op freed during the window lowers what
      is left, not the temporaries (as ``_transient`` on the CPU).
    * The counters are host-side: the allocator updates them when a kernel's host code
      allocates or frees, not when the GPU runs it, so no synchronisation is needed for
      them; the ``synchronize`` calls are kept so that a pending kernel of an earlier op
      can never be counted in a later one's window by an allocator backend that defers.
    * They count allocator blocks, not requests: at least 512 B each, rounded up to a
      multiple of 512 B, and a cached block that is not split is counted whole. So a
      temporary here is an upper bound on what the kernel asked for (safe for the rule).
    * A cuBLAS workspace made at an op's first call stays allocated (it is not freed at
      the op's end); the warm-up run makes it, so it is not counted as a temporary.

    Never run on a GPU here; ``tests/devices/test_cuda_peaks_path.py`` drives it with
    counters faked on the CPU."""

    def __init__(self, ops: int) -> None:
        self.result = [0] * ops

    def __call__(self, name: str) -> Any:
        import contextlib

        op = int(name.removeprefix("outcore_op_"))

        @contextlib.contextmanager
        def scope() -> Any:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated()
            yield
            torch.cuda.synchronize()
            held = max(torch.cuda.memory_allocated(), start)  # frees of older blocks: no gain
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
    fresh inputs. ``device="cuda"`` measures with CUDA's allocator counters instead of the
    CPU profiler (the batch and model on the GPU); ``device="cpu-emulated"`` (whose peak is
    the tracker's tensor count, which sees no kernel scratch) measures only what the step's
    kernels really return beyond the declared outputs (``RealOutputs``, which every in-step
    measurement applies too: dropped returns join the temporaries, larger storages raise
    the graph's ``nbytes``).
    ``rng_state``: the CPU generator's state the capture started from; each run of the step
    starts from it, so values the capture specialised on (a draw in Python, such as
    LayerDrop's) come out the same. The caller's generator is left as it was either way."""
    nodes = list(getattr(graph.source, "op_nodes", []))
    if len(nodes) != len(graph.ops):
        raise ProfileError(f"graph {graph.name!r} has no FX node per op; measure a graph from "
                           "outcore.capture (not one loaded from JSON)")
    in_step = batch is not None and not getattr(graph.source, "fake", True)
    cuda = _CudaPeaks(len(graph.ops)) if device == "cuda" else None
    outputs = RealOutputs(graph) if in_step else None
    tracked = device == "cpu-emulated"  # the tracker: tensors only, no kernel scratch
    if (tracked or cuda is not None) and outputs is None:  # alone: inputs made on the CPU
        raise ProfileError(f"device={device!r} measures in the step: pass the batch of a "
                           "graph captured with real tensors on that device")
    step = _in_step(graph, batch, _no_scope if tracked else cuda, outputs) if in_step else None

    def run() -> None:
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        if step is not None:
            step()
        else:
            _run_alone(nodes, seed, cuda)

    scratch: list[int] | None = None
    rng_devices = [torch.cuda.current_device()] if device == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=rng_devices):  # random ops draw as eager's
        run()  # warm up: lazy initialisations are not temporaries
        if tracked:
            result = [0] * len(graph.ops)
        elif cuda is not None:
            cuda.result = [0] * len(graph.ops)
            run()
            result = cuda.result
        else:
            result, scratch = _profiled(run, len(graph.ops))
    if outputs is not None:  # returned storages the graph drops die with the instruction
        result = [t + d for t, d in zip(result, outputs.dropped, strict=True)]
        if scratch is not None:
            scratch = [t + d for t, d in zip(scratch, outputs.dropped, strict=True)]
        outputs.apply()
    set_temporaries(graph, result)
    if scratch is not None:
        graph.meta[SCRATCH] = scratch
    graph.meta[RNG_STATE_BYTES] = rng_state_bytes(device)
    return result


def real_outputs_alone(graph: Graph, seed: int = 0) -> None:
    """``RealOutputs`` without a batch: each op of ``graph`` run once alone on the CPU, on
    fresh inputs laid out like its arguments (``outcore.cost.measure_ops``), under no_grad;
    storages larger than declared raise the graph's ``nbytes`` and returned storages the
    graph drops join the op's temporaries, as a measurement in the step applies them.

    For a graph whose step has no batch to run it on (``torch.compile``'s backend, which
    sees flat arguments): there the emulated device's tracker counts what the kernels
    really return, and fake tensors under-declare some of it (a CPU ``mse_loss``,
    ``smooth_l1_loss``, ``binary_cross_entropy`` or ``soft_margin_loss`` with a reduction
    returns its scalar in a storage the size of its input; ``_embedding_bag``'s
    offset2bag). Layout-dependent sizes (a ``copy`` into a view of a larger base) are
    the fresh inputs' and may still be below the step's. Ops on CUDA tensors are skipped
    (this runs on the CPU); an op that refuses normal random values runs again on values in
    [0, 1) (a binary cross-entropy's probabilities), and where it refuses those too its
    declared sizes stand. The caller's generator is left as it was."""
    nodes = list(getattr(graph.source, "op_nodes", []))
    if len(nodes) != len(graph.ops):
        raise ProfileError(f"graph {graph.name!r} has no FX node per op")
    outputs = RealOutputs(graph)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        for oid, node in enumerate(nodes):
            on_device = any(v.device.type != "cpu" for v in _tensors(node.meta.get("val")))
            if on_device or not callable(node.target):
                continue
            args, kwargs = _arguments(node, generator)
            result = _run_on(node, args, kwargs)
            if result is None:  # values it refuses (BCE wants [0, 1]) in [0, 1) too
                args, kwargs = tree_map(_unit, (args, kwargs))
                result = _run_on(node, args, kwargs)
            if result is not None:
                outputs.see(oid, args, kwargs, result)
            del result
    outputs.apply()
    for op, dropped in zip(graph.ops, outputs.dropped, strict=True):
        op.temporaries += dropped


def _run_on(node: Any, args: Any, kwargs: Any) -> Any:
    """``node``'s kernel on ``args``/``kwargs``, or None where it refuses their values."""
    try:
        return cast(Callable[..., Any], node.target)(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a value check of the kernel, not an outcore error
        return None


def _unit(value: Any) -> Any:
    """A floating tensor's values squashed into [0, 1), same layout; anything else as is."""
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return torch.sigmoid(value)
    return value


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

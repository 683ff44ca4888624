"""Kernel temporaries per op, measured with the CPU allocator's events. Imports torch.

A tensor count (``plan.memory``) sees an op's inputs and outputs; the allocator also sees
what the kernel allocates for itself and frees before returning: convolution backward's
column buffers, a norm's or a loss's scratch, attention's intermediate products. For op
``i``, ``temporaries[i]`` is the most bytes its call held at once beyond what it returned
(its allocator peak during the call minus the bytes still allocated when it returns), run
alone under ``torch.no_grad()`` on inputs laid out like its arguments (as
``outcore.cost.measure_ops`` times ops alone). Views and ops that allocate nothing measure 0.

The planned peak with temporaries is ``memory_curve(graph, schedule,
workspace=with_temporaries(...))``: each Compute holds its op's temporaries on top of its
inputs and outputs for that instruction only, as the replay already does for an operator
variant's workspace (``outcore.plan.residency``). The numbers are stored beside the per-op
times (``MeasuredProfile.temporaries``) and in ``graph.meta[TEMPORARIES]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from outcore.cost.measure_ops import _arguments
from outcore.errors import ProfileError
from outcore.graph.ir import Graph
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


def _run_alone(nodes: list[Any], seed: int) -> None:
    from torch.profiler import record_function

    generator = torch.Generator().manual_seed(seed)
    for i, node in enumerate(nodes):
        args, kwargs = _arguments(node, generator)
        with record_function(f"outcore_op_{i}"):
            cast(Callable[..., Any], node.target)(*args, **kwargs)


def _run_in_step(graph: Graph, batch: Any) -> None:
    """The joint graph node by node on the real parameters and batch (as
    ``measure_ops`` measures in the step), each op inside its own record_function."""
    from torch import fx
    from torch.profiler import record_function

    from outcore.cost.measure_ops import _last_users

    step = graph.source
    gm: fx.GraphModule = step.gm
    values = step.static_values(graph, batch)
    env: dict[Any, Any] = {n: values[step.nodes.node_tensors[n]] for n in gm.graph.nodes
                           if n.op == "placeholder"}
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    op_of = {node: i for i, node in enumerate(step.op_nodes)}
    last = _last_users(nodes)
    for node in nodes:
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        with record_function(f"outcore_op_{op_of.get(node, -1)}"):
            env[node] = cast(Callable[..., Any], node.target)(*args, **kwargs)
        for dead in last.get(node, ()):
            if dead.op != "placeholder":
                env.pop(dead, None)


def measure_temporaries(graph: Graph, batch: Any = None, *, seed: int = 0) -> list[int]:
    """Bytes of kernel temporaries of every op of ``graph`` (module docstring); also stored
    in ``graph.meta[TEMPORARIES]``. The graph must come from ``outcore.capture``. With
    ``batch`` the ops run in the step, on its real values (the kernels a step picks for its
    layouts); without, each alone on fresh inputs."""
    from torch.profiler import ProfilerActivity, profile

    nodes = list(getattr(graph.source, "op_nodes", []))
    if len(nodes) != len(graph.ops):
        raise ProfileError(f"graph {graph.name!r} has no FX node per op; measure a graph from "
                           "outcore.capture (not one loaded from JSON)")
    in_step = batch is not None and not getattr(graph.source, "fake", True)

    def run() -> None:
        if in_step:
            _run_in_step(graph, batch)
        else:
            _run_alone(nodes, seed)

    with torch.no_grad():
        run()  # warm up: lazy initialisations are not temporaries
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
    result = [0] * len(graph.ops)
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
    graph.meta[TEMPORARIES] = result
    return result


def with_temporaries(graph: Graph, temporaries: list[int],
                     workspace: Callable[[int], int] | None = None) -> Callable[[int], int]:
    """A ``workspace`` callback for ``plan.memory.memory_curve``: each op's temporaries plus
    its variant's workspace (``workspace``, default none)."""
    def total(op: int) -> int:
        return temporaries[op] + (workspace(op) if workspace is not None else 0)

    return total


def rng_state_bytes() -> int:
    """Bytes of one saved CPU RNG state (``torch.get_rng_state()``, the Mersenne Twister's
    5,056 bytes): the executor keeps one per random op from its forward to the step's end,
    to replay it when the op is recomputed (``outcore.runtime.executor``)."""
    return int(torch.get_rng_state().numel())


def allocator_peak_bound(graph: Graph, schedule: Any, temporaries: list[int]) -> int:
    """What the CPU allocator may hold at most during a step of ``schedule`` beyond what was
    allocated before it (parameters, the batch): the memory rule's peak with every op's
    temporaries on top of its Compute (and its variant's workspace), less the static bytes,
    plus the saved RNG states of every random op (counted over the whole step) and the
    backward's seed (the loss tangent the executor makes for each step)."""
    from outcore.plan.memory import memory_curve
    from outcore.plan.residency import default_workspace

    trace = memory_curve(graph, schedule,
                         with_temporaries(graph, temporaries, default_workspace(graph, schedule)))
    from outcore.graph.ir import TensorKind

    randoms = sum(1 for op in graph.ops if op.random)
    seeds = sum(t.nbytes for t in graph.tensors if t.kind is TensorKind.TANGENT)
    return trace.peak - trace.static + randoms * rng_state_bytes() + seeds

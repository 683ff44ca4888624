"""Execution orders for graphs with forks and joins (plain Python).

* ``capture``: the order the ops were traced in (always valid).
* ``superneurons``: SuperNeurons Alg. 1 (RouteConstruct): depth-first from the first layer;
  a join is entered only when its counter reaches its number of predecessors; successors
  are explored in capture order.
* ``dfs``: Dymem §3.1: depth-first over ready ops (all predecessors done) with an explicit
  stack, so at a fork one branch is followed to its join before the next starts.

Both DFS routes are applied to the forward ops, then to the backward ops; forward always
comes first. Every route is a topological order (``is_topological`` checks it) of the
dependencies of ``dependencies``: data, and the traced order of random ops. Both are
iterative, so 10,000-layer graphs do not hit Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from outcore.graph.ir import Graph, Phase

STRATEGIES = ("capture", "superneurons", "dfs")


def dependencies(graph: Graph) -> tuple[list[list[int]], list[list[int]]]:
    """(predecessors, successors) of every op: op B follows op A when B reads A's output,
    and a random op follows the random op traced before it (each draws from the generator
    where eager's program order leaves it: another order gives other dropout masks)."""
    preds: list[list[int]] = [[] for _ in graph.ops]
    succs: list[list[int]] = [[] for _ in graph.ops]
    previous_random: int | None = None
    for op in graph.ops:
        before = [graph.tensors[tid].producer for tid in op.inputs]
        if op.random:
            before.append(previous_random)
            previous_random = op.id
        for producer in before:
            if producer is not None and producer not in preds[op.id]:
                preds[op.id].append(producer)
                succs[producer].append(op.id)
    return preds, succs


def execution_order(graph: Graph, strategy: str = "capture") -> list[int]:
    """A topological order of all ops under ``strategy`` (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown order strategy {strategy!r}; choose one of {STRATEGIES}")
    if strategy == "capture":
        return [op.id for op in graph.ops]
    preds, succs = dependencies(graph)
    route: list[int] = []
    for phase_ops in (_ops_of(graph, True), _ops_of(graph, False)):
        members = set(phase_ops)
        local_preds = {o: [p for p in preds[o] if p in members] for o in phase_ops}
        walk = _route_construct if strategy == "superneurons" else _ready_dfs
        route += walk(phase_ops, local_preds, succs, members)
    return route


def _ops_of(graph: Graph, forward: bool) -> list[int]:
    return [op.id for op in graph.ops if (op.phase is Phase.FORWARD) == forward]


def _route_construct(ops: list[int], preds: dict[int, list[int]], succs: list[list[int]],
                     members: set[int]) -> list[int]:
    """SuperNeurons Alg. 1 with an explicit stack in place of recursion."""
    counter = dict.fromkeys(ops, 0)
    route: list[int] = []
    visited: set[int] = set()
    for root in ops:  # every source (and any op left unvisited) starts a construction
        if root in visited or preds[root]:
            continue
        stack = [root]
        while stack:
            layer = stack.pop()
            if layer in visited:
                continue
            counter[layer] += 1
            if counter[layer] < max(1, len(preds[layer])):
                continue  # a join waits for all its previous layers (Alg. 1 lines 5-6)
            route.append(layer)
            visited.add(layer)
            nxt = [s for s in succs[layer] if s in members]
            stack.extend(reversed(nxt))  # explore next layers in order (lines 8-10)
    return route


def _ready_dfs(ops: list[int], preds: dict[int, list[int]], succs: list[list[int]],
               members: set[int]) -> list[int]:
    """Dymem's DFS: push an op once all its predecessors have run; pop the newest."""
    remaining = {o: len(preds[o]) for o in ops}
    stack = [o for o in reversed(ops) if remaining[o] == 0]
    route: list[int] = []
    while stack:
        op = stack.pop()
        route.append(op)
        ready = []
        for s in succs[op]:
            if s in members:
                remaining[s] -= 1
                if remaining[s] == 0:
                    ready.append(s)
        stack.extend(reversed(ready))
    return route


def is_topological(graph: Graph, order: Sequence[int]) -> bool:
    """True when ``order`` lists every op once and each op follows its producers."""
    if sorted(order) != list(range(len(graph.ops))):
        return False
    position = {op: i for i, op in enumerate(order)}
    preds, _ = dependencies(graph)
    return all(position[p] < position[o] for o in order for p in preds[o])

"""The ``variants`` option every variant-choosing policy takes, and the table it resolves to.

vDNN, SuperNeurons and moDNN each choose an operator variant per op; each takes the same
option, a ``VariantSpec``: op id -> variant names, or a callable ``graph -> that table`` (a
table keyed by op id fits one graph; a callable fits every graph a policy re-captures, e.g.
moDNN's sub-batches). ``variant_table`` resolves it for one graph, the same way for all three:

* every name must be a ``outcore.variants.names.Variant`` and every op id one of the graph's
  (``PolicyOptionError`` otherwise, naming the valid ones);
* a variant capture refused for the op (``Op.variant_options[name]["refused"]``: the op is
  outside what the variant declares it computes) is dropped: the search never offers it.

Without a spec (or with ``True``) the table is what capture recorded as able to run each op;
``False`` is the empty table: PyTorch's kernels only (``--option variants=off``), the way to
keep the results equal to eager PyTorch's bit for bit (a variant sums in another order:
``outcore.variants.notice``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outcore.errors import PolicyOptionError
from outcore.graph.ir import Graph, Op
from outcore.variants.names import parse

#: op id -> variant names, or a callable graph -> that table; False: none (PyTorch's
#: kernels only), True: the default (what capture recorded).
VariantSpec = Mapping[int, Sequence[str]] | Callable[[Any], Mapping[int, Sequence[str]]] | bool


def runnable(op: Op, names: Sequence[str]) -> list[str]:
    """``names`` without those capture refused for ``op`` (order kept, duplicates dropped)."""
    return [n for n in dict.fromkeys(names) if "refused" not in op.variant_options.get(n, {})]


def recorded(graph: Graph) -> dict[int, list[str]]:
    """Op id -> the variants capture recorded as able to run it (``Op.variant_options``)."""
    return {op.id: runnable(op, list(op.variant_options)) for op in graph.ops
            if op.variant_options}


def variant_table(graph: Graph, spec: VariantSpec | None) -> dict[int, list[str]]:
    """The table the search may offer for ``graph`` (see the module docstring)."""
    if spec is False:
        return {}
    if spec is None or spec is True:
        return recorded(graph)
    listed = spec(graph) if callable(spec) else spec
    table: dict[int, list[str]] = {}
    for op_id, names in dict(listed).items():
        if not isinstance(op_id, int) or not 0 <= op_id < len(graph.ops):
            raise PolicyOptionError(
                f"options['variants'] names op {op_id!r}, but graph {graph.name!r} has "
                f"{len(graph.ops)} ops; pass a callable graph -> table to fit every graph",
                f"op ids 0..{len(graph.ops) - 1}")
        if isinstance(names, str):
            raise PolicyOptionError(f"options['variants'][{op_id}] must be a list of variant "
                                    f"names, got the string {names!r}", "a list of names")
        table[op_id] = runnable(graph.ops[op_id], [parse(n).value for n in names])
    return table

"""A recompute kernel is not fused with backward work: each runs where the partition put it.

The partition orders the backward graph as autograd would run it, each recomputed forward
op just before its first use, and the plan's predicted peak counts the re-made value and the
backward's buffers in that order. Inductor's scheduler may fuse two kernels that do not
depend on each other but read the same buffers (*horizontal* fusion); the fused kernel runs
at the earlier one's place, so the later one's buffers are made there, before every kernel
the order put between the two. On the tiny GPT of ``tests/compiled`` (session 15), a plan
that re-makes the final layer norm for the head's weight gradient had that recompute fused
with the layer norm's backward (same input, mean and rstd): the backward's two gradient
buffers were made before the head's matrix product, beside the logits' gradient and the
re-made value, and the step's allocator peak was 1,536 B above the plan.

``KeepRecomputeInPlace`` is an Inductor choices handler (``torch._inductor.virtualized.V
.set_choices_handler``) that refuses a horizontal fusion of a *recompute kernel* (every IR
origin a recomputed node, marked by the partitioner with ``mark_recomputed``) with a kernel
that does backward work (an origin that is not recomputed). Everything else is Inductor's
default, in particular vertical fusion (a recompute inlined into its consumer, which the
fused prediction relies on) and horizontal fusion among recomputes or among backward
kernels. Invariant: no recompute kernel shares a kernel with backward work it does not feed.
The backward is compiled while the handler is set (``force_non_lazy_backward_lowering``:
lazily, at the first ``backward()``, it would be compiled without it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import fx
from torch._inductor.choices import InductorChoices

#: ``fx.Node.meta`` key the partitioner sets on each recomputed node of a backward graph.
RECOMPUTED = "outcore_recomputed"


def mark_recomputed(nodes: Iterable[fx.Node]) -> None:
    """Mark ``nodes`` (a backward graph's recomputed forward ops) for the handler."""
    for node in nodes:
        node.meta[RECOMPUTED] = True


def _origins(node: Any) -> tuple[bool, bool]:
    """(has a recomputed origin, has another) over a scheduler node's members' IR origins."""
    redone = other = False
    for member in node.get_nodes():
        for origin in getattr(getattr(member, "node", None), "origins", None) or ():
            if origin.meta.get(RECOMPUTED):
                redone = True
            else:
                other = True
    return redone, other


def joins_recompute_and_backward(node1: Any, node2: Any) -> bool:
    """Whether one of two scheduler nodes is a recompute kernel and the other does backward
    work (module docstring)."""
    r1, o1 = _origins(node1)
    r2, o2 = _origins(node2)
    return (r1 and not o1 and o2) or (r2 and not o2 and o1)


class KeepRecomputeInPlace(InductorChoices):
    """Inductor's default choices, less the horizontal fusions of a recompute kernel with
    backward work (module docstring)."""

    @staticmethod
    def can_fuse_horizontal(scheduler: Any, node1: Any, node2: Any,
                            shared_data_score: int) -> bool:
        if joins_recompute_and_backward(node1, node2):
            return False
        return InductorChoices.can_fuse_horizontal(scheduler, node1, node2,
                                                   shared_data_score)

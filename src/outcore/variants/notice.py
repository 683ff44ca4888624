"""What a plan's operator variants change for the user, said where it is planned (no torch).

A variant (``names.Variant``: an im2col or FFT convolution, a materialised or chunked
attention) computes the same function as PyTorch's kernel with its sums in another order, so
a step that runs one gives a loss and gradients equal to eager PyTorch's only up to rounding.
The policies that choose variants (vDNN, SuperNeurons, moDNN; outcore-auto never does: its
portfolio drops them) do so as their papers do, to trade workspace for speed; outcore says so
every time a plan runs one: a ``VariantWarning``, the ``outcore`` logger and the plan's notes
(``PlannedStep.notes``, ``Trainer.stats.notes``, ``outcore plan`` / ``explain``). Invariant:
a plan whose schedule runs no variant gets no note, one that runs any gets exactly one.
"""

from __future__ import annotations

from collections.abc import Mapping

from outcore.errors import VariantWarning
from outcore.graph.ir import Graph
from outcore.log import announce
from outcore.variants.names import is_framework

#: Ops named in the note at most (the count says how many more).
SHOWN = 3


def chosen(graph: Graph, variants: Mapping[int, str]) -> list[tuple[str, str]]:
    """``(op name, variant)`` for every op of ``graph`` whose variant is not the framework's
    kernel, in op order."""
    return [(graph.ops[op].name, str(name)) for op, name in sorted(variants.items())
            if not is_framework(str(name))]


def variant_note(graph: Graph, variants: Mapping[int, str]) -> str | None:
    """The note for a schedule running ``variants`` on ``graph``; None when it runs only
    PyTorch's kernels."""
    ops = chosen(graph, variants)
    if not ops:
        return None
    shown = ", ".join(f"{op} ({name})" for op, name in ops[:SHOWN])
    more = f" and {len(ops) - SHOWN} more" if len(ops) > SHOWN else ""
    return (f"operator variants replace PyTorch's kernels on {len(ops)} op(s): {shown}{more}. "
            "They compute the same function with sums in another order, so the loss and "
            "gradients equal eager PyTorch's only up to rounding. policy='auto', or the "
            "policy option variants=False (CLI: --option variants=off), keeps PyTorch's "
            "kernels")


def announce_variants(graph: Graph, variants: Mapping[int, str]) -> str | None:
    """Warn (``VariantWarning``) and log that the plan runs operator variants; returns the
    note, or None (and says nothing) when it runs none."""
    text = variant_note(graph, variants)
    if text is not None:
        announce(text, VariantWarning, stacklevel=4)
    return text

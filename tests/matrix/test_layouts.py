"""Layouts capture records versus layouts real kernels produce (issue 21 item 2).

The cross-check runs each captured joint graph on real tensors, node by node, and asserts
that every real value has the strides its traced (fake) value has wherever they matter:
a divergence is what made ``Linear -> transpose -> BatchNorm1d -> transpose`` fail with
"view size is not compatible". It covers norms over every layout, channels_last
convolutions, permute chains and elided ``contiguous``, dropout's backward.
"""

from __future__ import annotations

import pytest
import torch
from matrix_harness import clone_batch, eager_step
from matrix_models import BY_NAME, CASES
from torch import fx

import outcore
from outcore.capture import eager_meta, layouts
from outcore.capture.aot import fx_graph_of
from outcore.runtime.layout import relayout_copy, same_layout

LAYOUT_CASES = ["bn1d-transposed", "instancenorm-transposed", "groupnorm-transposed",
                "layernorm-permuted", "rmsnorm-permuted", "permute-chain", "convbn",
                "convbn-channels-last", "convbn-cl-input-only", "conv1d", "conv3d",
                "convtranspose2d", "dropout-train", "frozen-backbone-bn-eval", "bf16"]


class StrideCheck(fx.Interpreter):
    """Runs the joint graph on real tensors; records every node whose real layout differs
    from the traced one (a divergence propagates through elementwise ops to a view)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.diverged: list[str] = []

    def run_node(self, n: fx.Node) -> object:
        out = super().run_node(n)
        fake = n.meta.get("val")
        pairs = zip(out, fake, strict=False) if isinstance(out, (tuple, list)) and \
            isinstance(fake, (tuple, list)) else [(out, fake)]
        for real, traced in pairs:
            if isinstance(real, torch.Tensor) and isinstance(traced, torch.Tensor) and \
                    not same_layout(real.stride(), real.shape, traced.stride()):
                self.diverged.append(f"{n.name} ({n.target}): real {real.stride()} "
                                     f"traced {traced.stride()}")
        return out


def diverging_nodes(name: str) -> list[str]:
    case = BY_NAME[name]
    batch = case.example()
    graph = outcore.capture(case.build(), case.loss_fn, batch)
    step = graph.source
    values = step.static_values(graph, batch)
    placeholders = [n for n in step.gm.graph.nodes if n.op == "placeholder"]
    check = StrideCheck(step.gm)
    with torch.no_grad():
        check.run(*[values[step.nodes.node_tensors[n]] for n in placeholders])
    return check.diverged


@pytest.mark.parametrize("name", LAYOUT_CASES)
def test_every_traced_layout_is_the_real_kernels(name: str) -> None:
    assert diverging_nodes(name) == []


def _copies(graph: outcore.Graph) -> int:
    copies = [n for n in fx_graph_of(graph).graph.nodes if n.target is relayout_copy]
    assert sum(op.target == "relayout_copy" for op in graph.ops) == len(copies)
    return len(copies)


def test_batchnorm_over_a_transposed_activation_is_traced_in_the_real_layout() -> None:
    """``eager_meta`` gives batch norm's outputs the real kernel's layout while tracing, so
    nothing is left for ``repair_layouts`` to mend."""
    case = BY_NAME["bn1d-transposed"]
    assert _copies(outcore.capture(case.build(), case.loss_fn, case.example())) == 0


@pytest.mark.parametrize("name", [case.name for case in CASES])
def test_no_case_needs_a_copy_into_the_traced_layout(name: str) -> None:
    """The class behind BatchNorm1d over a sequence: where the trace took another layout
    than the real kernel, the ops after the mending copy ran (and summed) in another layout
    than eager's. Every case of the matrix is now traced in the real kernels' layouts."""
    case = BY_NAME[name]
    assert _copies(outcore.capture(case.build(), case.loss_fn, case.example())) == 0


def test_without_the_trace_time_rules_the_repair_copies_into_the_traced_layout(
        monkeypatch) -> None:
    """The net behind the trace-time rules: ``repair_layouts`` records the real layout and
    copies once into the traced one, for the forward's output and the backward's grad_input."""
    monkeypatch.setattr(eager_meta, "KNOWN_RULES", {})
    case = BY_NAME["bn1d-transposed"]
    assert _copies(outcore.capture(case.build(), case.loss_fn, case.example())) == 2
    assert diverging_nodes("bn1d-transposed") == []


def test_a_divergence_outside_the_table_still_computes_eagers_values(monkeypatch) -> None:
    """The run-time net (``outcore.runtime.layout.relayout``): with the table emptied, the
    executor copies the real output into the traced layout before a view relies on it."""
    monkeypatch.setattr(layouts, "KNOWN_RULES", {})
    monkeypatch.setattr(eager_meta, "KNOWN_RULES", {})
    case = BY_NAME["bn1d-transposed"]
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        diverging_nodes("bn1d-transposed")  # the graph as traced fails on real tensors
    model, ref = case.build(), case.build()
    batch = case.example()
    want = eager_step(ref, case, clone_batch(batch))
    with outcore.compile(model, case.loss_fn, batch, budget=None, device="cpu") as tr:
        got = tr.step(*batch)
    torch.testing.assert_close(got, want)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)

"""The ``variants`` option, resolved the same way for vDNN, SuperNeurons and moDNN: a table or
a callable, known names only (the ``Variant`` enum), op ids of the graph, and a variant capture
refused for an op never offered."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.errors import PolicyOptionError
from outcore.policies import config_for
from outcore.policies.common import variant_table
from outcore.variants.meta import CONV
from outcore.variants.names import Variant, is_framework, parse
from outcore.variants.registry import FRAMEWORK, variants_for


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, groups=2), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 3))
    return outcore.capture(model, F.cross_entropy, (torch.randn(2, 4, 6, 6),
                                                    torch.tensor([0, 2])))


def _grouped(graph):
    return next(op.id for op in graph.ops if op.target == CONV)


def test_one_spelling_of_the_framework_kernel():
    assert FRAMEWORK is Variant.FRAMEWORK and FRAMEWORK == "framework"
    assert is_framework("") and is_framework("framework") and not is_framework("im2col")
    assert variants_for(CONV) == ["framework", "im2col", "fft"]
    assert all(type(v) is str for v in variants_for(CONV))  # plain strings in plans and JSON
    assert parse("") is Variant.FRAMEWORK


def test_refused_variant_is_dropped_from_a_given_table(graph):
    op = _grouped(graph)
    assert variant_table(graph, {op: ["im2col", "fft"]}) == {op: ["im2col"]}  # fft: grouped
    assert variant_table(graph, lambda g: {op: ["fft"]}) == {op: []}


def test_unknown_name_and_op_are_refused_with_the_valid_ones(graph):
    op = _grouped(graph)
    with pytest.raises(PolicyOptionError, match=r"winograd.*known: framework, im2col, fft"):
        variant_table(graph, {op: ["winograd"]})
    with pytest.raises(PolicyOptionError, match="names op 999"):
        variant_table(graph, {999: ["im2col"]})
    with pytest.raises(PolicyOptionError, match="list of variant names"):
        variant_table(graph, {op: "im2col"})


@pytest.mark.parametrize("policy", ["superneurons", "vdnn-dyn", "vdnn-all-p", "modnn"])
def test_every_variant_policy_takes_a_callable_table(graph, policy):
    """One typed option for all three papers; fft on the grouped convolution never chosen."""
    op = _grouped(graph)
    config_for(policy, {"variants": lambda g: {op: ["fft", "im2col"]}})
    planned = outcore.plan(graph, None, policy=policy, simulate=False,
                           variants=lambda g: {op: ["fft", "im2col"]})
    assert planned.schedule.variants.get(op, "framework") in ("framework", "im2col")

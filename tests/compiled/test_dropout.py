"""``outcore.compiled.dropout.mask_only_dropout``: a dropout's readers read input*mask*scale.

FX graphs traced with ``make_fx`` (no compile): the rewrite must leave every value the graph
returns bit-identical at the same seed (same draws, same roundings), leave the dropout's
float output without readers, and leave an inference-mode dropout alone.
"""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from outcore.compiled.dropout import mask_only_dropout

_aten = torch.ops.aten


def _net(p: float, train: bool = True):
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, mask = _aten.native_dropout(x, p, train)
        y = (out.sin() + out) * 2.0
        z, _ = _aten.native_dropout(y.exp(), p, train)  # its mask is never read
        return y, z.sum(-1), mask
    return f


def _run(gm: torch.fx.GraphModule, x: torch.Tensor, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return list(gm(x))


def _output_readers(gm: torch.fx.GraphModule) -> int:
    """Readers of native_dropout outputs 0, over the graph."""
    return sum(len(u.users) for n in gm.graph.find_nodes(
        op="call_function", target=_aten.native_dropout.default)
        for u in n.users if u.target is operator.getitem and u.args[1] == 0)


@pytest.mark.parametrize("p", [0.1, 0.5, 1.0])
def test_values_are_bit_identical_and_outputs_unread(p: float) -> None:
    x = torch.randn(6, 33)
    gm = make_fx(_net(p))(x)
    want = _run(gm, x, 7)
    assert _output_readers(gm) == 3  # sin, add; sum
    assert mask_only_dropout(gm) == 2
    assert _output_readers(gm) == 0
    got = _run(gm, x, 7)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert not all(torch.equal(g, w) for g, w in zip(_run(gm, x, 8), want, strict=True)) \
        or p == 1.0  # another seed draws other masks (p=1 drops everything either way)
    assert sum(1 for _ in gm.graph.find_nodes(
        op="call_function", target=_aten.native_dropout.default)) == 2  # draws unchanged


def test_inference_dropout_is_left_alone() -> None:
    x = torch.randn(4, 5)
    gm = make_fx(_net(0.3, train=False))(x)
    before = gm.code
    assert mask_only_dropout(gm) == 0
    assert gm.code == before

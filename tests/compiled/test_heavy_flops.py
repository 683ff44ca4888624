"""compiled.heavy counts a heavy node's flops as 2 * multiply-adds (torch's flop registry,
the count capture gives an op), and nothing for other nodes."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from outcore.compiled.heavy import node_flops


def _step(a, b, c, bias, x, w):
    aten = torch.ops.aten
    mm = aten.mm.default(a, b)  # (4, 6) @ (6, 5)
    addmm = aten.addmm.default(bias, a, b)
    bmm = aten.bmm.default(c, c.transpose(1, 2))  # (2, 3, 7) @ (2, 7, 3)
    baddbmm = aten.baddbmm.default(torch.zeros(2, 3, 3), c, c.transpose(1, 2))
    conv = aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    return mm, addmm, bmm, baddbmm, conv, aten.relu.default(mm)


def test_heavy_node_flops_are_two_multiply_adds_and_others_zero():
    inputs = (torch.randn(4, 6), torch.randn(6, 5), torch.randn(2, 3, 7), torch.randn(5),
              torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3))
    gm = make_fx(_step)(*inputs)
    by_target = {str(n.target): node_flops(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert by_target["aten.mm.default"] == 2 * 4 * 5 * 6
    assert by_target["aten.addmm.default"] == 2 * 4 * 5 * 6
    assert by_target["aten.bmm.default"] == 2 * 2 * 3 * 3 * 7
    assert by_target["aten.baddbmm.default"] == 2 * 2 * 3 * 3 * 7
    assert by_target["aten.convolution.default"] == 2 * (1 * 4 * 8 * 8) * (3 * 3 * 3)
    assert by_target["aten.relu.default"] == 0

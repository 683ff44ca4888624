"""What the joint graph holds on CPU, and that the variants are drop-in there.

Finding (PyTorch 2.13, CPU): ``F.scaled_dot_product_attention`` appears in the joint graph of
``aot_export_joint_with_descriptors`` as ``aten._scaled_dot_product_flash_attention_for_cpu``
(returning ``(out, logsumexp)``) and its ``_backward``; a causal call passes ``dropout_p`` and
``is_causal`` positionally, a mask is passed as the keyword ``attn_mask`` (a float tensor made
by ``where``). Convolutions appear as ``aten.convolution`` / ``aten.convolution_backward``.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

from outcore.variants import registry
from outcore.variants.meta import CONV, CONV_BACKWARD, SDPA, SDPA_BACKWARD
from outcore.variants.torchmeta import arg_meta_of, kwarg_meta_of


class _Net(torch.nn.Module):
    def __init__(self, masked: bool) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.proj = torch.nn.Linear(4, 8)
        self.masked = masked

    def forward(self, x):
        y = self.conv(x).relu()
        t = y.flatten(2).transpose(1, 2)  # (B, 16, 4)
        b, length = t.shape[0], t.shape[1]
        q = self.proj(t).view(b, length, 2, 4).transpose(1, 2)
        if self.masked:
            mask = torch.ones(length, length, dtype=torch.bool).tril()
            o = F.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=mask)
        else:
            o = F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True)
        return (o.transpose(1, 2).reshape(b, length, 8).pow(2).sum(),)


def _joint(masked: bool):
    torch.manual_seed(0)
    net = _Net(masked).double()
    x = torch.randn(2, 2, 4, 4, dtype=torch.float64)
    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(stack, net, (x,))
    # the joint graph takes (primals, tangents): parameters then inputs, and d(loss) = 1
    inputs = ([*net.parameters(), x], [torch.ones((), dtype=torch.float64)])
    return joint.graph_module, inputs


def _targets(gm):
    return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("masked", [False, True])
def test_joint_graph_holds_the_registered_targets(masked):
    gm, _ = _joint(masked)
    found = _targets(gm)
    for target in (CONV, CONV_BACKWARD, SDPA, SDPA_BACKWARD):
        assert target in found
    for node in gm.graph.nodes:
        if str(node.target) in (SDPA, SDPA_BACKWARD, CONV, CONV_BACKWARD):
            meta = arg_meta_of(node.args)
            kmeta = kwarg_meta_of(node.kwargs)
            assert list(registry.supported_variants(str(node.target), meta, kmeta)) == \
                registry.variants_for(str(node.target))
            if masked and str(node.target) == SDPA:
                assert "attn_mask" in node.kwargs


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("conv_variant,attn_variant",
                         list(itertools.product(["im2col", "fft"], ["materialised", "chunked"])))
def test_substituted_joint_graph_gives_the_same_loss_and_gradients(masked, conv_variant,
                                                                   attn_variant):
    gm, inputs = _joint(masked)
    with torch.no_grad():
        reference = gm(*inputs)
    choice = {CONV: conv_variant, CONV_BACKWARD: conv_variant, SDPA: attn_variant,
              SDPA_BACKWARD: attn_variant}
    for node in gm.graph.nodes:
        if str(node.target) in choice:
            node.target = registry.implementation(str(node.target), choice[str(node.target)])
    gm.recompile()
    with torch.no_grad():
        got = gm(*inputs)
    assert len(got) == len(reference)
    for g, r in zip(got, reference, strict=True):
        if r is None:
            assert g is None
        else:
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)

"""Capture decides the device a step computes on once, from the traced values, by one rule
(``first_accelerator``): an accelerator step refuses outcore's operator variants and marks
what its ops return in host memory; a CPU step does neither. Checked on the CPU by moving
a captured graph's traced values onto fake CUDA tensors (FakeTensorMode needs no GPU)."""

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import outcore
from outcore.capture.convert import build_graph, first_accelerator


def _captured_gm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 4))
    batch = (torch.randn(2, 3, 8, 8), torch.tensor([0, 3]))
    return outcore.capture(model, nn.functional.cross_entropy, batch).source.gm


def _on_fake_cuda(gm, keep_on_cpu=()):
    """Every traced value re-described on CUDA (same shape, strides, dtype), except the
    outputs of the nodes named in ``keep_on_cpu``."""
    def move(v):
        if not isinstance(v, torch.Tensor):
            return v
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")

    with FakeTensorMode(allow_non_fake_inputs=True):
        for node in gm.graph.nodes:
            if node.name in keep_on_cpu:
                continue
            val = node.meta.get("val")
            node.meta["val"] = (tuple(move(v) for v in val) if isinstance(val, (tuple, list))
                                else move(val))
    return gm


def _usable_variants(graph):
    return {op.target: sorted(k for k, v in op.variant_options.items() if "refused" not in v)
            for op in graph.ops if op.variant_options}


def test_a_cpu_step_offers_variants_and_marks_nothing_as_host():
    graph, _ = build_graph(_captured_gm(), "cpu")
    usable = _usable_variants(graph)
    assert usable and all(len(names) > 1 for names in usable.values())
    assert not any(t.host for t in graph.tensors)


def test_an_accelerator_step_refuses_every_variant_but_the_framework_kernel():
    graph, _ = build_graph(_on_fake_cuda(_captured_gm()), "cuda")
    usable = _usable_variants(graph)
    assert usable and all(names == ["framework"] for names in usable.values())
    reasons = [v["refused"] for op in graph.ops for v in op.variant_options.values()
               if "refused" in v]
    assert reasons and all("runs on cuda" in r for r in reasons)


def test_an_accelerator_step_marks_an_op_output_traced_on_the_cpu_as_host():
    gm = _captured_gm()
    relu = next(n for n in gm.graph.nodes if n.op == "call_function" and "relu" in n.name)
    graph, nodes = build_graph(_on_fake_cuda(gm, keep_on_cpu={relu.name}), "cuda")
    host = [t.name for t in graph.tensors if t.host]
    assert host == [graph.tensors[nodes.node_tensors[relu]].name]


def test_first_accelerator_skips_host_and_meta_tensors():
    with FakeTensorMode(allow_non_fake_inputs=True):
        gpu = torch.empty(2, device="cuda")
    assert first_accelerator([torch.ones(1), torch.empty(1, device="meta"), 3, gpu]) == gpu.device
    assert first_accelerator([torch.ones(1), torch.empty(1, device="meta")]) is None
    assert first_accelerator([]) is None

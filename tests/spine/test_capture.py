"""Capture: kinds, aliasing, multi-output ops, JSON round trip, fake sizing, bad input."""

import time

import pytest
import torch
from torch import nn

import outcore
from outcore.capture import capture
from outcore.errors import CaptureError, GraphError
from outcore.graph.ir import Graph, OpCategory, Phase, TensorKind

from models import MODELS, make


@pytest.mark.parametrize("name", MODELS)
def test_kinds_and_invariants(name):
    model, loss_fn, batch = make(name)
    graph = capture(model, loss_fn, batch)
    graph.validate()
    kinds = {t.kind for t in graph.tensors}
    assert {TensorKind.PARAMETER, TensorKind.INPUT, TensorKind.TANGENT, TensorKind.ACTIVATION,
            TensorKind.GRADIENT, TensorKind.OUTPUT} <= kinds
    params = {t.source for t in graph.tensors if t.kind is TensorKind.PARAMETER}
    assert params == {f"model.{n}" for n, _ in model.named_parameters()}
    grads = {t.source for t in graph.tensors if t.source.startswith("grad:")}
    assert grads == {f"grad:{p}" for p in params}
    assert {op.phase for op in graph.ops} == {Phase.FORWARD, Phase.BACKWARD}
    for t in graph.tensors:  # views carry no bytes; their base does
        if t.is_view:
            assert t.nbytes == 0 and not graph.tensors[t.storage].is_view
    assert graph.static_bytes() == sum(
        p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()) + sum(
        x.numel() * x.element_size() for x in batch) + 4  # + the tangent


def test_categories_and_flops():
    model, loss_fn, batch = make("vgg")
    graph = capture(model, loss_fn, batch)
    cats = {op.category for op in graph.ops}
    assert {OpCategory.CONV, OpCategory.NORM, OpCategory.POOL, OpCategory.MATMUL,
            OpCategory.VIEW} <= cats
    conv = next(op for op in graph.ops if op.target == "aten.convolution.default")
    # 2 * N * Cout * H * W * Cin * k * k for the first 3->8 conv on 16x16, batch 4
    assert conv.flops == 2 * 4 * 8 * 16 * 16 * 3 * 3 * 3
    assert all(op.flops == 0 for op in graph.ops if op.category is OpCategory.VIEW)


def test_multi_output_ops_own_every_output():
    model, loss_fn, batch = make("vgg")
    graph = capture(model, loss_fn, batch)
    bn = next(op for op in graph.ops if "batch_norm" in op.target and op.phase is Phase.FORWARD)
    assert len(bn.outputs) == 5  # out, mean, invstd, new running mean, new running var
    updates = [t for t in graph.tensors if t.source.startswith("update:")]
    assert {t.source for t in updates} >= {"update:model.features.1.running_mean"}


def test_json_round_trip_and_bad_documents():
    model, loss_fn, batch = make("densenet")
    graph = capture(model, loss_fn, batch)
    again = Graph.from_json(graph.to_json())
    assert again.tensors == graph.tensors and again.ops == graph.ops
    assert again.outputs == graph.outputs
    with pytest.raises(GraphError):
        Graph.from_json('{"tensors": []}')
    doc = graph.to_json().replace('"producer": 0', '"producer": 999', 1)
    with pytest.raises(GraphError):
        Graph.from_json(doc)


def big_vgg16():
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
           512, 512, 512, "M"]
    layers, c = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
            c = v
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 1000))


def test_fake_capture_of_paper_scale_vgg16_is_fast_and_sized():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = big_vgg16()
        batch = (torch.randn(256, 3, 224, 224), torch.randint(0, 1000, (256,)))
    start = time.perf_counter()
    graph = capture(model, nn.CrossEntropyLoss(), batch)
    elapsed = time.perf_counter() - start
    assert graph.meta["fake"]
    first = next(op for op in graph.ops if op.target == "aten.convolution.default")
    out = graph.tensors[first.outputs[0]]
    assert out.nbytes == 256 * 64 * 224 * 224 * 4  # 3.2 GB, never allocated
    assert elapsed < 60, "capture must not run the model"


def test_fake_flag_sizes_a_real_model_without_running_it():
    model, loss_fn, batch = make("resnet")
    real = capture(model, loss_fn, batch)
    fake = capture(model, loss_fn, batch, fake=True)
    assert [t.nbytes for t in fake.tensors] == [t.nbytes for t in real.tensors]
    assert isinstance(next(model.parameters()), nn.Parameter)
    assert not isinstance(next(model.parameters()).data, torch._subclasses.FakeTensor)


def test_bad_input_is_refused_clearly():
    model, loss_fn, batch = make("mlp")
    with pytest.raises(CaptureError, match=r"\(x, y\)"):
        capture(model, loss_fn, batch[0])
    with pytest.raises(CaptureError, match=r"nn\.Module"):
        capture(lambda x: x, loss_fn, batch)
    with pytest.raises(CaptureError, match="scalar"):
        capture(model, lambda out, y: out, batch)


class DataDependentBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return h * 2 if h.sum() > 0 else h


def test_data_dependent_control_flow_is_specialised_with_a_guard():
    batch = (torch.randn(2, 4), torch.randn(2, 4))
    graph = capture(DataDependentBranch(), nn.functional.mse_loss, batch)
    assert [g.reader for g in graph.source.guards] == ["__bool__"]
    assert [t.source for t in graph.tensors if t.source.startswith("guard:")] == ["guard:0"]


def test_data_dependent_control_flow_fake_names_cause_and_way_out():
    batch = (torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(CaptureError) as err:
        capture(DataDependentBranch(), nn.functional.mse_loss, batch, fake=True)
    message = str(err.value)
    assert "one graph" in message and "depend on tensor values" in message
    assert "torch.where" in message


def test_an_op_without_a_shape_rule_is_named_with_why():
    """torch.bincount's output shape depends on its input's values: PyTorch cannot trace it
    on fake tensors (torch.compile breaks the graph there), and by weights it depends on the
    weights' values too, which outcore does not specialise on, so the step is refused,
    naming the op. (F.ctc_loss, then torch.unique, were the examples here until session 30,
    which traces both: tests/spine/test_ctc_loss.py, test_mask_specialisation.py.)"""

    def distinct(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return out.sum() * torch.bincount(y.flatten(), weights=y.flatten().float()).sum()

    batch = (torch.randn(2, 12, 6), torch.randint(1, 6, (2, 3)))
    with pytest.raises(CaptureError) as err:
        capture(nn.Linear(6, 6), distinct, batch)
    message = str(err.value)
    assert "bincount" in message and "no shape rule" in message


@pytest.mark.parametrize("wrap", ["script", "trace", "compiled", "dataparallel"])
def test_a_module_that_runs_elsewhere_is_refused_with_what_to_pass(wrap: str) -> None:
    """TorchScript, torch.compile'd and DataParallel modules hand their forward to another
    runtime; each failed deep inside tracing with an unrelated message before."""
    inner = nn.Linear(6, 6)
    if wrap == "script":
        model = nn.Sequential(torch.jit.script(inner), nn.ReLU(), nn.Linear(6, 3))
    elif wrap == "trace":
        model = nn.Sequential(torch.jit.trace(inner, torch.randn(2, 6)), nn.Linear(6, 3))
    elif wrap == "compiled":
        model = nn.Sequential(torch.compile(inner), nn.Linear(6, 3))
    else:
        model = nn.DataParallel(nn.Sequential(inner, nn.Linear(6, 3)))
    batch = (torch.randn(4, 6), torch.randint(0, 3, (4,)))
    with pytest.raises(CaptureError) as err:
        capture(model, nn.functional.cross_entropy, batch)
    message = str(err.value)
    advice = {"script": "Python module", "trace": "Python module", "compiled": "_orig_mod",
              "dataparallel": ".module"}[wrap]
    assert advice in message
    assert ("submodule '0'" in message) == (wrap != "dataparallel")


@pytest.mark.parametrize("fake", [False, True])
def test_an_uninitialised_lazy_module_is_refused_with_the_dry_run_to_do(fake: bool) -> None:
    """A LazyLinear before its first forward failed inside tracing with PyTorch's message
    about ``_is_view``; it is refused at the door, naming the module, and the dry run
    PyTorch asks for makes the same model capturable."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 3))
    batch = (torch.randn(4, 6), torch.randint(0, 3, (4,)))
    with pytest.raises(CaptureError) as err:
        capture(model, nn.functional.cross_entropy, batch, fake=fake)
    message = str(err.value)
    assert "'0' (LazyLinear)" in message and "model(x)" in message
    with torch.no_grad():
        model(batch[0])
    graph = capture(model, nn.functional.cross_entropy, batch, fake=fake)
    assert sum(1 for t in graph.tensors if t.kind == "parameter") == 4


class PlainFakeAttributes(nn.Module):
    """Tensors kept as plain attributes (not buffers): on the model, on a submodule."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.lin = nn.Sequential(nn.Linear(8, 8))
        if how == "buffers":
            self.register_buffer("scale", torch.full((8,), 2.0), persistent=False)
            self.lin[0].register_buffer("shift", torch.ones(8), persistent=False)
        else:
            self.scale = torch.full((8,), 2.0)
            self.lin[0].shift = torch.ones(8)
        self.held = [torch.ones(8)] if how == "list" else []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = (self.lin(x) + self.lin[0].shift) * self.scale
        return out + self.held[0] if self.held else out


def test_a_fake_model_keeping_plain_tensor_attributes_is_sized_as_with_buffers():
    """A model built under FakeTensorMode may keep a tensor as a plain attribute: its fake
    tensor became a constant the trace refused ("Unexpected fake buffer"). Captured, it
    is a static input like a buffer (the same graph and peak as registering it), and the
    attribute is left a plain attribute; one held in a list is refused with the fix."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graphs = {}
    for how in ("plain", "buffers", "list"):
        with FakeTensorMode():
            model = PlainFakeAttributes(how)
            batch = (torch.randn(4, 8), torch.randn(4, 8))
        if how == "list":
            with pytest.raises(CaptureError, match="register_buffer"):
                capture(model, nn.functional.mse_loss, batch)
            continue
        graphs[how] = capture(model, nn.functional.mse_loss, batch)
        if how == "plain":
            assert "scale" in vars(model) and "scale" not in model._buffers
            assert "shift" in vars(model.lin[0]) and not dict(model.named_buffers())
    plain, buffers = graphs["plain"], graphs["buffers"]
    assert [op.target for op in plain.ops] == [op.target for op in buffers.ops]
    assert sorted(t.nbytes for t in plain.tensors) == sorted(t.nbytes for t in buffers.tensors)
    assert outcore.plan(plain, None).predicted_peak == outcore.plan(buffers, None).predicted_peak

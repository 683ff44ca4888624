"""The host side of weights held in host memory on CUDA, run without a GPU.

* On CUDA a Wait does not block the host: each overlapped host step must synchronize on the
  end events of its gradient's d2h copy and of the held parameter's prefetches before it
  reads or writes them. Shown with the emulated device wrapped to hand out fake events
  (``copy_event``) that log their ``synchronize``: every host step starts after both.
* ``pin_parameters``: the held parameters move into one segment, values exact, each a
  contiguous aligned range, the optimizer's state with them; the segment is at most the
  held bytes plus the alignment per parameter.
* ``view_bytes``: a layout rebuilt over a range of a larger byte buffer (a pool slot).
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from test_finetune import batches, weight_bytes
from weights_helpers import make_gpt, token_loss

from outcore.runtime.devices.cuda import view_bytes
from outcore.runtime.devices.storage import TensorLayout, byte_view
from outcore.runtime.host_weights import PIN_ALIGNMENT, copy_event, pin_parameters, pinned_bytes
from outcore.weights import compile as compile_weights

FAST = 2e9


class _LoggedEvent:
    def __init__(self, stepper, kind: str, name: str) -> None:
        self.stepper, self.kind, self.name = stepper, kind, name

    def synchronize(self) -> None:
        self.stepper._log(f"sync-{self.kind}", self.name)


class _EventDevice:
    """The emulated device plus ``copy_event`` (what CudaDevice adds)."""

    def __init__(self, device, stepper) -> None:
        self.device, self.stepper = device, stepper
        self.asked: list[tuple[str, int]] = []

    def host_tensor(self, tid: int) -> torch.Tensor:
        return self.device.host_tensor(tid)

    def copy_event(self, direction: str, tid: int) -> _LoggedEvent:
        self.asked.append((direction, tid))
        stepper = self.stepper
        name = stepper._name_of_param.get(tid) or next(
            n for n, g in stepper.grad_of.items()
            if stepper.graph.tensors[g].storage == tid)
        return _LoggedEvent(stepper, direction, name)


def test_each_host_step_synchronizes_on_its_copies_before_it_starts():
    model, example = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with compile_weights(model, token_loss, example, optimizer=opt,
                         budget=weight_bytes(model), bandwidth=FAST) as trainer:
        stepper = trainer.stepper
        events = _EventDevice(trainer.device, stepper)
        stepper.device = events
        stepper.record = True
        for x, y in batches(2):
            trainer.train_step(x, y)
    assert stepper.grad_of
    assert {d for d, _ in events.asked} == {"d2h", "h2d"}
    for name in stepper.grad_of:
        log = [(k, s) for s, k, n in sorted(stepper.events) if n == name]
        starts = [i for i, (k, _) in enumerate(log) if k == "step-start"]
        assert len(starts) == 2, name
        prev = -1
        for start in starts:
            window = [k for k, _ in log[prev + 1:start]]
            assert "sync-d2h" in window, f"{name}: stepped before waiting for its gradient"
            assert "sync-h2d" in window, f"{name}: stepped before its prefetches finished"
            prev = start


def test_devices_whose_waits_block_give_no_event():
    assert copy_event(object(), "d2h", 3) is None


def test_pin_parameters_moves_values_and_state_into_one_aligned_segment():
    model, (x, y) = make_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    token_loss(model(x), y).backward()
    opt.step()
    params = [p for n, p in model.named_parameters() if n.endswith("weight")]
    before = [p.detach().clone() for p in params]
    segments: list[torch.Tensor] = []

    def pin(nbytes: int) -> torch.Tensor:
        segments.append(torch.zeros(nbytes, dtype=torch.uint8))
        return segments[-1]

    segment = pin_parameters(params, pin, opt)
    assert segment is segments[0] and len(segments) == 1
    held = sum(p.numel() * p.element_size() for p in params)
    assert held <= segment.numel() == pinned_bytes(params) <= held + PIN_ALIGNMENT * len(params)
    base = segment.data_ptr()
    for p, old in zip(params, before, strict=True):
        assert torch.equal(p, old) and p.is_contiguous()
        assert p.untyped_storage().data_ptr() == base
        assert (p.data_ptr() - base) % PIN_ALIGNMENT == 0
        assert all(v.untyped_storage().data_ptr() != base for v in opt.state[p].values())
    assert pin_parameters([], pin) is None and len(segments) == 1
    token_loss(model(x), y).backward()  # the moved parameters still train
    opt.step()


def test_view_bytes_rebuilds_a_layout_inside_a_larger_buffer():
    grad = torch.arange(24, dtype=torch.float32).reshape(4, 6)[:, 1:4]
    layout = TensorLayout.of(grad)
    buffer = torch.zeros(256 + layout.nbytes, dtype=torch.uint8)
    flat = buffer[128:128 + layout.nbytes]
    flat.copy_(byte_view(grad.untyped_storage()))
    out = view_bytes(flat, layout)
    assert torch.equal(out, grad) and out.stride() == grad.stride()
    assert out.data_ptr() == flat.data_ptr() + 4 * grad.storage_offset()
    # what the executor and the host stepper do: offsets count from the slot, not the buffer
    again = out.as_strided(grad.size(), grad.stride(), grad.storage_offset())
    assert torch.equal(again, grad)
    out.add_(1)  # a view of the buffer's bytes, not a copy
    assert torch.equal(view_bytes(flat, layout), grad + 1)


def test_cuda_only_options_and_a_sent_gradient_of_a_device_parameter_are_refused(gpt):
    from types import SimpleNamespace

    import pytest

    from outcore.errors import OutcoreError
    from outcore.plan.weights import gradients
    from outcore.weights.trainer import _to_pinned_host

    model, example, graph = gpt
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(OutcoreError, match="device_options apply to device='cuda'"):
        compile_weights(model, token_loss, example, optimizer=opt, budget=10**9,
                        device_options={"poison": True})
    stray = SimpleNamespace(host_static=[], host_outputs=[gradients(graph)["tok.weight"]],
                            instructions=[])
    with pytest.raises(OutcoreError, match=r"'tok\.weight' to host memory but keeps"):
        _to_pinned_host(None, graph, stray, model, opt)

"""The CUDA path of ``measure_temporaries`` (``_CudaPeaks``: the caching allocator's
``max_memory_allocated`` during an op minus ``memory_allocated`` after it), run on this
GPU-less machine with ``torch.cuda``'s counters faked on the CPU. What this checks: the
arithmetic of the per-op window (reset at the op's start, peak less what the op leaves
allocated, the largest over runs) and the wiring of ``measure_temporaries(device="cuda")``
(RNG fork over the current device, the in-step run, the real-outputs pass). What it cannot
check: that CUDA's counters behave as documented (``tests/cuda`` does, on a GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from outcore.capture import capture
from outcore.cost import measure_temporaries as mt
from outcore.errors import ProfileError
from outcore.plan.residency import RNG_STATE_BYTES
from outcore.runtime.tracker import MemoryTracker


class Counters:
    """The caching allocator's two counters and their reset, as CUDA documents them."""

    def __init__(self) -> None:
        self.live = self.peak = 0
        self.calls: list[str] = []

    def alloc(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def free(self, nbytes: int) -> None:
        self.live -= nbytes

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self.calls.append("sync"))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self._reset)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: self.live)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: self.peak)

    def _reset(self, *args: object) -> None:
        self.calls.append("reset")
        self.peak = self.live


def test_the_window_is_the_ops_peak_less_what_it_leaves(monkeypatch):
    counters = Counters()
    counters.install(monkeypatch)
    peaks = mt._CudaPeaks(3)
    counters.alloc(1000)  # inputs made before the op: in the peak and after it, so cancel
    with peaks("outcore_op_1"):
        counters.alloc(300)  # a workspace
        counters.alloc(40)  # the output, still allocated when the op returns
        counters.free(300)
    assert peaks.result == [0, 300, 0]
    assert counters.calls == ["sync", "reset", "sync"]
    with peaks("outcore_op_1"):  # a later run with less: the largest stays
        counters.alloc(100)
        counters.free(100)
    with peaks("outcore_op_2"):  # an op that frees an earlier tensor: nothing negative
        counters.free(40)
    assert peaks.result == [0, 300, 0]


def test_measure_temporaries_on_cuda_runs_its_path_in_the_step(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv1d(8, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 17, 5))
    model[2].weight.requires_grad_(False)  # convolution backward returns a dropped grad_weight
    data = (torch.randn(2, 4, 17), torch.tensor([0, 1]))
    graph = capture(model, F.cross_entropy, data)
    with pytest.raises(ProfileError, match="measures in the step"):
        mt.measure_temporaries(graph, None, device="cuda")

    tracker = MemoryTracker()  # the counters: the bytes of the tensors the kernels make
    counters = Counters()
    counters.install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: tracker.live)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: tracker.peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: tracker.reset_peak())
    forks: list[str] = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_rng_state",
                        lambda *a: forks.append("get") or torch.get_rng_state())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a: forks.append("set"))
    with tracker:
        temps = mt.measure_temporaries(graph, data, device="cuda")
    assert forks == ["get", "set"]  # the current GPU's generator is forked, then restored
    assert counters.calls.count("sync") == 2 * 2 * len(graph.ops)  # warm-up + measured run
    conv_bwd = [t for op, t in zip(graph.ops, temps, strict=True)
                if op.target == "aten.convolution_backward.default"]
    assert sorted(conv_bwd) == [0, 8 * 8 * 3 * 4]  # the frozen layer's: its dropped weight
    assert graph.meta[RNG_STATE_BYTES] == 0  # saved states are host tensors on CUDA


def test_cuda_allocator_peak_is_the_steps_peak_from_its_start(monkeypatch):
    """``cuda_allocator_peak`` (the Trainer's measure on ``device="cuda"``): the window is
    the step, counted from what was allocated when it started."""
    from outcore.runtime.devices.allocator_peak import cuda_allocator_peak

    counters = Counters()
    counters.install(monkeypatch)
    counters.alloc(5000)  # parameters and the batch, allocated before the step

    def step() -> str:
        counters.alloc(700)
        counters.alloc(300)
        counters.free(700)
        return "loss"

    measured = cuda_allocator_peak(step)
    assert (measured.peak, measured.held_at_end, measured.result) == (1000, 300, "loss")
    assert counters.calls == ["sync", "reset", "sync"]

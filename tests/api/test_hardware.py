"""Issue 18 point 4: the default profile on device="cuda" is the GPU that is there, and a
bfloat16 step does not fail with ProfileError under the default profile."""

import pytest
import torch

import outcore
from outcore import hardware


@pytest.mark.parametrize("name,memory,profile", [
    ("NVIDIA H100 80GB HBM3", 80 * 2**30, "h100"),
    ("NVIDIA H100 PCIe", 80 * 2**30, "h100"),
    ("NVIDIA H200", 141 * 2**30, "h200"),
    ("NVIDIA A100-SXM4-40GB", 40 * 2**30, "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", 80 * 2**30, "a100-80gb"),
    ("NVIDIA A100 PCIe", 80 * 2**30, "a100-80gb"),
    ("Tesla V100-SXM2-16GB", 16 * 2**30, "v100-nvlink"),
    ("Tesla V100-PCIE-16GB", 16 * 2**30, "v100-pcie"),
    ("NVIDIA TITAN Xp", 12 * 2**30, "titan-xp"),
    ("GeForce GTX TITAN X", 12 * 2**30, "titan-x-maxwell"),
    ("Tesla K40c", 12 * 2**30, "k40c"),
    ("NVIDIA GeForce RTX 4090", 24 * 2**30, None),
])
def test_device_names_map_to_profiles(name, memory, profile):
    assert hardware.profile_for_device_name(name, memory) == profile


def test_cuda_default_is_the_gpu_that_is_there(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    props = type("P", (), {"total_memory": 80 * 2**30})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)
    assert hardware.default_gpu(None, "cuda") == "h100"
    assert hardware.default_gpu(None, "cpu") == "this-cpu"
    assert hardware.default_gpu(None, "cpu-emulated") == hardware.DEFAULT_GPU
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Some Future GPU")
    assert hardware.default_gpu(None, "cuda") == hardware.DEFAULT_GPU


def test_bfloat16_plans_and_trains_under_the_default_profile():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2)).to(torch.bfloat16)
    batch = (torch.randn(4, 8, dtype=torch.bfloat16), torch.tensor([0, 1, 1, 0]))
    graph = outcore.capture(model, torch.nn.functional.cross_entropy, batch)
    planned = outcore.plan(graph, "1MB")  # v100-pcie knows no bfloat16 peak
    assert "a100-40gb" in planned.simulation.cost_model
    assert hardware.default_gpu(graph) == "a100-40gb"
    trainer = outcore.compile(model, torch.nn.functional.cross_entropy, batch, budget="1MB",
                              device="cpu-emulated")
    try:
        assert torch.isfinite(trainer.step(*batch).float())
    finally:
        trainer.close()


def test_this_cpu_shares_memory_and_auto_never_offloads_there():
    """device="cpu" plans with this CPU's profile, whose host memory is the device's own:
    outcore-auto then holds no host copy (an offload would free nothing)."""
    from outcore.api import cost_model_for
    from outcore.cost.profiles import HardwareProfile, get_profile
    from outcore.plan.memory import memory_curve

    profile = get_profile("this-cpu")
    assert profile.shared_memory
    assert HardwareProfile.from_dict(profile.to_dict()).shared_memory
    assert not get_profile(hardware.DEFAULT_GPU).shared_memory
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 4))
    batch = (torch.randn(1024, 64), torch.randint(0, 4, (1024,)))
    graph = outcore.capture(model, torch.nn.functional.cross_entropy, batch)
    trace = memory_curve(graph, outcore.plan(graph, None).schedule)
    budget = trace.peak - (trace.peak - trace.static) // 10  # something must move
    planned = outcore.plan(graph, budget, gpu="this-cpu")
    assert planned.predicted_peak <= budget
    assert max(memory_curve(graph, planned.schedule).host, default=0) == 0
    assert planned.plan.decisions, "something was recomputed"
    assert cost_model_for(None, graph, "cpu").profile.shared_memory

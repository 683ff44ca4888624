"""``outcore.compiled.recompute_order``: a recompute kernel is not fused with backward work.

The tiny GPT of ``test_inductor_backend``, whole step compiled, dropout 0.1, at 55% of its
in-core peak, planned on a fixed CPU-like profile (memory-bound ops cheap, matrix products
dear: a measurement of this machine's own profile under load, scaled) on which the plan
re-makes the final layer norm for the head's weight gradient. Inductor, left to fuse as it
likes (``recompute_in_place=False``), fuses that recompute with the layer norm's backward and
the step's allocator peak exceeds the plan's prediction (the check can fail); with the
handler (the default) the recompute runs where the plan put it and the prediction bounds the
allocator's peak.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import outcore
from outcore.cost import measure_host
from outcore.cost.profiles import HardwareProfile
from outcore.errors import OutcoreWarning
from outcore.runtime.devices.allocator_peak import held_before

sys.path.insert(0, str(Path(__file__).parent))
from test_dropout import _in_core_peak
from test_inductor_backend import _measured_compile, _workload

#: The profile (see the module docstring); plans on it are the same on every machine.
_PROFILE = {
    "name": "this-cpu", "memory": 25325268992,
    "peak_tflops": {"float32": 0.00865, "float64": 0.00242, "bfloat16": 0.2434},
    "memory_bandwidth_gbs": 13.43, "h2d_gbs": 3.356, "d2h_gbs": 3.356, "copy_engines": 2,
    "launch_overhead_us": 0.01375, "shared_memory": True,
}


@pytest.fixture
def fixed_cpu_profile(monkeypatch):
    profile = HardwareProfile.from_dict(_PROFILE)
    monkeypatch.setattr(measure_host, "measure_this_cpu", lambda: profile)
    return profile


@pytest.mark.parametrize("in_place", [True, False])
def test_a_recompute_is_not_fused_with_backward_work(one_thread, fixed_cpu_profile,
                                                     in_place: bool) -> None:
    w = _workload(0.1)
    budget = int(_in_core_peak(w) * 0.55)
    be = outcore.inductor_backend(budget=budget, gpu="this-cpu", recompute_in_place=in_place)
    measured, part = _measured_compile(w, be)
    predicted = part.predicted_peak - held_before(part.planned.graph)
    assert part.predicted_peak <= budget and not part.forced
    if in_place:
        assert 0 < measured <= predicted
    else:  # the recompute fused with the layer norm's backward, its buffers made early
        assert measured > predicted


def test_a_torch_without_the_hooks_compiles_with_a_warning(monkeypatch) -> None:
    """On a torch without Inductor's choices handler (the GPU image's older torch may lack
    one of the hooks), the backend says that ``recompute_in_place`` has no effect and
    compiles as Inductor likes, rather than failing the user's compile."""
    import torch
    from torch._inductor.virtualized import V

    monkeypatch.delattr(type(V), "set_choices_handler")
    w = _workload(0.0)
    be = outcore.inductor_backend(budget=None, gpu="v100-pcie")
    compiled = torch.compile(w.model, backend=be, dynamic=False)
    with pytest.warns(OutcoreWarning, match="recompute_in_place has no effect"):
        loss = w.loss_fn(compiled(w.batch[0]), w.batch[1])
    loss.backward()
    assert be.partitions and all(p.grad is not None for p in w.model.parameters())

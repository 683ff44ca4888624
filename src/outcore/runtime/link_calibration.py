"""Scale the ``cpu-emulated`` link to the model it runs, so copies cost what they would on the GPU.

The emulated device stands for a GPU: the plan is made with that GPU's cost model, and the
device's copy engines stand for its host link. For a copy to take the share of the step it
would take on the GPU, the emulated link must run at

    emulated_bw = link_bw * model_seconds / cpu_seconds

where ``model_seconds`` is the graph's compute as the planning cost model prices it
(``outcore.policies.auto.compute_floor``: the sum of its op times, each op once, with the
schedule's kernels) and ``cpu_seconds`` the same ops
measured here, inside a step of the plan (``Executor.run(timed=True)``; the first run of each
op, so a recompute does not count twice).

Before any step the device runs at ``bandwidth.bandwidth_for_gpu``'s link, which assumes
both sides compute at their peak FLOP/s. That holds for large matmuls only: a small model's
kernels are priced by the GPU model at a few per cent of peak (launch and memory bound) while
the CPU runs them at a good share of its own, so the link came out far too slow. Measured
(``benchmarks/emulated_link.py``, ResNet-32 at batch 32, v100-pcie): the model prices the
compute at 41.4 ms, this CPU runs it in ~217 ms, so the link should be ~2.3 GB/s where peak
FLOP/s gave 139 MB/s; outcore-auto's plan, whose copies the model hides entirely, measured
873 ms against 258 ms once scaled.

Invariants:

* Only a link scaled from a GPU profile (``EmulatedDevice.emulates``) is recalibrated,
  never one given in bytes/s (``make_device(..., bandwidth=)``). A data-parallel rank's
  device keeps its share of the host link (``EmulatedDevice.link_share``).
* Who calibrates: ``outcore.compile``'s Trainer (planned with its ``gpu=`` or the default
  profile) and ``PlannedTrainer`` / ``DataParallelTrainer`` (for the profile the device
  emulates); not ``outcore.weights`` trainers nor ``outcore.backend`` graphs.
* The link changes only between steps (``EmulatedDevice.set_bandwidth`` refuses while a
  copy is in flight). Before the first step it is set from the compute this CPU's analytic
  profile ("this-cpu") prices for the graph; then the first ``STEPS`` one-sub-batch steps
  are timed and each sets it from the least compute measured so far on the same graph (the
  first step's warm-up inflates its own; a step of another batch shape starts over, since
  its compute is another's). Sub-batched steps are not timed.
* The compute is priced with the kernels the schedule chose (operator variants), as the
  simulator and the executor run them.
* Timing reads the clock only: the step's values and gradients are those of an untimed one.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outcore.errors import OutcoreError
from outcore.log import info

#: Steps timed to calibrate the link (the least compute among them is used).
STEPS = 2


def first_run_seconds(op_seconds: Sequence[tuple[int, float]]) -> float:
    """Seconds of the first Compute of each op in a timed step (``StepResult.op_seconds``):
    the step's compute without its recomputations."""
    seen: set[int] = set()
    total = 0.0
    for op, seconds in op_seconds:
        if op not in seen:
            seen.add(op)
            total += seconds
    return total


def graph_link(gpu: str, modelled: float, measured: float) -> tuple[float, float]:
    """(d2h, h2d) bytes/s of an emulated ``gpu`` link for a model whose compute the cost
    model prices at ``modelled`` seconds and this CPU runs in ``measured`` seconds.

    Raises:
        ValueError: a time that is not a finite number > 0.
    """
    from outcore.cost.profiles import get_profile

    for label, value in (("modelled", modelled), ("measured", measured)):
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{label} compute seconds must be a finite number > 0, "
                             f"got {value}")
    profile = get_profile(gpu)
    ratio = modelled / measured
    return profile.bandwidth("d2h") * ratio, profile.bandwidth("h2d") * ratio


class LinkCalibration:
    """Calibrates one emulated device's link to the model it runs.

    ``gpu_for(graph)`` names the profile the graph is planned with (the Trainer's ``gpu=``
    or ``outcore.hardware.default_gpu``): its cost model prices the compute and its link is
    the one scaled. ``estimate`` sets the link from this CPU's analytic profile
    ("this-cpu") before any step; ``observe`` from each of the first ``STEPS`` timed steps.
    ``bandwidth``: the (d2h, h2d) bytes/s set last (None before either).
    """

    def __init__(self, device: Any, gpu_for: Callable[[Any], str]) -> None:
        self.device = device
        self.gpu_for = gpu_for
        self.steps = 0
        self.measured = math.inf  # the least compute measured on ``_timed_graph``
        self._timed_graph: Any = None
        self.bandwidth: tuple[float, float] | None = None

    @staticmethod
    def applies(device: Any) -> bool:
        """Whether ``device`` has a link scaled from a GPU profile to recalibrate."""
        return getattr(device, "emulates", None) is not None and hasattr(device, "set_bandwidth")

    @classmethod
    def for_device(cls, device: Any, gpu_for: Callable[[Any], str],
                   first: Any) -> LinkCalibration | None:
        """The calibration of ``device``'s link, its estimate set from the first planned
        step ``first`` (a ``PlannedStep``); None for a device it does not apply to."""
        if not cls.applies(device):
            return None
        link = cls(device, gpu_for)
        link.estimate(first.graph, first.schedule.variants)
        return link

    def run(self, executor: Any, planned: Any, batch: Any, **options: Any) -> Any:
        """``executor.run(batch, **options)`` for one sub-batch of ``planned``; timed, and
        the link set from it (``observe``), while the calibration is ``pending``."""
        if not self.pending:
            return executor.run(batch, **options)
        result = executor.run(batch, timed=True, **options)
        self.observe(result.op_seconds, planned.graph, planned.schedule.variants)
        return result

    @property
    def pending(self) -> bool:
        """Whether the next one-sub-batch step should run timed."""
        return self.steps < STEPS

    def estimate(self, graph: Any, variants: Mapping[int, str] | None = None
                 ) -> tuple[float, float] | None:
        """Set the link from the compute this CPU's analytic profile prices for ``graph``
        (within 1.2-1.6x of the measured compute on ResNet-32 and a small LM, where peak
        FLOP/s is 13-14x off); returns the link (None when none was set: a graph that
        computes nothing, or a dtype no profile prices)."""
        from outcore.cost.profiles import THIS_CPU
        from outcore.planned import cost_model_for
        from outcore.policies.auto import compute_floor

        try:
            with warnings.catch_warnings():  # a dtype the profile lacks: its nearest peak
                warnings.simplefilter("ignore")
                here = compute_floor(graph, cost_model_for(THIS_CPU, graph), variants)
        except OutcoreError:  # no estimate: the link stays as it was made
            return None
        return self._set(graph, variants, here, "")

    def observe(self, op_seconds: Sequence[tuple[int, float]], graph: Any,
                variants: Mapping[int, str] | None = None) -> tuple[float, float] | None:
        """Take a timed step's ``op_seconds`` of ``graph`` (run with ``variants``) and set
        the link from the least compute measured on that graph so far (a step of another
        graph starts over: its compute is another's); returns the link (the one set before
        when the step timed no compute)."""
        self.steps += 1
        measured = first_run_seconds(op_seconds)
        if not measured > 0:
            return self.bandwidth
        if graph is not self._timed_graph:
            self._timed_graph, self.measured = graph, math.inf
        self.measured = min(self.measured, measured)
        return self._set(graph, variants, self.measured, "measured ")

    def _set(self, graph: Any, variants: Mapping[int, str] | None, here: float,
             how: str) -> tuple[float, float] | None:
        from outcore.planned import cost_model_for
        from outcore.policies.auto import compute_floor

        gpu = self.gpu_for(graph)
        modelled = compute_floor(graph, cost_model_for(gpu, graph), variants)
        if not (modelled > 0 and here > 0 and math.isfinite(here)):
            return self.bandwidth  # nothing to scale by: the link stays
        d2h, h2d = graph_link(gpu, modelled, here)
        share = getattr(self.device, "link_share", (1.0, 1.0))
        try:
            self.device.set_bandwidth(d2h * share[0], h2d * share[1], emulates=gpu)
        except OutcoreError:  # a copy in flight: keep the link; timing never fails a step
            return self.bandwidth
        self.bandwidth = (d2h * share[0], h2d * share[1])
        info(f"cpu-emulated link set to {self.bandwidth[0] / 1e6:.0f} MB/s (d2h), "
             f"{self.bandwidth[1] / 1e6:.0f} MB/s (h2d): {gpu}'s link x the compute it "
             f"models for this step ({modelled * 1e3:.1f} ms) / the compute {how or 'estimated '}"
             f"here ({here * 1e3:.1f} ms)")
        return self.bandwidth

"""What a simulation returns: times, memory, bytes moved, and the per-instruction timeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from outcore.units import format_bytes

COMPUTE, D2H, H2D = "compute", "d2h", "h2d"


@dataclass(frozen=True)
class Lifetime:
    """One residency of a storage on the device, in instruction indices.

    ``start`` is the instruction that allocates it (-1: resident before the step, e.g. a
    parameter); ``end`` is the instruction that releases it (``len(schedule)``: still
    resident when the step ends). A storage offloaded and prefetched back, or dropped and
    recomputed, has one Lifetime per residency.
    """

    storage: int
    nbytes: int
    start: int
    end: int


@dataclass
class SimResult:
    """The simulated step.

    Aggregates (times, bytes) cover the whole step, i.e. ``sub_batches`` passes of the
    schedule; the per-instruction timeline and memory curves describe one pass. Invariant:
    ``step_time == compute_time + host_time + exposed_transfer_time + optimizer_time`` (the
    compute stream is computing, spending host time on a non-kernel instruction
    (``HostCosts``; zero on a GPU profile) or stalled on a copy; a copy still running after
    the last instruction counts as exposed; ``optimizer_time`` is what the optimizer step
    adds after the pass, when simulated with ``optimizer=``: zero otherwise).
    ``host_step_time``: seconds the CPU spent on host optimizer steps (overlapped or not);
    ``optimizer``: their timeline (``outcore.sim.host_steps.StepTimeline``), or None.

    Per-instruction lists (index = instruction index):
        issue: when the compute stream reached the instruction (s from the pass start).
        start, end: when its work ran: the kernel for Compute, the copy for Offload/Prefetch,
            the stall (and host time) for Wait; a Free's host time (0 on a GPU profile).
        stream: "compute", "d2h" or "h2d".
        kind: "compute", "recompute", "free", "offload", "prefetch" or "wait".
        memory: device bytes after the instruction (``outcore.plan.memory.memory_curve``;
            a Compute's sample includes its workspace).
        host: host bytes after the instruction; live_tensors: resident tensors after it.
    """

    step_time: float
    pass_time: float
    sub_batches: int
    compute_time: float
    exposed_transfer_time: float
    stall_time: float
    overlapped_transfer_time: float
    d2h_busy_time: float
    h2d_busy_time: float
    bytes_d2h: int
    bytes_h2d: int
    peak_bytes: int
    average_bytes: float
    host_peak_bytes: int
    static_bytes: int
    issue: list[float] = field(repr=False)
    start: list[float] = field(repr=False)
    end: list[float] = field(repr=False)
    stream: list[str] = field(repr=False)
    kind: list[str] = field(repr=False)
    memory: list[int] = field(repr=False)
    host: list[int] = field(repr=False)
    live_tensors: list[int] = field(repr=False)
    lifetimes: list[Lifetime] = field(repr=False)
    placement: Any = field(default=None, repr=False)
    cost_model: str = ""
    host_time: float = 0.0
    optimizer_time: float = 0.0
    host_step_time: float = 0.0
    optimizer: Any = field(default=None, repr=False)

    @property
    def steps(self) -> list[int]:
        """Instruction index of every Compute (recomputes included), in order: the "steps"
        of SuperNeurons' Fig. 10."""
        return [i for i, k in enumerate(self.kind) if k in ("compute", "recompute")]

    @property
    def compute_only_time(self) -> float:
        """Compute time with no copy running beside it."""
        return self.compute_time - self.overlapped_transfer_time

    def breakdown(self) -> dict[str, float]:
        """Dymem Fig. 14's decomposition of the step time (seconds; the parts sum to it):
        copies overlapped with compute, copies the compute stream waited for, and compute
        with no copy beside it; plus, when the cost model charges host costs (the emulated
        device), the host time of non-kernel instructions."""
        parts = {
            "overlapped": self.overlapped_transfer_time,
            "exposed_transfer": self.exposed_transfer_time,
            "compute_only": self.compute_only_time,
        }
        if self.host_time:
            parts["host"] = self.host_time
        if self.optimizer_time:
            parts["optimizer"] = self.optimizer_time
        return parts

    def summary(self) -> str:
        """A few human lines: time split, memory, traffic."""
        b = self.breakdown()
        total = self.step_time or 1.0
        split = ", ".join(f"{k} {v * 1e3:.3f} ms ({100 * v / total:.1f}%)" for k, v in b.items())
        lines = [
            (f"step {self.step_time * 1e3:.3f} ms ({self.sub_batches} pass"
             f"{'es' if self.sub_batches != 1 else ''}; cost model {self.cost_model})"),
            "  " + split,
            (f"  device peak {format_bytes(self.peak_bytes)} ({self.peak_bytes} B), average "
             f"{format_bytes(self.average_bytes)}, host peak {format_bytes(self.host_peak_bytes)}"),
            f"  moved d2h {format_bytes(self.bytes_d2h)}, h2d {format_bytes(self.bytes_h2d)}",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The aggregates (no per-instruction lists), for tables and JSON."""
        keys = ("step_time", "pass_time", "sub_batches", "compute_time", "exposed_transfer_time",
                "stall_time", "overlapped_transfer_time", "d2h_busy_time", "h2d_busy_time",
                "bytes_d2h", "bytes_h2d", "peak_bytes", "average_bytes", "host_peak_bytes",
                "static_bytes", "host_time", "optimizer_time", "host_step_time", "cost_model")
        return {k: getattr(self, k) for k in keys}

"""Cost models: how long an op or a copy takes, and how much workspace an op needs.

A ``CostModel`` is anything with ``op_time(op)``, ``transfer_time(nbytes, direction)``,
``workspace(op)``, ``bind(graph)`` and ``copy_engines``; the simulator and the planners use
only that.
Two implementations exist: ``AnalyticCostModel`` (a roofline on a ``HardwareProfile``, below)
and ``outcore.cost.measured.MeasuredProfile`` (per-op seconds measured on this machine).

The roofline, per op::

    compute = (flops / peak[dtype] + kernels * fill_time) / eff[category]
    memory  = bytes_touched / (memory_bandwidth * eff["memory"])
    time    = launch_overhead + max(compute, memory)

``kernels * fill_time`` applies to heavy ops only (conv, matmul, attention): a kernel loses
about ``fill_time`` seconds of peak-rate work filling the device (wave quantisation, tails),
which is why a small 1x1 convolution runs far below peak while a large 3x3 one runs near
it. ``kernels`` is the number of matrix-shaped results the op computes (a convolution's
backward computes the input and the weight gradients: 2; its bias gradient is a cheap
reduction). Every other op gets ``kernels = 0``. View ops cost nothing (no kernel). A copy
costs ``launch_overhead + nbytes / bandwidth``. A profile may give its own ``fill_time``.

``peak[dtype]`` is the op's dtype's, except that a float32 op of a category PyTorch runs in
TF32 is priced at the profile's ``tf32`` peak, where it has one (Ampere and later):
convolutions while ``torch.backends.cudnn.allow_tf32`` (PyTorch's default: True), matmuls
and attention while ``torch.backends.cuda.matmul.allow_tf32`` (default: False), read when
the model is made (``tf32=`` overrides). Seen on an H200: ResNet-50's float32 convolution
backwards ran at 130-145 TFLOP/s, twice the float32 peak (session 32, docs/cuda.md).

The defaults were fitted to published training times (PoocH's ResNet-50 on a V100 PCIe;
VGG-16 and ResNet-50 in Torch + cuDNN 4 on a Maxwell Titan X, vDNN's setup);
``benchmarks/calibration.py`` prints the fit and its residuals (all within about 10%).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from outcore.cost.profiles import HardwareProfile
from outcore.cost.variant_costs import variant_time, variant_workspace
from outcore.errors import ProfileError
from outcore.graph.ir import Graph, Op, OpCategory

#: Fraction of peak FLOP/s reached per op category, and of DRAM bandwidth ("memory").
#: Heavy categories: fitted by benchmarks/calibration.py (see its residual table). "memory"
#: is fixed at 0.8, what bandwidth-bound kernels typically reach of the nominal DRAM rate.
#: Categories that are memory-bound in practice keep a nominal compute efficiency: their
#: memory term dominates.
DEFAULT_EFFICIENCY: Mapping[str, float] = {
    OpCategory.CONV.value: 0.79,
    OpCategory.MATMUL.value: 0.79,
    OpCategory.ATTENTION.value: 0.79,
    OpCategory.NORM.value: 0.25,
    OpCategory.POOL.value: 0.25,
    OpCategory.ELEMENTWISE.value: 0.25,
    OpCategory.REDUCTION.value: 0.25,
    OpCategory.DROPOUT.value: 0.25,
    OpCategory.LOSS.value: 0.25,
    OpCategory.CONCAT.value: 0.25,
    OpCategory.OTHER.value: 0.25,
    OpCategory.VIEW.value: 1.0,
    "memory": 0.80,
}

#: Seconds of peak-rate work a heavy kernel loses filling the device; fitted with the
#: efficiencies above.
DEFAULT_FILL_TIME = 3.2e-4

HEAVY = frozenset({OpCategory.CONV, OpCategory.MATMUL, OpCategory.ATTENTION})

_FLOATING = ("float", "bfloat", "tf32")


def torch_tf32() -> frozenset[OpCategory]:
    """The op categories PyTorch now runs float32 work of in TF32 on a GPU that has it."""
    import torch

    chosen = set()
    if torch.backends.cudnn.allow_tf32:
        chosen.add(OpCategory.CONV)
    if torch.backends.cuda.matmul.allow_tf32:
        chosen |= {OpCategory.MATMUL, OpCategory.ATTENTION}
    return frozenset(chosen)


@runtime_checkable
class CostModel(Protocol):
    """What the simulator needs to time a schedule.

    ``copy_engines``: 1 means host->device and device->host copies share one engine (they
    serialise); 2 or more gives each direction its own. A model may also carry
    ``host_costs`` (``outcore.cost.host_costs.HostCosts``, default all zero): the compute
    thread's time for Frees, copy issues and Waits on a device the host drives in step
    (the CPU-emulated one); a GPU's host runs ahead of it, so there they are hidden.
    """

    copy_engines: int

    def op_time(self, op: Op) -> float: ...

    def transfer_time(self, nbytes: int, direction: str) -> float: ...

    def workspace(self, op: Op) -> int: ...

    def bind(self, graph: Graph) -> CostModel:
        """This model for ``graph``: a model that needs nothing from the graph returns
        itself; the analytic one learns per-op dtypes; a measured profile refuses another
        graph. The simulator and the planners bind before pricing any op."""
        ...


@runtime_checkable
class VariantCosts(Protocol):
    """How an operator algorithm (``op.variant``, see outcore.variants) changes an op's cost:
    ``time_factor`` multiplies the default kernel's time, ``workspace`` is its extra bytes."""

    def time_factor(self, op: Op) -> float: ...

    def workspace(self, op: Op) -> int: ...


def check_direction(direction: str) -> None:
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")


class AnalyticCostModel:
    """Roofline cost model on a hardware profile.

    Args:
        profile: the device.
        graph: when given, each op's dtype is its first floating output's (else input's)
            dtype in this graph; otherwise every op uses ``dtype``.
        dtype: force one compute dtype for every op (e.g. "tf32" for float32 convolutions on
            Ampere); default "float32" when no graph is given.
        efficiency: per-category overrides on top of ``DEFAULT_EFFICIENCY`` and the profile's
            own ``efficiency``.
        fill_time: seconds of peak-rate work lost per heavy kernel (default: the
            profile's ``fill_time``, else ``DEFAULT_FILL_TIME``; 0 gives the plain roofline).
        tf32: the op categories whose float32 work runs in TF32 (module docstring; default:
            PyTorch's flags now). Only a profile with a ``tf32`` peak prices them so.
        variants: prices ``op.variant`` (time factor, workspace); without it, the costs
            capture recorded on each op (``variant_costs.RECORDED``), the same workspace the
            memory rule charges.
    """

    def __init__(self, profile: HardwareProfile, *, graph: Graph | None = None,
                 dtype: str | None = None, efficiency: Mapping[str, float] | None = None,
                 variants: VariantCosts | None = None, fill_time: float | None = None,
                 tf32: frozenset[OpCategory] | None = None) -> None:
        if fill_time is None:
            fill_time = DEFAULT_FILL_TIME if profile.fill_time is None else profile.fill_time
        if not (fill_time >= 0 and fill_time < float("inf")):
            raise ProfileError(f"fill_time must be a finite number of seconds >= 0, "
                               f"got {fill_time}")
        self.fill_time = fill_time
        self.profile = profile
        self.graph = graph
        self.dtype = dtype.removeprefix("torch.") if dtype else None
        eff = {**DEFAULT_EFFICIENCY, **profile.efficiency, **(efficiency or {})}
        for key, value in eff.items():
            if not 0 < value <= 1:
                raise ProfileError(f"efficiency[{key!r}] must be in (0, 1], got {value}")
        self.efficiency: dict[str, float] = eff
        self.variants = variants  # None: the costs capture recorded (variant_costs.RECORDED)
        self.copy_engines = profile.copy_engines
        self.tf32: frozenset[OpCategory] = torch_tf32() if tf32 is None else frozenset(tf32)
        self._dtypes: dict[int, str] = {}
        if self.dtype is not None:
            profile.peak(self.dtype)  # refuse an unknown dtype now, not mid-simulation

    def __repr__(self) -> str:
        return f"AnalyticCostModel({self.profile.name!r}, dtype={self.dtype or 'per-op'})"

    # -- CostModel ---------------------------------------------------------------------------
    def op_time(self, op: Op) -> float:
        """Seconds for ``op`` on the profile's device (0 for a view)."""
        if op.category is OpCategory.VIEW:
            return 0.0
        peak = self._peak(op)
        work = op.flops / peak
        if op.category in HEAVY:
            work += self._kernels(op) * self.fill_time
        compute = work / self.efficiency[op.category.value]
        memory = op.bytes_touched / (self.profile.memory_bandwidth * self.efficiency["memory"])
        return variant_time(op, self.profile.launch_overhead + max(compute, memory),
                            self.variants)

    def transfer_time(self, nbytes: int, direction: str) -> float:
        """Seconds to copy ``nbytes`` over the host link in ``direction``."""
        check_direction(direction)
        if nbytes <= 0:
            return 0.0
        return self.profile.launch_overhead + nbytes / self.profile.bandwidth(direction)

    def workspace(self, op: Op) -> int:
        """Transient bytes of the op's variant; 0 for the framework's default kernel."""
        return variant_workspace(op, self.variants)

    # -- binding -----------------------------------------------------------------------------
    def bind(self, graph: Graph) -> AnalyticCostModel:
        """This model, reading per-op dtypes from ``graph``; refuses (ProfileError) a graph
        whose dtypes the profile cannot price, or one other than the graph it was built for.

        The simulator calls ``bind`` before pricing any op.
        """
        if self.graph is not None and (self.graph.name != graph.name
                                       or len(self.graph.ops) != len(graph.ops)):
            raise ProfileError(
                f"this cost model reads dtypes from graph {self.graph.name!r} "
                f"({len(self.graph.ops)} ops) but was asked to price {graph.name!r} "
                f"({len(graph.ops)} ops); build AnalyticCostModel(profile, graph=that_graph)")
        model = self
        if self.graph is None and self.dtype is None:
            model = AnalyticCostModel(self.profile, graph=graph, efficiency=self.efficiency,
                                      variants=self.variants, fill_time=self.fill_time,
                                      tf32=self.tf32)
        for op in graph.ops:
            if op.category is not OpCategory.VIEW:
                model._peak(op)
        return model

    # -- internals ---------------------------------------------------------------------------
    def _peak(self, op: Op) -> float:
        dtype = self._dtype_of(op)
        if (dtype == "float32" and self.dtype is None and op.category in self.tf32
                and "tf32" in self.profile.peak_flops):
            dtype = "tf32"  # PyTorch runs this category's float32 work in TF32
        if dtype not in self.profile.peak_flops and not dtype.startswith(_FLOATING):
            dtype = "float32"  # integer/bool ops: memory-bound; price ALU work at the FP32 rate
        return self.profile.peak(dtype)

    def _kernels(self, op: Op) -> int:
        """Matrix-shaped results of a heavy op (>= 1); without a graph, its output count."""
        if self.graph is None:
            return max(1, len(op.outputs))
        return max(1, sum(len(self.graph.tensors[t].shape) >= 2 for t in op.outputs))

    def _dtype_of(self, op: Op) -> str:
        if self.dtype is not None:
            return self.dtype
        if self.graph is None:
            return "float32"
        cached = self._dtypes.get(op.id)
        if cached is None:
            cached = "float32"
            for tid in (*op.outputs, *op.inputs):
                d = self.graph.tensors[tid].dtype.removeprefix("torch.")
                if d.startswith(_FLOATING):
                    cached = d
                    break
            self._dtypes[op.id] = cached
        return cached

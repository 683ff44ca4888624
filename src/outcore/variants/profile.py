"""Measure each variant's time and workspace on this CPU (torch).

``measure_case`` runs every supported variant of one op on real tensors: the time is the
median of ``repeats`` timed calls (after a warm-up), the workspace is measured by the same
``MemoryTracker`` the executor uses (peak during the call minus live bytes before and the
outputs), and the formula's value is recorded beside it. ``profile`` returns plain data that
``save_json`` writes and ``outcore.variants.speeds`` reads.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from outcore.runtime.tracker import MemoryTracker
from outcore.variants import registry
from outcore.variants.meta import CONV, CONV_BACKWARD, SDPA, SDPA_BACKWARD
from outcore.variants.registry import FRAMEWORK
from outcore.variants.torchmeta import arg_meta_of, kwarg_meta_of


@dataclass(frozen=True)
class OpCase:
    """One op call to profile: a label, the ATen target and real arguments."""

    name: str
    target: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def conv_cases(name: str, n: int, c: int, h: int, w: int, o: int, k: int, stride: int = 1,
               padding: int | None = None, dtype: torch.dtype = torch.float32,
               seed: int = 0) -> list[OpCase]:
    """The forward and backward convolution calls of one conv layer (with bias)."""
    gen = torch.Generator().manual_seed(seed)
    pad = k // 2 if padding is None else padding
    x = torch.randn(n, c, h, w, dtype=dtype, generator=gen)
    weight = torch.randn(o, c, k, k, dtype=dtype, generator=gen) / (c * k * k) ** 0.5
    bias = torch.randn(o, dtype=dtype, generator=gen)
    fwd = (x, weight, bias, [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1)
    y = torch.ops.aten.convolution.default(*fwd)
    grad = torch.randn(y.shape, dtype=dtype, generator=gen)
    bwd = (grad, x, weight, [o], [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1,
           [True, True, True])
    return [OpCase(f"{name}.fwd", CONV, fwd), OpCase(f"{name}.bwd", CONV_BACKWARD, bwd)]


def attention_cases(name: str, b: int, h: int, lq: int, lk: int, d: int,
                    is_causal: bool = False, dtype: torch.dtype = torch.float32,
                    seed: int = 0) -> list[OpCase]:
    """The forward and backward CPU flash-attention calls, q/k/v laid out (B, L, H, D)."""
    gen = torch.Generator().manual_seed(seed)

    def heads(length: int) -> torch.Tensor:
        return torch.randn(b, length, h, d, dtype=dtype, generator=gen).transpose(1, 2)

    q, k, v = heads(lq), heads(lk), heads(lk)
    fwd = (q, k, v, 0.0, is_causal)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(*fwd)
    grad = torch.randn(out.shape, dtype=dtype, generator=gen)
    bwd = (grad, q, k, v, out, lse, 0.0, is_causal)
    return [OpCase(f"{name}.fwd", SDPA, fwd), OpCase(f"{name}.bwd", SDPA_BACKWARD, bwd)]


@dataclass
class Measurement:
    """One variant on one op: median time, measured and formula workspace, accuracy."""

    case: str
    target: str
    variant: str
    arg_meta: list[Any]
    kwarg_meta: dict[str, Any]
    time_s: float
    times_s: list[float]
    workspace_bytes: int
    formula_bytes: int
    relative_speed: float
    max_abs_error: float


def _tensors(value: Any) -> list[torch.Tensor]:
    items = value if isinstance(value, (tuple, list)) else (value,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def measured_workspace(fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[int, Any]:
    """(peak bytes beyond the live inputs and the outputs, the outputs) under the tracker."""
    tracker = MemoryTracker()
    with torch.no_grad():
        tracker.track(_tensors(list(args)) + _tensors(list(kwargs.values())))
        before = tracker.live
        with tracker:
            out = fn(*args, **kwargs)
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in _tensors(out)}
    return max(0, tracker.peak - before - sum(storages.values())), out


def _median_time(fn: Any, args: Sequence[Any], kwargs: dict[str, Any], repeats: int) -> list[float]:
    times = []
    with torch.no_grad():
        fn(*args, **kwargs)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            fn(*args, **kwargs)
            times.append(time.perf_counter() - start)
    return times


def _max_error(out: Any, ref: Any) -> float:
    worst = 0.0
    for a, b in zip(_tensors(out), _tensors(ref), strict=True):
        worst = max(worst, float((a.double() - b.double()).abs().max()) if a.numel() else 0.0)
    return worst


def measure_case(case: OpCase, variants: Iterable[str] | None = None,
                 repeats: int = 5) -> list[Measurement]:
    """Time and workspace of every supported variant of ``case`` (framework first)."""
    meta, kmeta = arg_meta_of(case.args), kwarg_meta_of(case.kwargs)
    supported = registry.supported_variants(case.target, meta, kmeta)
    names = [v for v in (variants or supported) if v in supported]
    if FRAMEWORK not in names:
        names.insert(0, FRAMEWORK)
    results: list[Measurement] = []
    base_time = 0.0
    with torch.no_grad():
        reference = registry.implementation(case.target, FRAMEWORK)(*case.args, **case.kwargs)
    for name in names:
        fn = registry.implementation(case.target, name)
        times = _median_time(fn, case.args, case.kwargs, repeats)
        median = statistics.median(times)
        if name == FRAMEWORK:
            base_time = median
        ws, out = measured_workspace(fn, case.args, case.kwargs)
        results.append(Measurement(
            case.name, case.target, name, _jsonable(meta), _jsonable(kmeta), median, times, ws,
            supported[name], median / base_time if base_time > 0 else 1.0,
            _max_error(out, reference)))
    return results


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def profile(cases: Iterable[OpCase], repeats: int = 5) -> dict[str, Any]:
    """Measure every case; plain data with the machine description and the entries."""
    entries = [asdict(m) for case in cases for m in measure_case(case, repeats=repeats)]
    return {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "torch": torch.__version__, "threads": torch.get_num_threads()},
        "repeats": repeats,
        "entries": entries,
    }


def save_json(table: dict[str, Any], path: str | Path) -> None:
    """Write ``profile``'s result as JSON (read back by ``speeds.SpeedTable.from_json``)."""
    Path(path).write_text(json.dumps(table, indent=1))

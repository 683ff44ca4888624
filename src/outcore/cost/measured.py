"""A measured per-op profile: seconds per op of one graph, measured on this machine.

PoocH and moDNN profile a few iterations and plan from the measured layer times; this is
that profile. It is made by ``outcore.cost.measure_ops.measure_ops`` (torch), saved as JSON,
and used as a ``CostModel`` in place of the analytic roofline. Copies are priced from the
link bandwidths it carries (set them with ``with_link``, e.g. the emulated device's link).

A profile belongs to one graph: it records the graph's name, op count and a digest of its op
targets, and ``bind(graph)`` refuses (ProfileError) any other graph.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from outcore.cost.host_costs import HostCosts
from outcore.cost.model import VariantCosts, check_direction
from outcore.cost.variant_costs import variant_time, variant_workspace
from outcore.errors import ProfileError
from outcore.graph.ir import Graph, Op

FORMAT = "outcore.measured-profile/1"


def graph_digest(graph: Graph) -> str:
    """A short digest of the graph's op targets, in order (detects a different graph that
    happens to share a name and an op count)."""
    h = hashlib.sha1()
    for op in graph.ops:
        h.update(op.target.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def _number(key: str, value: Any, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"measured profile: field {key!r} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise ProfileError(f"measured profile: field {key!r} must be a finite number "
                           f"{'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return v


@dataclass
class MeasuredProfile:
    """Per-op seconds of one graph plus the host link to price copies with.

    Invariants: ``len(op_seconds) == op_count``; every time is finite and >= 0; bandwidths,
    when set, are > 0; ``copy_engines`` >= 1.
    """

    graph_name: str
    op_count: int
    op_seconds: list[float]
    op_digest: str = ""
    device: str = ""
    repeats: int = 0
    h2d_bandwidth: float | None = None
    d2h_bandwidth: float | None = None
    transfer_latency: float = 0.0
    copy_engines: int = 2
    host_costs: HostCosts = field(default_factory=HostCosts)  # see outcore.cost.host_costs
    variants: VariantCosts | None = field(default=None, repr=False, compare=False)
    #: per op, its kernel temporaries in bytes (``outcore.cost.measure_temporaries``); empty
    #: when not measured. ``bind`` writes them onto the graph's ops for the memory rule.
    temporaries: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.graph_name, str) or not self.graph_name:
            raise ProfileError("measured profile: field 'graph_name' must be a non-empty string")
        count = self.op_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ProfileError(f"measured profile: field 'op_count' must be an integer >= 0, "
                               f"got {self.op_count!r}")
        if not isinstance(self.op_seconds, list) or len(self.op_seconds) != self.op_count:
            got = len(self.op_seconds) if isinstance(self.op_seconds, list) else self.op_seconds
            raise ProfileError(f"measured profile: field 'op_seconds' must list {self.op_count} "
                               f"times (one per op), got {got!r}")
        self.op_seconds = [_number(f"op_seconds[{i}]", t) for i, t in enumerate(self.op_seconds)]
        for key in ("h2d_bandwidth", "d2h_bandwidth"):
            value = getattr(self, key)
            if value is not None:
                setattr(self, key, _number(key, value, allow_zero=False))
        self.transfer_latency = _number("transfer_latency", self.transfer_latency)
        if not isinstance(self.temporaries, list) or (self.temporaries
                                                     and len(self.temporaries) != count):
            raise ProfileError(f"measured profile: field 'temporaries' must be empty or list "
                               f"{count} byte counts (one per op), got {self.temporaries!r}")
        self.temporaries = [int(_number(f"temporaries[{i}]", t))
                            for i, t in enumerate(self.temporaries)]
        if isinstance(self.host_costs, dict):
            self.host_costs = HostCosts.from_dict(self.host_costs, "measured profile: host_costs")
        elif not isinstance(self.host_costs, HostCosts):
            raise ProfileError("measured profile: field 'host_costs' must be a HostCosts or an "
                               f"object of seconds, got {self.host_costs!r}")
        if isinstance(self.copy_engines, bool) or not isinstance(self.copy_engines, int) \
                or self.copy_engines < 1:
            raise ProfileError(f"measured profile: field 'copy_engines' must be an integer "
                               f">= 1, got {self.copy_engines!r}")

    def __repr__(self) -> str:
        if self.h2d_bandwidth is None:
            link = "no link"
        else:
            d2h = (self.d2h_bandwidth or 0) / 1e9
            link = f"h2d {self.h2d_bandwidth / 1e9:.3g} GB/s, d2h {d2h:.3g} GB/s"
        return (f"MeasuredProfile({self.graph_name!r}, {self.op_count} ops, "
                f"{sum(self.op_seconds) * 1e3:.3f} ms, {link}, {self.device or 'unknown device'})")

    @classmethod
    def for_graph(cls, graph: Graph, op_seconds: list[float], **fields: Any) -> MeasuredProfile:
        """A profile keyed to ``graph`` (name, op count, digest)."""
        return cls(graph_name=graph.name, op_count=len(graph.ops), op_seconds=list(op_seconds),
                   op_digest=graph_digest(graph), **fields)

    def with_link(self, h2d_bandwidth: float, d2h_bandwidth: float | None = None, *,
                  latency: float = 0.0, copy_engines: int | None = None,
                  host_costs: HostCosts | None = None) -> MeasuredProfile:
        """A copy pricing copies at these bandwidths (bytes/s; d2h defaults to h2d), with a
        fixed ``latency`` per copy; ``host_costs`` replaces the profile's when given."""
        return replace(self, h2d_bandwidth=h2d_bandwidth,
                       d2h_bandwidth=h2d_bandwidth if d2h_bandwidth is None else d2h_bandwidth,
                       transfer_latency=latency,
                       host_costs=self.host_costs if host_costs is None else host_costs,
                       copy_engines=self.copy_engines if copy_engines is None else copy_engines)

    # -- CostModel ---------------------------------------------------------------------------
    def bind(self, graph: Graph) -> MeasuredProfile:
        """Return self if this profile was measured on ``graph``; else ProfileError. A
        profile with measured ``temporaries`` writes them onto ``graph``'s ops (the memory
        rule then holds them: ``outcore.plan.residency``)."""
        mismatch = (self.graph_name != graph.name or self.op_count != len(graph.ops)
                    or (self.op_digest and self.op_digest != graph_digest(graph)))
        if mismatch:
            raise ProfileError(
                f"this measured profile is for graph {self.graph_name!r} with {self.op_count} "
                f"ops, not {graph.name!r} with {len(graph.ops)} ops (or their op targets "
                "differ); measure this graph with outcore.cost.measure_ops.measure_ops(graph)")
        if self.temporaries:
            for op, nbytes in zip(graph.ops, self.temporaries, strict=True):
                op.temporaries = nbytes
        return self

    def op_time(self, op: Op) -> float:
        if not 0 <= op.id < self.op_count:
            raise ProfileError(f"measured profile of {self.graph_name!r} has no op {op.id} "
                               f"({op.name}); it holds {self.op_count} ops")
        return variant_time(op, self.op_seconds[op.id], self.variants)

    def transfer_time(self, nbytes: int, direction: str) -> float:
        check_direction(direction)
        if nbytes <= 0:
            return 0.0
        bandwidth = self.h2d_bandwidth if direction == "h2d" else self.d2h_bandwidth
        if bandwidth is None:
            raise ProfileError(f"measured profile of {self.graph_name!r} has no {direction} "
                               "bandwidth; set the link with profile.with_link(bytes_per_s)")
        return self.transfer_latency + nbytes / bandwidth

    def workspace(self, op: Op) -> int:
        return variant_workspace(op, self.variants)

    # -- JSON --------------------------------------------------------------------------------
    def to_json(self) -> str:
        doc = {"format": FORMAT, **asdict(self)}
        doc.pop("variants", None)
        doc["host_costs"] = self.host_costs.to_dict()
        return json.dumps(doc, indent=1)

    @classmethod
    def from_json(cls, text: str) -> MeasuredProfile:
        """Inverse of ``to_json``; ProfileError names a missing or bad field."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"measured profile is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ProfileError(f"not a measured profile: field 'format' must be {FORMAT!r}")
        doc.pop("format")
        for key in ("graph_name", "op_count", "op_seconds"):
            if key not in doc:
                raise ProfileError(f"measured profile: field {key!r} is missing")
        known = {f for f in cls.__dataclass_fields__ if f != "variants"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ProfileError(f"measured profile: field {unknown[0]!r} is unknown; "
                               f"known fields: {sorted(known)}")
        return cls(**doc)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> MeasuredProfile:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

"""Host memory: how much a step may hold in host copies, and the errors when it cannot.

Plain Python (no torch): the planner reads it.

``host_limit()`` is the default host budget: the least of what the machine and the
cgroups the process runs in allow.

* the machine: ``MemTotal`` of ``/proc/meminfo``;
* cgroup v2: ``memory.max`` of the process's cgroup (``/proc/self/cgroup``'s ``0::`` line)
  and of each ancestor up to the root of ``/sys/fs/cgroup`` ("max" means no limit);
* cgroup v1: ``memory.limit_in_bytes`` of the ``memory`` controller's cgroup (values at or
  above 2^60 mean no limit; the kernel writes 9223372036854771712 there).

It is a *limit*, not what is free right now: it does not move with other processes, so a
plan does not change from run to run; a plan that fits it can still fail if other
processes hold most of it (pinned memory cannot be swapped out). Pass ``host_budget=`` to
plan for less.

The host bytes of a plan are those of its host copies: ``residency_steps`` adds a
storage's bytes at each Offload and nothing leaves the host before the step ends, so the
host peak is the sum over the schedule's Offloads (``PlannedStep.host_peak``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from outcore.errors import InfeasibleBudgetError, OutcoreError

#: cgroup v1 reports "no limit" as a huge page-aligned number; anything this large is none.
_NO_LIMIT = 1 << 60


@dataclass(frozen=True)
class HostLimit:
    """A host memory limit in bytes and where it was read (e.g. "cgroup v2 /user.slice")."""

    bytes: int
    source: str


def meminfo_total(root: Path = Path("/")) -> int | None:
    """``MemTotal`` of ``root/proc/meminfo`` in bytes, None if unreadable."""
    try:
        text = (root / "proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            unit = parts[2].lower() if len(parts) > 2 else "b"
            return int(parts[1]) * (1024 if unit == "kb" else 1)
    return None


def _read_limit(path: Path) -> int | None:
    """A cgroup memory limit file: bytes, or None for "max", a huge value or no file."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    value = int(text)
    return None if value >= _NO_LIMIT else value


def _cgroup_paths(root: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory path) of this process's cgroups, from ``/proc/self/cgroup``."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    v2 = v1 = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def cgroup_limits(root: Path = Path("/")) -> list[HostLimit]:
    """Every memory limit of this process's cgroups (v2: the cgroup and its ancestors)."""
    v2, v1 = _cgroup_paths(root)
    found: list[HostLimit] = []
    base = root / "sys/fs/cgroup"
    if v2 is not None:
        path = Path(v2)
        while True:
            rel = str(path).lstrip("/")
            limit = _read_limit(base / rel / "memory.max")
            if limit is not None:
                found.append(HostLimit(limit, f"cgroup v2 {path}"))
            if path == path.parent:
                break
            path = path.parent
    if v1 is not None:
        rel = v1.lstrip("/")
        for mount in (base / "memory", base / "memory,cpu", base / "cpu,memory"):
            limit = _read_limit(mount / rel / "memory.limit_in_bytes")
            if limit is not None:
                found.append(HostLimit(limit, f"cgroup v1 {v1}"))
                break
    return found


def host_limit(root: Path = Path("/")) -> HostLimit:
    """The default host budget: the least of MemTotal and the cgroup limits (see above).

    ``OUTCORE_HOST_BUDGET`` (bytes or "64GiB"), when set, overrides it. Raises OutcoreError
    when nothing can be read (not Linux): pass ``host_budget=`` explicitly there.
    """
    override = os.environ.get("OUTCORE_HOST_BUDGET")
    if override:
        from outcore.units import parse_bytes

        return HostLimit(parse_bytes(override), "OUTCORE_HOST_BUDGET")
    candidates = cgroup_limits(root)
    total = meminfo_total(root)
    if total is not None:
        candidates.append(HostLimit(total, "MemTotal of /proc/meminfo"))
    if not candidates:
        raise OutcoreError("cannot read this machine's memory size (no /proc/meminfo and no "
                           "cgroup limit); pass host_budget= in bytes, or None for no limit")
    return min(candidates, key=lambda c: c.bytes)


class HostBudgetError(InfeasibleBudgetError):
    """A plan's host copies exceed the host budget.

    Attributes (besides InfeasibleBudgetError's, which here are host bytes):
        host_peak: bytes the plan keeps on the host at its peak.
        source: where the host budget came from.
    """

    def __init__(self, policy: str, host_budget: int, host_peak: int, source: str) -> None:
        self.host_peak = host_peak
        self.source = source
        super().__init__(
            policy, host_budget, host_peak,
            f"That is host memory ({source}): the plan offloads {host_peak} bytes, more than "
            "the host budget. Give a larger device budget (less to offload), pass a larger "
            "host_budget=, or use policy='auto', which prefers plans that fit the host "
            "budget (recompute instead of offload).")
        self.args = (f"host memory: {self.args[0]}",)

    def __str__(self) -> str:
        return str(self.args[0])


class HostOutOfMemory(OutcoreError):
    """A host pool would grow past its limit while the step runs."""

    def __init__(self, wanted: int, held: int, limit: int) -> None:
        from outcore.units import format_bytes

        self.wanted = wanted
        self.held = held
        self.limit = limit
        super().__init__(
            f"host memory: a host copy of {format_bytes(wanted)} does not fit; the pool holds "
            f"{format_bytes(held)} of its {format_bytes(limit)} limit. Plan with host_budget= "
            "at most that limit (outcore.plan reports PlannedStep.host_peak), or raise it.")

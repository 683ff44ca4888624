"""Transfer statistics a device reports: what was copied, and how much of it was exposed.

Per direction: bytes and copies completed, the seconds the copy engine was busy moving
data (``busy_s``), and the seconds the compute thread spent blocked waiting for copies of
that direction (``blocked_s``, the *exposed* transfer time). The transfer time hidden
behind compute is then ``overlapped_s = busy_s - blocked_s`` (clamped at 0: a wait can
also cover time a copy spent queued behind another). ``blocking_waits`` counts the Waits
that blocked and ``late_s`` sums, over them, the seconds from the copy's modelled end
(its deadline) to the Wait's return: the host's wake-up, which the simulator charges as
``HostCosts.wake``. Stats subtract (``after - before``) to give one step's share.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

from outcore.runtime.devices.copy_engine import CopyJob


@dataclass(frozen=True)
class DirectionStats:
    """Totals for one direction ("d2h" or "h2d")."""

    bytes: int = 0
    copies: int = 0
    failed: int = 0
    busy_s: float = 0.0
    blocked_s: float = 0.0
    blocking_waits: int = 0
    late_s: float = 0.0

    @property
    def overlapped_s(self) -> float:
        """Transfer seconds not seen by the compute thread."""
        return max(0.0, self.busy_s - self.blocked_s)

    def __sub__(self, other: DirectionStats) -> DirectionStats:
        return DirectionStats(*(getattr(self, f.name) - getattr(other, f.name)
                                for f in fields(self)))


@dataclass(frozen=True)
class TransferStats:
    """A snapshot of a device's transfers since it was made or last reset.

    ``releases_during_copy`` counts releases of a storage while a D2H copy still read it:
    a correct schedule keeps it at 0.
    """

    d2h: DirectionStats = field(default_factory=DirectionStats)
    h2d: DirectionStats = field(default_factory=DirectionStats)
    releases_during_copy: int = 0

    @property
    def exposed_s(self) -> float:
        """Seconds the compute thread was blocked on copies, both directions."""
        return self.d2h.blocked_s + self.h2d.blocked_s

    @property
    def overlapped_s(self) -> float:
        """Transfer seconds hidden behind compute, both directions."""
        return self.d2h.overlapped_s + self.h2d.overlapped_s

    def __sub__(self, other: TransferStats) -> TransferStats:
        return TransferStats(self.d2h - other.d2h, self.h2d - other.h2d,
                             self.releases_during_copy - other.releases_during_copy)


class StatsRecorder:
    """Thread-safe accumulator: engines call ``copied``, the compute thread ``blocked``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: dict[str, dict[str, float]] = {}
        self._releases = 0
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._dirs = {d: {f.name: 0 for f in fields(DirectionStats)}
                          for d in ("d2h", "h2d")}
            self._releases = 0

    def copied(self, job: CopyJob) -> None:
        """Record a finished job (engine thread)."""
        with self._lock:
            d = self._dirs[job.direction]
            if job.error is None:
                d["bytes"] += job.nbytes
                d["copies"] += 1
            else:
                d["failed"] += 1
            d["busy_s"] += max(0.0, job.finished - job.started)

    def blocked(self, direction: str, seconds: float, late: float = 0.0) -> None:
        """Record a Wait that blocked for ``seconds`` on a copy of ``direction`` and returned
        ``late`` seconds after the copy's modelled end."""
        with self._lock:
            d = self._dirs[direction]
            d["blocked_s"] += seconds
            d["blocking_waits"] += 1
            d["late_s"] += late

    def release_during_copy(self) -> None:
        with self._lock:
            self._releases += 1

    def snapshot(self) -> TransferStats:
        with self._lock:
            def one(d: dict[str, float]) -> DirectionStats:
                return DirectionStats(
                    bytes=int(d["bytes"]), copies=int(d["copies"]), failed=int(d["failed"]),
                    busy_s=d["busy_s"], blocked_s=d["blocked_s"],
                    blocking_waits=int(d["blocking_waits"]), late_s=d["late_s"])
            return TransferStats(one(self._dirs["d2h"]), one(self._dirs["h2d"]), self._releases)

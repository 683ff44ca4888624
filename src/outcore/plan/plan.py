"""A Plan: what a policy decided, per activation and per op, before lowering.

Decisions are per base activation (storage owner): KEEP it resident until its last use,
OFFLOAD it to host after it is produced and prefetch it before backward needs it, or
RECOMPUTE it in backward from its inputs. Views follow their base.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Decision(StrEnum):
    KEEP = "keep"
    OFFLOAD = "offload"
    RECOMPUTE = "recompute"


@dataclass
class Plan:
    """Per-tensor decisions plus per-op variants and the sub-batch count.

    ``reasons`` holds, per tensor id, a one-line human explanation of the decision.
    ``prefetch_at`` may map an offloaded tensor id to the backward op id before which its
    prefetch is issued (default: chosen by the lowering's prefetch window).
    ``release_at`` may map an offloaded tensor id to a later forward op id before which its
    ``Wait(d2h)`` and ``Free`` are placed (default: right after its last forward use), so
    that a long copy-out need not hold up the compute stream; it stays resident until then.
    """

    policy: str
    decisions: dict[int, Decision] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    variants: dict[int, str] = field(default_factory=dict)
    prefetch_at: dict[int, int] = field(default_factory=dict)
    release_at: dict[int, int] = field(default_factory=dict)
    sub_batches: int = 1
    budget: int | None = None
    free_at_last_use: bool = True  # False = network-wide allocation (nothing freed in the step)

    def decision(self, tid: int) -> Decision:
        """The decision for ``tid``; tensors not mentioned are kept."""
        return self.decisions.get(tid, Decision.KEEP)

    def tensors_with(self, decision: Decision) -> list[int]:
        return sorted(t for t, d in self.decisions.items() if d is decision)

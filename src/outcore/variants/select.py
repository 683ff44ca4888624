"""Per-op algorithm selection as in the papers, on plain tables (no torch import).

Every strategy sees, per step of the schedule, the candidate variants of that op as
``Candidate(variant, time_s, workspace_bytes)`` and the device memory at that step, and
returns ``{op: variant}``. The memory-optimal candidate (least workspace; the framework's
kernel, zero workspace, in outcore) plays the role of cuDNN's implicit GEMM in the papers;
the performance-optimal candidate is the fastest one.

* ``vdnn_dyn_greedy`` / ``vdnn_dyn``: vDNN (MICRO 2016) Sec. III-C "Dynamic vDNN".
* ``superneurons_fastest_fit``: SuperNeurons (PPoPP 2018) Sec. 3.5.
* ``modnn_gain``: moDNN (DATE 2018) Sec. IV-B.3, eq. (5).

Workspace is transient: it exists only while its op runs, so steps are independent given
the live bytes at each step (the policies compute those; this module only chooses).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from outcore.errors import InfeasibleBudgetError


@dataclass(frozen=True)
class Candidate:
    """One way to run an op: its measured (or modelled) time and its workspace."""

    variant: str
    time_s: float
    workspace_bytes: int


@dataclass(frozen=True)
class Step:
    """One op of the schedule: its candidates and the device bytes live while it runs,
    without its workspace (inputs, outputs and everything else resident then).

    An op with no choice (not a convolution/attention) has no candidates; it still has to
    fit (``live_bytes <= budget``) for a configuration to be trainable.
    """

    op: str
    live_bytes: int
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)


def memory_optimal(candidates: Sequence[Candidate]) -> Candidate:
    """The candidate with the least workspace (the fastest of those on a tie)."""
    return min(candidates, key=lambda c: (c.workspace_bytes, c.time_s))


def performance_optimal(candidates: Sequence[Candidate]) -> Candidate:
    """The fastest candidate (the one with less workspace on a tie)."""
    return min(candidates, key=lambda c: (c.time_s, c.workspace_bytes))


def downgrade_chain(candidates: Sequence[Candidate]) -> list[Candidate]:
    """vDNN's downgrade order: from the fastest, each next algorithm is slower but strictly
    more memory-efficient, ending at the memory-optimal one. Candidates that are slower
    *and* need more workspace than one already in the chain are never a downgrade."""
    chain: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.time_s, c.workspace_bytes)):
        if not chain or c.workspace_bytes < chain[-1].workspace_bytes:
            chain.append(c)
    return chain


def _too_small(policy: str, budget: int, step: Step, need: int, hint: str) -> InfeasibleBudgetError:
    return InfeasibleBudgetError(policy, budget, need, f"Step {step.op!r} needs it. {hint}")


# ---- vDNN -----------------------------------------------------------------------------------

def vdnn_dyn_greedy(steps: Sequence[Step], budget: int) -> dict[str, str]:
    """vDNN-dyn's greedy pass (vDNN Sec. III-C, "Dynamic vDNN", step 3).

    "When traversing through each layer, vDNN first calculates whether using the fastest
    algorithm will overflow the GPU memory budget. If so, then the given layer's
    convolutional algorithm will be locally downgraded into a less performant but more
    memory-efficient one, until it reaches the memory-optimal implicit GEMM."

    Per step, walk ``downgrade_chain`` from the fastest and keep the first candidate with
    ``live + workspace <= budget``. Raises ``InfeasibleBudgetError`` when a step does not fit
    even with its memory-optimal candidate (this training pass of vDNN fails).
    """
    choice: dict[str, str] = {}
    for step in steps:
        if not step.candidates:
            if step.live_bytes > budget:
                raise _too_small("vdnn-dyn", budget, step, step.live_bytes,
                                 "Offload more layers or raise the budget.")
            continue
        for c in downgrade_chain(step.candidates):
            if step.live_bytes + c.workspace_bytes <= budget:
                choice[step.op] = c.variant
                break
        else:
            need = step.live_bytes + memory_optimal(step.candidates).workspace_bytes
            raise _too_small("vdnn-dyn", budget, step, need,
                             "Offload more layers or raise the budget.")
    return choice


@dataclass(frozen=True)
class VdnnDynResult:
    """What vDNN-dyn settled on: the offload configuration ("none", "conv" or "all"), the
    profiling phase that chose it (2, 3 or 4), and the variant per op."""

    config: str
    phase: int
    choice: dict[str, str]


def _uniform(steps: Sequence[Step], pick: str) -> dict[str, str]:
    select = performance_optimal if pick == "fastest" else memory_optimal
    return {s.op: select(s.candidates).variant for s in steps if s.candidates}


def _fits(steps: Sequence[Step], choice: Mapping[str, str], budget: int) -> bool:
    for s in steps:
        ws = {c.variant: c.workspace_bytes for c in s.candidates}.get(choice.get(s.op, ""), 0)
        if s.live_bytes + ws > budget:
            return False
    return True


def vdnn_dyn(configs: Mapping[str, Sequence[Step]], budget: int) -> VdnnDynResult:
    """The whole vDNN-dyn profiling sequence (vDNN Sec. III-C, "Dynamic vDNN", steps 1-3).

    ``configs`` maps "none" (no offloading), "conv" (vDNN-conv) and "all" (vDNN-all) to the
    steps with their live bytes under that offloading; a training pass "passes" when every
    step fits the budget.

    1. vDNN-all with memory-optimal algorithms must pass, else the network is untrainable
       (``InfeasibleBudgetError``);
    2. no offloading with the fastest algorithms; if it fails, vDNN-conv then vDNN-all with
       the fastest algorithms (phase 2);
    3. the greedy downgrade (``vdnn_dyn_greedy``) with vDNN-conv, then with vDNN-all (phase 3);
    4. otherwise vDNN-all with memory-optimal algorithms everywhere (phase 4). Under an exact
       memory model the greedy pass on vDNN-all cannot fail once step 1 passed, so phase 4
       is reached only with inconsistent tables; it is kept to follow the paper.
    """
    missing = {"none", "conv", "all"} - set(configs)
    if missing:
        raise ValueError(f"vdnn_dyn needs live bytes for configurations {sorted(missing)}")
    safest = _uniform(configs["all"], "memory")
    if not _fits(configs["all"], safest, budget):
        need = max(s.live_bytes + (memory_optimal(s.candidates).workspace_bytes
                                   if s.candidates else 0) for s in configs["all"])
        raise InfeasibleBudgetError("vdnn-dyn", budget, need,
                                    "Even vDNN-all with memory-optimal algorithms overflows.")
    for config in ("none", "conv", "all"):
        fastest = _uniform(configs[config], "fastest")
        if _fits(configs[config], fastest, budget):
            return VdnnDynResult(config, 2, fastest)
    for config in ("conv", "all"):
        try:
            return VdnnDynResult(config, 3, vdnn_dyn_greedy(configs[config], budget))
        except InfeasibleBudgetError:
            continue
    return VdnnDynResult("all", 4, safest)


# ---- SuperNeurons ---------------------------------------------------------------------------

def superneurons_fastest_fit(steps: Sequence[Step], budget: int) -> dict[str, str]:
    """SuperNeurons Sec. 3.5, "Finding the Best Convolution Algorithm under the Memory
    Constraint": functional tensors are allocated first; at each layer the runtime takes the
    free bytes left (``budget - live``), skips "convolution algorithms that require more
    memory than it can provide", and picks the fastest of the rest.

    Raises ``InfeasibleBudgetError`` when not even the memory-optimal candidate fits.
    """
    choice: dict[str, str] = {}
    for step in steps:
        if not step.candidates:
            continue
        free = budget - step.live_bytes
        feasible = [c for c in step.candidates if c.workspace_bytes <= free]
        if not feasible:
            need = step.live_bytes + memory_optimal(step.candidates).workspace_bytes
            raise _too_small("superneurons", budget, step, need,
                             "Recompute or offload more, or raise the budget.")
        choice[step.op] = performance_optimal(feasible).variant
    return choice


# ---- moDNN ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModnnStep:
    """What moDNN's Algorithm 1 knows when it selects task t's algorithm (line 11).

    ``free_bytes``: device bytes free once t's inputs and output are allocated (before any
    workspace). ``prefetch_bytes``: bytes that s, the nearest future task that needs
    prefetched data, would prefetch while t runs. ``copy_busy_s``: time until the data
    stream is idle (an offload queued behind other copies waits for them, Fig. 3).
    """

    op: str
    candidates: tuple[Candidate, ...]
    free_bytes: int
    prefetch_bytes: int = 0
    copy_busy_s: float = 0.0


def _delayed_prefetch(step: ModnnStep, workspace: int) -> int:
    room = max(0, step.free_bytes - workspace)
    return max(0, step.prefetch_bytes - room)


def modnn_gains(step: ModnnStep, bandwidth: float) -> dict[str, float]:
    """moDNN eq. (5) for every candidate of task t:

        dT_alg(t) = T_base(t) - T_alg(t) - T_off,alg(t) - T_pre,alg(s)

    * T_base: time of the baseline (memory-optimal, zero-workspace) algorithm;
    * T_off,alg(t): delay from offloading what the workspace does not find free:
      ``copy_busy_s + (workspace - free) / bandwidth`` when the workspace exceeds the free
      bytes, else 0 (t cannot start before that offload ends, Fig. 3a);
    * T_pre,alg(s): prefetch time for s pushed after t because the workspace took the room
      the prefetch would have used: the bytes of s's prefetch that no longer fit during t,
      beyond those the baseline already delays, over the bandwidth.

    The baseline's gain is 0 by construction. ``bandwidth`` is bytes per second.
    """
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive bytes/s, got {bandwidth}")
    base = memory_optimal(step.candidates)
    base_delayed = _delayed_prefetch(step, base.workspace_bytes)
    gains: dict[str, float] = {}
    for c in step.candidates:
        deficit = max(0, c.workspace_bytes - step.free_bytes)
        t_off = step.copy_busy_s + deficit / bandwidth if deficit > 0 else 0.0
        t_pre = (_delayed_prefetch(step, c.workspace_bytes) - base_delayed) / bandwidth
        gains[c.variant] = base.time_s - c.time_s - t_off - t_pre
    return gains


def modnn_gain(steps: Sequence[ModnnStep], bandwidth: float) -> dict[str, str]:
    """moDNN Algorithm 1, lines 9-11: for each CONV task select "the algorithm with the
    maximum gain (defined in Eq. (5))"; ties go to the smaller workspace.

    Unlike SuperNeurons, a faster algorithm whose workspace does not fit can still win: moDNN
    offloads to make room when the time saved outweighs the offload and prefetch delays.
    """
    choice: dict[str, str] = {}
    for step in steps:
        if not step.candidates:
            continue
        gains = modnn_gains(step, bandwidth)
        best = max(step.candidates, key=lambda c: (gains[c.variant], -c.workspace_bytes))
        choice[step.op] = best.variant
    return choice

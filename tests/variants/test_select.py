"""Table tests: each strategy picks what its paper's rule says, derived by hand.

Candidates used throughout (bytes, seconds):
    framework 1.0 s / 0 B (memory-optimal), im2col 0.7 s / 300 B, fft 0.4 s / 800 B,
    gemm 0.8 s / 900 B (slower *and* bigger than im2col: never worth it).
"""

from __future__ import annotations

import pytest

from outcore.errors import InfeasibleBudgetError
from outcore.variants.select import (
    Candidate,
    ModnnStep,
    Step,
    downgrade_chain,
    memory_optimal,
    modnn_gain,
    modnn_gains,
    performance_optimal,
    superneurons_fastest_fit,
    vdnn_dyn,
    vdnn_dyn_greedy,
)

FW = Candidate("framework", 1.0, 0)
IM = Candidate("im2col", 0.7, 300)
FFT = Candidate("fft", 0.4, 800)
GEMM = Candidate("gemm", 0.8, 900)
ALL = (FW, IM, FFT, GEMM)


def test_optimal_candidates_and_downgrade_chain():
    assert memory_optimal(ALL) is FW
    assert performance_optimal(ALL) is FFT
    # fastest first; gemm is not a downgrade from im2col (slower and bigger)
    assert downgrade_chain(ALL) == [FFT, IM, FW]
    tie = (Candidate("a", 0.5, 200), Candidate("b", 0.5, 100), FW)
    assert downgrade_chain(tie) == [tie[1], FW]


# (live bytes, expected choice) for a 1000-byte budget: free = 1000 - live.
FIT_TABLE = [
    (100, "fft"),        # free 900: fft (800) fits; gemm (900) fits but is slower
    (200, "fft"),        # free 800: fft fits exactly
    (201, "im2col"),     # free 799: fft no longer fits; im2col is the fastest that does
    (800, "framework"),  # free 200: only the zero-workspace kernel
    (1000, "framework"),  # free 0
]


def test_superneurons_picks_the_fastest_that_fits_the_free_memory():
    steps = [Step(f"s{i}", live, ALL) for i, (live, _) in enumerate(FIT_TABLE)]
    steps.append(Step("relu", 1000))  # no choice to make
    assert superneurons_fastest_fit(steps, 1000) == {
        f"s{i}": want for i, (_, want) in enumerate(FIT_TABLE)}


def test_vdnn_greedy_downgrades_from_the_fastest_until_it_fits():
    steps = [Step(f"s{i}", live, ALL) for i, (live, _) in enumerate(FIT_TABLE)]
    assert vdnn_dyn_greedy(steps, 1000) == {
        f"s{i}": want for i, (_, want) in enumerate(FIT_TABLE)}


def test_strategies_refuse_when_nothing_fits():
    with pytest.raises(InfeasibleBudgetError) as info:
        superneurons_fastest_fit([Step("c", 1001, ALL)], 1000)
    assert info.value.required == 1001
    with pytest.raises(InfeasibleBudgetError) as info:
        vdnn_dyn_greedy([Step("c", 900, (IM, FFT))], 1000)  # no zero-workspace kernel
    assert info.value.required == 1200
    with pytest.raises(InfeasibleBudgetError, match="'relu'"):
        vdnn_dyn_greedy([Step("relu", 1200)], 1000)


def _configs(none, conv, all_):
    """Three steps: conv1 forward, a relu (no choice), conv1 backward; live per config."""
    def steps(live):
        return [Step("conv1", live[0], ALL), Step("relu", live[1]), Step("conv1.bwd", live[2], ALL)]
    return {"none": steps(none), "conv": steps(conv), "all": steps(all_)}


VDNN_TABLE = [
    # no offloading with the fastest algorithms fits: phase 2, "none"
    (_configs((100, 150, 150), (90, 100, 140), (80, 90, 120)),
     ("none", 2, {"conv1": "fft", "conv1.bwd": "fft"})),
    # none overflows (300 + 800); vDNN-conv with the fastest fits: phase 2, "conv"
    (_configs((300, 150, 300), (150, 100, 200), (120, 90, 180)),
     ("conv", 2, {"conv1": "fft", "conv1.bwd": "fft"})),
    # fastest overflows under every offloading (250 + 800, 220 + 800): greedy on vDNN-conv
    # keeps fft for conv1 and downgrades the backward to im2col (250 + 300)
    (_configs((300, 150, 300), (150, 100, 250), (120, 90, 220)),
     ("conv", 3, {"conv1": "fft", "conv1.bwd": "im2col"})),
    # vDNN-conv cannot hold the relu step at all (1100): greedy on vDNN-all
    (_configs((300, 1200, 300), (150, 1100, 250), (120, 900, 220)),
     ("all", 3, {"conv1": "fft", "conv1.bwd": "im2col"})),
]


@pytest.mark.parametrize("configs,expected", VDNN_TABLE)
def test_vdnn_dyn_follows_the_profiling_phases(configs, expected):
    result = vdnn_dyn(configs, 1000)
    assert (result.config, result.phase, result.choice) == expected


def test_vdnn_dyn_untrainable_when_vdnn_all_memory_optimal_overflows():
    with pytest.raises(InfeasibleBudgetError) as info:
        vdnn_dyn(_configs((300, 1200, 300), (150, 1100, 250), (120, 1001, 220)), 1000)
    assert info.value.required == 1001


def test_vdnn_dyn_needs_all_three_configurations():
    with pytest.raises(ValueError, match="conv"):
        vdnn_dyn({"none": [], "all": []}, 1000)


# moDNN eq. (5) with bandwidth 1000 B/s, fft now 0.3 s:
#   gain = (T_base - T_alg) - T_off - T_pre
FAST = Candidate("fft", 0.3, 800)
MODNN = (FW, IM, FAST)
MODNN_TABLE = [
    # free 500, nothing to prefetch: fft offloads 300 B (0.3 s): 0.7 - 0.3 = 0.4 > im2col 0.3
    (ModnnStep("t", MODNN, 500), 1000.0, {"framework": 0.0, "im2col": 0.3, "fft": 0.4}, "fft"),
    # s must prefetch 400 B during t: im2col leaves 200 B of room (200 B delayed, 0.2 s),
    # fft leaves none (400 B delayed, 0.4 s) and offloads 300 B
    (ModnnStep("t", MODNN, 500, prefetch_bytes=400), 1000.0,
     {"framework": 0.0, "im2col": 0.1, "fft": 0.0}, "im2col"),
    # the copy stream is busy 0.5 s more: fft's offload waits for it
    (ModnnStep("t", MODNN, 500, copy_busy_s=0.5), 1000.0,
     {"framework": 0.0, "im2col": 0.3, "fft": -0.1}, "im2col"),
    # everything fits, but a 1100 B prefetch is pushed back: the baseline already delays
    # 100 B; im2col 300 B more (0.333 s), fft 800 B more (0.889 s): keep the baseline
    (ModnnStep("t", MODNN, 1000, prefetch_bytes=1100), 900.0,
     {"framework": 0.0, "im2col": 0.3 - 300 / 900, "fft": 0.7 - 800 / 900}, "framework"),
]


@pytest.mark.parametrize("step,bandwidth,gains,choice", MODNN_TABLE)
def test_modnn_eq5_gains_and_choice(step, bandwidth, gains, choice):
    got = modnn_gains(step, bandwidth)
    assert got.keys() == gains.keys()
    for name, value in gains.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
    assert modnn_gain([step], bandwidth) == {"t": choice}


def test_modnn_differs_from_superneurons_where_the_paper_says():
    # free 500: SuperNeurons skips fft (800 > 500); moDNN offloads to run it (row 1 above)
    assert superneurons_fastest_fit([Step("t", 500, MODNN)], 1000) == {"t": "im2col"}
    assert modnn_gain([MODNN_TABLE[0][0]], 1000.0) == {"t": "fft"}
    # free 1000: SuperNeurons takes fft; moDNN keeps the baseline to not delay prefetching
    assert superneurons_fastest_fit([Step("t", 0, MODNN)], 1000) == {"t": "fft"}
    assert modnn_gain([MODNN_TABLE[3][0]], 900.0) == {"t": "framework"}


def test_modnn_ties_go_to_less_workspace_and_bad_bandwidth_is_refused():
    tie = (Candidate("big", 0.5, 200), Candidate("small", 0.5, 100), FW)
    assert modnn_gain([ModnnStep("t", tie, 1000)], 1000.0) == {"t": "small"}
    with pytest.raises(ValueError, match="bandwidth"):
        modnn_gains(ModnnStep("t", tie, 1000), 0.0)

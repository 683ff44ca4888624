"""The parts of the GPU benchmarks that need no GPU: fits, block wrapping, tables, and the
host-memory benchmark's replay (benchmarks/cuda_calibrate.py, cuda_speed.py, host_memory.py).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
from outcore import zoo
from outcore.capture import capture
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile, load_profiles
from outcore.graph.ir import OpCategory

import cuda_speed
import host_memory
from cuda_calibrate import (
    LinkSample,
    error_table,
    fit_efficiency,
    fit_link,
    profile_document,
)
from cuda_speed import Checkpointed, Row, checkpoint_blocks, largest_fitting, markdown


def test_fit_link_recovers_latency_and_bandwidth_per_direction_and_mode() -> None:
    truth = {("d2h", False): (8e-6, 24e9), ("h2d", False): (6e-6, 26e9),
             ("d2h", True): (9e-6, 20e9), ("h2d", True): (9e-6, 21e9)}
    samples = [LinkSample(d, n, lat + n / bw, c) for (d, c), (lat, bw) in truth.items()
               for n in (1 << 16, 1 << 20, 1 << 24, 1 << 28)]
    fits = fit_link(samples)
    for (d, c), (lat, bw) in truth.items():
        fit = fits[d + (" concurrent" if c else "")]
        assert fit.latency_s == pytest.approx(lat, rel=1e-6)
        assert fit.bandwidth == pytest.approx(bw, rel=1e-9)
    with pytest.raises(ValueError, match="two sizes"):
        fit_link([LinkSample("d2h", 10, 1.0, False)] * 3)


@pytest.fixture(scope="module")
def fake_graphs():
    graphs = []
    for name, batch in (("resnet20-cifar", 8), ("transformer", 2)):
        work = zoo.get(name, batch, fake=True, small=True)
        graphs.append(capture(work.model, work.loss_fn, work.batch, fake=True))
    return graphs


def test_fit_efficiency_recovers_a_known_gpu_from_its_op_times(fake_graphs) -> None:
    base = get_profile("h100")
    true_eff = {c.value: 0.3 for c in OpCategory if c is not OpCategory.VIEW}
    true_eff.update({"conv": 0.55, "matmul": 0.45, "attention": 0.6, "memory": 0.7})
    truth = AnalyticCostModel(base.__class__(**{**base.__dict__, "efficiency": true_eff,
                                                "launch_overhead": 5e-6}))
    measured = [(g, [truth.bind(g).op_time(op) for op in g.ops]) for g in fake_graphs]
    start_rms = fit_rms(base, measured)
    fitted, rms = fit_efficiency(base, measured)
    assert rms < 0.02 < start_rms, (rms, start_rms)
    model = AnalyticCostModel(fitted)
    for g, seconds in measured:
        bound = model.bind(g)
        total = sum(bound.op_time(op) for op in g.ops)
        assert total == pytest.approx(sum(seconds), rel=0.02)
    assert fitted.launch_overhead == pytest.approx(5e-6, rel=0.1)


def fit_rms(base, measured) -> float:
    """The time-weighted RMS log error of ``base`` itself on these measurements."""
    import math

    model = AnalyticCostModel(base)
    num = den = 0.0
    for g, seconds in measured:
        bound = model.bind(g)
        for op, s in zip(g.ops, seconds, strict=True):
            if s > 0 and op.category is not OpCategory.VIEW:
                num += s * (math.log(bound.op_time(op)) - math.log(s)) ** 2
                den += s
    return math.sqrt(num / den)


def test_the_profile_file_reads_back_as_a_hardware_profile() -> None:
    base = get_profile("h100")
    fitted = base.__class__(**{**base.__dict__, "name": "gpu-measured", "aliases": ()})
    import json

    text = json.dumps(profile_document(fitted, {"link_samples": []}))
    back = load_profiles(text)["gpu-measured"]
    assert back.h2d_bandwidth == pytest.approx(fitted.h2d_bandwidth)
    assert back.peak("float32") == pytest.approx(fitted.peak("float32"))


def test_error_table_flags_rows_off_by_more_than_ten_percent() -> None:
    rows = [{"workload": "w", "fraction": 0.5, "method": "outcore a", "step_s": 0.100,
             "simulated_s": 0.108},
            {"workload": "w", "fraction": 0.3, "method": "outcore b", "step_s": 0.100,
             "simulated_s": 0.085},
            {"workload": "w", "fraction": 0.3, "method": "eager in-core", "step_s": 0.05,
             "simulated_s": None}]
    table, ok = error_table(rows)
    assert not ok and "+8.0 | yes" in table and "-15.0 | NO" in table
    assert "eager" not in table
    assert error_table(rows[:1])[1]


@pytest.mark.parametrize(("name", "blocks"), [("resnet18", 8), ("transformer", 2)])
def test_checkpoint_blocks_wraps_repeated_blocks_and_keeps_gradients(name, blocks) -> None:
    work = zoo.get(name, 2, small=True)
    reference = copy.deepcopy(work.model)
    assert checkpoint_blocks(work.model) == blocks
    assert sum(isinstance(m, Checkpointed) for m in work.model.modules()) == blocks
    for model in (reference, work.model):
        torch.manual_seed(0)
        work.loss_fn(model(work.batch[0]), work.batch[1]).backward()
    for p, q in zip(work.model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_largest_fitting_takes_the_largest_budget_that_fits_and_stops_there() -> None:
    peaks = {1.0: 100, 0.5: 70, 0.3: None, 0.1: 40}
    tried: list[float] = []

    def peak_of(f: float) -> int | None:
        tried.append(f)
        return peaks[f]

    assert largest_fitting(list(peaks), peak_of, 75) == (0.5, 70)
    assert tried == [1.0, 0.5]
    assert largest_fitting(list(peaks), peak_of, 10) == (None, None)


def test_markdown_reports_ratios_and_budget_misses() -> None:
    rows = [Row("w", 1.0, 1000, "eager in-core", 0.1, 1000),
            Row("w", 0.5, 500, "outcore x", 0.15, 480, 470, 0.01, 0.02, 0.003, 0.14),
            Row("w", 0.5, 500, "torch.compile budget 0.3", 0.12, 600)]
    text = markdown(rows, "Some GPU")
    assert "GPU: Some GPU" in text
    line = next(x for x in text.splitlines() if "outcore x" in x)
    assert "| 1.50 |" in line and "| yes |" in line and "| -6.7 |" in line
    assert "| NO |" in next(x for x in text.splitlines() if "torch.compile" in x)


def test_the_compile_peer_compiles_each_fraction_once_for_all_budgets() -> None:
    """The budgets of one workload share the compiles: a fraction already timed is looked up,
    not compiled again (each is a Triton compile on the GPU)."""
    peer = cuda_speed.CompilePeer.__new__(cuda_speed.CompilePeer)
    peer.w = cuda_speed.Workload("w", None, torch.nn.Linear(1, 1), (), None, 1000, None, None,
                                 "cpu")
    peer.results = {0.5: (0.2, 700), 0.3: (0.3, 450), 0.1: None}
    row = peer.row(0.5, 500, [0.5, 0.3, 0.1])
    assert (row.method, row.step_s, row.peak) == ("torch.compile budget 0.3", 0.3, 450)
    row = peer.row(0.3, 300, [0.5, 0.3, 0.1])
    assert row.method == "torch.compile" and row.step_s is None and "fits" in row.note


def test_the_speed_benchmark_runs_its_whole_flow_on_the_cpu(tmp_path: Path) -> None:
    """``--device cpu --small --measured-ops``: the GPU session's flow, dry, on this CPU:
    the eager row, an outcore row planned and simulated on the measured per-op profile
    (and on the analytic one), the checkpoint row; the JSON holds every row."""
    out = tmp_path / "speed.json"
    cuda_speed.main(["--device", "cpu", "--small", "--measured-ops", "--profile", "h200",
                     "--models", "gpt2", "--budgets", "0.99", "--policies", "keep-all",
                     "pooch", "--skip-compile", "--steps", "1", "--warmup", "1",
                     "--save-ops", str(tmp_path / "ops"), "--json", str(out)])
    import json

    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) >= {"eager in-core", "outcore pooch", "checkpoint per block"}
    pooch = rows["outcore pooch"]
    assert pooch["step_s"] > 0 and pooch["simulated_s"] > 0 and pooch["analytic_s"] > 0
    assert pooch["tracked_peak"] <= pooch["budget"]
    assert "refused" in rows["outcore keep-all"]["note"]  # 99% is under keep-all's peak
    assert (tmp_path / "ops" / "gpt2.ops.json").exists()


def test_host_memory_benchmark_pool_stays_within_limit_where_pin_memory_does_not() -> None:
    assert [host_memory.pow2(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [
        1, 2, 4, 1024, 1024, 2048]
    rows = host_memory.rows_for("resnet20-cifar", 16, {"small": True}, cuda=False)
    assert rows, "offload-all offloads something"
    for row in rows:
        assert not row.pool_grew
        assert row.pool / row.host_peak <= host_memory.LIMIT
        assert row.pinned == sum(host_memory.pow2(n) for n in _sizes(row))
        assert row.pinned >= row.host_peak  # rounding up never holds less


def _sizes(row) -> list[int]:
    import outcore.api
    from outcore.graph.bounds import reference_peaks

    work = zoo.get("resnet20-cifar", 16, fake=True, small=True)
    graph = capture(work.model, work.loss_fn, work.batch, fake=True)
    limit = None if row.plan == "offload-all" else int(reference_peaks(graph).liveness * 0.5)
    policy = "offload-all" if row.plan == "offload-all" else "auto"
    return outcore.api.plan(graph, limit, policy=policy, simulate=False).host_sizes

"""Issue 18: a second identical `outcore plan` skips capture and planning (the on-disk cache);
--no-cache plans again; progress is off under --json and off the terminal."""

import json

import pytest

import outcore
from outcore import cli_workload, progress
from outcore.cli import EXIT_OK, main


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OUTCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OUTCORE_NO_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def counted(monkeypatch):
    counts = {"capture": 0, "policy": 0}
    import importlib
    import sys

    from outcore.policies import registry

    importlib.import_module("outcore.capture")
    package = sys.modules["outcore.capture"]
    real_capture = package.capture

    def capture(*args, **kwargs):
        counts["capture"] += 1
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(package, "capture", capture)
    real_get = registry.get

    def get(name):
        info = real_get(name)

        def fn(graph, ctx):
            counts["policy"] += 1
            return info.fn(graph, ctx)

        return type(info)(info.name, fn, info.description, info.paper, info.config)

    import outcore.planned

    monkeypatch.setattr(outcore.planned, "get", get)
    return counts


ARGS = ["plan", "--model", "resnet20-cifar", "--batch", "16", "--budget", "20MB", "--json"]


def test_second_identical_plan_skips_capture_and_planning(cache_dir, counted, capsys):
    assert main(ARGS) == EXIT_OK
    first = json.loads(capsys.readouterr().out)
    assert counted == {"capture": 1, "policy": 1}
    assert main(ARGS) == EXIT_OK
    second = json.loads(capsys.readouterr().out)
    assert counted == {"capture": 1, "policy": 1}  # nothing captured or planned again
    assert second == first
    assert len(list(cache_dir.glob("*.pkl"))) == 2  # the graph and the plan
    assert main([*ARGS, "--no-cache"]) == EXIT_OK
    assert counted == {"capture": 2, "policy": 2}
    assert json.loads(capsys.readouterr().out) == first


def test_cache_key_covers_budget_policy_options_and_gpu(cache_dir, counted, capsys):
    assert main(ARGS) == EXIT_OK
    for extra in (["--budget", "21MB"], ["--policy", "vdnn-all"], ["--gpu", "h100"],
                  ["--option", "portfolio=false"]):
        before = counted["policy"]
        assert main([*ARGS, *extra]) == EXIT_OK
        assert counted["policy"] == before + 1, extra
    capsys.readouterr()


def test_api_plan_cache_gives_the_same_plan(cache_dir):
    from outcore import zoo

    w = zoo.get("resnet20-cifar", 16, fake=True)
    graph = outcore.capture(w.model, w.loss_fn, w.batch, fake=True)
    first = outcore.plan(graph, "15MB", cache=True)
    again = outcore.plan(graph, "15MB", cache=True)
    assert again.plan.decisions == first.plan.decisions
    assert again.schedule.instructions == first.schedule.instructions
    assert again.predicted_peak == first.predicted_peak
    assert again.simulation.step_time == first.simulation.step_time
    assert len(list(cache_dir.glob("*.pkl"))) == 1


def test_corrupt_cache_entry_is_a_miss(cache_dir):
    from outcore import zoo

    w = zoo.get("resnet20-cifar", 16, fake=True)
    graph = outcore.capture(w.model, w.loss_fn, w.batch, fake=True)
    first = outcore.plan(graph, "15MB", cache=True)
    for entry in cache_dir.glob("*.pkl"):
        entry.write_bytes(b"not a pickle")
    assert outcore.plan(graph, "15MB", cache=True).predicted_peak == first.predicted_peak


def test_progress_off_under_json_and_off_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    assert progress.configure(True)
    progress.configure(False)
    assert not progress.enabled()
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert not progress.configure(True)  # a pipe or CI: nothing drawn


def test_progress_draws_each_step_on_a_terminal(monkeypatch):
    """On a terminal every long step is drawn: capture, planning, simulation (a separate
    step where the policy did not simulate its plan itself: outcore-auto's portfolio hands
    its simulation of the winner over, so that run has none)."""
    import io

    shown = []
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    real_task = progress.task

    def task(description):
        shown.append(description)
        return real_task(description)

    monkeypatch.setattr(progress, "task", task)
    monkeypatch.setattr(cli_workload.progress, "task", task)
    monkeypatch.setattr("sys.stderr", io.StringIO(), raising=False)
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["plan", "--model", "mlp", "--batch", "8", "--budget", "30MB", "--no-cache"]) \
        == EXIT_OK
    assert any(s.startswith("capturing mlp") for s in shown)
    assert any(s.startswith("planning") for s in shown)
    shown.clear()
    assert main(["plan", "--model", "mlp", "--batch", "8", "--budget", "30MB", "--no-cache",
                 "--policy", "offload-all"]) == EXIT_OK
    assert any(s.startswith("simulating") for s in shown)
    shown.clear()
    assert main(["plan", "--model", "mlp", "--batch", "8", "--budget", "30MB", "--no-cache",
                 "--json"]) == EXIT_OK
    assert not progress.enabled()


def test_cache_key_covers_what_the_cost_model_runs_in_tf32() -> None:
    """Which categories the model prices in TF32 follows PyTorch's flags when it is made; a
    plan cached under one setting must not be served under another."""
    from outcore.cost.model import AnalyticCostModel
    from outcore.cost.profiles import get_profile
    from outcore.graph.ir import OpCategory
    from outcore.plan_cache import describe

    gpu = get_profile("h200")
    conv = AnalyticCostModel(gpu, tf32=frozenset({OpCategory.CONV}))
    matmul = AnalyticCostModel(gpu, tf32=frozenset({OpCategory.MATMUL}))
    assert describe(conv) != describe(matmul)
    assert describe(conv) == describe(AnalyticCostModel(gpu, tf32=frozenset({OpCategory.CONV})))

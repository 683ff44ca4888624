"""Issue 18: arguments checked before any capture, one exit code per class of error, the
catalogues, --version, --json and --no-cache anywhere, --option, --list-*."""

import json
import time

import pytest

from outcore import cli, cli_workload
from outcore.cli import EXIT_INFEASIBLE, EXIT_OK, EXIT_USAGE, main, parse_option


@pytest.mark.parametrize("args,error", [
    (["plan", "--model", "resnet152", "--batch", "256", "--gpu", "foo"], "UnknownGPUError"),
    (["plan", "--model", "resnet152", "--policy", "vdnnx"], "UnknownPolicyError"),
    (["plan", "--model", "resnet152", "--budget", "12XB"], "UnreadableBudgetError"),
    (["plan", "--model", "resnet152", "--budget", "1e400"], "NonFiniteBudgetError"),
    (["plan", "--model", "resnet152", "--budget", "inf"], "UnreadableBudgetError"),
    (["plan", "--model", "resnet152", "--budget", "0GB"], "NonPositiveBudgetError"),
    (["explain", "--model", "resnet152", "--budget=-3GB"], "NonPositiveBudgetError"),
    (["compare", "--model", "resnet-nope"], "UnknownModelError"),
    (["simulate", "--model", "resnet152", "--batch", "0"], "InvalidOptionError"),
    (["run", "--model", "mlp", "--steps", "0"], "InvalidOptionError"),
    (["plan", "--model", "mlp", "--option", "no_equals_sign"], "InvalidOptionError"),
    (["reproduce", "nopaper"], "UnknownPaperError"),
    (["plan"], "needs --model"),
])
def test_bad_arguments_exit_2_before_any_capture(args, error, no_capture, capsys):
    start = time.perf_counter()
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert error in err and len(err.splitlines()) == 1
    assert time.perf_counter() - start < 10  # no 20-second capture first


def test_every_error_class_has_its_own_exit_code():
    from outcore import errors

    codes = {cls: cli._exit_code(cls.__new__(cls)) for cls in (
        errors.UnknownPolicyError, errors.InfeasibleBudgetError, errors.DeviceOutOfMemory,
        errors.CaptureError, errors.OutputPathError, errors.ScheduleError)}
    assert codes[errors.UnknownPolicyError] == EXIT_USAGE
    assert codes[errors.InfeasibleBudgetError] == EXIT_INFEASIBLE
    assert len(set(codes.values())) == len(codes)  # ScheduleError: 1, the others distinct
    assert cli._exit_code(KeyboardInterrupt()) == cli.EXIT_INTERRUPTED
    assert "Exit codes" in cli.__doc__ and "6  an output" in cli.__doc__


def test_json_error_names_the_exit_code(no_capture, capsys):
    assert main(["plan", "--model", "mlp", "--gpu", "foo", "--json"]) == EXIT_USAGE
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"error": "UnknownGPUError", "exit_code": 2, "message": doc["message"]}
    assert "'foo'" in doc["message"] and "h100" in doc["message"]


def test_version(capsys):
    import outcore

    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == f"outcore {outcore.__version__}"


@pytest.mark.parametrize("args,key,name", [
    (["models"], "models", "resnet152"),
    (["gpus"], "gpus", "h100"),
    (["policies"], "policies", "modnn"),
    (["plan", "--list-models"], "models", "vgg16"),
    (["explain", "--list-policies"], "policies", "outcore-auto"),
    (["simulate", "--list-gpus"], "gpus", "v100-pcie"),
])
def test_catalogues_and_list_flags(args, key, name, capsys):
    assert main([*args, "--json"]) == EXIT_OK  # --json after the command
    doc = json.loads(capsys.readouterr().out)
    assert name in [row["name"] for row in doc[key]]


def test_catalogue_tables_render(capsys):
    assert main(["policies"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "outcore-auto" in out and "vDNN" in out


@pytest.mark.parametrize("text,expected", [
    ("portfolio=false", ("portfolio", False)), ("k=3", ("k", 3)), ("x=0.5", ("x", 0.5)),
    ("mode=memory", ("mode", "memory")), ("a=None", ("a", None)), ("s=1e3", ("s", 1000.0)),
])
def test_options_are_typed(text, expected):
    assert parse_option(text) == expected


def test_options_reach_the_policy(monkeypatch, capsys):
    seen = {}
    import outcore.api

    real = outcore.api.plan

    def spy(graph, budget=None, **kwargs):
        seen.update(kwargs)
        return real(graph, budget, **kwargs)

    monkeypatch.setattr(outcore.api, "plan", spy)
    assert main(["--json", "plan", "--model", "mlp", "--batch", "8", "--budget", "64MB",
                 "--option", "portfolio=false", "--option", "allow_variants=true"]) == EXIT_OK
    assert seen["portfolio"] is False and seen["allow_variants"] is True


def test_options_go_through_the_policies_validator(monkeypatch, no_capture, capsys):
    """The CLI asks one validator; once outcore.policies.config_for exists, its error is
    the CLI's error."""
    from outcore import policies
    from outcore.errors import InvalidArgumentError

    def config_for(name, options):
        if "recomptue" in options:
            raise InvalidArgumentError("recomptue", "one of recompute, offload")

    monkeypatch.setattr(policies, "config_for", config_for, raising=False)
    assert main(["plan", "--model", "mlp", "--option", "recomptue=memory"]) == EXIT_USAGE
    assert "recomptue" in capsys.readouterr().err


def test_unitless_budget_gets_a_note(capsys):
    code = main(["plan", "--model", "mlp", "--batch", "8", "--budget", "12", "--json"])
    captured = capsys.readouterr()
    assert code == EXIT_INFEASIBLE
    assert "no unit" in captured.err and "12 bytes" in captured.err


def test_module_function_loading_is_documented_as_running_code():
    assert "runs your code" in cli.__doc__ or "RUNS" in cli.__doc__
    assert "runs the\nuser's code" in cli_workload.__doc__ or "user's code" in cli_workload.__doc__


def test_profile_out_is_read_back_by_plan_cost(tmp_path, capsys):
    ops = tmp_path / "ops.json"
    assert main(["profile", "--model", "mlp", "--batch", "4", "--out", str(ops), "--json"]) \
        == EXIT_OK
    assert json.loads(capsys.readouterr().out)["saved"] == str(ops)
    assert main(["plan", "--model", "mlp", "--batch", "4", "--real", "--cost", str(ops),
                 "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulation"]["cost_model"].startswith("MeasuredProfile")
    assert main(["plan", "--model", "mlp", "--cost", str(tmp_path / "missing.json")]) \
        == EXIT_USAGE


def test_explain_rows_name_modules_and_come_grouped(capsys):
    assert main(["explain", "--model", "resnet20-cifar", "--batch", "32", "--budget", "25MB",
                 "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    rows = doc["tensors"]
    assert all(r["module"] and r["op"] and r["size"] for r in rows)
    order = {"offload": 0, "recompute": 1, "keep": 2}
    assert [order[r["decision"]] for r in rows] == sorted(order[r["decision"]] for r in rows)
    assert any(r["module"].endswith("branch.0") for r in rows)  # zoo ResNet's conv modules


def test_outcore_zoo_is_an_attribute():
    import outcore

    assert "resnet50" in outcore.zoo.names()


def test_sub_batches_need_the_flag_and_are_announced(capsys):
    args = ["plan", "--model", "resnet20-cifar", "--batch", "16", "--budget", "3MB", "--json"]
    assert main(args) == EXIT_INFEASIBLE
    captured = capsys.readouterr()
    assert "--allow-sub-batches" in json.loads(captured.out)["message"]
    assert main([*args, "--allow-sub-batches"]) == EXIT_OK
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["sub_batches"] > 1 and "batch-coupled" in doc["notes"][0]
    assert "WARNING" in captured.err and "sub-batches" in captured.err

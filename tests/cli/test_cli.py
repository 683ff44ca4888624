"""The outcore command: help everywhere, JSON output, meaningful exit codes, one-line errors."""

import json

import pytest

from outcore.cli import EXIT_INFEASIBLE, EXIT_OK, EXIT_USAGE, build_parser, main

COMMANDS = ["plan", "simulate", "run", "compare", "reproduce", "explain", "profile", "models",
            "gpus", "policies"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    assert main([command, "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "usage: outcore" in out and command in out


def test_top_level_help_lists_commands(capsys):
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert all(c in out for c in COMMANDS)
    assert set(build_parser()._subparsers._group_actions[0].choices) == set(COMMANDS)


def run_json(args, capsys):
    code = main(["--json", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err


def test_plan_json(capsys):
    code, doc, _ = run_json(["plan", "--model", "resnet20-cifar", "--batch", "64",
                             "--budget", "60MB"], capsys)
    assert code == EXIT_OK
    assert doc["predicted_peak"] <= 60_000_000
    assert doc["simulation"]["step_time"] > 0
    assert sum(doc["decisions"].values()) > 0


def test_compare_lists_every_policy(capsys):
    from outcore import policies

    code, doc, _ = run_json(["compare", "--model", "mlp", "--batch", "64"], capsys)
    assert code == EXIT_OK
    assert [r["policy"] for r in doc["policies"]] == policies()


def test_explain_gives_reasons(capsys):
    code, doc, _ = run_json(["explain", "--model", "resnet20-cifar", "--batch", "64",
                             "--budget", "60MB"], capsys)
    assert code == EXIT_OK
    assert all(row["why"] for row in doc["tensors"])
    assert any(row["decision"] != "keep" for row in doc["tensors"])


def test_simulate_writes_plot_and_trace(tmp_path, capsys):
    code, _, _ = run_json(["simulate", "--model", "mlp", "--batch", "32",
                           "--out", str(tmp_path)], capsys)
    assert code == EXIT_OK
    assert (tmp_path / "memory.png").stat().st_size > 1000
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace["traceEvents"]


def test_run_trains_on_the_emulated_device(capsys):
    code, doc, _ = run_json(["run", "--model", "resnet20-cifar", "--small", "--batch", "4",
                             "--steps", "2", "--budget", "4MB"], capsys)
    assert code == EXIT_OK
    assert doc["measured_peak"] == doc["predicted_peak"] <= 4_000_000
    assert len(doc["losses"]) == 2


def test_infeasible_budget_exit_code(capsys):
    code = main(["plan", "--model", "mlp", "--batch", "8", "--budget", "1KB"])
    err = capsys.readouterr().err
    assert code == EXIT_INFEASIBLE
    assert "InfeasibleBudgetError" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args,words", [
    (["plan", "--model", "no-such-net"], "unknown model"),
    (["plan", "--model", "mlp", "--budget", "lots"], "cannot read"),
    (["plan", "--model", "mlp", "--policy", "nope"], "unknown policy"),
    (["reproduce", "nopaper"], "unknown paper"),
    (["plan", "--model", "nosuchmodule:fn"], "Cannot load"),
    (["run", "--model", "mlp", "--steps", "0"], "at least 1"),
])
def test_bad_arguments_are_one_line_errors(args, words, capsys):
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_unknown_flag_is_usage_error(capsys):
    assert main(["plan", "--bogus"]) == EXIT_USAGE

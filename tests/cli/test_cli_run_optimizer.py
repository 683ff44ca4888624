"""``outcore run --optimizer``: training with SGD, Adam or AdamW under the plan that
``outcore plan --optimizer`` makes (the budget holds the parameters, gradients and optimizer
state with the activations; what it cannot hold lives in host memory and is stepped there),
equal to eager PyTorch with the same optimizer; its arguments checked before any capture."""

import json

import pytest
import torch

from outcore import cli_workload, zoo
from outcore.cli import EXIT_OK, EXIT_USAGE, main

MLP = ["--model", "mlp", "--small", "--batch", "8"]
BUDGET = 60_000  # below the MLP's weights, gradients and Adam state (about 0.2 MB)


def run_json(args, capsys):
    code = main(["--json", *args])
    captured = capsys.readouterr()
    assert code == EXIT_OK, captured.err
    return json.loads(captured.out)


def eager_losses(kind, steps, **options):
    """The losses of ``steps`` eager steps of the zoo MLP on its batch with ``kind``."""
    work = zoo.get("mlp", 8, small=True)
    model, loss_fn, (x, y) = work.model, work.loss_fn, work.batch
    optimizer = getattr(torch.optim, kind)(model.parameters(), **options)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("name,kind,extra,options", [
    ("adam", "Adam", [], {"lr": 1e-3}),
    ("adamw", "AdamW", ["--weight-decay", "0.1"], {"lr": 1e-3, "weight_decay": 0.1}),
    ("sgd", "SGD", ["--lr", "0.05", "--momentum", "0.9"], {"lr": 0.05, "momentum": 0.9}),
])
def test_run_optimizer_trains_under_the_weights_plan_as_eager(name, kind, extra, options,
                                                              capsys):
    args = [*MLP, "--budget", str(BUDGET), "--optimizer", name]
    doc = run_json(["run", *args, "--steps", "3", *extra], capsys)
    assert doc["optimizer"] == kind
    assert doc["losses"] == eager_losses(kind, 3, **options)
    assert doc["losses"][-1] < doc["losses"][0]
    assert doc["held"], "at this budget some parameters must live in host memory"
    assert doc["measured_peak"] == doc["predicted_peak"]
    assert doc["predicted_peak"] + doc["device_state"] <= BUDGET
    planned = run_json(["plan", *args, "--real"], capsys)  # the plan `run` trained under
    assert sorted(planned["weights"]["held"]) == doc["held"]
    assert planned["predicted_peak"] == doc["predicted_peak"]


def test_run_without_optimizer_is_sgd_with_the_new_flags(capsys):
    doc = run_json(["run", *MLP, "--budget", "4MB", "--steps", "2", "--lr", "0.1",
                    "--momentum", "0.9", "--weight-decay", "0.01"], capsys)
    assert doc["optimizer"] == "SGD" and "held" not in doc
    assert doc["losses"] == eager_losses("SGD", 2, lr=0.1, momentum=0.9, weight_decay=0.01)


@pytest.fixture
def no_capture(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("loaded the model before checking the arguments")

    monkeypatch.setattr(cli_workload, "load_workload", refuse)
    monkeypatch.setattr(cli_workload, "capture", refuse)


@pytest.mark.parametrize("args,words", [
    (["--optimizer", "adam"], "needs --budget"),
    (["--optimizer", "adam", "--budget", "1MB", "--nproc", "2"], "runs one process"),
    (["--optimizer", "adam", "--budget", "1MB", "--policy", "vdnn-all"], "not 'vdnn-all'"),
    (["--optimizer", "adam", "--budget", "1MB", "--option", "portfolio=false"], "--option"),
    (["--optimizer", "adam", "--budget", "1MB", "--allow-sub-batches"], "sub-batches"),
    (["--optimizer", "adamw", "--momentum", "0.9"], "SGD's"),
    (["--lr", "0"], "above 0"),
    (["--lr", "nan"], "above 0"),
    (["--weight-decay", "-1"], "at least 0"),
    (["--optimizer", "lbfgs"], "invalid choice"),
    (["--cost", __file__], "unrecognized arguments: --cost"),  # was accepted, never read
])
def test_run_optimizer_arguments_are_checked_first(args, words, no_capture, capsys):
    assert main(["run", *MLP, *args]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert words in err, err
    assert "Traceback" not in err

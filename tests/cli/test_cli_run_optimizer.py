"""``outcore run --optimizer``: training with SGD, Adam or AdamW under the plan that
``outcore plan --optimizer`` makes (the budget holds the parameters, gradients and optimizer
state with the activations; what it cannot hold lives in host memory and is stepped there),
equal to eager PyTorch with the same optimizer; its arguments checked before any capture."""

import json

import pytest
import torch

from outcore import zoo
from outcore.cli import EXIT_INFEASIBLE, EXIT_OK, EXIT_USAGE, main
from outcore.weights.report import HOST_KEYS

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
    sizing = [a for i, a in enumerate(extra) if "--lr" not in (a, extra[i - 1])]
    planned = run_json(["plan", *args, *sizing, "--real"], capsys)  # what `run` trained under
    assert sorted(planned["weights"]["held"]) == doc["held"]
    assert planned["predicted_peak"] == doc["predicted_peak"]
    assert_same_memory(doc, planned)


def plan_and_run(args, capsys, steps=2):
    """``outcore run`` and ``outcore plan --real`` with the same arguments: their JSON."""
    return (run_json(["run", *args, "--steps", str(steps)], capsys),
            run_json(["plan", *args, "--real"], capsys))


def assert_same_plan(doc, planned):
    assert sorted(planned["weights"]["held"]) == doc["held"]
    assert planned["predicted_peak"] == doc["predicted_peak"] == doc["measured_peak"]
    assert_same_memory(doc, planned)


def assert_same_memory(doc, planned):
    """`run --json` reports the plan's memory under `plan --json`'s names and meanings
    (``HOST_KEYS``): host_bytes is the step's host copies plus the host-held state."""
    for key in HOST_KEYS:
        assert doc[key] == planned["weights"][key], key
    assert doc["host_bytes"] == doc["host_copies"] + doc["host_state"]


@pytest.mark.parametrize("extra,options", [([], {}), (["--momentum", "0.9"], {"momentum": 0.9})],
                         ids=["no-momentum", "momentum"])
def test_plan_and_run_sgd_agree_with_and_without_momentum(extra, options, capsys):
    """SGD keeps a momentum buffer only with momentum: `plan --optimizer sgd` counts what
    `run --optimizer sgd` keeps, so both hold the same parameters at the same peak."""
    doc, planned = plan_and_run([*MLP, "--budget", str(BUDGET), "--optimizer", "sgd",
                                 *extra], capsys)
    assert_same_plan(doc, planned)
    assert (doc["device_state"] > 0) == bool(options)
    assert doc["losses"] == eager_losses("SGD", 2, lr=0.01, **options)


def test_run_weights_host_holds_what_plan_weights_host_holds(capsys):
    doc, planned = plan_and_run([*MLP, "--budget", "120000", "--optimizer", "adam",
                                 "--weights", "host"], capsys)
    assert_same_plan(doc, planned)
    assert len(doc["held"]) == doc["parameters"] and doc["device_state"] == 0
    assert doc["losses"] == eager_losses("Adam", 2, lr=1e-3)


def test_run_weights_device_is_refused_where_plan_refuses_it(capsys):
    args = [*MLP, "--budget", str(BUDGET), "--optimizer", "adam", "--weights", "device"]
    assert main(["run", *args]) == EXIT_INFEASIBLE
    assert main(["plan", *args, "--real"]) == EXIT_INFEASIBLE


def test_run_host_adam_rate_reaches_the_chooser(monkeypatch, capsys):
    from outcore.weights import trainer as weights_trainer

    seen = []
    choose = weights_trainer.choose_weights

    def spy(*args, **kwargs):
        seen.append((kwargs.get("host_adam_rate"), kwargs.get("mode")))
        return choose(*args, **kwargs)

    monkeypatch.setattr(weights_trainer, "choose_weights", spy)
    doc, planned = plan_and_run([*MLP, "--budget", str(BUDGET), "--optimizer", "adam",
                                 "--host-adam-rate", "2.5e6"], capsys, steps=1)
    assert seen == [(2.5e6, "auto")]
    assert_same_plan(doc, planned)


def test_run_without_optimizer_is_sgd_with_the_new_flags(capsys):
    doc = run_json(["run", *MLP, "--budget", "4MB", "--steps", "2", "--lr", "0.1",
                    "--momentum", "0.9", "--weight-decay", "0.01"], capsys)
    assert doc["optimizer"] == "SGD" and "held" not in doc
    assert doc["losses"] == eager_losses("SGD", 2, lr=0.1, momentum=0.9, weight_decay=0.01)


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
    (["--weights", "host"], "--weights goes with --optimizer"),
    (["--host-adam-rate", "1e9"], "--host-adam-rate goes with --optimizer"),
    (["--optimizer", "adam", "--budget", "1MB", "--host-adam-rate", "0"], "above 0"),
    (["--optimizer", "adam", "--budget", "1MB", "--weights", "all"], "invalid choice"),
])
def test_run_optimizer_arguments_are_checked_first(args, words, no_capture, capsys):
    assert main(["run", *MLP, *args]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert words in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("args,words", [
    (["--momentum", "0.9"], "--momentum goes with --optimizer"),
    (["--weight-decay", "0.1"], "--weight-decay goes with --optimizer"),
    (["--weights", "host"], "--weights goes with --optimizer"),
    (["--optimizer", "adam", "--momentum", "0.9"], "SGD's"),
    (["--optimizer", "sgd", "--momentum", "-1"], "at least 0"),
    (["--optimizer", "sgd", "--host-adam-rate", "inf"], "above 0"),
])
@pytest.mark.parametrize("command", ["plan", "explain"])
def test_plan_optimizer_arguments_are_checked_first(command, args, words, no_capture, capsys):
    assert main([command, *MLP, "--budget", "1MB", *args]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert words in err, err
    assert "Traceback" not in err


BF16_MODULE = '''
import torch
import torch.nn.functional as F
from torch import nn


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 10)).to(torch.bfloat16)
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    return model, F.cross_entropy, (x, torch.randint(0, 10, (8,)))
'''


@pytest.fixture
def bf16_model(user_module):
    """``--model bf16mod:mlp``: a bf16 MLP (6922 parameters)."""
    return user_module("bf16mod", BF16_MODULE) + ":mlp"


@pytest.mark.parametrize("name,extra", [("adamw", []), ("sgd", ["--momentum", "0.9"])])
def test_plan_and_run_agree_on_a_bf16_model(name, extra, bf16_model, capsys):
    """`run` builds the optimizer on the bf16 parameters (bf16 state, no fp32 masters), and
    `plan` now counts that: the same held parameters and device-held state. Before, `plan`
    counted fp32 state plus masters (3x AdamW's bytes here) and held other parameters."""
    import importlib

    budget = "30000"  # below the weights, gradients and bf16 AdamW state (55400 bytes)
    doc, planned = plan_and_run(["--model", bf16_model, "--budget", budget, "--optimizer",
                                 name, *extra], capsys)
    assert_same_plan(doc, planned)
    assert doc["held"] and len(doc["held"]) < doc["parameters"]
    model = importlib.import_module("bf16mod").mlp()[0]
    device = [p for n, p in model.named_parameters() if n not in doc["held"]]
    moments, scalars = (2, 4) if name == "adamw" else (1, 0)  # AdamW: a 4-byte step
    assert doc["device_state"] == sum(moments * p.nbytes + scalars for p in device)
    held = [p for n, p in model.named_parameters() if n in doc["held"]]
    assert doc["host_state"] == sum(moments * p.nbytes + scalars for p in held)
    # the held weights and their gradients' host copies (before, run's host_bytes was the
    # held weights and state only: 28876 for AdamW where plan said 38496)
    assert doc["host_copies"] >= 2 * sum(p.nbytes for p in held)


def eager_master_losses(kind, steps, **options):
    """The losses of ``steps`` eager mixed-precision steps of the bf16 MLP: ``kind`` built on
    its fp32 masters, each step ``outcore.weights.mixed.eager_step``."""
    import importlib

    from outcore.weights.mixed import MasterWeights, eager_step

    model, loss_fn, (x, y) = importlib.import_module("bf16mod").mlp()
    master = MasterWeights(model)
    optimizer = getattr(torch.optim, kind)(master.parameters(), **options)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(x), y)
        losses.append(float(loss.detach()))
        eager_step(model, master, optimizer, loss)
    return losses


@pytest.mark.parametrize("name,kind,extra,options", [
    ("adamw", "AdamW", [], {"lr": 1e-3}),
    ("sgd", "SGD", ["--momentum", "0.9"], {"lr": 0.01, "momentum": 0.9}),
])
@pytest.mark.parametrize("budget,weights", [("20000", []), ("60000", ["--weights", "device"])],
                         ids=["auto", "device"])
def test_plan_and_run_agree_with_master_weights(name, kind, extra, options, budget, weights,
                                                bf16_model, capsys):
    """``--master-weights``: `run` trains the bf16 model on fp32 masters in host memory as
    eager mixed precision does, and `plan` counts what it allocates: the same held
    parameters and peak, every HOST_KEYS key equal; the masters and their fp32 state are
    host state whatever the placement (none on the device)."""
    import importlib

    extra = [*extra, *weights]
    doc, planned = plan_and_run(["--model", bf16_model, "--budget", budget, "--optimizer",
                                 name, "--master-weights", *extra], capsys, steps=3)
    assert_same_plan(doc, planned)
    # below the bf16 weights and gradients (27688 bytes) some must be held; on the device none
    assert bool(doc["held"]) == (not weights)
    assert doc["master_weights"] is True and planned["master_weights"] is True
    assert doc["losses"] == eager_master_losses(kind, 3, **options)
    model = importlib.import_module("bf16mod").mlp()[0]
    moments, scalars = (2, 4) if name == "adamw" else (1, 0)  # AdamW: a 4-byte step
    assert doc["device_state"] == 0
    assert doc["host_state"] == sum((moments + 1) * 4 * p.numel() + scalars
                                    for p in model.parameters())
    without, _ = plan_and_run(["--model", bf16_model, "--budget", budget, "--optimizer", name,
                               *extra], capsys, steps=1)
    assert without["master_weights"] is False
    assert without["host_state"] < doc["host_state"]  # bf16 state, no masters


FP32_AND_BF16_MODULE = '''
import torch
import torch.nn.functional as F
from torch import nn


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64).to(torch.bfloat16), nn.Linear(64, 10))
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    return model, lambda o, y: F.cross_entropy(o.float(), y), (x, torch.randint(0, 10, (8,)))
'''


@pytest.mark.parametrize("command", ["plan", "explain", "run"])
def test_master_weights_are_refused_where_they_make_no_sense(command, user_module, capsys):
    """Without --optimizer (nothing planned with them), on an fp32 model (nothing to
    master) and on a model mixing fp32 with bf16 parameters (`run` would master the fp32
    ones too, `plan` would not count them): refused with exit code 2, saying what to do."""
    mixed = user_module("mixedmod", FP32_AND_BF16_MODULE) + ":mlp"
    for args, words in [
        ([*MLP, "--budget", "1MB", "--master-weights"], "--master-weights goes with --optimizer"),
        ([*MLP, "--budget", "1MB", "--optimizer", "adamw", "--master-weights"],
         "an fp32 model needs no masters, leave out --master-weights"),
        (["--model", mixed, "--budget", "1MB", "--optimizer", "adamw", "--master-weights"],
         "2 of the model's 4 parameters are not bf16/fp16, e.g. '1.weight' is float32"),
    ]:
        assert main([command, *args]) == EXIT_USAGE, args
        err = capsys.readouterr().err.strip()
        assert words in err, err
        assert "Traceback" not in err

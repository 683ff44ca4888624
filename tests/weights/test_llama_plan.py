"""``outcore plan --optimizer``: can this Llama be fine-tuned on this GPU, and how fast.

The zoo's Llamas captured with fake tensors (nothing allocated): a full-width Llama 7B
block stack cut to two layers and a short sequence keeps the test quick while the
parameters keep their real sizes (4096x11008 bf16 matrices)."""

import json

import pytest

import outcore
from outcore import zoo
from outcore.cli import EXIT_INFEASIBLE, EXIT_OK, main
from outcore.errors import InfeasibleBudgetError
from outcore.runtime.devices.cuda import HOST_ALIGNMENT
from outcore.weights.report import PINNED_ALIGNMENT, tokens_per_step


@pytest.fixture(scope="module")
def llama7b_2layers():
    w = zoo.get("llama-7b", 2, fake=True, n_layer=2, seq_len=128)
    return outcore.capture(w.model, w.loss_fn, w.batch, fake=True, name="llama-7b-2")


def test_the_weights_of_a_llama_go_to_host_memory_and_pinned_stays_within_5_percent(
        llama7b_2layers):
    graph = llama7b_2layers
    weights = sum(t.nbytes for t in graph.tensors if t.kind.value == "parameter")
    budget = 2 * weights  # bf16 weights + grads + fp32 AdamW and masters: 8x the weights
    planned = outcore.plan(graph, budget, optimizer="adamw", gpu="a100-80gb", cache=False)
    w = planned.weights
    assert w.held, "the weights, gradients and state do not fit: some go to host memory"
    assert planned.predicted_peak + w.device_state <= budget
    assert w.host_state >= 12 * (w.held_weights // 2)  # fp32 master + two fp32 moments
    assert w.host_copies >= w.held_weights
    assert w.pinned >= w.host_copies
    assert w.pinned <= 1.05 * w.host_copies
    assert w.total_seconds > w.step_seconds > 0
    assert tokens_per_step(graph) == 2 * 128


def test_pinned_alignment_is_the_cuda_pools():
    assert PINNED_ALIGNMENT == HOST_ALIGNMENT


def test_a_budget_below_every_placement_is_refused_with_the_lowest_figure(llama7b_2layers):
    with pytest.raises(InfeasibleBudgetError) as info:
        outcore.plan(llama7b_2layers, "64MB", optimizer="adamw", gpu="a100-80gb", cache=False)
    assert info.value.lowest > 64e6
    assert "Ways out" in str(info.value)


#: A small Llama whose weights need the host at this budget, for the CLI tests.
SMALL_LLAMA = ["--model", "llama-1b", "--small", "--batch", "2", "--budget", "200KB",
               "--gpu", "a100-40gb", "--optimizer", "adamw"]


def _cli_json(command: str, capsys: pytest.CaptureFixture[str]) -> dict:
    code = main(["--json", "--no-cache", command, *SMALL_LLAMA])
    assert code == EXIT_OK
    return json.loads(capsys.readouterr().out)


def test_cli_plan_answers_with_tokens_per_second_and_host_memory(capsys):
    doc = _cli_json("plan", capsys)
    w = doc["weights"]
    assert w["held"] and w["host_bytes"] == w["host_copies"] + w["host_state"]
    assert w["pinned_ratio"] <= 1.05
    assert doc["tokens_per_step"] == 2 * 16
    assert doc["tokens_per_second"] == pytest.approx(32 / w["total_seconds"])
    assert doc["gap"] is not None and doc["gap"] >= 0


def test_cli_explain_says_what_moved(capsys):
    doc = _cli_json("explain", capsys)
    assert [r["parameter"] for r in doc["parameters"]] == doc["weights"]["held"]
    assert all("frees" in r["why"] for r in doc["parameters"])
    code = main(["--no-cache", "explain", *SMALL_LLAMA])
    out = capsys.readouterr().out
    assert code == EXIT_OK and "parameters held in host memory" in out


def test_cli_refuses_a_budget_no_placement_reaches(capsys):
    code = main(["--no-cache", "plan", "--model", "llama-1b", "--small", "--batch", "2",
                 "--budget", "20KB", "--gpu", "a100-40gb", "--optimizer", "adamw"])
    err = capsys.readouterr().err
    assert code == EXIT_INFEASIBLE and "Ways out" in err


@pytest.mark.parametrize(("name", "count"), [("llama-1b", 1_235_814_400),
                                             ("llama-7b", 6_738_415_616)])
def test_zoo_llamas_have_the_published_parameter_counts(name, count):
    """Llama 3.2 1B (tied embedding) and Llama 2 7B, built with fake tensors."""
    w = zoo.get(name, 1, fake=True)
    assert sum(p.numel() for p in w.model.parameters()) == count
    assert all(p.dtype.is_floating_point and p.element_size() == 2
               for p in w.model.parameters())

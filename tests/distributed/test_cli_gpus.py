"""``outcore plan --gpus N``, ``compare --gpus N`` (simulated) and ``run --nproc 2``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from outcore.cli import EXIT_OK, EXIT_USAGE, main


def run_json(args, capsys):
    code = main(["--json", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else None, captured.err


def test_plan_gpus_simulates_the_shared_link_and_the_allreduce(capsys):
    """What ``--gpus`` adds to a plan: ranks sharing one host link, the gradient allreduce.
    Any policy that offloads exercises it; SuperNeurons plans this in seconds, where
    outcore-auto took 116-344 s (its planner is not what is tested here; it runs under
    ``--gpus`` in ``test_compare_gpus_lists_every_policy`` and tests/distributed/
    test_data_parallel.py)."""
    args = ["plan", "--model", "resnet20-cifar", "--batch", "128", "--budget", "60MB",
            "--policy", "superneurons"]
    code, two, _ = run_json([*args, "--gpus", "2", "--host", "v100-pcie-x8"], capsys)
    assert code == EXIT_OK
    assert two["gpus"] == 2 and two["host"] == "v100-pcie-x8"
    assert two["peak_bytes"] <= 60_000_000
    assert two["d2h_gbs"] == 6.0  # two ranks behind one x16 uplink
    assert two["allreduce_bytes"] > 0 and two["comm_time"] > 0
    assert two["step_time"] >= two["rank_step_time"]
    assert 1.0 < two["speedup_over_one_gpu"] <= 2.0
    code, four, _ = run_json([*args, "--gpus", "4", "--host", "v100-pcie-x8"], capsys)
    assert code == EXIT_OK and four["d2h_gbs"] == 3.0
    assert four["rank_step_time"] < two["rank_step_time"]  # a quarter of the batch each


def test_compare_gpus_lists_every_policy(capsys):
    code, doc, _ = run_json(["compare", "--model", "mlp", "--batch", "64", "--gpus", "2",
                             "--host", "dgx1-v100"], capsys)
    assert code == EXIT_OK
    names = [r["policy"] for r in doc["policies"]]
    assert "outcore-auto" in names and "keep-all" in names
    assert all(r["feasible"] for r in doc["policies"])


def test_gpus_must_split_the_batch(capsys):
    code, doc, _ = run_json(["plan", "--model", "mlp", "--batch", "33", "--gpus", "2"], capsys)
    assert code == EXIT_USAGE and "equal shares" in doc["message"]  # --json: errors as JSON


def test_plan_gpus_refuses_optimizer_instead_of_ignoring_it(capsys):
    """``--optimizer`` plans one GPU's weights; with ``--gpus`` it was silently dropped."""
    code = main(["plan", "--model", "resnet20-cifar", "--batch", "128", "--budget", "60MB",
                 "--gpus", "2", "--optimizer", "adamw"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "--optimizer" in err and "--gpus" in err


def test_run_nproc_two_ranks_under_torchrun(tmp_path: Path):
    """The real command line: torchrun starts 2 ranks, each trains its half (gloo)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    out = subprocess.run([sys.executable, "-m", "outcore.cli", "--json", "run", "--model",
                          "mlp", "--batch", "16", "--steps", "2", "--nproc", "2",
                          "--policy", "offload-all"],
                         capture_output=True, text=True, env=env, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    docs, text, decoder = [], out.stdout, json.JSONDecoder()
    while "{" in text:  # each process prints one JSON document
        doc, end = decoder.raw_decode(text[text.index("{"):])
        docs.append(doc)
        text = text[text.index("{") + end:]
    ranks = [d for d in docs if "losses" in d]
    assert len(ranks) == 2, out.stdout[-2000:]
    assert ranks[0]["measured_peak"] == ranks[0]["predicted_peak"]
    assert docs[-1] == {"nproc": 2, "exit_code": 0}

"""benchmarks/vs_pytorch_report.py: the table and the verdicts of ``vs_pytorch.py`` on made-up
rows (no step runs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import vs_pytorch  # a benchmarks/ module, not a package
import vs_pytorch_report as report

MiB = 2**20


def _rows() -> list[report.Row]:
    """eager; a peer with wrong gradients; outcore+inductor below it in activation but above
    it in step peak, faster every round."""
    return [
        report.Row("m", "eager", 8 * MiB, 10 * MiB, [1.0, 1.1, 1.2, 1.0, 1.1]),
        report.Row("m", "compile 0.5", 4 * MiB, 5 * MiB, [2.0, 2.1, 2.2, 2.0, 2.1],
                   note="compiled in 3 s; gradient error 0.8: WRONG GRADIENTS"),
        report.Row("m", "outcore+inductor @ compile 0.5", 3 * MiB, 6 * MiB,
                   [1.0, 1.05, 1.1, 1.0, 1.05]),
    ]


def test_the_table_gives_ratios_to_eager() -> None:
    lines = report.table(_rows()).splitlines()
    assert len(lines) == 2 + 3
    peer = lines[3].split(" | ")
    assert peer[1:6] == ["compile 0.5", "5.0", "0.50", "4.0", "0.50"]


def test_verdicts_follow_the_match_measure_and_flag_wrong_peer_gradients() -> None:
    [activation] = report.verdicts(_rows(), "activation")
    [step] = report.verdicts(_rows(), "step")
    assert "memory <= (activation peak) peer" in activation
    assert "memory > (step peak) peer" in step
    assert "faster beyond the spread" in activation
    assert activation.endswith("the PEER's gradients are WRONG")
    rows = _rows()
    rows[1].note = "compiled in 3 s; gradients match eager's"
    assert "WRONG" not in report.verdicts(rows, "activation")[0]


def test_vs_pytorch_uses_the_report_module(tmp_path: Path) -> None:
    assert vs_pytorch.Row is report.Row and vs_pytorch.verdicts is report.verdicts
    out = tmp_path / "rows.json"
    report.write_json(_rows(), str(out))
    first = json.loads(out.read_text())[0]
    assert first["tool"] == "eager" and first["median"] == 1.1

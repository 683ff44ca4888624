"""The real-model corpus: one step per (model, policy) against eager, as a table.

Runs every model of ``tests/realmodels/corpus.py`` under every policy of
``tests/realmodels/harness.POLICIES`` (six outcore policies and the torch.compile backend) on
``cpu-emulated``, halfway between the model's layer-wise lower bound and its in-core peak
(a policy that cannot reach that runs at the least budget it names), and prints a Markdown
table: model, ops, in-core peak, budget, and per policy ``ok`` or what failed. A failure of
a pair in ``corpus.KNOWN_FAILURES`` is marked ``xfail`` (its cause is listed under the
table); such a pair that passes is marked ``XPASS`` (remove its entry).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/realmodel_corpus.py [--only a,b] \\
        [--out corpus.md] [--rows DIR]

``--rows DIR`` keeps each model's row in ``DIR/<model>.md`` and reuses the rows already
there: a run that was stopped resumes where it was, and runs of separate processes (one per
model, or ``--only`` slices) are joined into one table by a last run over the same folder.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realmodels"))

from corpus import BY_NAME, CORPUS, KNOWN_FAILURES
from harness import POLICIES, check, in_core_peak


def _cell(name: str, policy: str, budget: int, details: list[str]) -> str:
    cell = _outcome_cell(name, policy, budget, details)
    if (name, policy) not in KNOWN_FAILURES:
        return cell
    return "XPASS " + cell if cell.startswith("ok") else "xfail: " + cell


def _outcome_cell(name: str, policy: str, budget: int, details: list[str]) -> str:
    try:
        outcome = check(BY_NAME[name], policy, budget)
    except Exception as exc:  # noqa: BLE001 - a failure is a table cell, with its reason
        details.append(f"{name} {policy}: {type(exc).__name__}: {exc}")
        return f"{type(exc).__name__}: {str(exc)[:60]}".replace("|", "/").replace("\n", " ")
    if outcome.ok:
        return "ok" if outcome.budget <= budget else f"ok@{outcome.budget / budget:.2f}x"
    details.append(f"{name} {policy}: " + "; ".join(outcome.problems))
    return "diff: " + outcome.problems[0][:40]


def _row(name: str, policies: list[str], details: list[str]) -> list[str]:
    """One model's table cells: its size, its budget and one outcome per policy."""
    try:
        ops, peak, budget = in_core_peak(BY_NAME[name])
    except Exception as exc:  # noqa: BLE001 - a model that cannot be captured is a row
        details.append(f"{name} capture: {type(exc).__name__}: {exc}")
        return [name, "-", "-", "-", *[f"capture: {type(exc).__name__}"] * len(policies)]
    results = [_cell(name, policy, budget, details) for policy in policies]
    return [name, str(ops), f"{peak / 2**20:.2f} MiB", f"{budget / 2**20:.2f} MiB", *results]


def _details_of(details: list[str], name: str) -> list[str]:
    """The failure details of ``name``, as lines after its row (``--rows``)."""
    return [f"<!-- {d} -->" for d in details if d.startswith(f"{name} ")]


def _kept_row(rows: Path | None, name: str, header: list[str]) -> list[str] | None:
    """The cells of ``name``'s row kept in ``rows`` by an earlier run with the same columns;
    None when there is none (the model is then run)."""
    path = rows / f"{name}.md" if rows is not None else None
    if path is None or not path.exists():
        return None
    text = path.read_text().splitlines()
    if not text or text[0] != "| " + " | ".join(header) + " |":
        return None  # other policies: run again
    for line in text[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == name and len(cells) == len(header):
            return cells
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--policies", default="", help="comma-separated policies (default: all)")
    parser.add_argument("--out", default="", help="also write the table to this file")
    parser.add_argument("--details", default="", help="write each failure in full to this file")
    parser.add_argument("--rows", default="",
                        help="folder keeping one row per model; rows already there are reused")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else [c.name for c in CORPUS]
    policies = args.policies.split(",") if args.policies else POLICIES
    details: list[str] = []
    header = ["model", "ops", "in-core peak", "budget", *policies]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    print("\n".join(lines), flush=True)
    passed = xfailed = total = reused = 0
    start = time.perf_counter()
    rows = Path(args.rows) if args.rows else None
    for name in names:
        kept = _kept_row(rows, name, header)
        cells = kept if kept is not None else _row(name, policies, details)
        reused += kept is not None
        if rows is not None and kept is None:
            rows.mkdir(parents=True, exist_ok=True)
            (rows / f"{name}.md").write_text("\n".join(
                [lines[0], lines[1], "| " + " | ".join(cells) + " |", *_details_of(details, name)])
                + "\n")
        total += len(policies)
        passed += sum(c.startswith(("ok", "XPASS")) for c in cells[4:])
        xfailed += sum(c.startswith("xfail") for c in cells[4:])
        line = "| " + " | ".join(cells) + " |"
        lines.append(line)
        print(line, flush=True)
    causes = sorted({cause for (name, policy), cause in KNOWN_FAILURES.items()
                     if name in names and policy in policies})
    summary = (f"\n{passed}/{total} pairs pass ({100 * passed / max(total, 1):.1f}%), "
               f"{xfailed} known failures (xfail), {total - passed - xfailed} other failures, "
               f"in {time.perf_counter() - start:.0f} s"
               + (f" ({reused} rows reused from {rows})" if reused else "")
               + "\n\nCauses of the known failures:\n"
               + "\n".join(f"- {cause}" for cause in causes))
    print(summary)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n" + summary + "\n")
    if args.details:
        Path(args.details).write_text("\n\n".join(details) + "\n")


if __name__ == "__main__":
    main()

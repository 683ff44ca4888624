"""The whole differential matrix (issue 21) as a table: every model of
``tests/matrix/matrix_models.py`` under every registered policy, one step against eager
PyTorch on ``cpu-emulated`` (``tests/matrix/matrix_harness.run_cell``). A cell is ``ok``,
``xfail`` (a known open item that still breaks it, as the tests mark it), ``XPASS`` (that
item is fixed: drop the mark) or what differed. ``pytest -m slow tests/matrix`` runs the
same cells as tests; the default test run takes a slice of them.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/matrix.py [--only a,b] \\
        [--policies p,q] [--out matrix.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "matrix"))

from matrix_harness import run_cell
from matrix_models import ALL_POLICIES, CASES


def _cell(case, policy: str) -> str:
    cell = run_cell(case, policy)
    known = policy in case.xfail
    if cell.ok:
        return "XPASS" if known else "ok" + (" (min)" if cell.at_minimum else "")
    if known:
        return "xfail"
    return cell.problems[0][:70].replace("|", "/").replace("\n", " ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--policies", default="", help="comma-separated policy names")
    parser.add_argument("--out", default="", help="also write the table to this file")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.only or c.name in args.only.split(",")]
    policies = args.policies.split(",") if args.policies else ALL_POLICIES
    lines = ["| model | " + " | ".join(policies) + " |",
             "|---|" + "---|" * len(policies)]
    bad = 0
    start = time.perf_counter()
    for case in cases:
        cells = [_cell(case, p) for p in policies]
        bad += sum(c not in ("ok", "ok (min)", "xfail") for c in cells)
        lines.append(f"| {case.name} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    lines.append("")
    lines.append(f"{len(cases) * len(policies)} cells, {bad} unexpected, "
                 f"{time.perf_counter() - start:.0f} s")
    print(lines[-1])
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

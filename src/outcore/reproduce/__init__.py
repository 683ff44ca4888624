"""The papers' reproductions, shipped with the package: ``outcore reproduce PAPER [--quick]``.

Each module (vdnn, superneurons, modnn, pooch, dymem) has ``main(argv) -> int`` and prints
its tables; ``benchmarks/repro_*.py`` are thin callers of these, and docs/repro/*.md give
the figures.
"""

from __future__ import annotations

import importlib

PAPERS = ("vdnn", "superneurons", "modnn", "pooch", "dymem")


def run(paper: str, quick: bool = False) -> int:
    """Run ``paper``'s reproduction; returns its exit code (UnknownPaperError: no such paper)."""
    from outcore.errors import UnknownPaperError

    if paper not in PAPERS:
        raise UnknownPaperError(paper, f"one of {', '.join(PAPERS)}")
    module = importlib.import_module(f"outcore.reproduce.{paper}")
    return int(module.main(["--quick"] if quick else []) or 0)

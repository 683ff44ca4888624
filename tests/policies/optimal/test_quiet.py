"""HiGHS's C-level debugging prints are kept off stdout; other output survives."""

from __future__ import annotations

import ctypes
import os
import threading

from outcore.policies.optimal import highs_quiet

LINE = b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n"


def test_c_printf_of_highs_is_dropped_and_other_lines_kept(capfd) -> None:
    libc = ctypes.CDLL(None)
    with highs_quiet():
        libc.printf(LINE.replace(b"%", b"%%"))  # C stdio, buffered: the flush must catch it
        os.write(1, b"the user's own line\n")
        print("a python line", flush=True)
    out = capfd.readouterr().out
    assert "HighsMipSolverData" not in out
    assert "the user's own line" in out and "a python line" in out


def test_fd1_is_restored_after_nested_and_concurrent_blocks(capfd) -> None:
    before = os.fstat(1)
    errors: list[BaseException] = []

    def solve() -> None:
        try:
            with highs_quiet(), highs_quiet():
                os.write(1, LINE)
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=solve) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = os.fstat(1)
    assert not errors
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    os.write(1, b"after\n")
    out = capfd.readouterr().out
    assert "HighsMipSolverData" not in out and "after" in out


def test_an_exception_in_the_block_restores_fd1(capfd) -> None:
    before = os.fstat(1)
    try:
        with highs_quiet():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    after = os.fstat(1)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)

"""``python -m outcore`` is the ``outcore`` command: same parser, same exit codes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from outcore import __version__
from outcore.cli import EXIT_OK, EXIT_PIPE, EXIT_USAGE

SRC = Path(__file__).resolve().parents[2] / "src"


def python_m_outcore(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OUTCORE_NO_CACHE": "1"}
    return subprocess.run([sys.executable, "-m", "outcore", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_python_m_outcore_runs_the_command():
    done = python_m_outcore("--version")
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    assert done.stdout.strip() == f"outcore {__version__}"
    done = python_m_outcore("--json", "gpus")
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    assert "v100-pcie" in done.stdout


def test_python_m_outcore_passes_the_exit_code_on():
    done = python_m_outcore("plan", "--model", "no-such-net")
    assert done.returncode == EXIT_USAGE
    assert "unknown model" in done.stderr and "Traceback" not in done.stderr


def outcore_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """Run ``python -m outcore`` with stdout a pipe whose reader is already gone (what
    ``outcore ... | head -1`` meets once head has read its line and exited)."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONPATH": str(SRC), "OUTCORE_NO_CACHE": "1"}
    try:
        return subprocess.run([sys.executable, "-m", "outcore", *args], env=env,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=300,
                              check=False)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("--json", "gpus"), ("gpus",), ("policies",),
                                  ("--json", "plan", "--model", "mlp", "--small", "--budget",
                                   "1MB")], ids=["json", "table", "policies", "json-plan"])
def test_a_closed_pipe_ends_quietly_with_exit_141(args):
    """No BrokenPipeError traceback (json's print, rich's tables), and not rich's own
    SystemExit(1): the shell's code for a program stopped by SIGPIPE."""
    done = outcore_into_a_closed_pipe(*args)
    assert done.returncode == EXIT_PIPE == 141, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr
    assert "Exception ignored" not in done.stderr

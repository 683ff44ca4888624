"""``python -m outcore`` is the ``outcore`` command: same parser, same exit codes."""

import os
import subprocess
import sys
from pathlib import Path

from outcore import __version__
from outcore.cli import EXIT_OK, EXIT_USAGE

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

"""Fixtures shared by the command-line tests."""

from __future__ import annotations

import sys

import pytest

from outcore import cli_workload


@pytest.fixture
def no_capture(monkeypatch):
    """Fail the test if a model is loaded or captured: argument checks must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("loaded or captured the model before checking the arguments")

    monkeypatch.setattr(cli_workload, "load_workload", refuse)
    monkeypatch.setattr(cli_workload, "capture", refuse)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``write(name, source)``: a module ``name`` importable for this test only (written to
    ``tmp_path``, on ``sys.path``, dropped from ``sys.modules`` afterwards), as a user's
    ``--model module:function`` names it; returns ``name``."""
    written: list[str] = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)

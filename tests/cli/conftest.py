"""Fixtures shared by the command-line tests."""

from __future__ import annotations

import pytest

from outcore import cli_workload


@pytest.fixture
def no_capture(monkeypatch):
    """Fail the test if a model is loaded or captured: argument checks must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("loaded or captured the model before checking the arguments")

    monkeypatch.setattr(cli_workload, "load_workload", refuse)
    monkeypatch.setattr(cli_workload, "capture", refuse)

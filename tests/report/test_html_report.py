"""The HTML report opens in headless Chromium with its tables and plot."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
import outcore
from outcore.report.html import render_html, write_html

from models import make

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def planned():
    model, loss_fn, batch = make("resnet")
    graph = outcore.capture(model, loss_fn, batch)
    return outcore.plan(graph, 300_000, policy="auto")


def test_report_holds_tables_and_escapes(planned):
    text = render_html(planned, "a <b>title</b>")
    assert "a &lt;b&gt;title&lt;/b&gt;" in text
    assert 'id="summary"' in text and 'id="decisions"' in text
    assert text.count("<tr") >= len(planned.explain()) + 5
    assert "data:image/png;base64," in text


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="headless Chromium is installed by .ci/run (required under CI)")
def test_report_renders_in_headless_chromium(planned, tmp_path):
    assert CHROMIUM is not None, "CI must install chromium (see .ci/run)"
    page = write_html(planned, tmp_path / "report.html", title="resnet plan")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "<title>resnet plan</title>" in dom
    assert 'id="decisions"' in dom and "predicted peak" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1200,1600",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000

"""Issue 18: the wheel carries what an installed `outcore` needs: the reproductions
(`outcore reproduce vdnn --quick` from outside the source tree), py.typed, the data files;
and declares no dependency the package does not import."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Build the wheel from a copy of the tree (no build/ or egg-info left in the checkout)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(work / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    (built,) = (work / "dist").glob("outcore-*.whl")
    return built


def test_wheel_holds_reproductions_types_and_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "outcore/py.typed" in names
    assert "outcore/__main__.py" in names  # python -m outcore
    assert {f"outcore/reproduce/{p}.py" for p in
            ("vdnn", "superneurons", "modnn", "pooch", "dymem")} <= names
    assert "outcore/cost/gpus.json" in names


def test_installed_wheel_reproduces_vdnn_outside_the_tree(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "OUTCORE_NO_CACHE": "1"}
    done = subprocess.run([sys.executable, "-m", "outcore.cli", "reproduce", "vdnn", "--quick"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "VGG-16" in done.stdout and "done in" in done.stdout
    where = subprocess.run([sys.executable, "-c", "import outcore; print(outcore.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(site))  # the installed copy ran, not the checkout


def test_every_declared_dependency_is_imported():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    modules = {re.split(r"[<>=!~ ]", d)[0].lower() for d in declared}
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "outcore").rglob("*.py"))
    for module in modules:
        assert re.search(rf"^\s*(import|from) {module}\b", source, re.M), \
            f"{module} is a declared dependency that no module imports"

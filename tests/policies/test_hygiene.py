"""Import hygiene of the policy family (issue 14): no policy imports another paper's modules
or private names, and tests and benchmarks use only each policy subpackage's public names
(its ``__init__``'s ``__all__``). Read from the source with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "src" / "outcore" / "policies"
SUBPACKAGES = sorted(p.name for p in POLICIES.iterdir() if (p / "__init__.py").is_file())
SHARED = "common"

#: Known reaches into modules of ``auto`` and ``optimal`` (rewritten by the optimal-planner
#: work, which owns their ``__init__``): (file relative to the root, module). A new entry
#: needs a reason; everything else must pass.
EXEMPT: set[tuple[str, str]] = set()


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of an ``outcore`` module in ``path``; a plain
    ``import a.b`` has no names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("outcore"):
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names
                      if a.name.startswith("outcore")]
    return found


def public_names(package: str) -> set[str]:
    """The ``__all__`` of ``outcore.policies.<package>``, read from its source."""
    tree = ast.parse((POLICIES / package / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"outcore.policies.{package} has no __all__")


def policy_subpackage(module: str) -> tuple[str, bool] | None:
    """(subpackage, reaches a module inside it) for ``outcore.policies.<sub>[.<mod>...]``."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["outcore", "policies"] and parts[2] in SUBPACKAGES:
        return parts[2], len(parts) > 3
    return None


def source_violations(path: Path, owner: str, root: Path = ROOT) -> list[str]:
    """What a module of policy subpackage ``owner`` imports that it must not."""
    bad = []
    for line, module, names in imports(path):
        where = f"{path.relative_to(root)}:{line}"
        private = [n for n in names if n.startswith("_")]
        sub = policy_subpackage(module)
        if sub is None or sub[0] == owner:
            continue
        other, deep = sub
        if owner == SHARED:
            bad.append(f"{where}: common imports paper {other} ({module})")
        elif deep and other != SHARED:
            bad.append(f"{where}: imports {module}, a module of another paper")
        elif private:
            bad.append(f"{where}: imports private {private} from {module}")
        elif not deep:
            hidden = sorted(set(names) - public_names(other))
            if hidden:
                bad.append(f"{where}: imports {hidden} that {module}.__all__ does not list")
    return bad


def consumer_violations(path: Path, root: Path = ROOT) -> list[str]:
    """What a test or benchmark imports from a policy subpackage beyond its public names."""
    bad = []
    rel = str(path.relative_to(root))
    for line, module, names in imports(path):
        sub = policy_subpackage(module)
        if sub is None or (rel, module) in EXEMPT:
            continue
        package, deep = sub
        where = f"{rel}:{line}"
        if deep:
            bad.append(f"{where}: imports {module}; use outcore.policies.{package}")
            continue
        hidden = sorted(n for n in names if n not in public_names(package))
        if hidden:
            bad.append(f"{where}: imports {hidden}, not in outcore.policies.{package}.__all__")
    return bad


def test_no_policy_imports_another_papers_modules_or_private_names():
    bad = [v for sub in SUBPACKAGES for f in sorted((POLICIES / sub).rglob("*.py"))
           for v in source_violations(f, sub)]
    assert not bad, "\n".join(bad)


def test_tests_and_benchmarks_import_only_public_policy_names():
    files = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    bad = [v for f in files for v in consumer_violations(f)]
    assert not bad, "\n".join(bad)


def test_every_subpackage_exports_only_names_it_defines():
    import importlib

    for sub in SUBPACKAGES:
        module = importlib.import_module(f"outcore.policies.{sub}")
        missing = sorted(n for n in public_names(sub) if not hasattr(module, n))
        assert not missing, f"outcore.policies.{sub}.__all__ lists {missing}, not defined"


@pytest.mark.parametrize("source, owner, words", [
    ("from outcore.policies.pooch.classify import _Search\n", "dymem", "another paper"),
    ("from outcore.policies.pooch import _keep_or_swap\n", "dymem", "private"),
    ("from outcore.policies.pooch import Classification, nothing_public\n", "dymem",
     "does not list"),
    ("from outcore.policies.vdnn import VdnnMode\n", "common", "common imports paper"),
])
def test_the_source_check_catches_each_kind_of_violation(tmp_path, source, owner, words):
    fake = tmp_path / "src" / "mod.py"
    fake.parent.mkdir()
    fake.write_text(source)
    found = source_violations(fake, owner, root=tmp_path)
    assert len(found) == 1 and words in found[0], found


@pytest.mark.parametrize("source, words", [
    ("from outcore.policies.vdnn.policy import plan_dyn\n", "use outcore.policies.vdnn"),
    ("from outcore.policies.modnn import budget_of\n", "not in outcore.policies.modnn"),
    ("import outcore.policies.superneurons.utp\n", "use outcore.policies.superneurons"),
])
def test_the_consumer_check_catches_each_kind_of_violation(tmp_path, source, words):
    fake = tmp_path / "tests" / "test_fake.py"
    fake.parent.mkdir()
    fake.write_text(source)
    found = consumer_violations(fake, root=tmp_path)
    assert len(found) == 1 and words in found[0], found

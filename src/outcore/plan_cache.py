"""A plan cache on disk: a second identical ``plan``/``compile`` skips planning.

The key is a SHA-256 over the graph (its JSON), the budget, the policy, its options, the
cost model's parameters, whether sub-batches are allowed, and a fingerprint of outcore's own
source files (so editing outcore invalidates every entry). An entry holds the plan, the
schedule, the predicted peak and the simulation: never code, and only plans that run on the
graph given (a sub-batched plan needs the re-captured graph and is not stored).

Location: ``$OUTCORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/outcore``, else
``~/.cache/outcore``. ``OUTCORE_NO_CACHE=1`` (or ``cache=False``, or the CLI's
``--no-cache``) bypasses it. A corrupt or unreadable entry is treated as a miss; a cache
that cannot be written is skipped silently (the plan is still returned).

The CLI also keeps the captured graph of zoo models here (``graph_key``), so a second
identical ``outcore plan`` skips the capture too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from outcore.log import info

FORMAT = 1


def cache_dir() -> Path:
    """Where entries live (see the module docstring)."""
    explicit = os.environ.get("OUTCORE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "outcore"


def enabled(flag: bool | None) -> bool:
    """``flag`` when given, else on unless ``OUTCORE_NO_CACHE`` is set to a true value."""
    if flag is not None:
        return flag
    return os.environ.get("OUTCORE_NO_CACHE", "").lower() in ("", "0", "false", "no")


@cache
def code_fingerprint() -> str:
    """A hash of every outcore source file's path, size and modification time."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json") and path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def describe(value: Any, depth: int = 0) -> Any:
    """A stable, hashable description of a cost model or an option value (no addresses)."""
    if depth > 6:
        return type(value).__qualname__
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), describe(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [describe(v, depth + 1) for v in value]
        return tuple(sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return (type(value).__qualname__, describe(fields, depth + 1))
    if hasattr(value, "__dict__"):
        public = {k: v for k, v in vars(value).items() if not k.startswith("_")}
        return (type(value).__qualname__, describe(public, depth + 1))
    return (type(value).__qualname__, repr(value))


def _digest(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def plan_key(graph: Any, budget: int | None, policy: str, options: Mapping[str, Any],
             cost: Any, allow_sub_batches: bool) -> str:
    """The cache key of one planning call."""
    graph_hash = hashlib.sha256(graph.to_json().encode()).hexdigest()
    return _digest("plan", FORMAT, code_fingerprint(), graph_hash, budget, policy,
                   describe(dict(options)), describe(cost), allow_sub_batches)


def graph_key(**workload: Any) -> str:
    """The cache key of a captured zoo workload (name, batch, width, fake or real)."""
    import torch

    return _digest("graph", FORMAT, code_fingerprint(), torch.__version__,
                   describe(workload))


def load(key: str) -> Any:
    """The entry stored under ``key``, or None (missing, corrupt, unreadable)."""
    path = cache_dir() / f"{key}.pkl"
    try:
        with path.open("rb") as handle:
            value = pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError,
            ValueError, TypeError):
        return None
    info(f"plan cache: hit {path}")
    return value


def store(key: str, value: Any) -> None:
    """Write ``value`` under ``key`` atomically (a temporary file, then a rename)."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, folder / f"{key}.pkl")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return  # a cache that cannot be written costs a re-plan, nothing else
    info(f"plan cache: stored {folder / f'{key}.pkl'}")

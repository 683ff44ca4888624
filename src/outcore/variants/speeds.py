"""Measured relative speeds of variants, for the cost model's GPU profiles (no torch import).

``relative_speed(target, variant, arg_meta)`` = variant time / framework time, as measured on
this machine by ``outcore.variants.profile`` and saved as JSON. The cost model multiplies
its analytic GPU time of the op by it. Lookup order: the exact op shape; else the geometric
mean over every measured shape of that (target, variant); else 1.0 (unmeasured). The
framework variant is 1.0 by definition.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outcore.errors import ProfileError
from outcore.variants.names import is_framework

#: The table shipped with outcore (written by benchmarks/variants_profile.py --save).
DEFAULT_TABLE = Path(__file__).with_name("measured_cpu.json")


def _plain(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        if (len(value) in (2, 3) and isinstance(value[0], (tuple, list))
                and isinstance(value[1], str)):
            return [[int(s) for s in value[0]], value[1].removeprefix("torch.")]
        return [_plain(v) for v in value]
    return value


def meta_key(target: str, arg_meta: Sequence[Any],
             kwarg_meta: Mapping[str, Any] | None = None) -> str:
    """A canonical string for an op's shapes and scalars (strides ignored)."""
    kwargs = {k: _plain(v) for k, v in (kwarg_meta or {}).items()}
    return json.dumps([target, _plain(list(arg_meta)), kwargs], sort_keys=True)


@dataclass
class SpeedTable:
    """Relative speeds keyed by (target, variant, meta_key)."""

    exact: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def add(self, target: str, variant: str, key: str, ratio: float) -> None:
        if not (ratio > 0 and math.isfinite(ratio)):
            raise ProfileError(f"relative speed of {variant!r} on {target} must be a positive "
                               f"finite number, got {ratio}")
        self.exact[(target, variant, key)] = ratio

    def lookup(self, target: str, variant: str, key: str) -> float:
        if is_framework(variant):
            return 1.0
        if (target, variant, key) in self.exact:
            return self.exact[(target, variant, key)]
        same = [r for (t, v, _), r in self.exact.items() if t == target and v == variant]
        if same:
            return math.exp(sum(math.log(r) for r in same) / len(same))
        return 1.0

    @classmethod
    def from_json(cls, text: str) -> SpeedTable:
        """Read the JSON written by ``outcore.variants.profile.save_json``."""
        data = json.loads(text)
        if "entries" not in data:
            raise ProfileError("a variant profile must have an 'entries' list; re-run "
                               "benchmarks/variants_profile.py --save")
        table = cls()
        for e in data["entries"]:
            try:
                key = meta_key(e["target"], e["arg_meta"], e.get("kwarg_meta"))
                table.add(e["target"], e["variant"], key, float(e["relative_speed"]))
            except KeyError as missing:
                raise ProfileError(f"variant profile entry lacks {missing}: {e}") from None
        return table


_loaded: dict[Path, SpeedTable] = {}


def load_table(path: str | Path = DEFAULT_TABLE) -> SpeedTable:
    """The table at ``path`` (cached); an empty table if the default file is absent."""
    p = Path(path)
    if p not in _loaded:
        if not p.exists():
            if p == DEFAULT_TABLE:
                return SpeedTable()
            raise ProfileError(f"no variant profile at {p}; run benchmarks/variants_profile.py")
        _loaded[p] = SpeedTable.from_json(p.read_text())
    return _loaded[p]


def relative_speed(target: str, variant: str, arg_meta: Sequence[Any],
                   kwarg_meta: Mapping[str, Any] | None = None,
                   table: SpeedTable | None = None) -> float:
    """Variant time / framework time for this op, from ``table`` (default: the shipped one)."""
    t = table if table is not None else load_table()
    return t.lookup(target, variant, meta_key(target, arg_meta, kwarg_meta))

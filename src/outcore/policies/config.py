"""Typed, frozen policy configurations: one dataclass per policy, built from ``options``.

``PolicyConfig.parse(options, policy)`` rejects a key the policy does not have, listing the
ones it has, and turns strings (``--option key=value`` on the command line) into the field's
type (bool, int, float, an enum: enums are ``StrEnum``, so a member equals its string and a
user's string option keeps working); each subclass checks its values in ``__post_init__``.
Every rejection is a ``PolicyOptionError`` (also a ``ValueError``) that lists what is valid.
A policy reads its configuration with ``ctx.config_as(ItsConfig)``; nothing reads
``options`` by string key.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, Union

from outcore.errors import PolicyOptionError

C = TypeVar("C", bound="PolicyConfig")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """A policy without options (the baselines). Subclasses add fields with defaults."""

    #: Where the options are described (a policy module's docstring), for error messages.
    doc: ClassVar[str] = ""

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def parse(cls: type[C], options: Mapping[str, Any], policy: str = "") -> C:
        """The configuration ``options`` spell; PolicyOptionError names an unknown key and the
        valid ones, or a value of the wrong kind (an enum's: its valid values)."""
        valid = cls.option_names()
        who = f"policy {policy!r}" if policy else cls.__name__
        unknown = sorted(set(options) - set(valid))
        if unknown:
            have = ", ".join(valid) if valid else "none"
            raise PolicyOptionError(f"{who} has no option {', '.join(map(repr, unknown))}; its "
                                    f"options are: {have}"
                                    + (f" (see {cls.doc})" if cls.doc else ""), have)
        hints = typing.get_type_hints(cls)
        values = {key: _coerce(key, value, hints[key], who) for key, value in options.items()}
        return cls(**values)

    def as_options(self) -> dict[str, Any]:
        """The options that differ from the defaults (what to pass to rebuild this config)."""
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


def _coerce(key: str, value: Any, hint: Any, who: str) -> Any:
    """``value`` as the field's type when it is a string spelling of it (or already is).

    ``None`` for a field that takes no None but an enum with a "none" member is that member:
    the command line reads ``--option recompute=none`` as None."""
    kinds = _kinds(hint)
    enums = [k for k in kinds if isinstance(k, type) and issubclass(k, enum.Enum)]
    if value is None and type(None) not in kinds:
        for kind in enums:
            if "none" in {m.value for m in kind}:
                return kind("none")
    if not isinstance(value, str) or str in kinds:
        return value
    for kind in kinds:
        if kind is bool:
            lowered = value.lower()
            if lowered in _TRUE | _FALSE:
                return lowered in _TRUE
        elif kind in (int, float) or (isinstance(kind, type) and issubclass(kind, enum.Enum)):
            try:
                return kind(value)
            except ValueError:
                continue
    choices = [m.value for k in enums for m in k]
    if choices:
        valid = " or ".join(map(repr, choices))
        raise PolicyOptionError(f"{who}: option {key!r} must be one of {valid}, got {value!r}",
                                valid)
    names = " or ".join(getattr(k, "__name__", str(k)) for k in kinds)
    raise PolicyOptionError(f"{who}: option {key!r} must be {names}, got {value!r}", names)


def _kinds(hint: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return tuple(k for arg in typing.get_args(hint) for k in _kinds(arg))
    return (origin or hint,)


def check_bool(config: PolicyConfig, *names: str) -> None:
    """PolicyOptionError unless each named field is True or False."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, bool):
            raise PolicyOptionError(f"options[{name!r}] must be True or False, got {value!r}",
                                    "True or False")


def check_choice(value: Any, choices: type[enum.Enum], name: str) -> None:
    """PolicyOptionError, listing the enum's values, unless ``value`` is one of them."""
    allowed = [c.value for c in choices]
    if value not in allowed:
        valid = " or ".join(map(repr, allowed))
        raise PolicyOptionError(f"options[{name!r}] must be one of {valid}, got {value!r}", valid)

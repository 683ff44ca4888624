"""Validation at the door: every public function and CLI command checks its arguments here,
before any capture or planning, and fails with one error type per cause.

Each check returns the normalised value or raises a subclass of
``outcore.errors.InvalidArgumentError`` (also a ``ValueError``) that names the value given,
what is accepted and what to do. Only ``check_model`` imports torch (it reads the zoo's
catalogue, about two seconds), so the CLI checks every argument well before the (sometimes
20-second) capture.

Policy options are checked by ``check_policy``, the single place the CLI and the API ask;
it defers to the policies' own validator (``outcore.policies.config_for``) when the package
provides one, and otherwise only checks the policy name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from outcore.errors import (
    BudgetUnitWarning,
    InvalidArgumentError,
    NonPositiveBudgetError,
    PolicyOptionError,
    UnknownDeviceError,
    UnknownGPUError,
    UnknownModelError,
    UnknownPolicyError,
)
from outcore.log import announce
from outcore.units import format_bytes, has_unit, parse_bytes

DEVICES = ("cuda", "cpu-emulated", "cpu")
#: Options that ``outcore.plan``/``compile`` take themselves (not a policy's).
API_OPTIONS = ("allow_sub_batches",)


def check_budget(value: int | float | str | None, *, warn_unitless: bool = True) -> int | None:
    """A budget in bytes (None = unbounded).

    Raises UnreadableBudgetError, NonPositiveBudgetError (zero or negative) or
    NonFiniteBudgetError ("inf", "1e400"). A string without a unit ("12") is read as bytes,
    with a ``BudgetUnitWarning`` saying so (an int is bytes without comment).
    """
    if value is None:
        return None
    limit = parse_bytes(value)
    if limit <= 0:
        raise NonPositiveBudgetError(value, "a positive number of bytes",
                                     "Give a size such as '12GB', or None for no budget.")
    if warn_unitless and isinstance(value, str) and not has_unit(value):
        note = (f"budget {value!r} has no unit and is read as {limit} bytes "
                f"({format_bytes(limit)}); write e.g. '{value}GB' or '{value}GiB' if you "
                "meant more")
        announce(note, BudgetUnitWarning, stacklevel=4)
    return limit


def check_device(device: str) -> str:
    """``device`` if it is one outcore runs on; UnknownDeviceError otherwise."""
    if device not in DEVICES:
        raise UnknownDeviceError(device, f"one of {', '.join(DEVICES)}",
                                 'Use "cpu-emulated" to try outcore without a GPU.')
    return device


def check_gpu(gpu: str | None) -> str | None:
    """The canonical profile name for ``gpu`` (aliases and case accepted); None stays None."""
    if gpu is None:
        return None
    from outcore.cost.profiles import _resolve, profile_names
    from outcore.errors import ProfileError

    try:
        return _resolve(gpu)
    except ProfileError:
        raise UnknownGPUError(gpu, f"one of {', '.join(profile_names())} (or an alias)",
                              "List them with `outcore gpus`.") from None


def check_policy(policy: str, options: Mapping[str, Any] | None = None) -> str:
    """The registered name of ``policy`` ("auto" is outcore-auto), with ``options`` checked.

    The options check is the policies' own (``outcore.policies.config_for(name, options)``)
    when that validator exists; it rejects unknown keys and lists the valid ones.
    """
    from outcore.policies.registry import names

    name = "outcore-auto" if policy == "auto" else policy
    known = names()
    if name not in known:
        raise UnknownPolicyError(policy, f"one of auto, {', '.join(known)}",
                                 "List them with `outcore policies`.")
    validator = _options_validator()
    if validator is not None:
        policy_options = {k: v for k, v in (options or {}).items() if k not in API_OPTIONS}
        try:
            validator(name, policy_options)
        except InvalidArgumentError:
            raise
        except ValueError as exc:  # the typed configuration's own words
            raise PolicyOptionError(str(exc), "") from exc
    return name


def _options_validator() -> Any:
    """The policies' option validator (``outcore.policies.config_for``)."""
    from outcore.policies.registry import config_for

    return config_for


def check_model(name: str) -> str:
    """A zoo name, or a ``module:function`` spec (whose import is left to the loader)."""
    if ":" in name:
        module, _, func = name.partition(":")
        if module and func:
            return name
    from outcore import zoo

    if name not in zoo.names():
        raise UnknownModelError(name, f"a zoo name ({', '.join(zoo.names())}) or "
                                "module:function returning (model, loss_fn, (x, y))",
                                "List the zoo with `outcore models`.")
    return name


def check_positive_int(value: int, what: str) -> int:
    """``value`` if it is an int >= 1 (a batch size, a step count)."""
    from outcore.errors import InvalidOptionError

    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOptionError(f"{what}={value!r}", "an integer of at least 1")
    return value

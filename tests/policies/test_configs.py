"""Typed policy configurations (issue 14): every registered policy rejects an unknown option
listing its options, an enum option rejects a bad value listing the valid ones, and an enum
given as the command line spells it (``--option key=value``) parses to the member, whose
string rebuilds the same configuration."""

from __future__ import annotations

import dataclasses
import enum
import typing

import pytest

from outcore.cli import parse_option
from outcore.errors import PolicyOptionError
from outcore.policies import PolicyContext, config_for, get, names
from outcore.policies.common import KEEP, RECOMPUTE, SWAP, FeatureClass
from outcore.policies.modnn import BlockState
from outcore.policies.superneurons import Recompute, SuperNeuronsConfig
from outcore.policies.vdnn import VdnnAlgo, VdnnMode, VdnnStaticConfig, offload_set
from outcore.validation import check_policy
from outcore.variants.names import Variant


def enum_fields(name: str) -> list[tuple[str, type[enum.Enum]]]:
    """(option, enum) for every option of policy ``name`` whose type is an enum."""
    config = get(name).config
    hints = typing.get_type_hints(config)
    found = []
    for f in dataclasses.fields(config):
        kinds = typing.get_args(hints[f.name]) or (hints[f.name],)
        found += [(f.name, k) for k in kinds if isinstance(k, type) and issubclass(k, enum.Enum)]
    return found


ENUM_OPTIONS = [(n, key, kind) for n in names() for key, kind in enum_fields(n)]


def test_the_enum_options_are_the_ones_the_papers_name():
    assert {(key, kind) for _, key, kind in ENUM_OPTIONS} == {
        ("algo", VdnnAlgo), ("recompute", Recompute)}
    for kind in (VdnnMode, VdnnAlgo, Recompute, FeatureClass, BlockState, Variant):
        assert issubclass(kind, str), f"{kind.__name__} must be a str enum (CLI strings)"


@pytest.mark.parametrize("name", names())
def test_unknown_option_is_refused_with_the_policys_options(name):
    valid = [f.name for f in dataclasses.fields(get(name).config)]
    with pytest.raises(PolicyOptionError) as info:
        config_for(name, {"no_such_option": 1})
    message = str(info.value)
    assert "no_such_option" in message and name in message
    for option in valid:
        assert option in message, f"{name}: {option} missing from {message!r}"
    assert isinstance(info.value, ValueError), "still a ValueError for callers that catch it"


@pytest.mark.parametrize("name, key, kind", ENUM_OPTIONS)
def test_bad_enum_value_lists_every_valid_value(name, key, kind):
    for bad in ("no-such-value", 3):
        with pytest.raises(PolicyOptionError) as info:
            config_for(name, {key: bad})
        message = str(info.value)
        assert repr(bad) in message or str(bad) in message
        for member in kind:
            assert repr(member.value) in message, f"{member.value!r} not listed: {message!r}"


@pytest.mark.parametrize("name, key, kind", ENUM_OPTIONS)
def test_enum_round_trip_from_the_command_line(name, key, kind):
    for member in kind:
        option = parse_option(f"{key}={member.value}")  # what `--option key=value` gives
        config = config_for(name, dict([option]))
        value = getattr(config, key)
        assert value is member and type(value) is kind, (option, value)
        again = config_for(name, {k: str(v) for k, v in config.as_options().items()})
        assert again == config, "the member's string rebuilds the same configuration"
        assert config_for(name, {key: member}) == config, "the member itself is accepted"
        assert check_policy(name, dict([option])) == name, "the API's check agrees"


def test_string_options_keep_working_for_users():
    # users wrote these before the enums; they must read the same
    assert SuperNeuronsConfig(recompute="speed").recompute is Recompute.SPEED  # type: ignore[arg-type]
    assert VdnnStaticConfig(algo="m").algo is VdnnAlgo.MEMORY  # type: ignore[arg-type]
    assert Recompute.COST_AWARE == "cost-aware" and VdnnMode.ALL == "all"
    assert (KEEP, SWAP, RECOMPUTE) == ("keep", "swap", "recompute")
    assert Variant.FRAMEWORK == "framework" and BlockState.HOST == "host"
    ctx = PolicyContext(options={"recompute": "none", "offload": "false"})
    config = ctx.config_as(SuperNeuronsConfig)
    assert (config.recompute, config.offload) == (Recompute.NONE, False)


def test_a_config_refuses_bad_values_built_directly():
    with pytest.raises(PolicyOptionError, match="'cost-aware' or 'speed' or 'memory' or 'none'"):
        SuperNeuronsConfig(recompute="lazy")  # type: ignore[arg-type]
    with pytest.raises(PolicyOptionError, match="'m' or 'p'"):
        VdnnStaticConfig(algo="fast")  # type: ignore[arg-type]
    with pytest.raises(PolicyOptionError, match="True or False"):
        SuperNeuronsConfig(tensor_cache="maybe")  # type: ignore[arg-type]


def test_vdnn_offload_mode_as_string_or_enum(cnn):
    assert offload_set(cnn, "conv") == offload_set(cnn, VdnnMode.CONV)
    with pytest.raises(PolicyOptionError, match="'none', 'conv', 'all'"):
        offload_set(cnn, VdnnMode.BASE)  # the baseline offloads nothing by another rule
    with pytest.raises(PolicyOptionError, match="'none', 'conv', 'all', 'base'"):
        from outcore.policies.vdnn import plan_static

        plan_static(cnn, PolicyContext(), "everything")

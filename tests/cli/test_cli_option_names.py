"""``--option`` takes policy options only: ``outcore.plan``'s own arguments are refused."""

from __future__ import annotations

import pytest

from outcore.cli import PLAN_ARGUMENTS, main, parse_option
from outcore.errors import InvalidOptionError


@pytest.mark.parametrize("key", sorted(PLAN_ARGUMENTS))
def test_plan_arguments_are_not_policy_options(key: str) -> None:
    with pytest.raises(InvalidOptionError, match=f"'{key}' is an argument of outcore.plan"):
        parse_option(f"{key}=false")


def test_superneurons_cache_option_is_tensor_cache(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_option("tensor_cache=false") == ("tensor_cache", False)
    # was a TypeError (exit 1, "a bug in outcore"): plan() got 'cache' twice
    code = main(["plan", "--model", "mlp", "--policy", "superneurons", "--budget", "1GB",
                 "--option", "cache=false"])
    assert code == 2
    assert "--no-cache" in capsys.readouterr().err

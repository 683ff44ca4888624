"""The examples in the public docstrings run and print what they claim."""

import doctest

import pytest

import outcore.api
from outcore.capture import aot


@pytest.mark.parametrize("module", [outcore.api, aot])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0

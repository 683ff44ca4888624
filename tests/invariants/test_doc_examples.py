"""The examples in the public docstrings run and print what they claim."""

import doctest

import pytest

import outcore.api
import outcore.capture.aot


@pytest.mark.parametrize("module", [outcore.api, outcore.capture.aot])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0

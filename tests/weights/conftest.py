"""The small GPT fixture for host-held weights (helpers in ``weights_helpers``)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from weights_helpers import make_gpt, token_loss

from outcore.capture import capture


@pytest.fixture
def gpt():
    model, batch = make_gpt()
    return model, batch, capture(model, token_loss, batch)

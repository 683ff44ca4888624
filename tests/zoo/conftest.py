"""Zoo tests run their tiny models on one intra-op thread.

The machine is shared; with several threads each tiny kernel pays for synchronisation and
contention, which makes these tests slow without testing anything more.
"""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

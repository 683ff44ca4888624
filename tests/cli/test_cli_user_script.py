"""``--model module:function`` on a user's own script, end to end (session-20 journey):

* ``outcore run`` on a function returning a dict batch and ``loss_fn=None`` (a model that
  returns its own loss, as Hugging Face's) crashed with ``TypeError: step() takes one
  batch ... got 3 arguments`` (the dict was unpacked into its keys), exit code 1;
* the label ``usermod:cat`` was printed as ``usermod🐱`` (rich's emoji codes; ``:llama``
  likewise);
* an exception raised by the user's function read "this is a bug in outcore";
* a fake capture that needs the example's values did not name the CLI's ``--real``.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from outcore.cli import EXIT_CAPTURE, EXIT_OK, EXIT_USAGE, main

SCRIPT = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn


    class OwnLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.head = nn.Linear(16, 32)

        def forward(self, input_ids, labels):
            logits = self.head(torch.tanh(self.emb(input_ids)))
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


    def llama():
        torch.manual_seed(0)
        ids = torch.randint(0, 32, (2, 8))
        return OwnLoss(), None, {"input_ids": ids, "labels": ids.masked_fill(ids < 4, -100)}


    def cat():
        torch.manual_seed(0)
        batch = (torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
        return nn.Linear(4, 3), F.cross_entropy, batch


    def raises():
        raise ValueError("my data file is missing")


    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 3)

        def forward(self, x):
            return self.l(x) if x.sum() > 0 else self.l(-x)


    def branchy():
        return Branchy(), F.cross_entropy, (torch.ones(4, 4), torch.zeros(4, dtype=torch.long))
''')


@pytest.fixture
def usermod(user_module):
    return user_module("usermod", SCRIPT)


def test_run_trains_a_model_that_returns_its_own_loss_from_a_dict(usermod, capsys):
    code = main(["--json", "run", "--model", f"{usermod}:llama", "--budget", "10MB",
                 "--steps", "2"])
    captured = capsys.readouterr()
    assert code == EXIT_OK, captured.err
    doc = json.loads(captured.out)
    assert len(doc["losses"]) == 2 and doc["losses"][1] < doc["losses"][0]


def test_the_label_is_printed_as_given(usermod, capsys):
    code = main(["run", "--model", f"{usermod}:cat", "--budget", "10MB", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == EXIT_OK
    assert f"{usermod}:cat: 1 steps" in " ".join(out.split())


def test_an_error_in_the_users_function_says_so(usermod, capsys):
    code = main(["plan", "--model", f"{usermod}:raises", "--budget", "1MB"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "raised ValueError: my data file is missing" in err and "bug in outcore" not in err


def test_a_fake_capture_that_needs_values_names_real(usermod, capsys):
    code = main(["explain", "--model", f"{usermod}:branchy", "--budget", "1MB"])
    err = capsys.readouterr().err
    assert code == EXIT_CAPTURE
    assert "--real" in err

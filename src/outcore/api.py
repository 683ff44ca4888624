"""The user-facing Python API: plan a captured step, or compile a model into a trainer.

    >>> import torch, outcore
    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> batch = (torch.randn(4, 8), torch.tensor([0, 1, 1, 0]))
    >>> trainer = outcore.compile(net, torch.nn.functional.cross_entropy, batch,
    ...                           budget="64KiB", device="cpu")
    >>> loss = trainer.step(*batch)          # gradients are now in net's .grad
    >>> trainer.stats.measured_peak <= trainer.budget
    True

``plan`` and ``PlannedStep`` live in ``outcore.planned`` (torch-free); ``compile`` in
``outcore.compiling``; ``Trainer`` and ``TrainerStats`` in ``outcore.trainer``. This module
gathers them.
"""

from __future__ import annotations

from outcore.compiling import compile
from outcore.planned import (
    DEFAULT_GPU,
    DEFAULT_POLICY,
    MACHINE,
    PlannedStep,
    cost_model_for,
    plan,
    policies,
)
from outcore.planned_trainer import PlannedTrainer
from outcore.trainer import Trainer, TrainerStats

__all__ = ["DEFAULT_GPU", "DEFAULT_POLICY", "MACHINE", "PlannedStep", "PlannedTrainer",
           "Trainer", "TrainerStats", "compile", "cost_model_for", "plan", "policies"]

"""The zoo: the networks the five papers evaluate, and a GPT-style transformer, in plain torch.nn.

>>> from outcore import zoo
>>> w = zoo.get("vgg16", batch_size=256, fake=True)      # paper scale, no memory used
>>> w = zoo.get("resnet50", batch_size=2, small=True)    # tiny, runs on the CPU
>>> loss = w.loss_fn(w.model(w.batch[0]), w.batch[1])

``names()`` lists every network; ``options(name)`` shows what ``get`` accepts for it.
Every network builds under ``FakeTensorMode`` (nothing reads tensor data while building),
uses out-of-place activations, and is returned in training mode (BatchNorm batch statistics,
dropout active) where the original network has those layers.
"""

from outcore.zoo.registry import get, names, options
from outcore.zoo.workload import Workload

__all__ = ["Workload", "get", "names", "options"]

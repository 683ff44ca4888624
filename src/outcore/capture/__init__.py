"""Capture: the only package that traces torch.

Calling the package, ``outcore.capture(model, loss_fn, (x, y))``, is
``outcore.capture.aot.capture`` (see ``outcore._callable_module``).
"""

from outcore._callable_module import make_callable
from outcore.capture.aot import capture, fx_graph_of
from outcore.capture.step import CapturedStep

__all__ = ["CapturedStep", "capture", "fx_graph_of"]

make_callable(__name__, lambda: capture)

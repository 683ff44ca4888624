"""Capture: the only package that traces torch."""

from outcore.capture.aot import capture, fx_graph_of
from outcore.capture.step import CapturedStep

__all__ = ["CapturedStep", "capture", "fx_graph_of"]

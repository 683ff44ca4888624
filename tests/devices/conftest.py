"""Fixtures for the device tests: emulated devices that are always closed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from outcore.runtime.devices.emulated import EmulatedDevice

MB = 1e6


@pytest.fixture
def make_emulated() -> Iterator[Callable[..., EmulatedDevice]]:
    """``make_emulated(capacity=None, bw=..., **kw)`` -> an EmulatedDevice closed at teardown."""
    made: list[EmulatedDevice] = []

    def make(capacity: int | None = None, bw: float = 1000 * MB, **kw: object) -> EmulatedDevice:
        dev = EmulatedDevice(capacity, bw, bw, **kw)  # type: ignore[arg-type]
        made.append(dev)
        return dev

    yield make
    for dev in made:
        dev.close()

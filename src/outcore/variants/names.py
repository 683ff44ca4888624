"""The names of operator variants: one enum, one spelling of the framework's kernel (no torch).

``Variant`` is a ``StrEnum``: a member equals its string (``Variant.IM2COL == "im2col"``), so
plans, ``Op.variant_options`` keys and JSON written before the enum read the same. The
framework's own kernel is ``Variant.FRAMEWORK``; the IR also writes it as ``Op.variant == ""``
(an op nobody chose a variant for), which ``is_framework`` accepts.
"""

from __future__ import annotations

from enum import StrEnum


class Variant(StrEnum):
    """Every operator variant outcore implements."""

    FRAMEWORK = "framework"  # the framework's kernel: zero workspace, runs every op
    IM2COL = "im2col"        # convolution by unfold + GEMM (conv_im2col)
    FFT = "fft"              # convolution in the frequency domain (conv_fft)
    MATERIALISED = "materialised"  # attention with the whole score matrix (attention)
    CHUNKED = "chunked"      # attention over key blocks, flash-style (attention)


def is_framework(name: str) -> bool:
    """Whether ``name`` is the framework's kernel ("framework", or "" for no choice)."""
    return name in ("", Variant.FRAMEWORK)


def parse(name: str) -> Variant:
    """The ``Variant`` spelled ``name`` ("" is the framework's kernel).

    Raises ``PolicyOptionError`` naming the known variants for any other string.
    """
    if name == "":
        return Variant.FRAMEWORK
    try:
        return Variant(name)
    except ValueError:
        from outcore.errors import PolicyOptionError

        known = ", ".join(v.value for v in Variant)
        raise PolicyOptionError(f"unknown operator variant {name!r}; known: {known}",
                                known) from None

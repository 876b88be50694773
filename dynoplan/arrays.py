"""Checks of the numeric arrays read from user files (the planner's performance profile, the engine's timing
profile), shared so that both refuse the same values the same way; each caller words its own message.

A profile quantity is a length, a time, a rate or a share: a real number, finite and never negative. Reading
one with ``numpy.asarray(a, dtype=float)`` is not a check: it raises on strings and silently drops the
imaginary part of complex numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def real_float64(a: Any) -> npt.NDArray[np.float64] | None:
    """``a`` as a float64 array, or None when its dtype is not one of integers and floats (strings, complex
    numbers, objects, booleans)."""
    raw = np.asarray(a)
    if raw.dtype.kind not in "iuf":
        return None
    out: npt.NDArray[np.float64] = raw.astype(np.float64)
    return out


def first_out_of_range(x: npt.NDArray[np.float64], *, zero_ok: bool = False) -> str | None:
    """``[i, j] = v`` for the first value of ``x`` (row-major order) that is not finite or not > 0 (not >= 0
    with ``zero_ok``), or None when every value is in range."""
    bad = ~np.isfinite(x) | ((x < 0) if zero_ok else (x <= 0))
    if not bad.any():
        return None
    i = tuple(int(k) for k in np.argwhere(bad)[0])
    return f"[{', '.join(map(str, i))}] = {x[i]:g}"


__all__ = ["first_out_of_range", "real_float64"]

"""Pass-time models of the simulated engines (milliseconds).

Sources, selected by the timing spec :attr:`mocker.config.EngineConfig.timing` (parsed by
:mod:`mocker.timing_spec`; ``aic:`` specs become an :class:`NpzTiming` over a sampled profile,
:mod:`mocker.timing_aic`):

- :class:`PolynomialTiming` — the reference mocker's baseline (docs/architecture.md "Polynomial timing baseline"):
  ``prefill(T) = 4.209989e-07*T^2 + 1.518344e-02*T + 16.50142`` with ``T = batch_size * (mean ISL - mean
  cached prefix)`` of the pass (0 ms when nothing new is computed), and
  ``decode(p) = max(1.0, -25.74*p^2 + 54.01*p + 5.74)`` with ``p = active KV tokens / total KV tokens``.
- :class:`NpzTiming` — interpolation over a profile ``.npz`` with arrays ``prefill_isl``, ``prefill_ttft_ms``
  (1-D, linear over new tokens) and ``decode_active_kv_tokens`` (N), ``decode_context_length`` (M),
  ``decode_itl`` (N x M, bilinear over (active KV tokens, mean context length)). Both extrapolate linearly
  outside the grid (as the reference's ``Linear/Bilinear::extrapolate(true)``); decode is clamped to >= 1 ms.

Every duration is divided by ``speedup_ratio`` and then rounded to whole nanoseconds, as the reference does
by passing it through a Rust ``Duration`` (so simulated timestamps agree with the reference to the ns).
``decode_ms_array`` is the single implementation used by both the single-pass and the vectorised
fast-forward paths, which keeps them bit-identical.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from dynoplan.arrays import first_out_of_range, real_float64
from dynoplan.errors import ConfigError
from mocker.timing_spec import POLYNOMIAL, is_aic

# docs/architecture.md "Polynomial timing baseline" (reference mocker polynomial model).
PREFILL_A, PREFILL_B, PREFILL_C = 4.209989e-07, 1.518344e-02, 16.50142
DECODE_A, DECODE_B, DECODE_C = -25.74, 54.01, 5.74
DECODE_MIN_MS = 1.0


def round_ns(ms: float) -> float:
    """Round a duration in ms to whole nanoseconds the way a Rust ``Duration`` round trip does."""
    ns = round(ms / 1000.0 * 1e9)
    return (ns // 1_000_000_000 + (ns % 1_000_000_000) / 1e9) * 1000.0


def kv_transfer_ms(tokens: int, kv_bytes_per_token: int, bandwidth_gbps: float) -> float:
    """KV transfer time (ms, ns-rounded) of ``tokens`` tokens of ``kv_bytes_per_token`` bytes over a link of
    ``bandwidth_gbps`` GB/s (1e9 bytes/s); 0.0 when nothing is charged or the bandwidth is 0 (no delay).
    :meth:`mocker.transfer.KvTransferConfig.transfer_ms`, here to be compiled with the fleet that calls it."""
    if tokens <= 0 or not bandwidth_gbps > 0:
        return 0.0
    return round_ns(tokens * kv_bytes_per_token / (bandwidth_gbps * 1e9) * 1000.0)


def round_ns_array(ms: np.ndarray) -> np.ndarray:
    """Vectorised :func:`round_ns` (same arithmetic element by element)."""
    ns = np.rint(ms / 1000.0 * 1e9)
    sec = np.floor_divide(ns, 1e9)
    return (sec + (ns - sec * 1e9) / 1e9) * 1000.0


def decode_pass_ms(timing: TimingModel, active_kv_tokens: int, num_decode: int, speedup: float) -> float:
    """Duration (ms, ns-rounded, speed-up applied) of a pass's decode part: the scalar twin of
    :func:`decode_pass_ms_array`, bit-identical to it (same IEEE operations in the same order)."""
    if isinstance(timing, PolynomialTiming):
        p = active_kv_tokens / timing.total_kv_tokens
        v = DECODE_A * p * p + DECODE_B * p + DECODE_C
        d = round_ns(v if v > DECODE_MIN_MS else DECODE_MIN_MS)
    else:
        d = float(
            round_ns_array(
                timing.decode_ms_array(
                    np.array([float(active_kv_tokens)]), np.array([float(active_kv_tokens // num_decode)])
                )
            )[0]
        )
    return round_ns(d / speedup) if speedup != 1.0 else d


def decode_pass_ms_array(
    timing: TimingModel, active_kv_tokens: np.ndarray, num_decode: int, speedup: float
) -> np.ndarray:
    """Vectorised :func:`decode_pass_ms` over an int64 array of active KV token counts."""
    if speedup == 1.0 and isinstance(timing, PolynomialTiming):
        # the same operations as the scalar twin, in place (sub-second durations need no seconds split)
        p = active_kv_tokens / timing.total_kv_tokens
        v = DECODE_A * p
        v *= p
        p *= DECODE_B
        v += p
        v += DECODE_C
        np.maximum(v, DECODE_MIN_MS, out=v)
        if v.max() < 1000.0:
            v /= 1000.0
            v *= 1e9
            np.rint(v, out=v)
            v /= 1e9
            v *= 1000.0
            return v
        return round_ns_array(v)
    d = round_ns_array(
        timing.decode_ms_array(active_kv_tokens.astype(np.float64), (active_kv_tokens // num_decode).astype(np.float64))
    )
    return round_ns_array(d / speedup) if speedup != 1.0 else d


class TimingModel(Protocol):
    """What an engine core needs from a timing source. All results in ms, before speed-up scaling."""

    def prefill_ms(self, batch_size: int, mean_isl: int, mean_prefix: int) -> float: ...

    def decode_ms_array(self, active_kv_tokens: np.ndarray, context_length: np.ndarray) -> np.ndarray: ...


class PolynomialTiming:
    """The reference baseline polynomial. ``total_kv_tokens`` = num_gpu_blocks * block_size."""

    def __init__(self, total_kv_tokens: int) -> None:
        self.total_kv_tokens = float(total_kv_tokens)
        self._decode_table = np.empty(0)

    def decode_table(self, max_active_kv_tokens: int) -> np.ndarray:
        """Decode pass durations (ms, ns-rounded, no speed-up) by active KV tokens: ``table[s] ==
        decode_pass_ms(self, s, n, 1.0)`` bit for bit (any ``n``), for ``s`` = 0 .. at least
        ``max_active_kv_tokens`` (>= 0). Computed on demand (:func:`decode_pass_ms_array`) and grown at least
        twofold, so a replay evaluates each entry once; fast-forwarded decode stretches read their pass
        durations from it as a strided slice ``table[s0::n]``."""
        table = self._decode_table
        if max_active_kv_tokens >= table.size:
            size = max(max_active_kv_tokens + 1, 2 * table.size, 4096)
            more = decode_pass_ms_array(self, np.arange(table.size, size, dtype=np.int64), 1, 1.0)
            table = self._decode_table = np.concatenate((table, more))
        return table

    def prefill_ms(self, batch_size: int, mean_isl: int, mean_prefix: int) -> float:
        t = batch_size * max(0, mean_isl - mean_prefix)
        if t <= 0:
            return 0.0
        return PREFILL_A * t * t + PREFILL_B * t + PREFILL_C

    def decode_ms_array(self, active_kv_tokens: np.ndarray, context_length: np.ndarray) -> np.ndarray:
        p = np.asarray(active_kv_tokens, dtype=np.float64) / self.total_kv_tokens
        return np.maximum(DECODE_MIN_MS, DECODE_A * p * p + DECODE_B * p + DECODE_C)


def _interp1_extrap(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Piecewise-linear interpolation with linear extrapolation from the end segments."""
    if len(xs) == 1:
        return float(ys[0])
    i = int(np.clip(np.searchsorted(xs, x, side="right") - 1, 0, len(xs) - 2))
    x0, x1 = xs[i], xs[i + 1]
    return float(ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0))


class NpzTiming:
    """Profile interpolation (arrays as documented in the module docstring).

    Raises :class:`ConfigError` naming the file and the array on a missing array, a value that is not a
    finite real number of its range (:func:`_profile_array`), a shape mismatch or a grid point given twice.
    """

    REQUIRED = ("prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl")

    def __init__(self, path: str | Path) -> None:
        path = str(path)
        try:
            data = np.load(path)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # a truncated or non-zip file too
            raise ConfigError(f"timing={path!r}: cannot read profile: {e}") from None
        missing = [k for k in self.REQUIRED if k not in data]
        if missing and {"decode_kv_usage", "decode_itl_ms"} <= set(data.files):
            # the planner's performance profile (`dynoplan profile`: decode over KV-usage fraction, ITL in ms,
            # throughput per GPU) is a different file from this engine timing profile
            raise ConfigError(
                f"timing={path!r}: this looks like a planner performance profile (dynoplan profile: "
                "decode_kv_usage, decode_itl_ms, ...); --timing needs an engine timing profile with "
                f"arrays {', '.join(self.REQUIRED)} (planner profiles go to simulate --profile)"
            )
        if missing:
            raise ConfigError(
                f"timing={path!r}: missing arrays {', '.join(missing)}; expected {', '.join(self.REQUIRED)}"
            )
        problems: list[str] = []
        px = _profile_array(data, "prefill_isl", problems)
        py = _profile_array(data, "prefill_ttft_ms", problems, time=True)
        dx = _profile_array(data, "decode_active_kv_tokens", problems)
        dy = _profile_array(data, "decode_context_length", problems)
        dz = _profile_array(data, "decode_itl", problems, time=True)
        if problems:
            raise ConfigError([f"timing={path!r}: {p}" for p in problems])
        if px.ndim != 1 or py.shape != px.shape or len(px) == 0:
            problems.append(
                f"prefill_isl/prefill_ttft_ms: expected equal-length 1-D arrays, got {px.shape} and {py.shape}"
            )
        if dx.ndim != 1 or dy.ndim != 1 or dz.shape != (len(dx), len(dy)) or len(dx) == 0 or len(dy) == 0:
            problems.append(
                f"decode_itl: expected shape (len(decode_active_kv_tokens), len(decode_context_length)) = "
                f"({len(dx)}, {len(dy)}), got {dz.shape}"
            )
        for name, axis in (("prefill_isl", px), ("decode_active_kv_tokens", dx), ("decode_context_length", dy)):
            twice = np.unique(axis.ravel(), return_counts=True)
            if (twice[1] > 1).any():  # two points at one x: the interpolation's slope there is 0/0
                problems.append(f"{name}: {twice[0][twice[1] > 1][0]:g} appears twice; expected distinct values")
        if problems:
            raise ConfigError([f"timing={path!r}: {p}" for p in problems])
        po = np.argsort(px, kind="stable")
        self.prefill_x, self.prefill_y = px[po], py[po]
        xo, yo = np.argsort(dx, kind="stable"), np.argsort(dy, kind="stable")
        self.decode_x, self.decode_y, self.decode_z = dx[xo], dy[yo], dz[np.ix_(xo, yo)]

    def prefill_ms(self, batch_size: int, mean_isl: int, mean_prefix: int) -> float:
        new = max(0, mean_isl - mean_prefix)
        if batch_size == 0 or new == 0:
            return 0.0
        return max(0.0, _interp1_extrap(float(batch_size * new), self.prefill_x, self.prefill_y))

    def decode_ms_array(self, active_kv_tokens: np.ndarray, context_length: np.ndarray) -> np.ndarray:
        x = np.asarray(active_kv_tokens, dtype=np.float64)
        y = np.broadcast_to(np.asarray(context_length, dtype=np.float64), x.shape)
        return np.maximum(DECODE_MIN_MS, _bilinear_extrap(x, y, self.decode_x, self.decode_y, self.decode_z))


def _profile_array(data: Mapping[str, np.ndarray], name: str, problems: list[str], time: bool = False) -> np.ndarray:
    """``data[name]`` as float64, or an empty array after appending why not to ``problems`` (one line naming the
    array, and for a bad value its index and value): real numbers only (numpy's float conversion fails on
    strings and drops the imaginary part of complex numbers), finite, and not negative -- grid axes are token
    counts (>= 0), times are > 0 ms (a pass takes time; the model clamps what it extrapolates below, not what
    the file states)."""
    try:
        raw = np.asarray(data[name])
    except ValueError:  # an object array: np.load does not unpickle (allow_pickle=False)
        raw = np.asarray([], dtype=object)
    x = real_float64(raw)
    if x is None:
        problems.append(f"{name} has dtype {raw.dtype}: expected real numbers")
        return np.zeros(0)
    bad = first_out_of_range(x, zero_ok=not time)
    if bad is not None:
        problems.append(f"{name}{bad}: expected {'ms > 0' if time else 'tokens >= 0'}, finite")
        return np.zeros(0)
    return x


def _seg(v: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(grid) == 1:
        return np.zeros(v.shape, dtype=np.intp), np.zeros(v.shape)
    i = np.clip(np.searchsorted(grid, v, side="right") - 1, 0, len(grid) - 2)
    return i, (v - grid[i]) / (grid[i + 1] - grid[i])


def _bilinear_extrap(x: np.ndarray, y: np.ndarray, gx: np.ndarray, gy: np.ndarray, z: np.ndarray) -> np.ndarray:
    i, tx = _seg(x, gx)
    j, ty = _seg(y, gy)
    i1 = np.minimum(i + 1, len(gx) - 1)
    j1 = np.minimum(j + 1, len(gy) - 1)
    z00, z10, z01, z11 = z[i, j], z[i1, j], z[i, j1], z[i1, j1]
    return z00 * (1 - tx) * (1 - ty) + z10 * tx * (1 - ty) + z01 * (1 - tx) * ty + z11 * tx * ty


class TimingSource(Protocol):
    """What :func:`load_timing` reads of an engine's settings (:class:`mocker.config.EngineConfig` has both)."""

    @property
    def timing(self) -> str: ...

    @property
    def total_kv_tokens(self) -> int: ...


def load_timing(source: TimingSource) -> TimingModel:
    """The timing model named by ``source.timing`` ('polynomial', a ``.npz`` path or an ``aic:`` spec);
    the polynomial's KV capacity is ``source.total_kv_tokens`` (tokens). Raises ConfigError (unreadable or
    malformed profile, AIConfigurator unavailable)."""
    if source.timing == POLYNOMIAL:
        return PolynomialTiming(source.total_kv_tokens)
    if is_aic(source.timing):  # optional AIConfigurator source
        # here, not at module level: only an aic: spec needs the sampler
        from mocker.timing_aic import ensure_profile

        return NpzTiming(ensure_profile(source.timing))
    return NpzTiming(source.timing)

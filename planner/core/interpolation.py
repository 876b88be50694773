"""Performance profiles: what one engine delivers, interpolated with scipy.

Profile ``.npz`` format (written by ``dynoplan profile``, read by :func:`load_profile`); all arrays
float64, names are the contract:

==========================  =======  =====================================================================
array                       shape    meaning
==========================  =======  =====================================================================
``prefill_isl``             (K,)     input sequence lengths, tokens, strictly increasing
``prefill_ttft_ms``         (K,)     TTFT of one request of that ISL on an idle engine, ms
``prefill_thpt_per_gpu``    (K,)     prefill throughput at that ISL, prompt tokens / s / GPU
``decode_kv_usage``         (N,)     KV-cache usage fraction (0..1), strictly increasing
``decode_context_length``   (M,)     context length (ISL + generated so far), tokens, strictly increasing
``decode_itl_ms``           (N, M)   inter-token latency at (usage, context), ms
``decode_thpt_per_gpu``     (N, M)   decode throughput at (usage, context), output tokens / s / GPU
``decode_max_kv_tokens``    (1,)     KV-cache capacity of one engine, tokens (usage = tokens / this)
==========================  =======  =====================================================================

Either half may be absent (a prefill-only or decode-only profile). A Dynamo profiler results directory is
accepted too: ``selected_prefill_interpolation/raw_data.npz`` (``prefill_isl``, ``prefill_ttft`` [ms],
``prefill_thpt_per_gpu``) and ``selected_decode_interpolation/raw_data.npz`` (scattered 1-D
``x_kv_usage``, ``y_context_length``, ``z_itl`` [ms], ``z_thpt_per_gpu``, ``max_kv_tokens``); the scattered
decode points are resampled onto a regular grid with ``scipy.interpolate.griddata`` (linear, holes
filled with nearest).

Interpolation: prefill is piecewise linear in ISL (``numpy.interp``), decode bilinear on the grid
(``scipy.interpolate.RegularGridInterpolator``). Inputs outside the grid are clamped to its edge (the
Dynamo planner clamps ISL the same way), never extrapolated, except the prefill TTFT beyond the longest
ISL, which grows in proportion at the edge's throughput (:meth:`PrefillProfile.ttft_ms_at`).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dynoplan.arrays import first_out_of_range, real_float64
from dynoplan.errors import ProfileError

FloatArray = npt.NDArray[np.float64]


def _arr(name: str, a: Any, ndim: int, src: str, *, zero_ok: bool = False) -> FloatArray:
    """``a`` as a float64 array of ``ndim`` dimensions, every value finite and > 0 (>= 0 with ``zero_ok``).

    Every profile quantity is a length, a time, a rate or a share: none is negative, and a zero ISL, TTFT, ITL
    or prefill throughput would make an engine infinitely fast (a KV usage of 0 is an idle engine, whose
    decode throughput is 0). Raises
    ProfileError naming the array -- and for a bad value (a NaN or infinity, or out of range) its index and
    value, as the engine timing profile's checks do (:func:`mocker.timing._profile_array`) -- for an array of
    strings or complex numbers (numpy's float conversion would fail on the first and drop the imaginary part
    of the second), a wrong shape, an empty array, a NaN or infinity, or a value out of range."""
    x = real_float64(a)
    if x is None:
        raise ProfileError(src, f"array {name!r} has dtype {np.asarray(a).dtype}: expected real numbers")
    if x.ndim != ndim:
        raise ProfileError(src, f"array {name!r} has shape {x.shape}: expected {ndim}-D")
    if x.size == 0:
        raise ProfileError(src, f"array {name!r}: expected finite values, non-empty")
    bad = first_out_of_range(x, zero_ok=zero_ok)  # the first NaN, infinity or value out of range, by its index
    if bad is not None:
        raise ProfileError(src, f"array {name!r}{bad}: expected finite values {'>=' if zero_ok else '>'} 0")
    return x


def _increasing(name: str, x: FloatArray, src: str) -> None:
    if x.size > 1 and not np.all(np.diff(x) > 0):
        raise ProfileError(src, f"array {name!r}: expected strictly increasing values")


@dataclass(frozen=True, eq=False)
class PrefillProfile:
    """Prefill performance vs ISL (see module docstring for units)."""

    isl: FloatArray
    ttft_ms: FloatArray
    thpt_per_gpu: FloatArray
    source: str = "<memory>"

    def __post_init__(self) -> None:
        s = self.source
        for n in ("isl", "ttft_ms", "thpt_per_gpu"):
            object.__setattr__(self, n, _arr("prefill_" + n, getattr(self, n), 1, s))
        _increasing("prefill_isl", self.isl, s)
        if not (self.isl.shape == self.ttft_ms.shape == self.thpt_per_gpu.shape):
            raise ProfileError(s, "prefill_isl, prefill_ttft_ms, prefill_thpt_per_gpu: expected equal lengths")

    @property
    def pass_overhead_ms(self) -> float:
        """The fixed cost of a prefill pass (ms): the line through the two shortest profiled ISLs at ISL 0,
        clamped to ``[0, TTFT of the shortest]``. Under load, waiting prompts share full chunked-prefill passes
        and so this cost; the queue's service is the rest (``planner.core.throughput.service_moments``)."""
        if self.isl.size < 2:
            return 0.0
        x0, x1 = float(self.isl[0]), float(self.isl[1])
        y0, y1 = float(self.ttft_ms[0]), float(self.ttft_ms[1])
        return min(max(y0 - (y1 - y0) / (x1 - x0) * x0, 0.0), y0)

    def ttft_ms_at(self, isl_tokens: float) -> float:
        """TTFT (ms) of a request of ``isl_tokens`` on an idle engine: piecewise linear on the grid, clamped
        below it; beyond the longest profiled ISL, that point's TTFT scaled by ``isl / isl_max`` (the prompt
        is prefilled at the edge's throughput, as :meth:`thpt_per_gpu_at` clamps it). A clamped TTFT would
        price a 126k-token prompt like a 32k one (Mooncake: 7 % of prompts beyond a 32k grid)."""
        edge = float(self.isl[-1])
        if isl_tokens > edge:
            return float(self.ttft_ms[-1]) * float(isl_tokens) / edge
        return float(np.interp(isl_tokens, self.isl, self.ttft_ms))

    def ttft_ms_of(self, isl_tokens: FloatArray) -> FloatArray:
        """:meth:`ttft_ms_at` of each length in ``isl_tokens`` (same values, element for element), as a float64
        array of the same shape."""
        x = np.asarray(isl_tokens, dtype=np.float64)
        out = np.interp(x, self.isl, self.ttft_ms)
        beyond = x > self.isl[-1]
        out[beyond] = float(self.ttft_ms[-1]) * x[beyond] / float(self.isl[-1])
        return out

    def thpt_per_gpu_at(self, isl_tokens: float) -> float:
        """Prefill throughput (prompt tokens/s/GPU) at ``isl_tokens`` (clamped to the grid)."""
        return float(np.interp(isl_tokens, self.isl, self.thpt_per_gpu))


@dataclass(frozen=True)
class DecodePoint:
    """Best decode operating point found for an ITL target (see :meth:`DecodeProfile.best_thpt_per_gpu`)."""

    thpt_per_gpu: float
    itl_ms: float
    kv_usage: float
    meets_itl: bool
    """False when even the lowest KV usage exceeds the ITL target (the lowest point is returned)."""


@dataclass(frozen=True, eq=False)
class DecodeProfile:
    """Decode performance on a (KV usage, context length) grid (see module docstring for units)."""

    kv_usage: FloatArray
    context_length: FloatArray
    itl_ms: FloatArray
    thpt_per_gpu: FloatArray
    max_kv_tokens: float
    source: str = "<memory>"
    resolution: int = 200
    """KV-usage samples scanned by :meth:`best_thpt_per_gpu`."""
    _itl: Callable[[FloatArray], FloatArray] = field(init=False, repr=False)
    """ITL (ms) at an (n, 2) array of (KV usage, context length) points: the bilinear interpolator."""
    _thpt: Callable[[FloatArray], FloatArray] = field(init=False, repr=False)
    """Throughput/GPU at an (n, 2) array of points: the bilinear interpolator."""

    def __post_init__(self) -> None:
        from scipy.interpolate import RegularGridInterpolator

        s = self.source
        kv = _arr("decode_kv_usage", self.kv_usage, 1, s, zero_ok=True)
        ctx = _arr("decode_context_length", self.context_length, 1, s)
        itl = _arr("decode_itl_ms", self.itl_ms, 2, s)
        thpt = _arr("decode_thpt_per_gpu", self.thpt_per_gpu, 2, s, zero_ok=True)  # 0 at KV usage 0
        _increasing("decode_kv_usage", kv, s)
        _increasing("decode_context_length", ctx, s)
        if itl.shape != (kv.size, ctx.size) or thpt.shape != (kv.size, ctx.size):
            raise ProfileError(
                s,
                f"decode_itl_ms {itl.shape} / decode_thpt_per_gpu {thpt.shape}: expected "
                f"shape ({kv.size}, {ctx.size}) = (len(decode_kv_usage), len(decode_context_length))",
            )
        if not (math.isfinite(self.max_kv_tokens) and self.max_kv_tokens > 0):
            raise ProfileError(s, f"decode_max_kv_tokens={self.max_kv_tokens!r}: expected tokens > 0")
        for n, v in (("kv_usage", kv), ("context_length", ctx), ("itl_ms", itl), ("thpt_per_gpu", thpt)):
            object.__setattr__(self, n, v)
        # A 1-point axis is duplicated so the bilinear interpolator has a cell (the value is constant along it).
        kv_ax, ctx_ax, itl_g, thpt_g = kv, ctx, itl, thpt
        if kv_ax.size == 1:
            kv_ax = np.array([kv[0], kv[0] + 1.0])
            itl_g, thpt_g = np.vstack([itl_g, itl_g]), np.vstack([thpt_g, thpt_g])
        if ctx_ax.size == 1:
            ctx_ax = np.array([ctx[0], ctx[0] + 1.0])
            itl_g, thpt_g = np.hstack([itl_g, itl_g]), np.hstack([thpt_g, thpt_g])
        object.__setattr__(self, "_itl", RegularGridInterpolator((kv_ax, ctx_ax), itl_g))
        object.__setattr__(self, "_thpt", RegularGridInterpolator((kv_ax, ctx_ax), thpt_g))

    def _clamp(self, kv_usage: Any, context_length: float) -> FloatArray:
        kv = np.clip(np.atleast_1d(np.asarray(kv_usage, dtype=float)), self.kv_usage[0], self.kv_usage[-1])
        ctx = np.full_like(kv, min(max(float(context_length), self.context_length[0]), self.context_length[-1]))
        return np.column_stack([kv, ctx])

    def itl_ms_at(self, kv_usage: float, context_length: float) -> float:
        """ITL (ms) at KV usage fraction and context length (tokens), bilinear, clamped to the grid."""
        return float(self._itl(self._clamp(kv_usage, context_length))[0])

    def thpt_per_gpu_at(self, kv_usage: float, context_length: float) -> float:
        """Decode throughput (output tokens/s/GPU) at (KV usage, context length), clamped to the grid."""
        return float(self._thpt(self._clamp(kv_usage, context_length))[0])

    def best_thpt_per_gpu(self, itl_ms: float, context_length: float) -> DecodePoint:
        """Highest throughput/GPU whose interpolated ITL is <= ``itl_ms`` at ``context_length``.

        Scans ``resolution`` KV-usage samples from the grid's lowest to highest usage (plus the grid
        points) and takes the highest usage meeting the target (ITL need not be monotone, so no bisection;
        the same scan as the Dynamo planner's ``find_best_throughput_per_gpu``).
        """
        kv = np.union1d(np.linspace(self.kv_usage[0], self.kv_usage[-1], self.resolution), self.kv_usage)
        pts = self._clamp(kv, context_length)
        itl = self._itl(pts)
        thpt = self._thpt(pts)
        ok = np.nonzero(itl <= itl_ms)[0]
        i, met = (int(ok[-1]), True) if ok.size else (0, False)
        return DecodePoint(float(thpt[i]), float(itl[i]), float(kv[i]), met)


@dataclass(frozen=True)
class PerformanceProfile:
    """Prefill and/or decode profile of one engine configuration."""

    prefill: PrefillProfile | None = None
    decode: DecodeProfile | None = None


def _load_npz(path: Path) -> dict[str, FloatArray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as e:
        if "pickled" in str(e):  # numpy's word for a file that is neither .npz nor .npy (it would unpickle it)
            raise ProfileError(
                str(path), "not an .npz archive (expected a profile written by dynoplan profile)"
            ) from None
        raise ProfileError(str(path), f"cannot read .npz: {e}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:  # a truncated or non-zip file too
        raise ProfileError(str(path), f"cannot read .npz: {e}") from None


def _need(data: dict[str, FloatArray], name: str, src: str) -> FloatArray:
    if name not in data:
        raise ProfileError(src, f"missing array {name!r} (has: {', '.join(sorted(data)) or 'none'})")
    return data[name]


def profile_from_arrays(data: dict[str, Any], source: str = "<memory>") -> PerformanceProfile:
    """Build a profile from arrays named as in the module docstring (either half optional)."""
    prefill = decode = None
    if any(k.startswith("prefill_") for k in data):
        prefill = PrefillProfile(
            _need(data, "prefill_isl", source),
            _need(data, "prefill_ttft_ms", source),
            _need(data, "prefill_thpt_per_gpu", source),
            source=source,
        )
    if any(k.startswith("decode_") for k in data):
        mk = _arr("decode_max_kv_tokens", np.ravel(_need(data, "decode_max_kv_tokens", source)), 1, source)
        decode = DecodeProfile(
            _need(data, "decode_kv_usage", source),
            _need(data, "decode_context_length", source),
            _need(data, "decode_itl_ms", source),
            _need(data, "decode_thpt_per_gpu", source),
            float(mk[0]),
            source=source,
        )
    if prefill is None and decode is None:
        raise ProfileError(source, "no prefill_* or decode_* arrays")
    return PerformanceProfile(prefill, decode)


def profile_to_arrays(profile: PerformanceProfile) -> dict[str, FloatArray]:
    """The arrays :func:`save_profile` writes (inverse of :func:`profile_from_arrays`)."""
    out: dict[str, FloatArray] = {}
    if profile.prefill is not None:
        p = profile.prefill
        out.update(prefill_isl=p.isl, prefill_ttft_ms=p.ttft_ms, prefill_thpt_per_gpu=p.thpt_per_gpu)
    if profile.decode is not None:
        d = profile.decode
        out.update(
            decode_kv_usage=d.kv_usage,
            decode_context_length=d.context_length,
            decode_itl_ms=d.itl_ms,
            decode_thpt_per_gpu=d.thpt_per_gpu,
            decode_max_kv_tokens=np.array([d.max_kv_tokens]),
        )
    return out


def save_profile(profile: PerformanceProfile, path: str | Path) -> None:
    """Write ``profile`` as a ``.npz`` in the format of the module docstring."""
    np.savez(path, **profile_to_arrays(profile))


def _grid_from_scattered(x: FloatArray, y: FloatArray, z: FloatArray, xi: FloatArray, yi: FloatArray) -> FloatArray:
    from scipy.interpolate import griddata

    X, Y = np.meshgrid(xi, yi, indexing="ij")
    try:
        g = griddata((x, y), z, (X, Y), method="linear")
    except Exception:  # noqa: BLE001 - collinear points: qhull cannot triangulate
        g = np.full(X.shape, np.nan)
    holes = np.isnan(g)
    if holes.any():
        g[holes] = griddata((x, y), z, (X[holes], Y[holes]), method="nearest")
    grid: FloatArray = g
    return grid


def load_profiler_results_dir(path: str | Path, resolution: int = 50) -> PerformanceProfile:
    """Read a Dynamo profiler results directory (see module docstring); either half may be missing."""
    root = Path(path)
    pf = root / "selected_prefill_interpolation" / "raw_data.npz"
    df = root / "selected_decode_interpolation" / "raw_data.npz"
    prefill = decode = None
    if pf.exists():
        d, src = _load_npz(pf), str(pf)
        isl = _arr("prefill_isl", _need(d, "prefill_isl", src), 1, src)
        order = np.argsort(isl)
        prefill = PrefillProfile(
            isl[order],
            _arr("prefill_ttft", _need(d, "prefill_ttft", src), 1, src)[order],
            _arr("prefill_thpt_per_gpu", _need(d, "prefill_thpt_per_gpu", src), 1, src)[order],
            source=src,
        )
    if df.exists():
        d, src = _load_npz(df), str(df)

        def flat(name: str, zero_ok: bool = False) -> FloatArray:
            return _arr(name, np.ravel(_need(d, name, src)), 1, src, zero_ok=zero_ok)

        x, y = flat("x_kv_usage", zero_ok=True), flat("y_context_length")
        zi, zt = flat("z_itl"), flat("z_thpt_per_gpu", zero_ok=True)
        mk = float(flat("max_kv_tokens")[0])
        if not (x.size == y.size == zi.size == zt.size) or x.size == 0:
            raise ProfileError(
                str(df), "x_kv_usage, y_context_length, z_itl, z_thpt_per_gpu: expected equal, non-zero lengths"
            )
        xi = np.unique(x) if np.unique(x).size <= 2 else np.linspace(x.min(), x.max(), resolution)
        yi = np.unique(y) if np.unique(y).size <= 2 else np.linspace(y.min(), y.max(), resolution)
        decode = DecodeProfile(
            xi, yi, _grid_from_scattered(x, y, zi, xi, yi), _grid_from_scattered(x, y, zt, xi, yi), mk, source=str(df)
        )
    if prefill is None and decode is None:
        raise ProfileError(
            str(root),
            "not a profiler results directory: expected selected_prefill_interpolation/"
            "raw_data.npz or selected_decode_interpolation/raw_data.npz",
        )
    return PerformanceProfile(prefill, decode)


def load_profile(path: str | Path) -> PerformanceProfile:
    """Load a ``.npz`` profile (module docstring format) or a Dynamo profiler results directory.

    Raises ProfileError naming the file and the missing or invalid array.
    """
    p = Path(path)
    if p.is_dir():
        return load_profiler_results_dir(p)
    if not p.exists():
        raise ProfileError(str(p), "no such file or directory")
    return profile_from_arrays(_load_npz(p), source=str(p))

"""Reports out: the replay summary (reference key names), a readable table, per-request JSONL.

Definitions follow the reference replay report (NVIDIA Dynamo Mocker, ``lib/mocker/src/replay/
collector.rs``: ``TraceCollector::finish``), checked against a real reference report and its per-request
file (``bench/`` compares them run by run):

- *completed*: status ``finished`` with an admission and a finish time. Token totals and latencies are
  over completed requests only; ``num_requests`` counts every request of the workload.
- ``duration_ms``: the latest finish time of a completed request (the clock starts at 0 = the trace's
  time origin). Throughputs divide by ``max(duration_ms / 1000, 1e-9)`` seconds.
- TTFT = first token - arrival; E2E = last token - arrival; TTST = second token - first token
  (requests with >= 2 tokens); TPOT = (last token - first token) / (tokens - 1), one value per request
  (this is the per-request "mean ITL" of the reference's per-request file); ITL = every gap between
  consecutive tokens of every completed request (one sample per gap); output token throughput per user
  = 1000 / gap for every gap > 0 (tokens/s). Latencies are clamped at >= 0.
- Statistics: mean, min, max, population std (divide by n), percentiles by rounded rank: the value at
  sorted index ``round((n - 1) * p / 100)`` (round half away from zero; median = p50). Empty -> 0.0.
  The per-token distributions (ITL, output token throughput per user) are streamed through a DDSketch
  in the reference (relative accuracy 0.001, ``ddsketchy``), so their percentiles are the sketch
  bucket's representative value of that same sample: ``exp(k * ln g) * 2 / (1 + g)`` with
  ``g = 1 + 2a / (1 - a)``, ``k = ceil(ln(x) / ln g)`` — within 0.1% of the exact value, and bit-identical
  to the reference for identical gaps (checked on the Azure 4-worker run).
- ``prefix_cache_reused_ratio``: cached prompt tokens / prompt tokens over completed requests. dynoplan's
  RequestRecord keeps the cached tokens of the *first* admission, so this equals the reference's
  ``first_admission_prefix_cache_reused_ratio`` (the two differ only for requests preempted and
  re-admitted with a different hit).
- Goodput (only when an SLA target is given): completed requests with TTFT <= ``sla_ttft_ms``, E2E <=
  ``sla_e2e_ms`` and their own mean ITL ``(E2E - TTFT) / (tokens - 1)`` <= ``sla_itl_ms`` (the ITL check is
  skipped for single-token requests, as in aiperf / the reference); ``sla_attainment`` = goodput /
  ``num_requests``.
- Worker-seconds: provisioned worker time from the fleet (``ReplayResult.worker_seconds``); GPU-hours =
  worker-seconds x GPUs per worker / 3600, GPUs per worker = ``engine.dp_size`` (TP 1).

The JSON holds no wall-clock value, so identical inputs give byte-identical files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import msgspec
import numpy as np

from mocker.records import RequestRecord, token_slice

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from mocker.config import EngineConfig

__all__ = [
    "DISTRIBUTIONS",
    "build_report",
    "distribution_stats",
    "percentile_rounded_rank",
    "render_table",
    "report_to_json",
    "sketch_value",
    "write_per_request_jsonl",
    "write_report_json",
]

STAT_NAMES = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")
DISTRIBUTIONS = ("ttft", "ttst", "tpot", "itl", "e2e_latency")
"""Latency distributions in the report, each as ``{stat}_{name}_ms`` keys."""


# ---------------------------------------------------------------------------------------------- stats
def _rounded_rank(n: int, p: float) -> int:
    x = (n - 1) * p / 100.0
    r = math.floor(x)
    if x - r >= 0.5:
        r += 1
    return min(r, n - 1)


def percentile_rounded_rank(sorted_values: np.ndarray, p: float) -> float:
    """Value at index ``round((n - 1) * p / 100)`` of an ascending array (round half away from zero).

    The reference report's percentile definition. Raises ValueError on an empty array.
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of an empty sample")
    return float(sorted_values[_rounded_rank(n, p)])


_SKETCH_ALPHA = 0.001
_SKETCH_GM1 = (2.0 * _SKETCH_ALPHA) / (1.0 - _SKETCH_ALPHA)
_SKETCH_GAMMA = 1.0 + _SKETCH_GM1
_SKETCH_LN_GAMMA = math.log1p(_SKETCH_GM1)
_SKETCH_INV_LN_GAMMA = 1.0 / _SKETCH_LN_GAMMA


def sketch_value(x: float) -> float:
    """The DDSketch (relative accuracy 0.001) representative of the bucket holding ``x`` (>= 0).

    ``exp(k * ln g) * 2 / (1 + g)``, ``k = ceil(ln x / ln g)``, ``g = 1 + 2a/(1 - a)``: the mapping of the
    ``ddsketchy`` crate the reference report uses for its per-token distributions. 0 maps to 0.
    """
    if x <= 0.0:
        return 0.0
    k = math.ceil(math.log(x) * _SKETCH_INV_LN_GAMMA)
    return math.exp(k * _SKETCH_LN_GAMMA) * (2.0 / (1.0 + _SKETCH_GAMMA))


def distribution_stats(values: Iterable[float] | np.ndarray, *, sketch: bool = False) -> dict[str, float]:
    """mean/min/max/median/p75/p90/p95/p99/std (population) of ``values``; all 0.0 when empty.

    ``sketch=True``: percentiles are :func:`sketch_value` of the rounded-rank sample (the reference's
    streamed per-token distributions); mean, min, max and std stay exact.
    """
    return _stats(np.asarray(values, dtype=np.float64), sketch=sketch)


def _stats(a: np.ndarray, *, sketch: bool) -> dict[str, float]:
    """:func:`distribution_stats` of a float64 array (not modified; the rank selection works in a copy)."""
    return _stats_in_place(np.array(a, dtype=np.float64), sketch=sketch)


_BLOCK = 8192
"""Elements per block of :func:`_sum_blocks`: numpy's ``np.add.reduce`` over a long contiguous float64 array
adds the pairwise sums of consecutive blocks of its buffer size (8192, ``np.getbufsize()``) in order."""


def _sum_blocks(a: np.ndarray, f: Callable[[np.ndarray, np.ndarray], None]) -> float:
    """``np.add.reduce(g(a))`` bit for bit, where ``f(block, out)`` writes ``g`` of a block of ``a`` into ``out``,
    without an array of ``a.size`` elements: ``g`` is applied one block of :data:`_BLOCK` elements at a time and
    the block sums are added in order, as numpy's own reduction does (checked in tests/mocker/test_report.py).
    ``a``: a contiguous 1-D float64 array."""
    buf = np.empty(min(_BLOCK, a.size))
    total = 0.0
    for lo in range(0, a.size, _BLOCK):
        block = a[lo : lo + _BLOCK]
        out = buf[: block.size]
        f(block, out)
        total += float(np.add.reduce(out))
    return total


_PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0)
"""The percentiles of :data:`STAT_NAMES` (median, p75, p90, p95, p99), in that order."""


def _moments(a: np.ndarray, *, recip: bool = False) -> tuple[float, float, float, float]:
    """(mean, min, max, population std) of the contiguous non-empty float64 array ``a`` (not modified), or
    with ``recip=True`` of ``1000 / a`` (``a`` all > 0) without materialising it: division is monotone, so
    its min and max are 1000 / max and 1000 / min.

    Bit-identical to numpy's ``mean()`` and ``std()`` of the same array: the mean as ``np.mean`` (sum / n)
    and the std as numpy's ``_var`` (sum of the squared deviations from the mean, divided by n, square
    root), every sum in numpy's order (:func:`_sum_blocks`)."""
    n = a.size
    if recip:

        def recip_into(block: np.ndarray, out: np.ndarray) -> None:
            np.divide(1000.0, block, out=out)

        mean = _sum_blocks(a, recip_into) / n
        lo, hi = 1000.0 / float(a.max()), 1000.0 / float(a.min())
    else:
        mean = float(a.mean())
        lo, hi = float(a.min()), float(a.max())

    def squared_deviation(block: np.ndarray, out: np.ndarray) -> None:
        if recip:
            np.divide(1000.0, block, out=out)
            np.subtract(out, mean, out=out)
        else:
            np.subtract(block, mean, out=out)
        np.multiply(out, out, out=out)

    return mean, lo, hi, math.sqrt(_sum_blocks(a, squared_deviation) / n)


def _stats_dict(moments: tuple[float, float, float, float], pct: list[float]) -> dict[str, float]:
    """The :data:`STAT_NAMES` dict from :func:`_moments` and the :data:`_PERCENTILES` values."""
    mean, lo, hi, std = moments
    return {
        "mean": mean,
        "min": lo,
        "max": hi,
        "median": pct[0],
        "p75": pct[1],
        "p90": pct[2],
        "p95": pct[3],
        "p99": pct[4],
        "std": std,
    }


def _stats_in_place(a: np.ndarray, *, sketch: bool) -> dict[str, float]:
    """:func:`distribution_stats` of the contiguous float64 array ``a``, which is left partially sorted (the
    rank selection runs in place, as ``np.partition`` would in a copy: the same selected elements)."""
    n = a.size
    if n == 0:
        return {k: 0.0 for k in STAT_NAMES}
    moments = _moments(a)
    ranks = [_rounded_rank(n, p) for p in _PERCENTILES]
    a.partition(sorted(set(ranks)))  # O(n) selection of the rank elements, in place
    q = sketch_value if sketch else float
    return _stats_dict(moments, [q(float(a[r])) for r in ranks])


def _gap_stats_in_place(itl: np.ndarray) -> tuple[dict[str, float], dict[str, float]]:
    """The sketch statistics of the gaps ``itl`` (ms, all > 0, non-empty) and of 1000 / gap (tokens/s), with
    one rank selection in ``itl`` (left partially sorted) and no second array of its size: the value at rank
    r of 1000 / gap is 1000 / (the gap at rank n - 1 - r), division being monotone."""
    n = itl.size
    gap_moments, user_moments = _moments(itl), _moments(itl, recip=True)  # both before ``itl`` is reordered
    ranks = [_rounded_rank(n, p) for p in _PERCENTILES]
    user_at = [n - 1 - r for r in ranks]
    itl.partition(sorted(set(ranks + user_at)))
    return (
        _stats_dict(gap_moments, [sketch_value(float(itl[r])) for r in ranks]),
        _stats_dict(user_moments, [sketch_value(1000.0 / float(itl[i])) for i in user_at]),
    )


# ---------------------------------------------------------------------------------------------- report
class ReportSource(Protocol):
    """What :func:`build_report` reads: a :class:`mocker.fleet.ReplayResult`, or the live load generator's
    :class:`mocker.live.loadgen.LoadgenResult` (client-side records, zero worker-seconds)."""

    @property
    def records(self) -> Sequence[RequestRecord]: ...

    @property
    def worker_seconds(self) -> float: ...

    @property
    def num_workers(self) -> int: ...

    @property
    def engine(self) -> EngineConfig: ...


class _TokenTimes(NamedTuple):
    """Per-request and per-gap latency samples of the completed requests that produced tokens.

    Per-request arrays have one element per such request, in request_id order: ``n_tok`` (int64, tokens),
    ``ttft``/``e2e`` (float64, ms), ``multi`` (bool, >= 2 tokens). ``ttst``/``tpot`` (float64, ms) have one
    element per request with ``multi``. ``n_itl``: the number of gaps between consecutive tokens (the ITL
    samples); ``itl_stats`` their statistics (ms) and ``per_user_stats`` those of 1000 / gap over every gap
    > 0 (output token throughput per user, tokens/s).
    """

    n_tok: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    multi: np.ndarray
    ttst: np.ndarray
    tpot: np.ndarray
    n_itl: int
    itl_stats: dict[str, float]
    per_user_stats: dict[str, float]


def _check_sla_targets(sla_ttft_ms: float | None, sla_itl_ms: float | None, sla_e2e_ms: float | None) -> None:
    """Raise ValueError naming the first SLA target (ms) that is negative or not finite; None passes."""
    for name, v in (("sla_ttft_ms", sla_ttft_ms), ("sla_itl_ms", sla_itl_ms), ("sla_e2e_ms", sla_e2e_ms)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name}={v!r}: expected a finite number of milliseconds >= 0")


def _token_times(with_tokens: Sequence[RequestRecord]) -> _TokenTimes:
    """The latency samples of ``with_tokens`` (completed, >= 1 token, request_id order); see _TokenTimes.

    Every token time of every request is flattened once (request order) and the per-request figures are
    read from it by index. The token times number millions, so that is the report's one array of their
    size: the gaps overwrite it, and the per-token statistics work in it (:func:`_stats_in_place`).
    """
    n_req = len(with_tokens)
    n_tok = np.fromiter((r.num_tokens for r in with_tokens), dtype=np.int64, count=n_req)
    arrival = np.fromiter((r.arrival_ms for r in with_tokens), dtype=np.float64, count=n_req)
    total_tok = int(n_tok.sum())
    flat = _flat_token_times(with_tokens, total_tok)
    stop = np.cumsum(n_tok)  # request i's tokens are flat[stop[i] - n_tok[i]:stop[i]]
    start = stop - n_tok
    first = flat[start]
    last = flat[stop - 1]
    ttft = np.maximum(first - arrival, 0.0)
    e2e = np.maximum(last - arrival, 0.0)
    multi = n_tok >= 2
    second = flat[start[multi] + 1]
    ttst = np.maximum(second - first[multi], 0.0)
    tpot = np.maximum(last[multi] - first[multi], 0.0) / (n_tok[multi] - 1)
    itl = _token_gaps(flat, stop, total_tok - n_req)
    if itl.size and float(itl.min()) > 0.0:  # the usual case: no zero gap (itl >= 0); 1000 / gap never materialised
        itl_stats, per_user_stats = _gap_stats_in_place(itl)
    else:
        per_user = itl[itl > 0.0]
        np.divide(1000.0, per_user, out=per_user)
        itl_stats = _stats_in_place(itl, sketch=True)
        per_user_stats = _stats_in_place(per_user, sketch=True)
    return _TokenTimes(n_tok, ttft, e2e, multi, ttst, tpot, int(itl.size), itl_stats, per_user_stats)


_FLUSH_TOKENS = 65536
"""Tokens of records holding their own lists that :func:`_flat_token_times` converts at a time (a 0.5 MiB array)."""


def _flat_token_times(with_tokens: Sequence[RequestRecord], total_tok: int) -> np.ndarray:
    """Every token time (ms) of ``with_tokens``, request after request, as one float64 array of ``total_tok``.

    A record whose token times are still a slice of an engine core's pass end list (:func:`mocker.records.
    token_slice`) is read from that list, converted once per core (a few hundred thousand passes instead of millions
    of token float objects); the lists of records holding their own are read a block of tokens at a time, straight
    into the result, so that no second array of its size is made. The same floats in the same order either way."""
    srcs = [token_slice(r) for r in with_tokens]
    n_slices = sum(1 for x in srcs if x is not None)
    if n_slices == 0:  # every record holds its own list (a live driver's records)
        return np.fromiter(
            chain.from_iterable(r.token_times_ms for r in with_tokens), dtype=np.float64, count=total_tok
        )
    ends_arrays: dict[int, np.ndarray] = {}  # id(pass end list) -> the list as an array

    def array_of(ends: list[float]) -> np.ndarray:
        arr = ends_arrays.get(id(ends))
        if arr is None:
            arr = ends_arrays[id(ends)] = np.fromiter(ends, dtype=np.float64, count=len(ends))
        return arr

    if n_slices == len(srcs):  # a vLLM-family replay: every record a slice
        return np.concatenate([array_of(x[0])[x[1] : x[2]] for x in srcs if x is not None])
    flat = np.empty(total_tok)
    o = 0
    pending: list[list[float]] = []
    pending_n = 0
    for r, x in zip(with_tokens, srcs, strict=True):
        if x is None:
            tt = r.token_times_ms
            pending.append(tt)
            pending_n += len(tt)
            if pending_n < _FLUSH_TOKENS:
                continue
        if pending:
            flat[o : o + pending_n] = np.fromiter(chain.from_iterable(pending), dtype=np.float64, count=pending_n)
            o += pending_n
            pending.clear()
            pending_n = 0
        if x is not None:
            ends, a, b = x
            flat[o : o + b - a] = array_of(ends)[a:b]
            o += b - a
    if pending:
        flat[o : o + pending_n] = np.fromiter(chain.from_iterable(pending), dtype=np.float64, count=pending_n)
    return flat


def _token_gaps(flat: np.ndarray, stop: np.ndarray, n_gaps: int) -> np.ndarray:
    """Every gap (ms, clamped >= 0) between consecutive tokens of the same request, in request order: the
    first ``n_gaps`` elements of ``flat``, overwritten (returned as a view).

    ``flat``: all token times (ms), request after request; ``stop``: the int64 end offsets of every request's
    tokens in it (``np.cumsum`` of the token counts, each >= 1); ``n_gaps`` = total tokens - requests. One
    subtraction of the shifted array in place (``flat[i] = flat[i + 1] - flat[i]``: numpy gives overlapping
    operands the result of non-overlapping ones), then the differences that span two requests (at each request's
    last token) are dropped by a boolean selection, which keeps the order.
    """
    if n_gaps <= 0:
        return flat[:0]
    np.subtract(flat[1:], flat[:-1], out=flat[:-1])
    keep = np.ones(flat.size - 1, dtype=bool)
    keep[stop[:-1] - 1] = False
    # compacted a block at a time: a kept difference only ever moves to a lower index, so writing block k's
    # selection after reading it never overwrites a difference of a later block (one block's copy, not n_gaps')
    o = 0
    for lo in range(0, flat.size - 1, _BLOCK * 64):
        sel = flat[lo : min(lo + _BLOCK * 64, flat.size - 1)][keep[lo : lo + _BLOCK * 64]]
        flat[o : o + sel.size] = sel
        o += sel.size
    itl = flat[:n_gaps]
    np.maximum(itl, 0.0, out=itl)
    return itl


def _worker_keys(result: ReportSource) -> dict[str, Any]:
    """Provisioned worker time (s), split prefill/decode, GPUs per worker and GPU-hours of the fleet.

    GPUs per worker = ``engine.dp_size`` (default 1); GPU-hours = worker-seconds x GPUs / 3600; the
    prefill figures are 0 unless the fleet is disaggregated (``prefill_worker_seconds``, mocker.fleet).
    """
    gpus = int(getattr(result.engine, "dp_size", 1))
    worker_seconds = float(result.worker_seconds)
    prefill_seconds = float(getattr(result, "prefill_worker_seconds", 0.0))  # disaggregated fleets (mocker.fleet)
    return {
        "num_workers": int(result.num_workers),
        "worker_seconds": worker_seconds,
        "prefill_worker_seconds": prefill_seconds,
        "decode_worker_seconds": worker_seconds - prefill_seconds,
        "prefill_gpus_per_worker": gpus if prefill_seconds else 0,
        "decode_gpus_per_worker": gpus,
        "gpu_hours": worker_seconds * gpus / 3600.0,
    }


def _goodput_keys(
    t: _TokenTimes,
    done: Sequence[RequestRecord],
    num_requests: int,
    duration_s: float,
    sla_ttft_ms: float | None,
    sla_itl_ms: float | None,
    sla_e2e_ms: float | None,
) -> dict[str, Any]:
    """The SLA targets (ms) and goodput keys: requests meeting every given target, their rates per second
    over ``duration_s`` and the attainment (goodput / ``num_requests``). At least one target is given.

    A request's ITL check uses its own mean ITL ``(E2E - TTFT) / (tokens - 1)`` and is skipped for
    single-token requests; with an e2e-only SLA the token-less completions of ``done`` count too
    (module docstring, "Goodput").
    """
    good = np.ones(len(t.n_tok), dtype=bool)
    if sla_ttft_ms is not None:
        good &= t.ttft <= sla_ttft_ms
    if sla_e2e_ms is not None:
        good &= t.e2e <= sla_e2e_ms
    if sla_itl_ms is not None:
        multi = t.multi
        mean_itl = np.zeros(len(t.n_tok))
        mean_itl[multi] = (t.e2e[multi] - t.ttft[multi]) / (t.n_tok[multi] - 1)
        good &= ~multi | (mean_itl <= sla_itl_ms)
    good_n = int(good.sum())
    good_tokens = int(t.n_tok[good].sum())
    if sla_ttft_ms is None and sla_itl_ms is None and sla_e2e_ms is not None:
        # e2e-only SLA: token-less completions count too (``done`` all have ``finish_ms``)
        good_n += sum(
            1
            for r in done
            if not r.num_tokens and r.finish_ms is not None and max(r.finish_ms - r.arrival_ms, 0.0) <= sla_e2e_ms
        )
    return {
        "sla_ttft_ms": sla_ttft_ms,
        "sla_itl_ms": sla_itl_ms,
        "sla_e2e_ms": sla_e2e_ms,
        "goodput_completed_requests": good_n,
        "goodput_request_throughput_rps": good_n / duration_s,
        "goodput_output_throughput_tok_s": good_tokens / duration_s,
        "sla_attainment": good_n / num_requests if num_requests else 0.0,
    }


def _distribution_keys(t: _TokenTimes) -> dict[str, float]:
    """``{stat}_{name}_ms`` for every latency distribution, then the per-user output token throughput
    statistics (tokens/s, ``{stat}_output_token_throughput_per_user``)."""
    rep: dict[str, float] = {}
    for name, values in (("ttft", t.ttft), ("ttst", t.ttst), ("tpot", t.tpot), ("itl", None), ("e2e_latency", t.e2e)):
        for stat, v in (t.itl_stats if values is None else _stats(values, sketch=False)).items():
            rep[f"{stat}_{name}_ms"] = v
    for stat, v in t.per_user_stats.items():
        rep[f"{stat}_output_token_throughput_per_user"] = v
    return rep


def build_report(
    result: ReportSource,
    *,
    sla_ttft_ms: float | None = None,
    sla_itl_ms: float | None = None,
    sla_e2e_ms: float | None = None,
) -> dict[str, Any]:
    """The replay summary as a flat dict with the reference report's key names, in a fixed order.

    ``result``: a :class:`mocker.fleet.ReplayResult` (uses ``records``, ``worker_seconds``,
    ``num_workers``, ``engine``). SLA targets in ms; a target of None is not checked, and the goodput
    keys appear only when at least one target is given. Raises ValueError on a negative or non-finite
    target. Definitions: see the module docstring.
    """
    _check_sla_targets(sla_ttft_ms, sla_itl_ms, sla_e2e_ms)
    # request_id order makes every float sum independent of the order the fleet returned records in
    records: Sequence[RequestRecord] = sorted(result.records, key=lambda r: r.request_id)
    # one pass over the records (they number tens of thousands): the completed ones and their totals
    done: list[RequestRecord] = []
    with_tokens: list[RequestRecord] = []
    total_in = total_out = cached = preemptions = 0
    latest = -math.inf
    for r in records:
        preemptions += r.num_preemptions
        finish = r.finish_ms
        if r.status == "finished" and r.admit_ms is not None and finish is not None:
            done.append(r)
            total_in += r.input_length
            cached += r.cached_tokens
            n = r.num_tokens
            if n:
                total_out += n
                with_tokens.append(r)
            if finish > latest:  # the first of equal maxima, as max() keeps
                latest = finish
    t = _token_times(with_tokens)
    duration_ms = latest if done else 0.0
    duration_s = max(duration_ms / 1000.0, 1e-9)
    rep: dict[str, Any] = {
        "num_requests": len(records),
        "completed_requests": len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "duration_ms": float(duration_ms),
        "request_throughput_rps": len(done) / duration_s,
        "input_throughput_tok_s": total_in / duration_s,
        "output_throughput_tok_s": total_out / duration_s,
        "total_throughput_tok_s": (total_in + total_out) / duration_s,
    }
    rep |= _worker_keys(result)
    if sla_ttft_ms is not None or sla_itl_ms is not None or sla_e2e_ms is not None:
        rep |= _goodput_keys(t, done, len(records), duration_s, sla_ttft_ms, sla_itl_ms, sla_e2e_ms)
    ratio = cached / total_in if total_in else 0.0
    rep |= {
        "processed_tokens": total_in + total_out,
        "prefix_cache_reused_ratio": ratio,
        "first_admission_prefix_cache_reused_ratio": ratio,
        "num_preemptions": preemptions,
        "num_ttft_samples": int(t.ttft.size),
        "num_tpot_samples": int(t.tpot.size),
        "num_e2e_latency_samples": int(t.e2e.size),
        "num_itl_samples": t.n_itl,
    }
    rep |= _distribution_keys(t)
    eng = result.engine
    rep |= {
        "engine": getattr(eng, "engine", None),
        "block_size": getattr(eng, "effective_block_size", None),
        "num_gpu_blocks": getattr(eng, "num_gpu_blocks", None),
    }
    kvbm = getattr(result, "kvbm", None)  # KVBM lower tiers on: extra kvbm_* counters (mocker.fleet.Fleet.tier_stats)
    if kvbm:
        rep |= kvbm
    return rep


def report_to_json(report: dict[str, Any]) -> str:
    """The report as JSON text (key order kept, one key per line, trailing newline). Deterministic."""
    return json.dumps(report, indent=1, allow_nan=False) + "\n"


def write_report_json(report: dict[str, Any], path: str | Path) -> None:
    """Write :func:`report_to_json` to ``path`` (parent directories are created). Raises OSError."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(report_to_json(report), encoding="utf-8")


# ---------------------------------------------------------------------------------------------- per request
def per_request_row(r: RequestRecord) -> dict[str, Any]:
    t = r.token_times_ms
    n = len(t)
    first = t[0] if n else r.first_token_ms
    last = t[-1] if n else None
    end = last if last is not None else r.finish_ms
    return {
        "request_id": r.request_id,
        "status": r.status,
        "worker_id": r.worker_id,
        "dp_rank": r.dp_rank,
        "prefill_worker_id": r.prefill_worker_id,
        "input_length": r.input_length,
        "output_length": r.output_length,
        "num_output_tokens": n,
        "cached_tokens": r.cached_tokens,
        "num_preemptions": r.num_preemptions,
        "arrival_ms": r.arrival_ms,
        "admit_ms": r.admit_ms,
        "first_token_ms": first,
        "finish_ms": r.finish_ms,
        "ttft_ms": None if first is None else max(first - r.arrival_ms, 0.0),
        "ttst_ms": max(t[1] - t[0], 0.0) if n >= 2 else None,
        "itl_ms": max(t[-1] - t[0], 0.0) / (n - 1) if n >= 2 else None,
        "e2e_ms": None if end is None else max(end - r.arrival_ms, 0.0),
        "token_times_ms": t,
    }


def write_per_request_jsonl(records: Iterable[RequestRecord], path: str | Path) -> None:
    """One JSON object per request, ordered by ``request_id``, fixed key order.

    Keys: request_id, status, worker_id, dp_rank, prefill_worker_id, input_length, output_length
    (requested), num_output_tokens (emitted), cached_tokens (first admission), num_preemptions,
    arrival_ms, admit_ms, first_token_ms, finish_ms, ttft_ms, ttst_ms, itl_ms (this request's mean gap,
    = the reference per-request ``itl_ms``), e2e_ms (last token - arrival), token_times_ms (every token).
    Times in ms; ``null`` where a request never reached that point. Raises OSError if unwritable.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    enc = msgspec.json.Encoder()
    buf = bytearray()
    with p.open("wb") as f:  # in pieces of ~1 MiB: the whole file (every token time) is never held in memory
        for r in sorted(records, key=lambda r: r.request_id):
            enc.encode_into(per_request_row(r), buf, len(buf))
            buf += b"\n"
            if len(buf) >= _WRITE_CHUNK:
                f.write(buf)
                buf.clear()
        f.write(buf)


_WRITE_CHUNK = 1 << 20
"""Bytes of JSONL gathered before :func:`write_per_request_jsonl` writes them (1 MiB)."""


# ---------------------------------------------------------------------------------------------- table
def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def render_table(report: dict[str, Any], *, title: str = "dynoplan replay", client_side: bool = False) -> Table:
    """A readable rich table of the report: a summary block and a latency grid (ms).

    ``client_side`` (``dynoplan loadgen``): only what a client measures — no engine / fleet, prefix-cache,
    preemption or worker-seconds rows, and the duration is wall time, not simulated time."""
    from rich.table import Table  # here, not at module level: a replay without a table never loads rich

    summary = Table(title=title, show_header=False, box=None, pad_edge=False)
    summary.add_column("metric", style="bold")
    summary.add_column("value", justify="right")
    rows: list[tuple[str, Any]] = [
        ("engine / workers", f"{report.get('engine')} x {report.get('num_workers')}"),
        ("requests (completed / total)", f"{report['completed_requests']:,} / {report['num_requests']:,}"),
        ("simulated duration (s)", _fmt(report["duration_ms"] / 1000.0)),
        ("request throughput (req/s)", _fmt(report["request_throughput_rps"], 3)),
        ("input / output tokens", f"{report['total_input_tokens']:,} / {report['total_output_tokens']:,}"),
        ("output throughput (tok/s)", _fmt(report["output_throughput_tok_s"], 1)),
        ("total throughput (tok/s)", _fmt(report["total_throughput_tok_s"], 1)),
        ("prefix cache reuse", f"{report['prefix_cache_reused_ratio']:.2%}"),
        ("preemptions", _fmt(report.get("num_preemptions"))),
        ("worker-seconds / GPU-hours", f"{report['worker_seconds']:,.1f} / {report['gpu_hours']:.3f}"),
    ]
    if client_side:
        server = ("engine / workers", "prefix cache reuse", "preemptions", "worker-seconds / GPU-hours")
        rows = [("duration (s)", v) if k == "simulated duration (s)" else (k, v) for k, v in rows if k not in server]
    if report.get("prefill_worker_seconds"):  # disaggregated fleet
        rows.append(
            (
                "prefill / decode worker-seconds",
                f"{report['prefill_worker_seconds']:,.1f} / {report['decode_worker_seconds']:,.1f}",
            )
        )
    if "kvbm_offloaded_blocks" in report:  # KVBM lower tiers
        rows.append(
            (
                "KVBM blocks offloaded / onboarded (G2, G3, G4)",
                f"{report['kvbm_offloaded_blocks']:,} / {report['kvbm_onboarded_blocks_g2']:,}, "
                f"{report['kvbm_onboarded_blocks_g3']:,}, {report['kvbm_onboarded_blocks_g4']:,}",
            )
        )
    if "goodput_completed_requests" in report:
        targets = ", ".join(
            f"{k[4:-3].upper()} <= {report[k]:g} ms"
            for k in ("sla_ttft_ms", "sla_itl_ms", "sla_e2e_ms")
            if report.get(k) is not None
        )
        rows.append((f"goodput ({targets})", f"{report['goodput_completed_requests']:,} req"))
        rows.append(("SLA attainment", f"{report['sla_attainment']:.2%}"))
    for k, v in rows:
        summary.add_row(k, v)

    lat = Table(title="latency (ms)", header_style="bold")
    lat.add_column("metric")
    stats = ("mean", "median", "p90", "p99", "max", "std")
    for s in stats:
        lat.add_column("p50" if s == "median" else s, justify="right", no_wrap=True)
    labels = {"ttft": "TTFT", "ttst": "TTST", "tpot": "TPOT", "itl": "ITL", "e2e_latency": "E2E"}
    none_done = report["completed_requests"] == 0  # no samples: "-" rather than 0.00 ms, which reads as instant
    for name in DISTRIBUTIONS:
        lat.add_row(labels[name], *("-" if none_done else f"{report[f'{s}_{name}_ms']:.2f}" for s in stats))

    outer = Table.grid(padding=(1, 0))
    outer.add_column()
    outer.add_row(summary)
    outer.add_row(lat)
    return outer

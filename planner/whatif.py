"""The planner's what-if engine: replays a traffic sample through a candidate fleet of simulated engines.

:class:`EngineFleetEvaluator` implements :class:`planner.core.sizing.FleetEvaluator` with the project's own
engine simulation (:class:`mocker.fleet.Fleet`: the same scheduler cores, KV cache and router as a replay),
configured with the engine settings the deployment declares (``EngineConfig`` per pool: scheduler family,
KV blocks, batch limits, timing model) and its router and KV transfer. The planner core never imports
mocker (import-linter contract); every driver -- ``dynoplan simulate``, ``dynoplan up``, the operator --
builds one of these and hands it to :class:`planner.core.Planner`.

Round-robin routing over an aggregated pool sends request ``i`` to engine ``i mod n``, so the engines are
independent and alike: when the sample holds more counted requests than the verdicts need
(``TrafficSample.min_counted``), only the first ``k`` engines and the requests routed to them are replayed,
``k`` the fewest that still receive the needed count. Their records are exactly those of the whole fleet's
engines ``0..k-1`` (the fleet's round robin over the kept requests hands the ``j``-th to engine ``j mod k``),
and the cost of a decision no longer grows with the fleet. The sample names the pool whose share may be
replayed (``TrafficSample.share_pool``, the pool being sized). In a disaggregated fleet that is the pool sized
while the other is ample: its engines ``0..k-1`` receive exactly their requests (prefill routing is in arrival
order; decode routing in order of prefill completion, so a decode share sees the same stream only in
distribution), and the ample pool keeps its per-engine load (``ceil(m k / n)`` of its ``m`` engines, so it stays
ample). The pair check, other routers and DP-ranked engines are replayed whole.

Prefix-cache hits: the frontend exports lengths, not content, so a sample's requests carry no prompt of their own;
the sample's ``cached_tokens`` (the mean length of a prefix all its requests share, from the share of prompt tokens
the live fleet served from its prefix cache: :mod:`planner.core.sizing`) becomes prompt block ids
(``TraceRequest.hash_ids``, one per ``trace_block_size`` tokens of the engines): request ``i`` starts with the
shared ids ``0 .. m_i - 1`` and the rest of its ids are its own. ``m_i = floor((i + 1) x) - floor(i x)`` with
``x = cached_tokens / trace_block_size`` (whole blocks whose mean over the requests is ``x`` exactly, with no random
draw: a 300-token prefix in 512-token blocks is one block for 59 % of the requests), capped at the request's own
whole blocks. Without a shared prefix (``cached_tokens`` 0, a deployment whose frontend does not report cached
tokens) the requests carry no ids and the what-if fleet has no hits: where the real traffic shares prefixes, the
sizing then errs on the safe side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mocker.config import EngineConfig
from mocker.fleet import Fleet
from mocker.records import TraceRequest
from planner.core.sizing import CONFIDENCE, SampleOutcome, TrafficSample, fail_count

UNIQUE_ID_BASE = 1 << 40
"""First prompt block id of the requests' own (unshared) blocks; the shared prefix's ids count up from 0."""


def prefix_hash_ids(isl_tokens: Sequence[int], cached_tokens: float, block_tokens: int) -> list[tuple[int, ...] | None]:
    """Prompt block ids of a sample's requests (module docstring, "Prefix-cache hits"): one tuple of
    ``ceil(isl / block_tokens)`` ids per request, the first ``m_i`` shared; all None when ``cached_tokens`` <= 0.
    ``isl_tokens``: prompt lengths (tokens, >= 1); ``cached_tokens``: mean shared prefix, tokens;
    ``block_tokens``: tokens per id (the engines' ``trace_block_size``)."""
    x = cached_tokens / block_tokens if block_tokens > 0 else 0.0
    if not x > 0:
        return [None] * len(isl_tokens)
    out: list[tuple[int, ...] | None] = []
    nxt = UNIQUE_ID_BASE
    for i, isl in enumerate(isl_tokens):
        n = -(-int(isl) // block_tokens)
        m = min(math.floor((i + 1) * x) - math.floor(i * x), int(isl) // block_tokens)
        out.append(tuple(range(m)) + tuple(range(nxt, nxt + n - m)))
        nxt += n - m
    return out


CHECK_EVERY = 128
"""Arrivals between two early-stop checks of a replay (each check rescans the requests still in flight)."""


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns ``a``'s memory (``a`` itself when it owns it)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class EngineFleetEvaluator:
    """``evaluate(sample, {pool: replicas})`` on a fresh fleet of ``engines`` (``{"agg": cfg}`` or
    ``{"prefill": cfg, "decode": cfg}``), every worker ready at t = 0.

    ``ttft_ms`` / ``itl_ms``: SLA targets (a request misses when its TTFT or its own mean ITL is above). The
    replay stops at the latest instant a counted request could still meet both (last arrival + TTFT target +
    the longest OSL x ITL target); a request unfinished by then is a miss. Errors: ConfigError of mocker for
    engine settings the fleet refuses.
    """

    def __init__(
        self,
        engines: Mapping[str, EngineConfig],
        *,
        ttft_ms: float,
        itl_ms: float,
        router: str = "round_robin",
        transfer: Any = None,
        seed: int = 0,
    ) -> None:
        self.engines = dict(engines)
        self.ttft_ms = float(ttft_ms)
        self.itl_ms = float(itl_ms)
        self.router = router
        self.transfer = transfer
        self.seed = seed
        self.evaluations = 0
        """Candidate fleets simulated so far (one :meth:`evaluate` call each)."""
        self.replayed_requests = 0
        """Sampled requests replayed through them so far (warm start state included)."""
        self._memo_arrays: tuple[np.ndarray | None, ...] = (None, None, None)
        """The arrays that own the latest sample's arrival, ISL and OSL memory (:attr:`_memo` is for them)."""
        self._memo: dict[tuple[Any, ...], SampleOutcome] = {}
        """Outcomes of the replays of the latest sample (its arrays, by the arrays that own them): two calls that
        would replay the same requests on the same engines with the same stop rule get one replay. A decision's
        looks are nested prefixes of one sample; looks that keep the same requests and the same engine share
        (the sample's interval holds more than the look needs) are one replay, not one per look."""
        self._ids_root: np.ndarray | None = None
        self._ids_cached = 0.0
        self._ids: list[tuple[int, ...] | None] = []
        """Prompt block ids of the latest sample's requests (:meth:`_hash_ids`)."""
        Fleet(self.engines, router=router, transfer=transfer, seed=seed).close()  # fail early on bad settings

    def _share(self, sample: TrafficSample, replicas: Mapping[str, int]) -> tuple[dict[str, int], np.ndarray | None]:
        """(engines to replay, indices of the requests they receive or None for all) -- module docstring."""
        pool = sample.share_pool
        n = int(replicas.get(pool, 0)) if pool else 0
        counted = sample.num_counted
        if (
            not pool
            or self.router != "round_robin"
            or n <= 1
            or sample.min_counted <= 0
            or any(cfg.dp_size != 1 for cfg in self.engines.values())
            or counted <= sample.min_counted
        ):
            return dict(replicas), None
        k = min(n, max(1, math.ceil(n * sample.min_counted / counted)))
        if k >= n:
            return dict(replicas), None
        # the shared pool's engines 0..k-1 and every request routed to them; any other pool keeps its engines per
        # request (the proportional share, rounded up: an ample pool stays ample)
        counts = {p: (k if p == pool else min(int(c), max(1, math.ceil(int(c) * k / n)))) for p, c in replicas.items()}
        idx = np.flatnonzero(np.arange(len(sample.arrival_s)) % n < k)
        return counts, idx

    def evaluate(
        self,
        sample: TrafficSample,
        replicas: Mapping[str, int],
        stop_allowed: float | None = None,
        stop_kind: str = "any",
        stop_confidence: float = CONFIDENCE,
    ) -> SampleOutcome:
        """The counted requests' misses (:class:`planner.core.sizing.FleetEvaluator`). With ``stop_allowed``, the
        replay checks every :data:`CHECK_EVERY` arrivals whether the misses already certain (no first token
        ``ttft_ms`` after arrival; a finished request over the ITL target) make the verdict FAIL at
        ``stop_confidence``, and stops."""
        counts, idx = self._share(sample, replicas)
        roots = (_root(sample.arrival_s), _root(sample.isl_tokens), _root(sample.osl_tokens))
        if any(a is not b for a, b in zip(roots, self._memo_arrays, strict=True)):
            self._memo_arrays, self._memo = roots, {}  # another sample: forget the last one's (its arrays then free)
        key = (
            tuple(a.__array_interface__["data"][0] for a in (sample.arrival_s, sample.isl_tokens, sample.osl_tokens)),
            len(sample.arrival_s),
            sample.num_warm,
            tuple(sorted(replicas.items())),
            tuple(sorted(counts.items())),
            sample.share_pool,
            sample.cached_tokens,
            stop_allowed,
            stop_kind,
            stop_confidence,
        )
        memo = self._memo
        if key not in memo:
            memo[key] = self._replay(sample, counts, idx, stop_allowed, stop_kind, stop_confidence)
        return memo[key]

    def _replay(
        self,
        sample: TrafficSample,
        counts: dict[str, int],
        idx: np.ndarray | None,
        stop_allowed: float | None,
        stop_kind: str,
        stop_confidence: float,
    ) -> SampleOutcome:
        """:meth:`evaluate` on the engines ``counts`` and the requests ``idx`` of :meth:`_share`, replayed."""
        num_warm = sample.num_warm if idx is None else int(np.count_nonzero(idx < sample.num_warm))
        self.evaluations += 1
        self.replayed_requests += len(sample.arrival_s) if idx is None else len(idx)
        fleet = Fleet(self.engines, router=self.router, transfer=self.transfer, seed=self.seed)
        try:
            for pool, n in counts.items():
                for _ in range(int(n)):
                    fleet.add_worker(pool, 0.0)
            arr_ms = sample.arrival_s * 1000.0
            isl = sample.isl_tokens
            osl = sample.osl_tokens
            if idx is not None:
                arr_ms, isl, osl = arr_ms[idx], isl[idx], osl[idx]
            recs = []
            n_counted = len(arr_ms) - num_warm
            stop_at = fail_count(n_counted, stop_allowed, stop_confidence) if stop_allowed is not None else None
            certain = _CertainMisses(self.ttft_ms, self.itl_ms)
            arr_list, isl_list, osl_list = arr_ms.tolist(), isl.tolist(), osl.tolist()  # Python numbers, once
            ids = self._hash_ids(sample)
            if idx is not None:
                ids = [ids[j] for j in idx.tolist()]
            for i in range(len(arr_list)):
                t = arr_list[i]
                fleet.advance_until(t)
                recs.append(fleet.submit(TraceRequest(i, t, isl_list[i], osl_list[i], ids[i]), t))
                if stop_at is not None and i > num_warm and (i - num_warm) % CHECK_EVERY == 0:
                    certain.add(recs[num_warm + certain.seen :])
                    o = certain.at(t, n_counted)
                    if o.misses_of(stop_kind) >= stop_at:
                        return o
            last = float(arr_ms[-1]) if len(arr_ms) else 0.0
            end = last + self.ttft_ms + float(osl.max() if len(osl) else 1) * self.itl_ms
            fleet.finish(end)
        finally:
            fleet.close()
        return self._count(recs[num_warm:], end)

    def _hash_ids(self, sample: TrafficSample) -> list[tuple[int, ...] | None]:
        """:func:`prefix_hash_ids` of the sample's requests (before any share is taken: request ``i`` keeps its ids).
        A look of a sequential verdict is a head of one sample (its arrays views of the same memory, from the
        start): the ids are built once for the whole array and the looks take their first part."""
        isl = sample.isl_tokens
        root = _root(isl)
        block = next(iter(self.engines.values())).trace_block_size
        if root.ndim != 1 or root.__array_interface__["data"][0] != isl.__array_interface__["data"][0]:
            return prefix_hash_ids(isl.tolist(), sample.cached_tokens, block)  # not a head: built for itself
        if self._ids_root is not root or self._ids_cached != sample.cached_tokens:
            self._ids = prefix_hash_ids(root.tolist(), sample.cached_tokens, block)
            self._ids_root, self._ids_cached = root, sample.cached_tokens
        return self._ids[: len(isl)]

    def _count(self, recs: list[Any], end_ms: float) -> SampleOutcome:
        n = len(recs)
        ttft = np.full(n, math.inf)
        itl = np.full(n, math.inf)
        for k, r in enumerate(recs):
            ft = r.first_token_ms
            if ft is not None and ft <= end_ms:
                ttft[k] = ft - r.arrival_ms
            if r.status == "finished" and r.finish_ms is not None and ft is not None and r.finish_ms <= end_ms:
                itl[k] = (r.finish_ms - ft) / (r.output_length - 1) if r.output_length > 1 else 0.0
        t_miss = ttft > self.ttft_ms
        i_miss = itl > self.itl_ms
        return SampleOutcome(
            n, int(t_miss.sum()), int(i_miss.sum()), int((t_miss | i_miss).sum()), unfinished=int(np.isinf(itl).sum())
        )


class _CertainMisses:
    """The misses already certain at a time among the counted records replayed so far, kept incrementally: a
    record that reached a terminal status (finished, failed, cancelled) no longer changes, so its misses are
    counted once and it leaves the open list (one that ended without a first token only once its TTFT miss is
    certain, which then depends on the time alone); only the open ones (queued or running) are looked at again at
    each check. The counts equal a fresh scan of every record at every check (the rule below), at a cost that
    grows with the requests in flight, not with the requests replayed.

    Certain at ``now_ms``: a TTFT miss when the first token came more than ``ttft_ms`` after arrival, or has not
    come and ``now_ms`` is already past that; an ITL miss when the request finished with a mean ITL
    ``(finish - first token) / (tokens - 1)`` over ``itl_ms``."""

    __slots__ = ("ttft_ms", "itl_ms", "open", "seen", "done_ttft", "done_itl", "done_both")

    def __init__(self, ttft_ms: float, itl_ms: float) -> None:
        self.ttft_ms = ttft_ms
        self.itl_ms = itl_ms
        self.open: list[Any] = []
        self.seen = 0
        """Records added so far."""
        self.done_ttft = self.done_itl = self.done_both = 0
        """Misses of the records that left the open list."""

    def add(self, recs: list[Any]) -> None:
        """Add newly replayed records (in order; each once)."""
        self.open.extend(recs)
        self.seen += len(recs)

    def at(self, now_ms: float, n_counted: int) -> SampleOutcome:
        """The certain misses at ``now_ms`` as an incomplete outcome of ``n_counted`` requests."""
        ttft_ms, itl_ms = self.ttft_ms, self.itl_ms
        t_miss = i_miss = both = 0
        still: list[Any] = []
        for r in self.open:
            ft = r.first_token_ms
            tm = (ft - r.arrival_ms > ttft_ms) if ft is not None else (now_ms - r.arrival_ms > ttft_ms)
            im = (
                ft is not None
                and r.finish_ms is not None
                and r.output_length > 1
                and (r.finish_ms - ft) / (r.output_length - 1) > itl_ms
            )
            if r.status == "pending" or (ft is None and not tm):  # may still change (a token-less end: with time)
                still.append(r)
                t_miss += tm
                i_miss += im
                both += tm or im
            else:
                self.done_ttft += tm
                self.done_itl += im
                self.done_both += tm or im
        self.open = still
        return SampleOutcome(
            n_counted, self.done_ttft + t_miss, self.done_itl + i_miss, self.done_both + both, complete=False
        )


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


POOL_ROLES = {"agg": "aggregated", "prefill": "prefill", "decode": "decode"}
"""Planned pool -> the ``worker_type`` of its engines."""


def evaluator_from_spec(
    engine: Any, config: Any, *, router: str = "round_robin", where: str = "spec.engine"
) -> EngineFleetEvaluator | None:
    """The operator's engine model: ``engine`` is the DynoPlanner's ``spec.engine`` mapping of flat
    :class:`mocker.config.EngineConfig` fields (snake_case or camelCase; None or empty = ``EngineConfig()``),
    the same engine for every pool of ``config`` (a ``PlannerConfig``) with the pool's role; SLA targets
    ``config.ttft_ms`` / ``config.itl_ms``. None (the closed-form sizing) when ``config`` does not size by
    simulation (``simulated_sizing`` off, or planning one half of a disaggregated deployment, ``mode: prefill``
    or ``decode``: a what-if fleet needs both halves); the engine settings are validated all the same.

    Raises :class:`dynoplan.errors.ConfigError` naming ``where.<field>``, the value and what was expected
    (mocker's validation), or ``where`` itself when it is not a mapping."""
    from dynoplan.errors import ConfigError
    from dynoplan.errors import ConfigError as MockerConfigError

    if engine is None:
        engine = {}
    if not isinstance(engine, Mapping):
        raise ConfigError(f"{where}={engine!r}: expected a mapping of engine settings (EngineConfig fields)")
    flat = {_snake(str(k)): v for k, v in engine.items()}
    if "worker_type" in flat:
        raise ConfigError(
            f"{where}.workerType={flat['worker_type']!r}: set per pool by the planner's mode, expected it left out"
        )
    try:
        base = EngineConfig.from_mapping(flat)
        if not getattr(config, "simulated_sizing", True) or tuple(config.pools) not in (
            ("agg",),
            ("prefill", "decode"),
        ):
            return None
        engines = {p: base.replace(worker_type=POOL_ROLES[p]) for p in config.pools}
        return EngineFleetEvaluator(engines, ttft_ms=config.ttft_ms, itl_ms=config.itl_ms, router=router)
    except MockerConfigError as e:
        raise ConfigError([f"{where}.{p}" for p in e.problems]) from None

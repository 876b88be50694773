"""The planner's one settings object: :class:`PlannerConfig` (frozen, validated at construction).

Each field states its unit, bound, default and the source of the default once, in its ``Field``. Defaults
follow the Dynamo Planner design (docs/architecture.md "Planner facts"): adjustment interval 180 s, load
interval 5 s, TTFT 500 ms, ITL 50 ms, min_endpoint 1, max_gpu_budget 8, Kalman q_level 1.0,
q_trend 0.1, r 10.0, min points 5, Prophet window 50, VirtualConnector timeout 1800 s (used here as
the pending-action timeout). Fields beyond the reference (the sizing by simulation, the auto predictor,
...) document their own defaults.

The class is a :func:`dynoplan.settings.settings` model: strict types (a bool is not an integer, ``"5"`` is
not a number), unknown keys rejected, field bounds checked by pydantic; the cross-field checks
(:meth:`PlannerConfig.__post_init__`) raise :class:`~dynoplan.settings.Problems` with every line at once.
Direct construction raises pydantic's ``ValidationError``; the functions below raise
:class:`~dynoplan.errors.ConfigError` with one ``field=value: expected ...`` line per problem.

Sources: :func:`config_from_mapping` (a dict, e.g. parsed YAML/JSON; nested ``prefill:``/``decode:``/
``agg:`` pool sections or flat ``prefill_min_replicas`` keys; ``cli=True`` for ``KEY=VALUE`` text),
:func:`load_config` (a ``.yaml``/``.yml``/``.json`` file plus overrides), :func:`add_config_arguments` /
:func:`config_from_args` (CLI flags ``--ttft-ms 300 --prefill-max-replicas 4``; flags win over the file).
Files and command-line text are read by one grammar (:mod:`dynoplan.settings_text`, docs/architecture.md
"Settings text"; :func:`parse_cli_values`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic.fields import FieldInfo

from dynoplan.errors import ConfigError
from dynoplan.fields import MAX_INT64
from dynoplan.settings import Problems, build, settings, spell, upper_bound_why

MAX_TTFT_MS = 3_600_000.0
"""Largest TTFT target accepted (one hour): beyond it no sizing rule has anything to say, and the tail
models' sums grow with the target."""
MAX_ITL_MS = 10_000.0
"""Largest ITL target accepted (10 s per token); the aggregated ITL-tail model sums Poisson terms over each
request's boundary life, whose length grows with the target."""
MODES: tuple[str, ...] = ("disagg", "prefill", "decode", "agg")
"""disagg: prefill + decode pools; prefill / decode: only that pool is planned; agg: one aggregated pool."""

POOLS_BY_MODE: dict[str, tuple[str, ...]] = {
    "disagg": ("prefill", "decode"),
    "prefill": ("prefill",),
    "decode": ("decode",),
    "agg": ("agg",),
}

MAX_REGRESSION_BUCKETS = 64
"""Most load-regression buckets (``regression_buckets``): bucket k holds passes of 2**k to 2**(k+1) - 1
scheduled tokens (planner.core.load.PassTimeRegression), and a pass's token count is below 2**63 (int64,
:data:`dynoplan.fields.MAX_INT64`), so buckets past 64 are never filled; each still costs one deque per
feature."""

MAX_ATTAINMENT_TARGET = 0.9999
"""Largest ``sla_attainment_target`` accepted (four nines). The sizing by simulation judges a fleet on
``ceil(2 z^2 / (1 - target))`` sampled requests at its first look (:func:`planner.core.sizing.sample_size`) and up to
8 x that at its last, and a replay holds a record per request (measured: 0.99999, whose first look is 541,176
requests, took 2.5 GB and 20 s for a whole simulate run of a 60-request trace). At 0.9999 the first look is 54,119
requests and the largest replay 432,952 (about 2 GB); each further nine multiplies both by ten (0.999999 ran for many
minutes at 10 GB, 0.999999999 asked for 40 GiB at once). 54,119 requests are already an hour of traffic at 15
requests/s, nearly three times the bundled Azure production trace's hour (19,366 requests), and the sample's sizes
are drawn from the last hour (:data:`planner.core.sizing.SIZE_HISTORY_S`): one more nine would need 150 requests/s
for that hour to hold even the first look."""

ATTAINMENT_LIMIT_WHY = (
    "the sizing judges each candidate fleet on at least 2 z^2 / (1 - target) simulated requests: 54,119 at 0.9999, "
    "ten times more for each further nine"
)
"""Why ``sla_attainment_target`` stops at :data:`MAX_ATTAINMENT_TARGET`, as the error lines say it."""


PREDICTORS: tuple[str, ...] = ("constant", "arima", "kalman", "prophet", "auto")

Mode = Literal["disagg", "prefill", "decode", "agg"]
"""The values of :data:`MODES` as a type."""
Predictor = Literal["constant", "arima", "kalman", "prophet", "auto"]
"""The values of :data:`PREDICTORS` as a type."""
Candidate = Literal["constant", "arima", "kalman", "prophet"]
"""A candidate of the ``auto`` predictor: any predictor but ``auto`` itself."""


@settings
class PoolLimits:
    """Replica limits of one worker pool (prefill, decode or agg)."""

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_INT64,
        description="Fewest replicas the planner keeps, >= 0 (default 1 = Dynamo "
        'min_endpoint, docs/architecture.md "Planner facts").',
    )
    max_replicas: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INT64,
        description="Most replicas the planner requests, >= 0; null (the default) = only the GPU budget limits it.",
    )
    gpus_per_engine: int = Field(
        default=1, ge=1, le=MAX_INT64, description="GPUs one replica occupies, >= 1 (default 1)."
    )


def _pool() -> PoolLimits:
    return PoolLimits()


@settings
class PlannerConfig:
    """Every knob of the planner core. Construct directly or via :func:`config_from_mapping`.

    Direct construction raises pydantic's ``ValidationError`` (a ``ValueError``); :func:`config_from_mapping`
    raises :class:`~dynoplan.errors.ConfigError` listing every invalid field at once.
    """

    mode: Mode = Field(
        default="disagg",
        description="Pools planned: disagg (prefill + decode), prefill, decode (that pool "
        "only) or agg (one aggregated pool); default disagg.",
    )
    throughput_enabled: bool = Field(
        default=True,
        description="Run the throughput-based loop (predict demand, size from the performance profile); default true.",
    )
    load_enabled: bool = Field(
        default=False,
        description="Run the load-based loop on ForwardPassMetrics (+/-1 replica per load interval); default false.",
    )
    adjustment_interval_s: float = Field(
        default=180.0,
        gt=0,
        description=(
            "Throughput loop period, seconds > 0 (default 180, Dynamo adjustment_interval). The sizing's traffic "
            "sample spans at least one interval, at most an hour (the span of the pooled sizes, "
            "planner.core.sizing.SIZE_HISTORY_S) unless its first look needs more."
        ),
    )
    load_adjustment_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="Load loop period, seconds > 0 (default 5); must be shorter than adjustment_interval_s.",
    )
    ttft_ms: float = Field(
        default=500.0, gt=0, le=MAX_TTFT_MS, description="TTFT SLA, milliseconds, 0 < value <= 3600000 (default 500)."
    )
    itl_ms: float = Field(
        default=50.0, gt=0, le=MAX_ITL_MS, description="ITL SLA, milliseconds, 0 < value <= 10000 (default 50)."
    )
    correction_enabled: bool = Field(
        default=True,
        description="Apply correction factors actual/expected TTFT (prefill) "
        "and ITL (decode); false = factors 1. Default true.",
    )
    predictor: Predictor = Field(
        default="arima",
        description="Demand predictor: constant, arima, kalman, prophet or auto (default arima, the Dynamo default).",
    )
    predictor_log1p: bool = Field(
        default=False, description="ARIMA: fit on log1p(values) and predict expm1 (reference option); default false."
    )
    predictor_min_points: int = Field(
        default=5,
        ge=1,
        le=MAX_INT64,
        description="ARIMA / Prophet: points needed before the model is "
        "used (constant fallback before), >= 1 (default 5).",
    )
    arima_refit_every: int = Field(
        default=10,
        ge=1,
        le=MAX_INT64,
        description="ARIMA: when the fitted model is degenerate (order "
        "(0,d,0)), refit after this many new points, >= 1 "
        "(default 10).",
    )
    kalman_q_level: float = Field(
        default=1.0,
        ge=0,
        description='Kalman: process noise of the level, >= 0 (default 1.0, docs/architecture.md "Load predictors").',
    )
    kalman_q_trend: float = Field(
        default=0.1,
        ge=0,
        description='Kalman: process noise of the trend, >= 0 (default 0.1, docs/architecture.md "Load predictors").',
    )
    kalman_r: float = Field(
        default=10.0,
        ge=0,
        description='Kalman: measurement noise, >= 0 (default 10.0, docs/architecture.md "Load predictors").',
    )
    kalman_min_points: int = Field(
        default=5,
        ge=1,
        le=MAX_INT64,
        description="Kalman: points needed before the filter is used, >= 1 "
        '(default 5, docs/architecture.md "Load predictors").',
    )
    prophet_window: int = Field(
        default=50,
        ge=1,
        le=MAX_INT64,
        description="Prophet: fit on the last this-many points, >= 1 (default "
        '50, docs/architecture.md "Load predictors").',
    )
    prophet_refit_every: int = Field(
        default=1,
        ge=1,
        le=MAX_INT64,
        description="Prophet: refit every this-many intervals, >= 1 (1 = "
        "every interval, the reference); in between, predict "
        "from the last fit. The three series (count, ISL, OSL) "
        "are staggered so a tick carries one fit.",
    )
    auto_candidates: tuple[Candidate, ...] = Field(
        default=("constant", "kalman", "arima"),
        min_length=1,
        description=(
            "auto predictor: candidates whose rolling one-step error is compared, a non-empty list of constant, "
            "arima, kalman, prophet (default constant, kalman, arima)."
        ),
    )
    auto_error_window: int = Field(
        default=10,
        ge=1,
        le=MAX_INT64,
        description="auto predictor: number of recent one-step absolute errors averaged, >= 1 (default 10).",
    )
    prefill: PoolLimits = Field(default_factory=_pool, description="Replica limits of the prefill pool.")
    decode: PoolLimits = Field(default_factory=_pool, description="Replica limits of the decode pool.")
    agg: PoolLimits = Field(default_factory=_pool, description="Replica limits of the aggregated pool.")
    max_gpu_budget: int = Field(
        default=8,
        ge=0,
        le=MAX_INT64,
        description="Total GPUs all pools may occupy, counting every replica "
        'requested, >= 0 (default 8, docs/architecture.md "Planner facts").',
    )
    min_gpu_budget: int = Field(
        default=0,
        ge=0,
        le=MAX_INT64,
        description="Total GPUs the pools should occupy at least, >= 0 (0, the default, = no minimum).",
    )
    load_prefill_window_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Load loop, agg ITL estimate: each engine's prefill work rate (prefill tokens per second of pass wall "
            "time) is taken over the passes it reported in the last this-many seconds, > 0 (default 30: several load "
            "intervals, so the few passes relayed per tick average out; planner.core.load.estimate_itl_ms)."
        ),
    )
    load_sensitivity: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Load loop: scale down only when every engine is "
        "below SLA x this factor, 0 < value <= 1 (default "
        "0.8).",
    )
    max_num_batched_tokens: int = Field(
        default=8192,
        ge=1,
        le=MAX_INT64,
        description="Engine chunk size used to simulate the prefill "
        "queue for the TTFT estimate, tokens >= 1 (default "
        "8192).",
    )
    regression_buckets: int = Field(
        default=16,
        ge=1,
        le=MAX_REGRESSION_BUCKETS,
        description="Load regressions: token-count buckets (log2-spaced) "
        "used to retain samples evenly, 1 <= value <= 64 (default 16; 64 buckets cover every int64 token count).",
    )
    regression_samples_per_bucket: int = Field(
        default=32,
        ge=1,
        le=MAX_INT64,
        description="Load regressions: most recent samples kept "
        "per bucket (memory is bounded by buckets x "
        "this), >= 1 (default 32).",
    )
    regression_min_samples: int = Field(
        default=8,
        ge=2,
        le=MAX_INT64,
        description="Load regressions: samples needed before an estimate is made (none = unknown), >= 2 (default 8).",
    )
    engine_stale_s: float = Field(
        default=30.0,
        gt=0,
        description="An engine that sent no ForwardPassMetrics for this long "
        "is no longer counted, seconds > 0 (default 30).",
    )
    pending_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="A decision not reflected in ready replicas after "
        "this long is abandoned and re-planned, seconds > 0 "
        "(default 1800, Dynamo VirtualConnector timeout).",
    )
    scale_down_cooldown_s: float = Field(
        default=0.0,
        ge=0,
        description="No scale-down of a pool within this long after it "
        "was scaled up, seconds >= 0 (0, the default, = "
        "off).",
    )
    external_change_grace_s: float = Field(
        default=180.0,
        ge=0,
        description="After adopting a replica count set by someone "
        "else, leave that pool alone this long, seconds "
        ">= 0 (default 180).",
    )
    load_max_scale_up_factor: float = Field(
        default=2.0,
        ge=1,
        description=(
            "Load loop: when every engine's estimated TTFT is r x the target, scale to ceil(current x min(r, this)) "
            "replicas (at least +1), >= 1 (default 2; 1.0 = the reference's +1 per interval)."
        ),
    )
    early_sizing_s: float | None = Field(
        default=30.0,
        gt=0,
        description=(
            "Early sizing, scale-up only, every this-many seconds (> 0) between the throughput loop's intervals, "
            "instead of holding a whole adjustment_interval_s with what the last sizing chose. The first, at start + "
            "this, sizes every pool from the traffic seen since the start (its count scaled to a full interval); each "
            "later one tests the latest forecast on the arrivals since that sizing (the latest 1, 2, 4, ... 10 s bins "
            "and the whole span, dispersion-scaled Poisson, 1 % level over all: planner.core.loops.forecast_exceeded) "
            "and, when they exceed it, sizes again at the highest rate a stretch supports; a full sizing tests the "
            "latest such span against its new forecast too. The predictors are not fed. Default 30: a few hundred "
            "requests at a few requests per second, and a 60 s "
            "start-up well inside an interval. A value >= adjustment_interval_s means no early sizing. null = off "
            "(reference: sizing only every interval, first at start + interval)."
        ),
    )
    simulated_sizing: bool = Field(
        default=True,
        description=(
            "Throughput loop: size the pools by simulation (planner.core.sizing) -- replay a traffic sample of the "
            "coming interval through candidate fleets of the deployment's engines and take the cheapest whose "
            "simulated attainment meets sla_attainment_target by a binomial bound. Used when the driver gives the "
            "planner an engine model (Planner(..., evaluator=)) and the target is set; otherwise, or false, the "
            "closed-form sizing of planner.core.throughput. Default true."
        ),
    )
    sla_attainment_target: float | None = Field(
        default=0.995,
        gt=0,
        le=MAX_ATTAINMENT_TARGET,
        description=(
            "Share of requests that should meet both SLA targets (TTFT and own mean ITL), 0 < value <= 0.9999 "
            "(default 0.995): the bar of the sizing by simulation (planner.core.sizing). null = size by the "
            "closed-form reference formulas. At most four nines: the sizing judges each candidate fleet on at least "
            "2 z^2 / (1 - value) simulated requests (z = 1.645), up to 8 times that: 54,119 to 432,952 at 0.9999 "
            "(about 2 GB), ten times more for each further nine."
        ),
    )

    _attainment_why = upper_bound_why("sla_attainment_target", ATTAINMENT_LIMIT_WHY)

    def __post_init__(self) -> None:
        """The cross-field checks; raises :class:`~dynoplan.settings.Problems` with every line it finds."""
        p: list[str] = []
        if self.load_adjustment_interval_s >= self.adjustment_interval_s:
            p.append(
                f"load_adjustment_interval_s={self.load_adjustment_interval_s!r}: expected less than "
                f"adjustment_interval_s={self.adjustment_interval_s!r}"
            )
        if not (self.throughput_enabled or self.load_enabled):
            p.append("throughput_enabled=false and load_enabled=false: expected at least one loop enabled")
        if self.min_gpu_budget > self.max_gpu_budget:
            p.append(f"min_gpu_budget={self.min_gpu_budget!r}: expected <= max_gpu_budget={self.max_gpu_budget!r}")
        min_gpus = 0
        for pool in ("prefill", "decode", "agg"):
            lim = self.limits(pool)
            if lim.max_replicas is not None and lim.min_replicas > lim.max_replicas:
                p.append(
                    f"{pool}.min_replicas={lim.min_replicas!r}: expected <= {pool}.max_replicas={lim.max_replicas!r}"
                )
            if pool in POOLS_BY_MODE[self.mode]:
                min_gpus += lim.min_replicas * lim.gpus_per_engine
        if min_gpus > self.max_gpu_budget:
            p.append(
                f"max_gpu_budget={self.max_gpu_budget!r}: expected >= {min_gpus} GPUs, what the pools' "
                f"min_replicas x gpus_per_engine need"
            )
        if p:
            raise Problems(p)

    @property
    def pools(self) -> tuple[str, ...]:
        """Pools planned in this mode, e.g. ``("prefill", "decode")``."""
        return POOLS_BY_MODE[self.mode]

    def limits(self, pool: str) -> PoolLimits:
        """The :class:`PoolLimits` of ``pool``."""
        return typing.cast(PoolLimits, getattr(self, pool))

    def with_limits(self, limits: Mapping[str, PoolLimits]) -> PlannerConfig:
        """A validated copy with the :class:`PoolLimits` of the pools named in ``limits`` (``prefill``,
        ``decode``, ``agg``) replaced. Raises ConfigError naming a key that is not a pool."""
        unknown = [p for p in limits if p not in _POOL_NAMES]
        if unknown:
            raise ConfigError(f"pool={spell(unknown[0])}: expected one of {', '.join(_POOL_NAMES)}")
        return dataclasses.replace(
            self,
            prefill=limits.get("prefill", self.prefill),
            decode=limits.get("decode", self.decode),
            agg=limits.get("agg", self.agg),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (round-trips through :func:`config_from_mapping`)."""
        out = dataclasses.asdict(self)
        out["auto_candidates"] = list(self.auto_candidates)
        return out


# ----------------------------------------------------------------------------------------------- sources

_POOL_NAMES = ("prefill", "decode", "agg")
_POOL_KEYS = tuple(f.name for f in dataclasses.fields(PoolLimits))
_TOP = tuple(f.name for f in dataclasses.fields(PlannerConfig))

REMOVED_SETTINGS: frozenset[str] = frozenset(
    {
        "sizing",
        "sizing_percentile",
        "scale_down_hysteresis",
        "scale_up_tolerance",
        "prefill_queueing",
        "prefill_ttft_tail",
        "prefill_length_mix",
        "agg_prefill_interference",
        "agg_itl_tail",
        "agg_itl_tail_calibration",
        "decode_kv_tail",
        "attainment_gain",
        "attainment_significance_z",
        "attainment_discount_unservable",
        "attainment_demand_guard",
        "attainment_relax",
        "attainment_max_headroom",
    }
)
"""Settings of the closed-form sizing rules that the sizing by simulation replaced (docs/planner-core.md)."""


def _unknown(key: str) -> str:
    """The problem line of an unknown ``key``: a removed rule's setting, a pool key without its pool, or the
    closest setting names (difflib ratio >= 0.6); a dotted ``<pool>.<key>`` (``--planner-set
    agg.max_replica=2``) gets the closest pool key, as the same key under an ``agg:`` section does."""
    if key in REMOVED_SETTINGS:
        hint = (
            ' (removed: the sizing by simulation replaced that rule, see docs/planner-core.md "Sizing by simulation"; '
            "simulated_sizing=false gives the reference formulas)"
        )
    elif key in _POOL_KEYS:
        hint = (
            f" (pool limits are per pool: {', '.join(f'{p}_{key}' for p in _POOL_NAMES)}, "
            f"or {key} under a prefill:/decode:/agg: section)"
        )
    elif key.partition(".")[0] in _POOL_NAMES:
        head, _, tail = key.partition(".")
        close = difflib.get_close_matches(tail, list(_POOL_KEYS), n=1)
        if close and close[0] == tail:  # the right key, written dotted where a file nests it
            hint = f" (in a file, write it under its section: {head}: {{{tail}: ...}})"
        else:
            hint = f" (did you mean {head}.{close[0]}?)" if close else ""
    else:
        close = difflib.get_close_matches(key, list(_TOP), n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return f"{key}: unknown setting{hint}"


def _field_kinds() -> dict[str, str]:
    """:func:`dynoplan.settings_text.field_kinds` of PlannerConfig and its pools (``agg.max_replicas``)."""
    from dynoplan.settings_text import field_kinds

    out = field_kinds(PlannerConfig)
    for p in _POOL_NAMES:
        out.update(field_kinds(PoolLimits, p + "."))
    return out


def setting_name(key: str) -> str:
    """The one spelling of a planner setting's key as command-line text writes it: ``-`` read as ``_`` and a
    dotted pool key (``agg.gpus_per_engine``) as the flat one (``agg_gpus_per_engine``), as
    :func:`parse_cli_values` and :func:`config_from_mapping` read them; so ``--planner-set`` and
    ``planner:k=v`` find a setting given twice in two spellings (:func:`dynoplan.settings_text.assignments`)."""
    k = str(key).replace("-", "_")
    head, dot, tail = k.partition(".")
    return f"{head}_{tail}" if dot and head in _POOL_NAMES and tail in _POOL_KEYS else k


def parse_cli_values(data: Mapping[str, Any]) -> dict[str, Any]:
    """``KEY=VALUE`` text (``--planner-set``, ``planner:key=value``, ``--ttft-ms 300``) as typed values: each
    string value read by :func:`dynoplan.settings_text.text_value` with its setting's type (flat pool keys
    ``agg_max_replicas`` included; ``<pool>.<key>`` is read as the flat ``<pool>_<key>``). Other keys are
    kept as given (``-`` or ``_``); values that are not strings, and unknown keys' values (read as YAML
    scalars), pass on for the validation to judge."""
    from dynoplan.settings_text import text_value

    kinds = _field_kinds()
    out: dict[str, Any] = {}
    for key, value in data.items():
        k = str(key).replace("-", "_")
        head, dot, tail = k.partition(".")
        if dot and head in _POOL_NAMES and tail in _POOL_KEYS:  # agg.max_replicas: the flat agg_max_replicas
            key = k = f"{head}_{tail}"
        pool = next((p for p in _POOL_NAMES if k.startswith(p + "_") and k[len(p) + 1 :] in _POOL_KEYS), None)
        kind = kinds.get(f"{pool}.{k[len(pool) + 1 :]}" if pool else k, "")
        out[key] = text_value(value, kind) if isinstance(value, str) else value
    return out


def config_from_mapping(
    data: Mapping[str, Any], *, source: str | None = None, base: PlannerConfig | None = None, cli: bool = False
) -> PlannerConfig:
    """Build a :class:`PlannerConfig` from plain data, on top of ``base`` (default: the defaults).

    Keys: any field name (``-`` read as ``_``); pool sections ``prefill``/``decode``/``agg`` as mappings of
    ``min_replicas``/``max_replicas``/``gpus_per_engine`` or flat ``<pool>_<key>`` keys. Values must have the
    setting's type (YAML/JSON values); ``cli=True`` reads string values as command-line text first
    (:func:`parse_cli_values`). Raises ConfigError listing unknown keys and invalid values at once.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping of settings, got {type(data).__name__}", source=source)
    if cli:
        data = parse_cli_values(data)
    merged = (base or PlannerConfig()).to_dict()
    problems: list[str] = []
    for key, value in data.items():
        k = str(key).replace("-", "_")
        if k in _POOL_NAMES and isinstance(value, Mapping):
            merged[k] = {**merged[k], **{str(pk).replace("-", "_"): pv for pk, pv in value.items()}}
            continue
        pool = next((p for p in _POOL_NAMES if k.startswith(p + "_") and k[len(p) + 1 :] in _POOL_KEYS), None)
        if pool is not None:
            merged[pool] = {**merged[pool], k[len(pool) + 1 :]: value}
        elif k in _TOP:
            merged[k] = value
        else:
            problems.append(_unknown(k))
    try:
        cfg = build(PlannerConfig, merged)
    except ConfigError as e:
        problems.extend(e.problems)
    if problems:
        raise ConfigError(problems, source=source)
    return cfg


def absent_pool_problems(data: Mapping[str, Any], cfg: PlannerConfig) -> list[str]:
    """Command-line settings of a pool the config's mode does not have (``prefill.min_replicas=2`` with mode
    agg): refused, since nothing would read them. Files may carry every pool's section (one file for several
    modes); a flag names one setting on purpose."""
    out = []
    for key, value in data.items():
        k = str(key).replace("-", "_")
        head, dot, tail = k.partition(".")
        pool = head if dot and head in _POOL_NAMES else None
        if pool is None and k in _POOL_NAMES and isinstance(value, Mapping):
            pool = k
        if pool is None:
            pool = next((p for p in _POOL_NAMES if k.startswith(p + "_") and k[len(p) + 1 :] in _POOL_KEYS), None)
        if pool is not None and pool not in cfg.pools:
            out.append(
                f"{key}={value if isinstance(value, str) else spell(value)}: mode {cfg.mode} has no {pool} pool, "
                f"expected a setting of "
                f"{' or '.join(cfg.pools)}"
            )
    return out


def planner_section(loaded: Mapping[str, Any], source: str | None = None) -> dict[str, Any]:
    """A settings file's planner settings: the file itself, or the mapping under its ``planner:`` key when that is
    the file's only key. Raises ConfigError (naming ``source``) for a ``planner:`` mapping beside other keys: the
    settings are either flat or all under ``planner:``, and one half would otherwise be read as an unknown
    setting named ``planner``."""
    if "planner" in loaded and isinstance(loaded["planner"], Mapping):
        if len(loaded) == 1:
            return dict(loaded["planner"])
        others = ", ".join(str(k) for k in loaded if k != "planner")
        raise ConfigError(
            f"planner: a section beside other keys ({others}); expected the settings either all under planner: "
            "or all at the top level",
            source=source,
        )
    return dict(loaded)


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> PlannerConfig:
    """Read a YAML or JSON file (:func:`dynoplan.settings_text.load_file`: one grammar for every settings
    file; a lone ``planner:`` mapping is looked into), apply ``overrides`` on top, validate.

    ``overrides`` are command-line values: a string is read as in :func:`parse_cli_values`, other values are
    taken as they are. Raises ConfigError (naming the file) when it cannot be read or parsed, a key is given
    twice or a value is invalid.
    """
    from dynoplan.settings_text import load_file

    data: dict[str, Any] = {}
    src = str(path) if path is not None else None
    if path is not None:
        data.update(planner_section(load_file(path, src, "config file"), src))
    for k, v in parse_cli_values(overrides or {}).items():
        k = k.replace("-", "_")
        if k in _POOL_NAMES and isinstance(v, Mapping) and isinstance(data.get(k), Mapping):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return config_from_mapping(data, source=src)


def _description(f: dataclasses.Field[Any]) -> str:
    """A settings field's ``description`` (its default is the ``Field(default=..., description=...)`` it was
    declared with)."""
    spec = f.default
    assert isinstance(spec, FieldInfo), f"{f.name}: declared without Field(...)"
    return str(spec.description)


def _flag_specs() -> list[tuple[str, str]]:
    """(dest, help) of every CLI flag: top-level settings and flat pool keys; the help is the field's
    description."""
    specs = []
    for f in dataclasses.fields(PlannerConfig):
        if f.name in _POOL_NAMES:
            for pf in dataclasses.fields(PoolLimits):
                specs.append((f"{f.name}_{pf.name}", f"{f.name} pool: {_description(pf)}"))
        else:
            specs.append((f.name, _description(f)))
    return specs


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config PATH`` and one ``--<field>`` flag per setting (values read by :func:`parse_cli_values`)."""
    g = parser.add_argument_group("planner settings (override --config)")
    g.add_argument(
        "--config", dest="planner_config", default=None, metavar="PATH", help="planner settings file (.yaml/.yml/.json)"
    )
    for dest, help_text in _flag_specs():
        g.add_argument(
            "--" + dest.replace("_", "-"),
            dest="planner__" + dest,
            default=None,
            metavar="V",
            help=help_text.replace("%", "%%"),
        )


def config_from_args(args: argparse.Namespace) -> PlannerConfig:
    """The config described by ``--config`` plus every flag given (flags win)."""
    overrides = {k[len("planner__") :]: v for k, v in vars(args).items() if k.startswith("planner__") and v is not None}
    return load_config(getattr(args, "planner_config", None), overrides)

"""The planner's one settings object: :class:`PlannerConfig` (frozen, validated at construction).

Defaults follow the Dynamo Planner design (DESIGN.md "Planner facts"): adjustment interval 180 s, load
interval 5 s, TTFT 500 ms, ITL 50 ms, min_endpoint 1, max_gpu_budget 8, Kalman q_level 1.0,
q_trend 0.1, r 10.0, min points 5, Prophet window 50, VirtualConnector timeout 1800 s (used here as
the pending-action timeout). Fields beyond the reference (the sizing by simulation, the auto predictor,
...) document their own defaults.

Sources: :func:`config_from_mapping` (a dict, e.g. parsed YAML/JSON; nested ``prefill:``/``decode:``/
``agg:`` pool sections or flat ``prefill_min_replicas`` keys), :func:`load_config` (a ``.yaml``/``.yml``/
``.json`` file plus overrides), :func:`add_config_arguments` / :func:`config_from_args` (CLI flags
``--ttft-ms 300 --prefill-max-replicas 4``; flags win over the file). Every invalid value is reported
in one :class:`~planner.errors.ConfigError` naming the field, the value and what was expected.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from planner.errors import ConfigError

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

PREDICTORS: tuple[str, ...] = ("constant", "arima", "kalman", "prophet", "auto")


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """Replica limits of one worker pool (prefill, decode or agg).

    ``min_replicas`` (default 1 = Dynamo ``min_endpoint``), ``max_replicas`` (``None`` = only the GPU
    budget limits it), ``gpus_per_engine`` (GPUs one replica occupies, default 1).
    """

    min_replicas: int = 1
    max_replicas: int | None = None
    gpus_per_engine: int = 1


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Every knob of the planner core. Construct directly or via :func:`config_from_mapping`.

    Raises :class:`~planner.errors.ConfigError` listing every invalid field at once.
    """

    mode: str = "disagg"
    """One of :data:`MODES`."""
    throughput_enabled: bool = True
    """Run the throughput-based loop (predict demand, size from the performance profile)."""
    load_enabled: bool = False
    """Run the load-based loop on ForwardPassMetrics (+/-1 replica per load interval)."""
    adjustment_interval_s: float = 180.0
    """Throughput loop period, seconds (Dynamo ``adjustment_interval`` default 180)."""
    load_adjustment_interval_s: float = 5.0
    """Load loop period, seconds (default 5); must be shorter than ``adjustment_interval_s``."""
    ttft_ms: float = 500.0
    """TTFT SLA, milliseconds (default 500)."""
    itl_ms: float = 50.0
    """ITL SLA, milliseconds (default 50)."""
    correction_enabled: bool = True
    """Apply correction factors actual/expected TTFT (prefill) and ITL (decode); False = factors 1."""
    predictor: str = "arima"
    """Demand predictor, one of :data:`PREDICTORS` (Dynamo default ``arima``)."""
    predictor_log1p: bool = False
    """ARIMA: fit on log1p(values) and predict expm1 (reference option)."""
    predictor_min_points: int = 5
    """ARIMA / Prophet: points needed before the model is used (constant fallback before)."""
    arima_refit_every: int = 10
    """ARIMA: when the fitted model is degenerate (order (0,d,0)), refit after this many new points."""
    kalman_q_level: float = 1.0
    kalman_q_trend: float = 0.1
    kalman_r: float = 10.0
    kalman_min_points: int = 5
    prophet_window: int = 50
    """Prophet: fit on the last this-many points (default 50)."""
    prophet_refit_every: int = 1
    """Prophet: refit every this-many intervals (1 = every interval, the reference); in between, predict
    from the last fit. The three series (count, ISL, OSL) are staggered so a tick carries one fit."""
    auto_candidates: tuple[str, ...] = ("constant", "kalman", "arima")
    """``auto`` predictor: candidates whose rolling one-step error is compared."""
    auto_error_window: int = 10
    """``auto`` predictor: number of recent one-step absolute errors averaged."""
    prefill: PoolLimits = field(default_factory=PoolLimits)
    decode: PoolLimits = field(default_factory=PoolLimits)
    agg: PoolLimits = field(default_factory=PoolLimits)
    max_gpu_budget: int = 8
    """Total GPUs all pools may occupy, counting every replica requested (default 8)."""
    min_gpu_budget: int = 0
    """Total GPUs the pools should occupy at least (0 = no minimum)."""
    load_prefill_window_s: float = 30.0
    """Load loop, agg ITL estimate: each engine's prefill work rate (prefill tokens per second of pass wall
    time) is taken over the passes it reported in the last this-many seconds (a window of several load
    intervals, so the few passes relayed per tick average out; :func:`planner.core.load.estimate_itl_ms`)."""
    load_sensitivity: float = 0.8
    """Load loop: scale down only when every engine is below SLA x this factor (0 < s <= 1)."""
    max_num_batched_tokens: int = 8192
    """Engine chunk size used to simulate the prefill queue for the TTFT estimate (default 8192)."""
    regression_buckets: int = 16
    """Load regressions: token-count buckets (log2-spaced) used to retain samples evenly."""
    regression_samples_per_bucket: int = 32
    """Load regressions: most recent samples kept per bucket (memory is bounded by buckets x this)."""
    regression_min_samples: int = 8
    """Load regressions: samples needed before an estimate is made (none = unknown)."""
    engine_stale_s: float = 30.0
    """An engine that sent no ForwardPassMetrics for this long is no longer counted."""
    pending_timeout_s: float = 1800.0
    """A decision not reflected in ready replicas after this long is abandoned and re-planned
    (Dynamo VirtualConnector default 1800 s)."""
    scale_down_cooldown_s: float = 0.0
    """No scale-down of a pool within this long after it was scaled up (0 = off)."""
    external_change_grace_s: float = 180.0
    """After adopting a replica count set by someone else, leave that pool alone this long."""
    load_max_scale_up_factor: float = 2.0
    """Load loop: when every engine's estimated TTFT is r x the target, scale to ceil(current x min(r, this))
    replicas (at least +1); 1.0 = the reference's +1 per interval."""
    first_sizing_s: float | None = 30.0
    """Early sizing: at start + this (seconds), size every pool from the traffic seen since the start (its
    count scaled to a full interval; lengths and histograms as observed) and scale up only, instead of
    waiting a whole ``adjustment_interval_s`` with whatever fleet was deployed; the predictors are not fed.
    30 s holds a few hundred requests at a few requests per second (the count is within ~10 %) and leaves a
    60 s start-up well inside the first interval. None = off (reference: first sizing at start + interval)."""
    demand_error_quantile: float | None = 0.9
    """Burst-aware demand: the predicted request count is multiplied by this quantile of the recent one-step
    ratios ``observed / predicted`` (floored at 1, so it never shrinks demand), the load the fleet must expect
    given how far the predictor has been short; None = off (size for the point prediction, reference)."""
    demand_error_window: int = 20
    """Burst-aware demand: most recent ratios kept."""
    demand_error_min_points: int = 3
    """Burst-aware demand: ratios needed before the factor is applied (1 before)."""
    simulated_sizing: bool = True
    """Throughput loop: size the pools by simulation (:mod:`planner.core.sizing`) -- replay a traffic sample of the
    coming interval through candidate fleets of the deployment's engines and take the cheapest whose simulated
    attainment meets ``sla_attainment_target`` by a binomial bound. Used when the driver gives the planner an
    engine model (``Planner(..., evaluator=)``) and the target is set; otherwise, or False, the closed-form
    sizing of :mod:`planner.core.throughput`."""
    sla_attainment_target: float | None = 0.995
    """Share of requests that should meet both SLA targets (TTFT and own mean ITL), 0 < f < 1: the bar of the sizing
    by simulation (:mod:`planner.core.sizing`). None = size by the closed-form reference formulas."""

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise ConfigError(problems)

    @property
    def pools(self) -> tuple[str, ...]:
        """Pools planned in this mode, e.g. ``("prefill", "decode")``."""
        return POOLS_BY_MODE[self.mode]

    def limits(self, pool: str) -> PoolLimits:
        """The :class:`PoolLimits` of ``pool``."""
        return typing.cast(PoolLimits, getattr(self, pool))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (round-trips through :func:`config_from_mapping`)."""
        out = dataclasses.asdict(self)
        out["auto_candidates"] = list(self.auto_candidates)
        return out


def _validate(c: PlannerConfig) -> list[str]:
    p: list[str] = []

    def pos(name: str, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            p.append(f"{name}={v!r}: expected a finite number > 0")

    def nonneg(name: str, v: float) -> None:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            p.append(f"{name}={v!r}: expected a finite number >= 0")

    if c.mode not in MODES:
        p.append(f"mode={c.mode!r}: expected one of {', '.join(MODES)}")
    for n in ("adjustment_interval_s", "load_adjustment_interval_s", "ttft_ms", "itl_ms", "engine_stale_s",
              "pending_timeout_s", "load_prefill_window_s"):
        pos(n, getattr(c, n))
    for n, top in (("ttft_ms", MAX_TTFT_MS), ("itl_ms", MAX_ITL_MS)):
        v = getattr(c, n)
        if isinstance(v, (int, float)) and math.isfinite(v) and v > top:
            p.append(f"{n}={v!r}: expected at most {top:.0f} ms")
    if c.sla_attainment_target is not None and not (
            isinstance(c.sla_attainment_target, (int, float)) and 0 < c.sla_attainment_target < 1):
        p.append(f"sla_attainment_target={c.sla_attainment_target!r}: expected 0 < value < 1 or null")
    if not (isinstance(c.load_max_scale_up_factor, (int, float)) and math.isfinite(c.load_max_scale_up_factor)
            and c.load_max_scale_up_factor >= 1):
        p.append(f"load_max_scale_up_factor={c.load_max_scale_up_factor!r}: expected a finite number >= 1")
    # first_sizing_s >= adjustment_interval_s is valid and means no early sizing (the first interval comes first)
    if c.first_sizing_s is not None and not (isinstance(c.first_sizing_s, (int, float)) and 0 < c.first_sizing_s):
        p.append(f"first_sizing_s={c.first_sizing_s!r}: expected seconds > 0, or null")
    if c.demand_error_quantile is not None and not (
            isinstance(c.demand_error_quantile, (int, float)) and 0 < c.demand_error_quantile <= 1):
        p.append(f"demand_error_quantile={c.demand_error_quantile!r}: expected 0 < value <= 1 or null")
    for n in ("scale_down_cooldown_s", "external_change_grace_s", "kalman_q_level", "kalman_q_trend", "kalman_r"):
        nonneg(n, getattr(c, n))
    if (isinstance(c.load_adjustment_interval_s, (int, float)) and isinstance(c.adjustment_interval_s, (int, float))
            and c.load_adjustment_interval_s >= c.adjustment_interval_s):
        p.append(f"load_adjustment_interval_s={c.load_adjustment_interval_s!r}: expected less than "
                 f"adjustment_interval_s={c.adjustment_interval_s!r}")
    if not (c.throughput_enabled or c.load_enabled):
        p.append("throughput_enabled=False and load_enabled=False: expected at least one loop enabled")
    if c.predictor not in PREDICTORS:
        p.append(f"predictor={c.predictor!r}: expected one of {', '.join(PREDICTORS)}")
    bad = [x for x in c.auto_candidates if x not in PREDICTORS or x == "auto"]
    if bad or not c.auto_candidates:
        p.append(f"auto_candidates={list(c.auto_candidates)!r}: expected a non-empty list of "
                 f"{', '.join(x for x in PREDICTORS if x != 'auto')}")
    if not (isinstance(c.load_sensitivity, (int, float)) and 0 < c.load_sensitivity <= 1):
        p.append(f"load_sensitivity={c.load_sensitivity!r}: expected 0 < value <= 1")
    for n in ("predictor_min_points", "kalman_min_points", "prophet_window", "prophet_refit_every", "auto_error_window",
              "max_num_batched_tokens", "regression_buckets", "regression_samples_per_bucket",
              "regression_min_samples", "arima_refit_every", "demand_error_window", "demand_error_min_points"):
        v = getattr(c, n)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            p.append(f"{n}={v!r}: expected an integer >= 1")
    if c.regression_min_samples < 2 if isinstance(c.regression_min_samples, int) else False:
        p.append(f"regression_min_samples={c.regression_min_samples!r}: expected an integer >= 2")
    for n in ("max_gpu_budget", "min_gpu_budget"):
        v = getattr(c, n)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            p.append(f"{n}={v!r}: expected an integer >= 0")
    if isinstance(c.max_gpu_budget, int) and isinstance(c.min_gpu_budget, int) and c.min_gpu_budget > c.max_gpu_budget:
        p.append(f"min_gpu_budget={c.min_gpu_budget!r}: expected <= max_gpu_budget={c.max_gpu_budget!r}")
    min_gpus = 0
    for pool in ("prefill", "decode", "agg"):
        lim = getattr(c, pool)
        if not isinstance(lim, PoolLimits):
            p.append(f"{pool}={lim!r}: expected a pool section with min_replicas, max_replicas, gpus_per_engine")
            continue
        ok = True
        if not (isinstance(lim.min_replicas, int) and lim.min_replicas >= 0):
            p.append(f"{pool}.min_replicas={lim.min_replicas!r}: expected an integer >= 0")
            ok = False
        if lim.max_replicas is not None and not (isinstance(lim.max_replicas, int) and lim.max_replicas >= 0):
            p.append(f"{pool}.max_replicas={lim.max_replicas!r}: expected an integer >= 0 or null")
            ok = False
        if not (isinstance(lim.gpus_per_engine, int) and lim.gpus_per_engine >= 1):
            p.append(f"{pool}.gpus_per_engine={lim.gpus_per_engine!r}: expected an integer >= 1")
            ok = False
        if ok and lim.max_replicas is not None and lim.min_replicas > lim.max_replicas:
            p.append(f"{pool}.min_replicas={lim.min_replicas!r}: expected <= {pool}.max_replicas={lim.max_replicas!r}")
        if ok and c.mode in MODES and pool in POOLS_BY_MODE[c.mode]:
            min_gpus += lim.min_replicas * lim.gpus_per_engine
    if isinstance(c.max_gpu_budget, int) and min_gpus > c.max_gpu_budget:
        p.append(f"max_gpu_budget={c.max_gpu_budget!r}: expected >= {min_gpus} GPUs, what the pools' "
                 f"min_replicas x gpus_per_engine need")
    return p


# ----------------------------------------------------------------------------------------------- sources

_POOL_KEYS = tuple(f.name for f in fields(PoolLimits))
_TOP = {f.name: f for f in fields(PlannerConfig)}
_POOL_NAMES = ("prefill", "decode", "agg")


def _type_of(tp: Any) -> tuple[type, bool]:
    """(base type, optional?) of a field annotation string/type."""
    if isinstance(tp, str):
        tp = eval(tp, {"tuple": tuple, "PoolLimits": PoolLimits})  # noqa: S307 - our own annotations
    optional = False
    if isinstance(tp, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        tp = args[0]
    origin = typing.get_origin(tp)
    return (origin or tp), optional


def _a(noun: str) -> str:
    """``noun`` with its indefinite article ("an int", "a float")."""
    return f"{'an' if noun[:1] in ('a', 'e', 'i', 'o', 'u') else 'a'} {noun}"


def _coerce(name: str, value: Any, tp: Any, problems: list[str]) -> Any:
    base, optional = _type_of(tp)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null", "")):
        if optional:
            return None
        problems.append(f"{name}=None: expected {_a(base.__name__)}")
        return dataclasses.MISSING
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                return value.lower() in ("true", "1", "yes", "on")
            raise ValueError
        if base is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if not isinstance(value, str):
                raise ValueError
            return value
        if base is tuple:
            if isinstance(value, str):
                return tuple(x.strip() for x in value.split(",") if x.strip())
            if isinstance(value, (list, tuple)):
                return tuple(str(x) for x in value)
            raise ValueError
    except (TypeError, ValueError):
        pass
    problems.append(f"{name}={value!r}: expected {'a comma-separated list' if base is tuple else _a(base.__name__)}")
    return dataclasses.MISSING


REMOVED_SETTINGS: frozenset[str] = frozenset({
    "sizing", "sizing_percentile", "scale_down_hysteresis", "scale_up_tolerance", "prefill_queueing",
    "prefill_ttft_tail", "prefill_length_mix", "agg_prefill_interference", "agg_itl_tail", "agg_itl_tail_calibration",
    "decode_kv_tail", "attainment_gain", "attainment_significance_z", "attainment_discount_unservable",
    "attainment_demand_guard", "attainment_relax", "attainment_max_headroom"})
"""Settings of the closed-form sizing rules that the sizing by simulation replaced (docs/planner-core.md)."""


def _unknown_hint(key: str) -> str:
    """What the user probably meant by an unknown top-level ``key``: a removed rule's setting, a pool key without
    its pool, or the closest setting names (difflib ratio >= 0.6); empty when nothing is close."""
    if key in REMOVED_SETTINGS:
        return (" (removed: the sizing by simulation replaced that rule, see docs/planner-core.md \"How the planner "
                "sizes a fleet\"; simulated_sizing=false gives the reference formulas)")
    if key in _POOL_KEYS:
        return (f" (pool limits are per pool: {', '.join(f'{p}_{key}' for p in _POOL_NAMES)}, "
                f"or {key} under a prefill:/decode:/agg: section)")
    close = difflib.get_close_matches(key, list(_TOP), n=3)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def config_from_mapping(data: Mapping[str, Any], *, source: str | None = None,
                        base: PlannerConfig | None = None) -> PlannerConfig:
    """Build a :class:`PlannerConfig` from plain data, on top of ``base`` (default: the defaults).

    Keys: any field name; pool sections ``prefill``/``decode``/``agg`` as mappings of
    ``min_replicas``/``max_replicas``/``gpus_per_engine`` or flat ``<pool>_<key>`` keys. String values are
    parsed (so CLI strings work). Raises ConfigError listing unknown keys and invalid values at once.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping of settings, got {type(data).__name__}", source=source)
    base = base or PlannerConfig()
    problems: list[str] = []
    top: dict[str, Any] = {}
    pools: dict[str, dict[str, Any]] = {p: {} for p in _POOL_NAMES}
    for key, value in data.items():
        k = str(key).replace("-", "_")
        if k in _POOL_NAMES:
            if not isinstance(value, Mapping):
                problems.append(f"{k}={value!r}: expected a mapping with {', '.join(_POOL_KEYS)}")
                continue
            for pk, pv in value.items():
                pk = str(pk).replace("-", "_")
                if pk not in _POOL_KEYS:
                    problems.append(f"{k}.{pk}: unknown setting (expected one of {', '.join(_POOL_KEYS)})")
                else:
                    pools[k][pk] = pv
            continue
        pool_prefix = next((p for p in _POOL_NAMES if k.startswith(p + "_") and k[len(p) + 1:] in _POOL_KEYS), None)
        if pool_prefix is not None:
            pools[pool_prefix][k[len(pool_prefix) + 1:]] = value
        elif k in _TOP:
            top[k] = value
        else:
            problems.append(f"{k}: unknown setting{_unknown_hint(k)}")
    kwargs: dict[str, Any] = {}
    for k, v in top.items():
        cv = _coerce(k, v, _TOP[k].type, problems)
        if cv is not dataclasses.MISSING:
            kwargs[k] = cv
    pool_types = {f.name: f.type for f in fields(PoolLimits)}
    for pool, vals in pools.items():
        if not vals:
            continue
        cur = dataclasses.asdict(getattr(base, pool))
        for pk, pv in vals.items():
            cv = _coerce(f"{pool}.{pk}", pv, pool_types[pk], problems)
            if cv is not dataclasses.MISSING:
                cur[pk] = cv
        kwargs[pool] = PoolLimits(**cur)
    try:
        cfg = dataclasses.replace(base, **kwargs)
    except ConfigError as e:
        problems.extend(e.problems)
        cfg = None
    if problems:
        raise ConfigError(problems, source=source)
    assert cfg is not None
    return cfg


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> PlannerConfig:
    """Read a YAML (``.yaml``/``.yml``) or JSON file, apply ``overrides`` on top, validate.

    Raises ConfigError (naming the file) when it cannot be read or parsed or a value is invalid.
    """
    data: dict[str, Any] = {}
    src = str(path) if path is not None else None
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file: {e.strerror}", source=src) from None
        except UnicodeDecodeError as e:  # a binary or Latin-1 file
            raise ConfigError(f"cannot read config file: byte 0x{e.object[e.start]:02x} at offset {e.start}: "
                              "expected UTF-8 text", source=src) from None
        try:
            if p.suffix.lower() == ".json":
                loaded = json.loads(text)
            else:
                import yaml

                loaded = yaml.safe_load(text)
        except Exception as e:  # noqa: BLE001 - parser errors of either format
            mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"cannot parse config file{where}: {what} (expected a YAML or JSON mapping of "
                              f"setting: value)", source=src) from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"expected a mapping of settings at the top level, got {type(loaded).__name__}", source=src)
        if "planner" in loaded and isinstance(loaded["planner"], dict) and len(loaded) == 1:
            loaded = loaded["planner"]
        data.update(loaded)
    for k, v in (overrides or {}).items():
        k = k.replace("-", "_")
        if k in _POOL_NAMES and isinstance(v, Mapping) and isinstance(data.get(k), Mapping):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return config_from_mapping(data, source=src)


def _flag_specs() -> list[tuple[str, str]]:
    """(dest, help) of every CLI flag: top-level scalars and flat pool keys."""
    specs = []
    for f in fields(PlannerConfig):
        if f.name in _POOL_NAMES:
            for pk in _POOL_KEYS:
                specs.append((f"{f.name}_{pk}", f"{f.name} pool {pk}"))
        else:
            specs.append((f.name, f.name.replace("_", " ")))
    return specs


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config PATH`` and one ``--<field>`` flag per setting (values parsed like file values)."""
    g = parser.add_argument_group("planner settings (override --config)")
    g.add_argument("--config", dest="planner_config", default=None, metavar="PATH",
                   help="planner settings file (.yaml/.yml/.json)")
    for dest, help_text in _flag_specs():
        g.add_argument("--" + dest.replace("_", "-"), dest="planner__" + dest, default=None, metavar="V",
                       help=help_text)


def config_from_args(args: argparse.Namespace) -> PlannerConfig:
    """The config described by ``--config`` plus every flag given (flags win)."""
    overrides = {k[len("planner__"):]: v for k, v in vars(args).items()
                 if k.startswith("planner__") and v is not None}
    return load_config(getattr(args, "planner_config", None), overrides)

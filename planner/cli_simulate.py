"""``dynoplan simulate``: the closed loop — a trace through a simulated fleet whose size a policy controls.

Runs every ``--compare`` policy (default: ``planner``) on the same trace in virtual time, prints one rich
table and, with ``--out DIR``, writes summary.json / details.json / timeline.csv / requests.jsonl /
report.html (:mod:`planner.sim.report`). The planner's profile is ``--profile FILE.npz`` or, by default,
a fresh ``dynoplan profile`` sweep of the same engine configuration (:mod:`planner.sim.profile`).

Planner settings: defaults < ``--config FILE.yaml`` < ``--planner-set key=value`` (any PlannerConfig
field); ``--mode``, the SLA flags and the engine's ``max_num_batched_tokens`` are always applied.
User mistakes print one line (exit 2).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import tempfile
import time
import zipfile
from typing import TYPE_CHECKING, Any

import numpy as np

from dynoplan.errors import ConfigError, DynoplanError, ProfileError, SimulationConfigError
from dynoplan.fields import float_text, int_text
from dynoplan.settings import check
from mocker.arguments import (
    MAX_WORKERS,
    RATE_ENVELOPE_HELP,
    check_pool_engine_cores,
    engine_config_from_args,
    failed_requests_note,
    given_flags,
    kv_transfer_from_args,
    nonneg_float,
    nonneg_int,
    positive_float,
    use_one_line_errors,
    worker_count,
)
from mocker.traces import apply_rate_envelope, load_trace, parse_rate_envelope, scale_arrivals, time_limit_problem
from planner.arguments import (
    ATTAINMENT_EXPECTED,
    add_engine_arguments,
    add_transfer_arguments,
    attainment_text,
    check_out_not_inputs,
    warm_start_windows,
)
from planner.core import PlannerConfig, config_from_mapping, load_profile
from planner.core.config import (
    ATTAINMENT_LIMIT_WHY,
    MAX_ATTAINMENT_TARGET,
    MAX_ITL_MS,
    MAX_TTFT_MS,
    parse_cli_values,
    setting_name,
)

if TYPE_CHECKING:
    from planner.sim.runner import RunContext


def _at_most(top: float):
    """argparse type: a finite number in (0, ``top``] (milliseconds)."""

    def parse(text: str) -> float:
        v = positive_float(text)
        if v > top:
            raise argparse.ArgumentTypeError(f"{text!r}: expected at most {top:.0f} ms")
        return v

    return parse


POLICY_HELP = (
    "planner | planner:key=value,... | throughput-only | static:N | static:P+D | static:peak | static:auto | "
    "schedule:T=N,T=N,... (T=P+D disagg; first T=0) | hpa[:kv|running[:target]] | saturation"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``simulate`` flags on ``parser`` (argparse errors become one stderr line, exit 2)."""
    use_one_line_errors(parser, "dynoplan simulate")
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--trace",
        required=True,
        metavar="TRACE",
        help="Azure CSV, Mooncake JSONL or synthetic:... spec",
    )
    w.add_argument(
        "--arrival-speedup", type=positive_float, default=1.0, metavar="R", help="divide arrival times by R (default 1)"
    )
    w.add_argument("--rate-envelope", metavar="SPEC", help=RATE_ENVELOPE_HELP)
    w.add_argument(
        "--seed", type=nonneg_int, default=0, metavar="N", help="seed (synthetic workloads, routers; default 0)"
    )
    s = parser.add_argument_group("loop")
    s.add_argument(
        "--mode",
        choices=("agg", "disagg"),
        help="aggregated or prefill+decode pools (default: the --config file's mode, else agg)",
    )
    s.add_argument(
        "--compare",
        nargs="+",
        action="extend",
        metavar="POLICY",
        help=POLICY_HELP + " (repeatable: every --compare adds its policies; default planner)",
    )
    s.add_argument(
        "--startup-delay-s", type=nonneg_float, default=60.0, metavar="S", help="worker start-up delay (default 60)"
    )
    s.add_argument(
        "--sla-ttft-ms",
        type=_at_most(MAX_TTFT_MS),
        metavar="MS",
        help="TTFT target (default: the --config file's ttft_ms, else 500)",
    )
    s.add_argument(
        "--sla-itl-ms",
        type=_at_most(MAX_ITL_MS),
        metavar="MS",
        help="ITL target (default: the --config file's itl_ms, else 50)",
    )
    s.add_argument(
        "--router",
        choices=("round_robin", "least_loaded", "kv"),
        default="round_robin",
        help="routing among ready workers (default round_robin)",
    )
    s.add_argument(
        "--sample-interval-s",
        type=_sample_interval_s,
        metavar="S",
        help=f"timeline sampling (default {DEFAULT_SAMPLE_INTERVAL_S:g})",
    )
    s.add_argument(
        "--initial-replicas",
        metavar="N|P+D|auto",
        help="fleet at t=0 for dynamic policies (default auto: the planner's own sizing by simulation of the "
        "trace's first adjustment interval, as an operator would have deployed it); each pool "
        "within the planner's [min_replicas, max_replicas] and the total within max_gpu_budget, "
        "for the run's settings and each planner:k=v variant's (else exit 2, no clamping)",
    )
    s.add_argument(
        "--auto-attainment",
        type=_share,
        default=0.995,
        metavar="F",
        help="static:auto target, 0 < F <= 1 (default 0.995); only with static:auto in --compare",
    )
    s.add_argument(
        "--max-replicas",
        type=worker_count,
        default=64,
        metavar="N",
        help=f"per-pool cap for baselines and static:auto (at most {MAX_WORKERS})",
    )
    p = parser.add_argument_group("planner")
    p.add_argument("--config", dest="planner_config", metavar="FILE.yaml", help="planner settings file")
    p.add_argument(
        "--planner-set", action="append", default=[], metavar="KEY=VALUE", help="planner setting (repeatable)"
    )
    p.add_argument(
        "--attainment-target",
        type=_attainment_flag,
        metavar="F|off",
        help="planner SLA-attainment target (PlannerConfig.sla_attainment_target): share of requests "
        f"that should meet each SLA, 0 < F <= {MAX_ATTAINMENT_TARGET:g}, or off (default: the planner config's, "
        f"0.995); at most four nines: {ATTAINMENT_LIMIT_WHY}",
    )
    p.add_argument("--profile", metavar="FILE.npz", help="performance profile (default: profile the engine now)")
    p.add_argument("--warm-start", metavar="TRACE", help="warm-start the predictors from this trace's intervals")
    o = parser.add_argument_group("output")
    o.add_argument(
        "--out", metavar="DIR", help="write summary.json, details.json, timeline.csv, requests.jsonl, report.html"
    )
    o.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    add_engine_arguments(parser)
    add_transfer_arguments(parser)


OFF = "off"


def _attainment_flag(text: str) -> float | str:
    """argparse type of --attainment-target: ``off`` or a YAML null (feedback disabled) or a share 0 < F <= 0.9999
    (:func:`planner.arguments.attainment_text`, the grammar of ``planner:attainment_target=``)."""
    try:
        v = attainment_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {ATTAINMENT_EXPECTED}") from None
    return OFF if v is None else v


DEFAULT_SAMPLE_INTERVAL_S = 10.0
"""``--sample-interval-s`` when not given."""


def _sample_interval_s(text: str) -> float:
    """argparse type of ``--sample-interval-s``: seconds >= :data:`planner.sim.loop.MIN_STEP_S`."""
    from planner.sim.loop import MIN_STEP_S

    v = positive_float(text)
    if v < MIN_STEP_S:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected seconds >= {MIN_STEP_S:g} (the loop's smallest clock step)"
        )
    return v


def _share(text: str) -> float:
    """argparse type: a share 0 < F <= 1 (an attainment target)."""
    try:
        v = float_text(text)
    except ValueError:
        v = float("nan")
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a share 0 < F <= 1")
    return v


def _check_out_dir(path: str) -> None:
    """Create ``--out DIR`` and prove it writable before any simulation runs (a late failure would lose the
    results). Raises SimulationConfigError naming the path."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise SimulationConfigError(
            f"--out {path}: exists and is not a directory, expected a directory (created if missing)"
        )
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise SimulationConfigError(f"--out {path}: not a writable directory: {e.strerror or e}") from None


OUTPUT_FILES: tuple[str, ...] = ("summary.json", "details.json", "timeline.csv", "requests.jsonl", "report.html")


def _parse_initial(text: str | None, pools: tuple[str, ...]) -> dict[str, int] | None:
    if text is None or text == "auto":
        return None
    try:
        nums = [int_text(x) for x in text.split("+")]
    except ValueError:
        nums = []
    if len(nums) != len(pools):  # the range of each count is check_initial's (the planner's pool limits)
        raise SimulationConfigError(
            f"--initial-replicas={text!r}: expected {'N' if len(pools) == 1 else 'P+D'} "
            f"(whole numbers within the planner's min_replicas..max_replicas) or auto"
        )
    return dict(zip(pools, nums))


def _attainment(v: float | str | None) -> float | str | None:
    if v is None or isinstance(v, str):  # None or OFF: the flag's type returns no other text
        return v
    if v is not None and not 0 < v <= MAX_ATTAINMENT_TARGET:
        raise SimulationConfigError(f"--attainment-target={v!r}: expected {ATTAINMENT_EXPECTED}")
    return v


def _planner_set_problems(text: str, key: str, value: str) -> list[str]:
    """The problems of one ``--planner-set KEY=VALUE`` on its own (asked when the whole config failed), each
    naming the flag: ``--planner-set foo=1: unknown setting ...``, ``--planner-set ttft_ms="abc": expected a
    number`` (the value as it was read); ``[]`` when this item is not at fault."""
    try:
        config_from_mapping({key: value}, cli=True)
    except ConfigError as e:
        k = key.replace("-", "_")
        own = [p for p in e.problems if p.startswith((f"{k}:", f"{k}=", f"{k}."))]
        return [
            f"--planner-set {text}:{p[len(k) + 1 :]}" if p.startswith(f"{k}:") else f"--planner-set {p}" for p in own
        ]
    return []


TIMING_PROFILE_ARRAYS = ("decode_active_kv_tokens", "decode_itl")
"""Arrays only an engine timing profile (``--timing``) holds, not a planner profile."""


def _load_planner_profile(path: str) -> Any:
    """``--profile FILE``: the planner's performance profile. An engine timing profile given here (the
    other kind of .npz) gets the swapped-file message ``dynoplan profile --timing`` gives the other way
    round. Raises SimulationConfigError naming the flag and the file."""
    try:
        return load_profile(path)
    except ProfileError as e:
        if os.path.isfile(path):
            try:
                with np.load(path) as z:
                    names = set(z.files)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile):
                names = set()
            if set(TIMING_PROFILE_ARRAYS) <= names and "decode_kv_usage" not in names:
                raise SimulationConfigError(
                    f"--profile {path}: this looks like an engine timing profile (decode_active_kv_tokens, decode_itl, "
                    f"...); --profile needs a planner performance profile with arrays prefill_isl, prefill_ttft_ms, "
                    f"prefill_thpt_per_gpu, decode_kv_usage, decode_context_length, decode_itl_ms, decode_thpt_per_gpu "
                    f"(write one with dynoplan profile; engine timing profiles go to --timing)"
                ) from None
        raise SimulationConfigError(f"--profile {e}") from None


def _read_planner_file(path: str) -> dict[str, Any]:
    """``--config FILE``: read once (a pipe works too) by :func:`dynoplan.settings_text.load_file` (the one
    grammar of every settings file: a key given twice, a non-UTF-8 byte, a parser error are one line naming
    the file), a lone ``planner:`` mapping looked into. Returns the settings mapping for
    :func:`planner.core.config_from_mapping`. Raises ConfigError naming the flag and the file."""
    from dynoplan.settings_text import load_file
    from planner.core.config import planner_section

    return planner_section(load_file(path, f"--config {path}", "config file"), f"--config {path}")


def _read_engine_file(path: str) -> Any:
    """``--engine-config FILE``: read once (a pipe works too) by :func:`dynoplan.settings_text.load_file`;
    the mapping goes to :func:`mocker.arguments.engine_config_from_args`. Raises ConfigError naming the flag
    and the file."""
    from dynoplan.settings_text import load_file

    return load_file(path, f"--engine-config {path}", "engine config file")


def _planner_config(file_settings: dict[str, Any], overrides: dict[str, Any], source: str | None) -> PlannerConfig:
    """``file_settings`` (the ``--config`` file's mapping) with ``overrides`` on top (a pool section's keys
    merged into the file's, as :func:`planner.core.load_config` does), validated by
    :func:`planner.core.config_from_mapping`. Raises ConfigError naming the file."""
    data = dict(file_settings)
    for k, v in parse_cli_values(overrides).items():  # command-line text read by the setting's type
        k = k.replace("-", "_")
        if k in ("agg", "prefill", "decode") and isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k] = {**data[k], **v}
        else:
            data[k] = v
    return config_from_mapping(data, source=source)


def build_context(args: argparse.Namespace) -> RunContext:
    """Trace, engines, settings, planner config and profile from the flags (raises on user mistakes).

    Steps, in this order (a user mistake surfaces before any expensive work): read each settings file once
    (:func:`_read_inputs`), the planner config (:func:`_planner_settings`), the engine and its KV transfer
    (:func:`_engine_and_transfer`), the trace (:func:`_requests`), the pools' engines and the final planner
    config (:func:`_pools`), the initial fleet, the profile, the warm start. ``args.mode``,
    ``args.sla_ttft_ms`` and ``args.sla_itl_ms`` are filled in with the effective values."""
    # The simulation (engines, fleet, loop) imported here, not at module level: `simulate --help` needs only
    # the flags, and the simulation is a fifth of its start-up.
    from planner.sim.loop import SimSettings
    from planner.sim.profile import profile_engine
    from planner.sim.runner import RunContext, check_initial

    in_file, engine_file = _read_inputs(args)
    overrides, cfg0 = _planner_settings(args, in_file)
    engine, transfer = _engine_and_transfer(args, engine_file)
    check_pool_engine_cores("--max-replicas", args.max_replicas, engine, args)  # the baselines' largest pool
    reqs = _requests(args, engine.trace_block_size)
    engines, cfg = _pools(args, in_file, overrides, cfg0, engine)
    initial = _parse_initial(args.initial_replicas, tuple(engines))
    check_initial(initial, cfg)  # the run's settings; each planner:k=v variant's when it is built (make_policy)
    fix = "a larger KV cache: --num-gpu-blocks or --block-size; or --profile FILE from dynoplan profile {}"
    profile = (
        _load_planner_profile(args.profile)
        if args.profile
        else profile_engine(engine, remedy=(fix.format("--isl"), fix.format("--context")))
    )
    warm = _warm_start(args.warm_start, cfg.adjustment_interval_s, engine.trace_block_size) if args.warm_start else ()
    # GPUs per worker: the planner's gpus_per_engine for the pool (what its budget counts), at least one per
    # DP rank (a worker of dp_size ranks holds dp_size GPUs at minimum)
    gpw = {p: max(cfg.limits(p).gpus_per_engine, e.dp_size) for p, e in engines.items()}
    settings = SimSettings(
        transfer=transfer,
        gpus_per_worker=gpw,
        startup_delay_s=args.startup_delay_s,
        sla_ttft_ms=args.sla_ttft_ms,
        sla_itl_ms=args.sla_itl_ms,
        sample_interval_s=args.sample_interval_s,
        router=args.router,
        seed=args.seed,
    )
    return RunContext(
        reqs,
        engines,
        settings,
        cfg,
        profile,
        warm,
        args.auto_attainment,
        initial,
        args.max_replicas,
        _attainment(args.attainment_target),
        args.trace_span_note,
    )


def _read_inputs(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The ``--config`` file's settings mapping (empty without one) and the ``--engine-config`` file's parsed
    document (None without one), each file read once."""
    in_file = _read_planner_file(args.planner_config) if args.planner_config is not None else {}
    engine_path = getattr(args, "engine_config", None)
    return in_file, (_read_engine_file(engine_path) if engine_path is not None else None)


def _load_config(args: argparse.Namespace, in_file: dict[str, Any], overrides: dict[str, Any]) -> PlannerConfig:
    """:func:`_planner_config` of the ``--config`` settings; when it fails and ``--planner-set`` items are at
    fault, SimulationConfigError naming each of them as the flag (every problem at once)."""
    try:
        source = f"--config {args.planner_config}" if args.planner_config is not None else None
        return _planner_config(in_file, overrides, source)
    except ConfigError:
        problems: list[str] = []
        for item in args.planner_set:  # well-formed: checked by dynoplan.settings_text.assignments
            key, _, value = item.partition("=")
            problems += _planner_set_problems(item.strip(), key.strip(), value.strip())
        if problems:
            raise SimulationConfigError(problems) from None
        raise


SIMULATE_DEFAULTS: dict[str, Any] = {"max_gpu_budget": 64}
"""simulate's planner defaults where the ``--config`` file does not set them (a simulated fleet may use 64 GPUs;
the planner core's default is 8: docs/offline.md "Settings precedence")."""


def _planner_settings(args: argparse.Namespace, in_file: dict[str, Any]) -> tuple[dict[str, Any], PlannerConfig]:
    """The planner overrides (flag > ``--planner-set`` > ``--config`` file > default) and the config they give
    before the engine is known. Sets ``args.mode`` (``--planner-set``'s or the file's mode if they name one,
    else agg) and the SLA targets (the flags, else the config's). Raises SimulationConfigError / ConfigError."""
    from dynoplan.settings_text import assignments

    # a key given twice in any spelling (ttft-ms / ttft_ms, agg.gpus_per_engine / agg_gpus_per_engine) is refused
    overrides: dict[str, Any] = dict(assignments(args.planner_set, "--planner-set", name=setting_name))
    if args.mode is None:
        named = overrides.get("mode", in_file.get("mode"))
        args.mode = named if named is not None else "agg"
    # the run's mode before validation: the file's settings (GPU budget, pools) are checked against it
    overrides["mode"] = args.mode
    cfg0 = _load_config(args, in_file, {**_defaults_not_in(in_file), **overrides})
    from planner.core.config import absent_pool_problems

    absent = absent_pool_problems(dict(assignments(args.planner_set, "--planner-set", name=setting_name)), cfg0)
    if absent:
        raise SimulationConfigError(f"--planner-set {absent[0]}")
    if args.mode not in ("agg", "disagg"):
        raise SimulationConfigError(f"planner mode={args.mode!r}: simulate runs a whole fleet, expected agg or disagg")
    args.sla_ttft_ms = cfg0.ttft_ms if args.sla_ttft_ms is None else args.sla_ttft_ms
    args.sla_itl_ms = cfg0.itl_ms if args.sla_itl_ms is None else args.sla_itl_ms
    overrides.update({"mode": args.mode, "ttft_ms": args.sla_ttft_ms, "itl_ms": args.sla_itl_ms})
    if args.attainment_target is not None:  # the flag beats --planner-set and the file: one effective value
        overrides["sla_attainment_target"] = None if args.attainment_target == OFF else args.attainment_target
    return overrides, cfg0


def _defaults_not_in(in_file: dict[str, Any]) -> dict[str, Any]:
    """:data:`SIMULATE_DEFAULTS` the ``--config`` file does not set (file > simulate's default)."""
    return {k: v for k, v in SIMULATE_DEFAULTS.items() if k not in in_file}


def _engine_and_transfer(args: argparse.Namespace, engine_file: Any) -> tuple[Any, Any]:
    """The engine (defaults < ``--engine-config`` < flags) and, with ``--mode disagg``, the KV transfer
    between the pools. Raises SimulationConfigError for a KV-transfer flag without ``--mode disagg``."""
    engine = engine_config_from_args(args, engine_file)
    if args.mode == "disagg":
        return engine, kv_transfer_from_args(args)
    # each flag given, at any value (none of them has an argparse default): with --mode agg it would be ignored
    given = given_flags(
        args,
        (
            "--kv-transfer-bandwidth",
            "--kv-bytes-per-token",
            "--model-config",
            "--kv-cache-dtype",
            "--kv-transfer-timing",
            "--handoff",
        ),
    )
    if given:
        raise SimulationConfigError(
            f"{', '.join(given)}: only with --mode disagg (KV transfer between pools), "
            f"expected --mode disagg or none of them"
        )
    return engine, None


def _requests(args: argparse.Namespace, trace_block_size: int) -> list[Any]:
    """The trace's requests after ``--arrival-speedup`` and then ``--rate-envelope`` (as in dynoplan replay;
    the envelope is checked before the trace is read). Raises SimulationConfigError when the trace span
    would give more than :data:`MAX_TIMELINE_SAMPLES` timeline samples."""
    envelope = parse_rate_envelope(args.rate_envelope) if getattr(args, "rate_envelope", None) is not None else None
    from planner.sim.loop import MAX_TIMELINE_SAMPLES
    from planner.sim.runner import trace_span_s

    reqs = load_trace(args.trace, trace_block_size=trace_block_size, seed=args.seed)
    read_s = trace_span_s(reqs)
    if args.arrival_speedup != 1.0:
        reqs = scale_arrivals(reqs, args.arrival_speedup)
    if envelope is not None:
        reqs = apply_rate_envelope(reqs, envelope)
    span_s = trace_span_s(reqs)
    args.trace_span_note = _span_note(args, span_s, read_s)
    too_long = time_limit_problem(span_s * 1000.0)
    if too_long is not None:
        raise SimulationConfigError(f"{args.trace_span_note}, {too_long}")
    given = args.sample_interval_s is not None
    if not given:
        args.sample_interval_s = DEFAULT_SAMPLE_INTERVAL_S
    interval = args.sample_interval_s
    cap = MAX_TIMELINE_SAMPLES
    if span_s / interval > cap:
        raise SimulationConfigError(
            f"{args.trace_span_note}; at --sample-interval-s={interval:g}{'' if given else ' (default)'} that is "
            f"{span_s / interval:.3g} timeline samples, more than the cap of {cap} per policy; expected "
            f"a trace of at most {cap * interval:g} s or --sample-interval-s >= {span_s / cap:.3g}"
        )
    return reqs


def _span_note(args: argparse.Namespace, span_s: float, read_s: float) -> str:
    """``the trace spans X s`` and what made it so: ``--trace SPEC`` itself, or ``--arrival-speedup`` /
    ``--rate-envelope`` (with the span as read) when given -- the start of a cap's message, which blames
    only what the user set."""
    shaped = [f"--arrival-speedup={args.arrival_speedup:g}"] if args.arrival_speedup != 1.0 else []
    if getattr(args, "rate_envelope", None) is not None:
        shaped.append(f"--rate-envelope {args.rate_envelope}")
    if shaped:
        return f"the trace spans {span_s:g} s after {' and '.join(shaped)} (--trace {args.trace}: {read_s:g} s as read)"
    return f"--trace {args.trace}: the trace spans {span_s:g} s"


def _pools(
    args: argparse.Namespace, in_file: dict[str, Any], overrides: dict[str, Any], cfg0: PlannerConfig, engine: Any
) -> tuple[dict[str, Any], PlannerConfig]:
    """The engine of each pool (``agg``, or ``prefill`` + ``decode`` with their worker roles) and the final
    planner config: the engine's ``max_num_batched_tokens`` (a different planner value is refused) and each
    pool's ``gpus_per_engine`` at least its workers' DP size. Raises SimulationConfigError."""
    if args.mode == "agg":
        engines = {"agg": engine}
    else:
        engines = {"prefill": engine.replace(worker_type="prefill"), "decode": engine.replace(worker_type="decode")}
    if cfg0.max_num_batched_tokens not in (PlannerConfig().max_num_batched_tokens, engine.max_num_batched_tokens):
        raise SimulationConfigError(
            f"planner max_num_batched_tokens={cfg0.max_num_batched_tokens}: differs from the "
            f"engine's {engine.max_num_batched_tokens}, expected it unset (set the engine's "
            f"--max-num-batched-tokens instead)"
        )
    overrides["max_num_batched_tokens"] = engine.max_num_batched_tokens
    cfg = _load_config(args, in_file, {**_defaults_not_in(in_file), **overrides})
    # a worker of dp_size ranks holds dp_size GPUs at least: the planner's budget counts them so
    # the new budget is validated: a ConfigError line, not a traceback
    cfg = check(
        lambda: cfg.with_limits(
            {
                p: dataclasses.replace(cfg.limits(p), gpus_per_engine=max(cfg.limits(p).gpus_per_engine, e.dp_size))
                for p, e in engines.items()
            }
        )
    )
    return engines, cfg


def _warm_start(path: str, interval_s: float, trace_block_size: int) -> list[Any]:
    """``--warm-start TRACE``: the trace's intervals (:func:`planner.arguments.warm_start_windows`, the reader
    of ``--trace``). Raises SimulationConfigError naming the flag and the reader's message."""
    try:
        return warm_start_windows(path, interval_s, trace_block_size=trace_block_size)
    except (DynoplanError, OSError) as e:
        msg = str(e) if not isinstance(e, OSError) else (e.strerror or str(e))
        raise SimulationConfigError(f"--warm-start {path}: {msg}") from None


POLICY_FLAGS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("auto_attainment", "--auto-attainment", ("static:auto",), "the SLA attainment its search must reach"),
    ("attainment_target", "--attainment-target", ("planner",), "the planner's SLA-attainment target"),
    ("warm_start", "--warm-start", ("planner", "throughput-only"), "it warm-starts their predictors"),
    (
        "initial_replicas",
        "--initial-replicas",
        ("planner", "throughput-only", "hpa", "saturation"),
        "the fleet they start from; static and schedule fleets are their own",
    ),
)
"""``simulate`` flags that only some ``--compare`` policies read: (namespace destination, flag, the policies, by
name or ``NAME:`` prefix, that read it, what it is to them). ``planner`` covers the ``planner:k=v`` variants and
``hpa`` the ``hpa:METRIC[:TARGET]`` forms (:func:`planner.sim.runner.make_policy` reads each flag for these)."""


def _reads_flag(spec: str, readers: tuple[str, ...]) -> bool:
    """Whether the ``--compare`` policy ``spec`` is one of ``readers`` (a name, or its ``NAME:`` forms; a
    reader that itself has a colon, ``static:auto``, only as that exact spec)."""
    s = spec.strip()
    return any(s == r or (":" not in r and s.startswith(r + ":")) for r in readers)


def _check_policy_flags(args: argparse.Namespace) -> None:
    """Refuse each flag of :data:`POLICY_FLAGS` given when no ``--compare`` policy reads it (none given: the
    planner alone): it would have no effect, and the run would look as if it had. Given at any value, its default
    too (argparse's default does not count: the options given are kept on the namespace,
    :data:`dynoplan.options.GIVEN_OPTIONS`). Raises SimulationConfigError naming the flag, its value, the
    policies that read it and what it is to them, as ``dynoplan replay`` refuses ``--kv-event-lag-ms`` without
    ``--kv-events``; the first such flag in :data:`POLICY_FLAGS` order."""
    from dynoplan.options import GIVEN_OPTIONS

    given: set[str] = getattr(args, GIVEN_OPTIONS, set())
    specs = args.compare or ["planner"]
    for dest, flag, readers, what in POLICY_FLAGS:
        if dest not in given or any(_reads_flag(spec, readers) for spec in specs):
            continue
        value = getattr(args, dest)
        text = f"{value:g}" if isinstance(value, float) else str(value)
        names = readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} or {readers[-1]}"
        expected = f"--compare {readers[0]}" if len(readers) == 1 else "one of them in --compare"
        raise SimulationConfigError(
            f"{flag} {text}: only with {names} in --compare ({what}); expected {expected} or no {flag}"
        )


def _warn_failed(policy: str, records: Any, engine: Any) -> None:
    """One warning line on stderr when requests failed (:func:`mocker.arguments.failed_requests_note`, the
    text ``dynoplan replay`` prints), naming the policy."""
    note = failed_requests_note(records, engine)
    if note:
        print(f"dynoplan simulate: warning: policy {policy}: {note}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Run every ``--compare`` policy; returns 0 (raises on user mistakes, AutoStaticUnreachable after the
    other policies ran and were reported)."""
    # rich (~0.1 s to import) and the simulation only when a simulation runs, not for `simulate --help`
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.sim.loop import simulate
    from planner.sim.report import render_table, schema_summary, summary_document, write_outputs
    from planner.sim.runner import AutoStaticUnreachable, make_policy

    _check_policy_flags(args)
    if args.out is not None and not args.out.strip():
        raise SimulationConfigError(
            f"--out {args.out!r}: empty, expected a directory path (omit --out to write nothing)"
        )
    if args.out:
        check_out_not_inputs(
            args.out,
            {
                "--trace": args.trace,
                "--config": args.planner_config,
                "--profile": args.profile,
                "--warm-start": args.warm_start,
                "--rate-envelope": args.rate_envelope,
                "--engine-config": getattr(args, "engine_config", None),
                "--model-config": getattr(args, "model_config", None),
            },
            {name: os.path.join(args.out, name) for name in OUTPUT_FILES},
        )
        _check_out_dir(args.out)
    ctx = build_context(args)

    policies, failed = [], None
    # every --compare adds its policies (action="extend"); none given: the planner alone. A policy is named
    # by its spec without the spaces around it (" planner" is planner): one run and one row per name
    specs: dict[str, str] = {}
    for spec in args.compare or ["planner"]:
        specs.setdefault(spec.strip(), spec)
    dups = [name for name, n in collections.Counter(spec.strip() for spec in args.compare or ()).items() if n > 1]
    if dups:  # say so once
        print(
            f"dynoplan simulate: warning: --compare {' '.join(dups)}: given more than once, each runs once",
            file=sys.stderr,
        )
    for spec in specs.values():
        try:
            policies.append(make_policy(spec, ctx))
        except AutoStaticUnreachable as e:  # the other policies still run and are reported; exit 2 after
            failed = e
    if failed is not None and not policies:
        raise failed
    err = Console(stderr=True, emoji=False)
    runs = []
    walls = {}
    show = not args.quiet and err.is_terminal
    for pol in policies:
        t0 = time.perf_counter()
        if show:
            with Progress(
                TextColumn(f"{pol.name:>16}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err,
                transient=True,
            ) as bar:
                task = bar.add_task(pol.name, total=len(ctx.requests))
                runs.append(
                    simulate(
                        ctx.requests,
                        ctx.engines,
                        pol,
                        ctx.settings,
                        progress=lambda d, n: bar.update(task, completed=d, total=n),  # noqa: B023  (called in this iteration only)
                    )
                )
        else:
            runs.append(simulate(ctx.requests, ctx.engines, pol, ctx.settings))
        walls[pol.name] = round(time.perf_counter() - t0, 3)
        _warn_failed(pol.name, runs[-1].records, next(iter(ctx.engines.values())))
    base_config = ctx.config.to_dict()
    meta = {
        "trace": args.trace,
        "mode": args.mode,
        "arrival_speedup": args.arrival_speedup,
        "startup_delay_s": args.startup_delay_s,
        "sla_ttft_ms": args.sla_ttft_ms,
        "sla_itl_ms": args.sla_itl_ms,
        "router": args.router,
        "seed": args.seed,
        "planner_config": base_config,
        **({"rate_envelope": args.rate_envelope} if args.rate_envelope else {}),
        "policies": {p.name: getattr(p, "replicas", None) for p in policies},
        # what each planner-driven row ran with where it differs from planner_config (a planner:k=v variant, the
        # reference settings of throughput-only, a variant's attainment target): {} for the plain planner
        "policy_settings": {
            p.name: {k: v for k, v in cfg.to_dict().items() if base_config.get(k) != v}
            for p in policies
            if isinstance(cfg := getattr(p, "config", None), PlannerConfig)
        },
    }
    title = (
        f"dynoplan simulate — {args.trace} ({args.mode}, x{args.arrival_speedup:g}, "
        f"SLA TTFT {args.sla_ttft_ms:g} ms / ITL {args.sla_itl_ms:g} ms)"
    )
    try:
        doc = write_outputs(runs, args.out, meta) if args.out else summary_document(runs)
    except OSError as e:
        # the results must not be lost: table and summary JSON on stdout, then the one-line error (exit 2)

        doc = summary_document(runs)
        _print_whole(render_table(doc, title=title), Console(emoji=False))
        sys.stdout.write(json.dumps(schema_summary(doc), indent=2) + "\n")
        sys.stdout.flush()
        where = e.filename or args.out
        raise SimulationConfigError(
            f"--out {args.out}: cannot write {where}: {e.strerror or e} (results printed "
            f"to stdout above), expected a writable directory"
        ) from None
    if not args.quiet:
        table = render_table(doc, title=title)
        out = Console(emoji=False)
        if out.is_terminal:
            out.print(table)
        else:
            _print_whole(table, out)
        err.print("wall time per policy (s): " + ", ".join(f"{k}={v}" for k, v in walls.items()))
    if failed is not None:
        raise failed
    return 0


def _print_whole(table: Any, console: Any) -> None:
    """Print a rich table at its natural width, however wide (a file or pipe has no width to fit: a cropped
    column would lose figures), at least the console's."""
    from rich.console import Console
    from rich.measure import Measurement

    wide = Console(width=100_000, emoji=False, file=console.file)
    natural = Measurement.get(wide, wide.options, table).maximum
    Console(width=max(console.width, natural), emoji=False, file=console.file).print(table)


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - convenience
    from planner.cli import main as cli_main

    return cli_main(["simulate", *(argv or sys.argv[1:])])

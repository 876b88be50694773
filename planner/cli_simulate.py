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
import sys
import time
from typing import Any

from mocker.cli_replay import (MAX_WORKERS, _nonneg_float, _nonneg_int, _positive_float, _positive_int, _worker_count,
                               engine_config_from_args, failed_requests_note)
from mocker.cli_replay import RATE_ENVELOPE_HELP
from mocker.cli_replay import add_engine_arguments as _add_replay_engine_arguments
from mocker.cli_replay import add_transfer_arguments as _add_replay_transfer_arguments
from planner.core.config import MAX_ITL_MS, MAX_TTFT_MS


def _at_most(top: float):
    """argparse type: a finite number in (0, ``top``] (milliseconds)."""
    def parse(text: str) -> float:
        v = _positive_float(text)
        if v > top:
            raise argparse.ArgumentTypeError(f"{text!r}: expected at most {top:.0f} ms")
        return v
    return parse


POLICY_HELP = ("planner | planner:key=value,... | throughput-only | static:N | static:P+D | static:peak | static:auto | "
               "schedule:T=N,T=N,... (T=P+D disagg; first T=0) | hpa[:kv|running[:target]] | saturation")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags of ``dynoplan replay`` (same names and meaning), plus trace block size and DP ranks."""
    _add_replay_engine_arguments(parser, "engine (override --engine-config; as in dynoplan replay)")
    e = parser.add_argument_group("engine layout")
    e.add_argument("--trace-block-size", type=_positive_int, metavar="N", help="tokens per trace hash id (default 512)")
    e.add_argument("--dp-size", type=_positive_int, metavar="N", help="data-parallel ranks per worker (default 1)")


def add_transfer_arguments(parser: argparse.ArgumentParser) -> None:
    """The KV-transfer flags of ``dynoplan replay`` (disaggregated mode), same names, choices and defaults
    (:func:`mocker.cli_replay.add_transfer_arguments`); the pool sizes (replay's --prefill-workers /
    --decode-workers) are the policy's."""
    _add_replay_transfer_arguments(parser.add_argument_group("KV transfer (--mode disagg; as in dynoplan replay)"))


def _replay_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` completed with ``dynoplan replay``'s defaults for flags simulate does not offer, so the
    replay module's own ``engine_config_from_args`` / ``transfer_config_from_args`` read them."""
    from mocker import cli_replay

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    cli_replay.add_arguments(p)
    base = vars(p.parse_args(["--trace", "-"]))
    return argparse.Namespace(**{**base, **{k: v for k, v in vars(args).items() if k in base or not k.startswith("_")}})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mocker.cli_replay import _one_line_error

    parser.error = _one_line_error("dynoplan simulate")  # type: ignore[method-assign]
    w = parser.add_argument_group("workload")
    w.add_argument("--trace", required=True, metavar="TRACE", help="Azure CSV, Mooncake JSONL or synthetic:... spec")
    w.add_argument("--arrival-speedup", type=_positive_float, default=1.0, metavar="R", help="divide arrival times by R (default 1)")
    w.add_argument("--rate-envelope", metavar="SPEC", help=RATE_ENVELOPE_HELP)
    w.add_argument("--seed", type=_nonneg_int, default=0, metavar="N", help="seed (synthetic workloads, routers; default 0)")
    s = parser.add_argument_group("loop")
    s.add_argument("--mode", choices=("agg", "disagg"), help="aggregated or prefill+decode pools (default: the "
                   "--config file's mode, else agg)")
    s.add_argument("--compare", nargs="+", default=["planner"], metavar="POLICY", help=POLICY_HELP)
    s.add_argument("--startup-delay-s", type=_nonneg_float, default=60.0, metavar="S", help="worker start-up delay (default 60)")
    s.add_argument("--sla-ttft-ms", type=_at_most(MAX_TTFT_MS), metavar="MS",
                   help="TTFT target (default: the --config file's ttft_ms, else 500)")
    s.add_argument("--sla-itl-ms", type=_at_most(MAX_ITL_MS), metavar="MS",
                   help="ITL target (default: the --config file's itl_ms, else 50)")
    s.add_argument("--router", choices=("round_robin", "least_loaded", "kv"), default="round_robin", help="routing among ready workers (default round_robin)")
    s.add_argument("--sample-interval-s", type=_positive_float, default=10.0, metavar="S", help="timeline sampling (default 10)")
    s.add_argument("--initial-replicas", metavar="N|P+D|auto",
                   help="fleet at t=0 for dynamic policies (default auto: sized by the throughput formulas for the "
                        "trace's first adjustment interval, as an operator would have deployed it); each pool "
                        "within the planner's [min_replicas, max_replicas] and the total within max_gpu_budget "
                        "(else exit 2, no clamping)")
    s.add_argument("--auto-attainment", type=_share, default=0.995, metavar="F", help="static:auto target, 0 < F <= 1 (default 0.995)")
    s.add_argument("--max-replicas", type=_worker_count, default=64, metavar="N",
                   help=f"per-pool cap for baselines and static:auto (at most {MAX_WORKERS})")
    p = parser.add_argument_group("planner")
    p.add_argument("--config", dest="planner_config", metavar="FILE.yaml", help="planner settings file")
    p.add_argument("--planner-set", action="append", default=[], metavar="KEY=VALUE", help="planner setting (repeatable)")
    p.add_argument("--attainment-target", type=_attainment_flag, metavar="F|off",
                   help="planner SLA-attainment target (PlannerConfig.sla_attainment_target): share of requests "
                        "that should meet each SLA, 0 < F < 1, or off (default: the planner config's, 0.995)")
    p.add_argument("--profile", metavar="FILE.npz", help="performance profile (default: profile the engine now)")
    p.add_argument("--warm-start", metavar="TRACE", help="warm-start the predictors from this trace's intervals")
    o = parser.add_argument_group("output")
    o.add_argument("--out", metavar="DIR", help="write summary.json, details.json, timeline.csv, requests.jsonl, report.html")
    o.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    add_engine_arguments(parser)
    add_transfer_arguments(parser)


OFF = "off"


def _attainment_flag(text: str) -> float | str:
    """argparse type of --attainment-target: ``off`` (feedback disabled) or a share 0 < F < 1."""
    if text.strip().lower() in ("off", "none"):
        return OFF
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a share 0 < F < 1 or off")
    return v


MAX_SAMPLES = 100_000
"""Upper bound on timeline samples per policy (trace span / --sample-interval-s): keeps memory and time bounded."""


def _share(text: str) -> float:
    """argparse type: a share 0 < F <= 1 (an attainment target)."""
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a share 0 < F <= 1")
    return v


def _check_out_dir(path: str) -> None:
    """Create ``--out DIR`` and prove it writable before any simulation runs (a late failure would lose the
    results). Raises SimulationConfigError naming the path."""
    import os
    import tempfile

    from planner.sim.errors import SimulationConfigError

    if os.path.exists(path) and not os.path.isdir(path):
        raise SimulationConfigError(f"--out {path}: exists and is not a directory, expected a directory (created if missing)")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise SimulationConfigError(f"--out {path}: not a writable directory: {e.strerror or e}") from None


OUTPUT_FILES: tuple[str, ...] = ("summary.json", "details.json", "timeline.csv", "requests.jsonl", "report.html")


def _check_out_not_inputs(out: str, inputs: dict[str, str | None],
                          outputs: dict[str, str] | None = None) -> None:
    """Refuse an ``--out`` where an output file would overwrite an input file (``--trace``, ``--config``,
    ``--profile``, ``--timing``, ...): compared by ``os.path.samefile`` / realpath. ``outputs`` maps each
    output's name to its path (default: :data:`OUTPUT_FILES` inside the directory ``out``; ``dynoplan profile``
    passes its one ``.npz`` file). Raises SimulationConfigError naming ``--out`` and the input's flag."""
    import os

    from planner.sim.errors import SimulationConfigError

    if outputs is None:
        outputs = {name: os.path.join(out, name) for name in OUTPUT_FILES}
    for flag, path in inputs.items():
        if not path or not os.path.exists(path):
            continue
        for name, target in outputs.items():
            same = os.path.realpath(target) == os.path.realpath(path)
            if not same and os.path.exists(target):
                try:
                    same = os.path.samefile(target, path)
                except OSError:
                    same = False
            if same:
                if target == out:  # a single output file (dynoplan profile)
                    raise SimulationConfigError(f"--out {out}: would overwrite {flag} {path}, expected an output "
                                                f"path different from every input file")
                raise SimulationConfigError(f"--out {out}: would overwrite {flag} {path} ({name}), expected an output "
                                            f"directory that holds none of the input files")


def _check_initial(initial: dict[str, int] | None, cfg: Any) -> None:
    """Each pool of ``--initial-replicas`` within the planner's [min_replicas, max_replicas] (max: the pool's
    ``max_replicas``, else ``max_gpu_budget // gpus_per_engine``) and the fleet's GPUs within
    ``max_gpu_budget``. Rejects rather than clamps. Raises SimulationConfigError."""
    from planner.sim.errors import SimulationConfigError

    if not initial:
        return
    gpus = 0
    for pool, n in initial.items():
        lim = cfg.limits(pool)
        hi = cfg.max_gpu_budget // lim.gpus_per_engine
        if lim.max_replicas is not None:
            hi = min(hi, lim.max_replicas)
        if not lim.min_replicas <= n <= hi:
            raise SimulationConfigError(f"--initial-replicas {pool}={n}: expected {lim.min_replicas} <= N <= {hi} "
                                        f"(planner {pool}.min_replicas / max_replicas, max_gpu_budget={cfg.max_gpu_budget})")
        gpus += n * lim.gpus_per_engine
    if gpus > cfg.max_gpu_budget:
        raise SimulationConfigError(f"--initial-replicas: {gpus} GPUs, expected <= max_gpu_budget={cfg.max_gpu_budget}")


def _parse_initial(text: str | None, pools: tuple[str, ...]) -> dict[str, int] | None:
    from planner.sim.errors import SimulationConfigError

    if text is None or text == "auto":
        return None
    try:
        nums = [int(x) for x in text.split("+")]
    except ValueError:
        nums = []
    if len(nums) != len(pools):  # the range of each count is _check_initial's (the planner's pool limits)
        raise SimulationConfigError(f"--initial-replicas={text!r}: expected {'N' if len(pools) == 1 else 'P+D'} "
                                    f"(whole numbers within the planner's min_replicas..max_replicas) or auto")
    return dict(zip(pools, nums))


def _attainment(v: float | str | None) -> float | str | None:
    from planner.sim.errors import SimulationConfigError

    if v == OFF:
        return v
    if v is not None and not 0 < v < 1:
        raise SimulationConfigError(f"--attainment-target={v!r}: expected 0 < value < 1")
    return v


def _check_settings_file(flag: str, path: str | None, numeric: dict[str, set[str]] | None = None) -> None:
    """Refuse what YAML/JSON loaders accept silently in a settings file: a key given twice in one mapping
    (the last would win; named with both lines) and, for the setting names in ``numeric`` (section -> keys,
    ``""`` = top level), a quoted number (``max_replicas: "3"``, refused as ``2.5`` is). A file that cannot
    be read or parsed is left to its loader's own error. Raises SimulationConfigError."""
    if path is None:
        return
    from pathlib import Path

    import yaml

    from planner.sim.errors import SimulationConfigError

    try:
        root = yaml.compose(Path(path).read_text())  # JSON is YAML 1.2 for this purpose (line marks kept)
    except (OSError, ValueError, yaml.YAMLError):
        return

    def walk(node: Any, section: str) -> None:
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item, section)
        if not isinstance(node, yaml.MappingNode):
            return
        seen: dict[str, int] = {}
        lone_planner = section == "" and len(node.value) == 1 and node.value[0][0].value == "planner"
        for k, v in node.value:
            key = str(k.value)
            line = k.start_mark.line + 1
            if key in seen:
                where = f"{section}." if section else ""
                raise SimulationConfigError(f"{flag} {path}: line {line}: duplicate key {where + key!r} (first at line "
                                            f"{seen[key]}), expected each setting once")
            seen[key] = line
            name = key.replace("-", "_")
            if numeric is not None and isinstance(v, yaml.ScalarNode) and v.style in ("'", '"') \
                    and name in numeric.get(section, set()):
                try:
                    float(v.value)
                except ValueError:
                    pass
                else:
                    where = f"{section}." if section else ""
                    raise SimulationConfigError(f"{flag} {path}: line {v.start_mark.line + 1}: {where}{name}="
                                                f"{v.value!r}: a quoted string, expected an unquoted number")
            walk(v, "" if lone_planner else (name if not section else f"{section}.{name}"))

    walk(root, "")


def _planner_numeric_keys() -> dict[str, set[str]]:
    """PlannerConfig's numeric settings by section (top level ``""``, pool sections ``agg``/``prefill``/``decode``)."""
    import dataclasses

    from planner.core import PlannerConfig
    from planner.core.config import PoolLimits

    def nums(cls: Any) -> set[str]:
        return {f.name for f in dataclasses.fields(cls) if str(f.type).split(" | ")[0] in ("int", "float")}

    pool = nums(PoolLimits)
    top = nums(PlannerConfig) | {f"{p}_{k}" for p in ("agg", "prefill", "decode") for k in pool}
    return {"": top, "agg": pool, "prefill": pool, "decode": pool}


def _check_planner_set(text: str, key: str, value: str) -> None:
    """One ``--planner-set KEY=VALUE`` on its own (called when the whole config failed): a problem of this
    key (unknown, wrong type, out of range) is reported naming the whole flag (``--planner-set foo=1: unknown
    setting ...``); otherwise returns and the caller re-raises the whole config's error. Raises
    SimulationConfigError."""
    from planner.core import config_from_mapping
    from planner.errors import ConfigError
    from planner.sim.errors import SimulationConfigError

    try:
        config_from_mapping({key: value}, cli=True)
    except ConfigError as e:
        k = key.replace("-", "_")
        own = [p for p in e.problems if p.startswith((f"{k}:", f"{k}=", f"{k}."))]
        if own:
            msgs = [p[len(k) + 1:].strip() if p.startswith(f"{k}:") else p for p in own]
            raise SimulationConfigError(f"--planner-set {text}: " + "; ".join(msgs)) from None


TIMING_PROFILE_ARRAYS = ("decode_active_kv_tokens", "decode_itl")
"""Arrays only an engine timing profile (``--timing``) holds, not a planner profile."""


def _load_planner_profile(path: str) -> Any:
    """``--profile FILE``: the planner's performance profile. An engine timing profile given here (the
    other kind of .npz) gets the swapped-file message ``dynoplan profile --timing`` gives the other way
    round. Raises SimulationConfigError / ProfileError naming the file."""
    import os

    from planner.core import load_profile
    from planner.errors import ProfileError
    from planner.sim.errors import SimulationConfigError

    try:
        return load_profile(path)
    except ProfileError:
        if os.path.isfile(path):
            import numpy as np

            try:
                with np.load(path) as z:
                    names = set(z.files)
            except (OSError, ValueError):
                names = set()
            if set(TIMING_PROFILE_ARRAYS) <= names and "decode_kv_usage" not in names:
                raise SimulationConfigError(
                    f"--profile {path}: this looks like an engine timing profile (decode_active_kv_tokens, decode_itl, "
                    f"...); --profile needs a planner performance profile with arrays prefill_isl, prefill_ttft_ms, "
                    f"prefill_thpt_per_gpu, decode_kv_usage, decode_context_length, decode_itl_ms, decode_thpt_per_gpu "
                    f"(write one with dynoplan profile; engine timing profiles go to --timing)") from None
        raise


def _file_settings(path: str | None) -> dict[str, Any]:
    """The top-level settings of a planner settings file (a lone ``planner:`` mapping is looked into, as
    load_config does); empty when there is no file or it cannot be parsed (``load_config`` then reports the
    file's error)."""
    if path is None:
        return {}
    import json
    from pathlib import Path

    import yaml

    try:
        text = Path(path).read_text()
        data = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    if "planner" in data and isinstance(data["planner"], dict) and len(data) == 1:
        data = data["planner"]
    return data


def build_context(args: argparse.Namespace) -> Any:
    """Trace, engines, settings, planner config and profile from the flags (raises on user mistakes)."""
    from mocker.traces import load_trace
    from planner.core import PlannerConfig, read_trace_intervals
    from planner.sim.errors import SimulationConfigError
    from planner.sim.loop import SimSettings
    from planner.sim.profile import profile_engine
    from planner.sim.runner import RunContext

    _check_settings_file("--config", args.planner_config, _planner_numeric_keys())
    _check_settings_file("--engine-config", getattr(args, "engine_config", None))
    overrides: dict[str, Any] = {}
    for kv in args.planner_set:
        if "=" not in kv:
            raise SimulationConfigError(f"--planner-set {kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        overrides[k.strip()] = v.strip()

    def load_config(path: str | None, ov: dict[str, Any]) -> Any:
        """The core's load_config; when it fails, a --planner-set item at fault is named as the flag."""
        from planner.core import load_config as core_load_config
        from planner.errors import ConfigError

        try:
            return core_load_config(path, ov)
        except ConfigError:
            for item in args.planner_set:
                key, value = item.split("=", 1)
                _check_planner_set(item, key.strip(), value.strip())
            raise
    base = {"max_gpu_budget": 64}
    in_file = _file_settings(args.planner_config)
    if args.mode is None:  # --planner-set's or the file's mode if they name one, else agg
        named = overrides.get("mode", in_file.get("mode"))
        args.mode = named if named is not None else "agg"
    # the run's mode before validation: the file's settings (GPU budget, pools) are checked against it
    overrides["mode"] = args.mode
    # flag > --planner-set > --config file > default: the file's values are validated (unknown keys, NaN
    # rejected by load_config) and used where the flag was not given
    # simulate's defaults (a simulated fleet may use 64 GPUs) where the file does not set them: file > default
    base = {k: v for k, v in base.items() if k not in in_file}
    cfg0 = load_config(args.planner_config, {**base, **overrides})
    if args.mode not in ("agg", "disagg"):
        raise SimulationConfigError(f"planner mode={args.mode!r}: simulate runs a whole fleet, expected agg or disagg")
    args.sla_ttft_ms = cfg0.ttft_ms if args.sla_ttft_ms is None else args.sla_ttft_ms
    args.sla_itl_ms = cfg0.itl_ms if args.sla_itl_ms is None else args.sla_itl_ms
    overrides.update({"mode": args.mode, "ttft_ms": args.sla_ttft_ms, "itl_ms": args.sla_itl_ms})
    if args.attainment_target is not None:  # the flag beats --planner-set and the file: one effective value
        overrides["sla_attainment_target"] = None if args.attainment_target == OFF else args.attainment_target
    rargs = _replay_namespace(args)
    engine = engine_config_from_args(rargs)
    transfer = None
    if args.mode == "disagg":
        from mocker import cli_replay

        if hasattr(cli_replay, "transfer_config_from_args"):
            rargs.prefill_workers = rargs.decode_workers = 1
            transfer = cli_replay.transfer_config_from_args(rargs)[2]
    else:
        given = [f for f, v in (("--kv-transfer-bandwidth", args.kv_transfer_bandwidth),
                                ("--kv-bytes-per-token", args.kv_bytes_per_token),
                                ("--model-config", args.model_config),
                                ("--kv-cache-dtype", None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype),
                                ("--kv-transfer-timing", None if args.kv_transfer_timing == "full_prompt" else 1),
                                ("--handoff", None if args.handoff == "coordinated" else 1)) if v is not None]
        if given:
            raise SimulationConfigError(f"{', '.join(given)}: only with --mode disagg (KV transfer between pools), "
                                        f"expected --mode disagg or none of them")
    envelope = None
    if getattr(args, "rate_envelope", None) is not None:  # checked before the trace is read
        from mocker.traces import parse_rate_envelope

        envelope = parse_rate_envelope(args.rate_envelope)
    reqs = load_trace(args.trace, trace_block_size=engine.trace_block_size, seed=args.seed)
    if args.arrival_speedup != 1.0:
        from mocker.traces import scale_arrivals

        reqs = scale_arrivals(reqs, args.arrival_speedup)
    if envelope is not None:  # after --arrival-speedup, as in dynoplan replay
        from mocker.traces import apply_rate_envelope

        reqs = apply_rate_envelope(reqs, envelope)
    span_s = max((r.arrival_ms for r in reqs), default=0.0) / 1000.0
    if span_s / args.sample_interval_s > MAX_SAMPLES:
        raise SimulationConfigError(f"--sample-interval-s={args.sample_interval_s:g}: {span_s:g} s of trace would give "
                                    f"{span_s / args.sample_interval_s:.3g} samples, expected >= "
                                    f"{span_s / MAX_SAMPLES:g} s (at most {MAX_SAMPLES} samples per policy)")
    if args.mode == "agg":
        engines = {"agg": engine}
    else:
        engines = {"prefill": engine.replace(worker_type="prefill"), "decode": engine.replace(worker_type="decode")}
    if cfg0.max_num_batched_tokens not in (PlannerConfig().max_num_batched_tokens, engine.max_num_batched_tokens):
        raise SimulationConfigError(f"planner max_num_batched_tokens={cfg0.max_num_batched_tokens}: differs from the "
                                    f"engine's {engine.max_num_batched_tokens}, expected it unset (set the engine's "
                                    f"--max-num-batched-tokens instead)")
    overrides["max_num_batched_tokens"] = engine.max_num_batched_tokens
    cfg = load_config(args.planner_config, {**base, **overrides})
    # a worker of dp_size ranks holds dp_size GPUs at least: the planner's budget counts them so
    from dynoplan.settings import check  # the new budget is validated: a ConfigError line, not a traceback

    cfg = check(lambda: dataclasses.replace(cfg, **{p: dataclasses.replace(cfg.limits(p), gpus_per_engine=max(
        cfg.limits(p).gpus_per_engine, e.dp_size)) for p, e in engines.items()}))
    initial = _parse_initial(args.initial_replicas, tuple(engines))
    _check_initial(initial, cfg)
    profile = _load_planner_profile(args.profile) if args.profile else profile_engine(engine)
    warm = ()
    if args.warm_start:
        from mocker.errors import MockerError
        from planner.errors import PlannerError

        try:
            warm = read_trace_intervals(args.warm_start, cfg.adjustment_interval_s)
        except (PlannerError, MockerError, OSError) as e:
            msg = str(e) if not isinstance(e, OSError) else (e.strerror or str(e))
            raise SimulationConfigError(f"--warm-start {args.warm_start}: {msg}") from None
    # GPUs per worker: the planner's gpus_per_engine for the pool (what its budget counts), at least one per
    # DP rank (a worker of dp_size ranks holds dp_size GPUs at minimum)
    gpw = {p: max(cfg.limits(p).gpus_per_engine, e.dp_size) for p, e in engines.items()}
    settings = SimSettings(transfer=transfer, gpus_per_worker=gpw, startup_delay_s=args.startup_delay_s, sla_ttft_ms=args.sla_ttft_ms, sla_itl_ms=args.sla_itl_ms,
                           sample_interval_s=args.sample_interval_s, router=args.router, seed=args.seed)
    return RunContext(reqs, engines, settings, cfg, profile, warm, args.auto_attainment,
                      initial, args.max_replicas,
                      _attainment(args.attainment_target))


def _warn_failed(policy: str, records: Any, engine: Any) -> None:
    """One warning line on stderr when requests failed (:func:`mocker.cli_replay.failed_requests_note`, the
    text ``dynoplan replay`` prints), naming the policy."""
    note = failed_requests_note(records, engine)
    if note:
        print(f"dynoplan simulate: warning: policy {policy}: {note}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from planner.sim.loop import simulate
    from planner.sim.report import render_table, summary_document, write_outputs
    from planner.sim.runner import make_policy

    if args.out is not None and not args.out.strip():
        from planner.sim.errors import SimulationConfigError

        raise SimulationConfigError(f"--out {args.out!r}: empty, expected a directory path (omit --out to write nothing)")
    if args.out:
        _check_out_not_inputs(args.out, {"--trace": args.trace, "--config": args.planner_config,
                                         "--profile": args.profile, "--warm-start": args.warm_start,
                                         "--rate-envelope": args.rate_envelope,
                                         "--engine-config": getattr(args, "engine_config", None),
                                         "--model-config": getattr(args, "model_config", None)})
        _check_out_dir(args.out)
    ctx = build_context(args)
    from planner.sim.runner import AutoStaticUnreachable

    policies, failed = [], None
    dups = [spec for spec, n in collections.Counter(args.compare).items() if n > 1]
    if dups:  # one run and one row per policy name: say so once
        print(f"dynoplan simulate: warning: --compare {' '.join(dups)}: given more than once, each runs once",
              file=sys.stderr)
    for spec in dict.fromkeys(args.compare):
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
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(TextColumn(f"{pol.name:>16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=err, transient=True) as bar:
                task = bar.add_task(pol.name, total=len(ctx.requests))
                runs.append(simulate(ctx.requests, ctx.engines, pol, ctx.settings,
                                     progress=lambda d, n: bar.update(task, completed=d, total=n)))
        else:
            runs.append(simulate(ctx.requests, ctx.engines, pol, ctx.settings))
        walls[pol.name] = round(time.perf_counter() - t0, 3)
        _warn_failed(pol.name, runs[-1].records, next(iter(ctx.engines.values())))
    meta = {"trace": args.trace, "mode": args.mode, "arrival_speedup": args.arrival_speedup,
            "startup_delay_s": args.startup_delay_s, "sla_ttft_ms": args.sla_ttft_ms, "sla_itl_ms": args.sla_itl_ms,
            "router": args.router, "seed": args.seed, "planner_config": ctx.config.to_dict(),
            **({"rate_envelope": args.rate_envelope} if args.rate_envelope else {}),
            "policies": {p.name: getattr(p, "replicas", None) for p in policies}}
    title = (f"dynoplan simulate — {args.trace} ({args.mode}, x{args.arrival_speedup:g}, "
             f"SLA TTFT {args.sla_ttft_ms:g} ms / ITL {args.sla_itl_ms:g} ms)")
    try:
        doc = write_outputs(runs, args.out, meta) if args.out else summary_document(runs)
    except OSError as e:
        # the results must not be lost: table and summary JSON on stdout, then the one-line error (exit 2)
        import json

        from planner.sim.errors import SimulationConfigError
        from planner.sim.report import schema_summary

        doc = summary_document(runs)
        out = Console(width=max(Console().width, 180), emoji=False)
        out.print(render_table(doc, title=title))
        sys.stdout.write(json.dumps(schema_summary(doc), indent=2) + "\n")
        sys.stdout.flush()
        where = e.filename or args.out
        raise SimulationConfigError(f"--out {args.out}: cannot write {where}: {e.strerror or e} (results printed "
                                    f"to stdout above), expected a writable directory") from None
    if not args.quiet:
        out = Console(emoji=False)
        if not out.is_terminal:
            out = Console(width=max(out.width, 180), emoji=False)
        out.print(render_table(doc, title=title))
        err.print("wall time per policy (s): " + ", ".join(f"{k}={v}" for k, v in walls.items()))
    if failed is not None:
        raise failed
    return 0


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - convenience
    from planner.cli import main as cli_main

    return cli_main(["simulate", *(argv or sys.argv[1:])])

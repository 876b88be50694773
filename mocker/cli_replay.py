"""``dynoplan replay``: replay a request trace through a simulated fleet in virtual time.

Reads a trace (Azure CSV, Mooncake JSONL or a ``synthetic:`` spec, see :mod:`mocker.traces`), builds the
engine configuration (defaults < ``--engine-config`` YAML < command-line flags), runs
:func:`mocker.fleet.run_replay`, prints a table and writes ``--report-json`` / ``--per-request``.

Errors: every user mistake (bad flag value, missing or malformed trace, bad YAML, invalid engine setting)
is one line on stderr and exit code 2 — argparse errors through :func:`_one_line_error`, the rest as
:class:`mocker.errors.MockerError` caught by the ``dynoplan`` dispatcher. If an output file cannot be
written after the replay, the report JSON is printed to stdout first so the computed result is not lost,
then the error line, exit 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable, NoReturn, Sequence

from dynoplan.settings import check
from mocker.config import ENGINES, EngineConfig
from mocker.errors import ConfigError
from mocker.modelcfg import KV_CACHE_DTYPES
from mocker.transfer import HANDOFF_PATHS, TIMING_MODES

ROUTERS = ("round_robin", "least_loaded", "kv")
MAX_WORKERS = 4096
"""Upper bound of ``--workers`` / ``--prefill-workers`` / ``--decode-workers``: every worker is built up
front with its own KV cache and scheduler, so 100000 workers exhaust memory before the first request
(far above any fleet the planner scales to)."""


# ---------------------------------------------------------------------------------------------- arg types
def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return v


def _worker_count(text: str) -> int:
    v = _positive_int(text)
    if v > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a worker count between 1 and {MAX_WORKERS}")
    return v


def check_output_paths(outputs: list[tuple[str, str | None]], inputs: list[str]) -> None:
    """Refuse output paths before any work: each ``(flag, path)`` must have an existing parent directory
    (one rule for every command, as ``profile --out``) and must not be one of the ``inputs`` files (a
    ``--per-request`` onto the trace would overwrite it). Raises ConfigError naming the flag and path."""
    for flag, path in outputs:
        if not path:
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ConfigError(f"{flag} {path}: parent directory {parent} does not exist or is not a directory; "
                              "expected an existing directory")
        for src in inputs:
            if os.path.exists(path) and os.path.exists(src) and os.path.samefile(path, src):
                raise ConfigError(f"{flag} {path}: is the input trace {src}; expected a different output file")
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if path:
            real = os.path.realpath(path)
            if real in seen:
                raise ConfigError(f"{flag} {path}: same file as {seen[real]}; expected a different output file")
            seen[real] = flag


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number > 0")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number >= 0") from None
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0")
    return v


def _one_line_error(prog: str) -> Callable[[str], NoReturn]:
    def error(message: str) -> NoReturn:
        print(f"{prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)

    return error


def failed_requests_note(records: Sequence[Any], engine: EngineConfig) -> str | None:
    """The warning text for requests that failed (a prompt that can never fit a worker's KV cache), or None
    when none did; shared by ``dynoplan replay`` and ``dynoplan simulate`` (which prefix their own names)."""
    failed = [r for r in records if r.status == "failed"]
    if not failed:
        return None
    return (f"{len(failed)} of {len(records)} requests failed: a prompt that can never fit in a worker's KV cache "
            f"(longest failed prompt {max(r.input_length for r in failed)} tokens; num_gpu_blocks="
            f"{engine.num_gpu_blocks} x block_size={engine.effective_block_size} = "
            f"{engine.num_gpu_blocks * engine.effective_block_size} tokens); they count as not completed")


# ---------------------------------------------------------------------------------------------- parser
RATE_ENVELOPE_HELP = ("time-warp arrivals (after --arrival-speedup) by a rate multiplier m(t): "
                      "periodic:period_s=P,low=A,high=B[,phase_s=S][,duration_s=D] (raised cosine from A to B; with D "
                      "the trace is repeated to cover D s, then cut) or a CSV file time_s,multiplier (piecewise linear)")


def add_transfer_arguments(group: Any) -> None:
    """The prefill->decode KV-transfer flags (``--kv-transfer-bandwidth``, ``--kv-bytes-per-token``,
    ``--model-config``, ``--kv-cache-dtype``, ``--kv-transfer-timing``, ``--handoff``) on ``group`` (a parser or
    argument group); shared by ``dynoplan replay`` and ``dynoplan simulate``."""
    group.add_argument("--kv-transfer-bandwidth", type=_nonneg_float, metavar="GBPS",
                       help="prefill->decode KV transfer bandwidth in GB/s (1e9 B/s); 0 = no delay (default 0)")
    group.add_argument("--kv-bytes-per-token", type=_positive_int, metavar="N", help="KV bytes per token (or --model-config)")
    group.add_argument("--model-config", metavar="config.json",
                       help="Hugging Face config.json: kv bytes/token = layers x 2 x kv_heads x head_dim x dtype bytes")
    group.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                       help="KV cache dtype for --model-config (default auto = the model's torch_dtype)")
    group.add_argument("--kv-transfer-timing", choices=TIMING_MODES, default="full_prompt",
                       help="tokens charged: whole prompt, or only blocks the decode worker lacks (default full_prompt)")
    group.add_argument("--handoff", choices=HANDOFF_PATHS, default="coordinated",
                       help="prefill->decode handoff path (default coordinated, the reference's timeline)")


def add_engine_arguments(parser: argparse.ArgumentParser, title: str = "engine (override --engine-config)") -> None:
    """The engine flags shared by ``replay``, ``simulate``, ``profile`` and ``mocker serve`` (same names, same meaning).

    Read back with :func:`engine_config_from_args`.
    """
    e = parser.add_argument_group(title)
    e.add_argument("--engine-config", metavar="FILE.yaml", help="engine settings file (flat or {engine: {...}})")
    e.add_argument("--engine", choices=ENGINES, help="scheduler family (default vllm)")
    e.add_argument("--block-size", "--page-size", type=_positive_int, metavar="N", help="tokens per KV block (SGLang: page size; default: vllm 64, trtllm 32, sglang 1)")
    e.add_argument("--num-gpu-blocks", type=_positive_int, metavar="N", help="KV cache capacity in blocks (default 16384)")
    e.add_argument("--max-num-seqs", type=_positive_int, metavar="N", help="max running sequences (default 256)")
    e.add_argument("--max-num-batched-tokens", type=_positive_int, metavar="N", help="per-pass token budget (default 8192)")
    e.add_argument("--speedup-ratio", type=_positive_float, metavar="R", help="divide every pass time by R (default 1.0)")
    e.add_argument("--preemption-mode", choices=("lifo", "fifo"), help="which request to recompute when KV runs out (default lifo)")
    e.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    e.add_argument("--no-chunked-prefill", action="store_true", help="disable chunked prefill")
    e.add_argument("--timing", metavar="polynomial|FILE.npz|aic:SPEC", help="timing model (default polynomial; aic:model=...,system=...,backend=...,tp=...,quant=... = AIConfigurator)")
    e.add_argument("--gpu-memory-fraction", type=_positive_float, metavar="F", help="with --timing aic:...: KV blocks from this share of GPU memory (when --num-gpu-blocks is not given)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``replay`` flags on ``parser`` (argparse errors become one stderr line, exit 2)."""
    parser.error = _one_line_error("dynoplan replay")  # type: ignore[method-assign]
    parser.epilog = (
        "TRACE is an Azure LLM inference CSV, a Mooncake JSONL file, or a synthetic workload such as "
        "'synthetic:poisson?rate=5&duration_s=600&isl=1000&osl=200&seed=1' (see README). "
        "Engine settings: defaults < --engine-config YAML < flags."
    )
    w = parser.add_argument_group("workload")
    w.add_argument("--trace", required=True, metavar="TRACE", help="trace file or synthetic:KIND?key=value&... spec")
    w.add_argument("--trace-block-size", type=_positive_int, metavar="N", help="tokens per trace hash id (default 512)")
    w.add_argument("--arrival-speedup", type=_positive_float, default=1.0, metavar="R", help="divide arrival times by R (default 1.0)")
    w.add_argument("--rate-envelope", metavar="SPEC", help=RATE_ENVELOPE_HELP)
    w.add_argument("--seed", type=_nonneg_int, default=0, metavar="N", help="seed for synthetic workloads and routers (default 0)")

    f = parser.add_argument_group("fleet")
    f.add_argument("--workers", type=_worker_count, default=1, metavar="N", help=f"aggregated workers (default 1, at most {MAX_WORKERS})")
    f.add_argument("--router", choices=ROUTERS, default="round_robin", help="request router (default round_robin)")
    f.add_argument("--max-time-s", type=_positive_float, metavar="S", help="stop the simulation at S simulated seconds")
    f.add_argument("--kv-events", action="store_true", help="the kv router reads workers' KV events, not their caches")
    f.add_argument("--kv-event-lag-ms", type=_nonneg_float, default=0.0, metavar="MS",
                   help="delay before the router sees a KV event (with --kv-events; default 0)")
    f.add_argument("--single-step", action="store_true", help="advance one engine pass at a time (reference mode, slower)")

    d = parser.add_argument_group("disaggregation (prefill/decode pools) and data parallelism")
    d.add_argument("--prefill-workers", type=_worker_count, metavar="N", help="prefill workers (with --decode-workers: disaggregated fleet)")
    d.add_argument("--decode-workers", type=_worker_count, metavar="N", help="decode workers (with --prefill-workers)")
    add_transfer_arguments(d)
    d.add_argument("--dp-size", type=_positive_int, metavar="N", help="data-parallel ranks per worker (default 1)")

    add_engine_arguments(parser)
    k = parser.add_argument_group("KV tiers (KVBM)")
    k.add_argument("--g1-backend", choices=("native", "kvbm"), help="G1 block pool: native LRU or kvbm lineage-aware (default native)")
    k.add_argument("--num-g2-blocks", type=_nonneg_int, metavar="N", help="G2 host blocks per worker (needs --g1-backend kvbm and --kv-bytes-per-token or --model-config)")
    k.add_argument("--num-g3-blocks", type=_nonneg_int, metavar="N", help="G3 disk blocks, shared (needs --g1-backend kvbm)")
    k.add_argument("--g4", action="store_true", help="G4 shared object tier (needs --g1-backend kvbm)")
    k.add_argument("--offload-batch-size", type=_positive_int, metavar="N", help="blocks per G1->G2 offload transfer (default 16)")
    k.add_argument("--tier-bandwidth", action="append", default=[], metavar="LINK=GBPS", help="link bandwidth, LINK one of g1_g2 g2_g1 g2_g3 g3_g2 g3_g4 g4_g2 (repeatable)")

    o = parser.add_argument_group("output")
    o.add_argument("--report-json", metavar="FILE", help="write the summary report (reference key names)")
    o.add_argument("--per-request", metavar="FILE", help="write one JSON line per request")
    o.add_argument("--sla-ttft-ms", type=_nonneg_float, metavar="MS", help="goodput target: TTFT <= MS")
    o.add_argument("--sla-itl-ms", type=_nonneg_float, metavar="MS", help="goodput target: the request's mean ITL <= MS")
    o.add_argument("--sla-e2e-ms", type=_nonneg_float, metavar="MS", help="goodput target: E2E latency <= MS")
    o.add_argument("--quiet", action="store_true", help="no progress bar and no table")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Defaults < ``--engine-config`` YAML < flags. Raises ConfigError naming the field or file."""
    if args.engine_config:
        try:
            base = EngineConfig.from_yaml(args.engine_config)
        except OSError as e:  # a directory, no permission, ...
            raise ConfigError(f"cannot read engine config: {e.strerror or e}", source=args.engine_config) from None
        except UnicodeDecodeError as e:  # a binary or Latin-1 file
            raise ConfigError(f"byte 0x{e.object[e.start]:02x} at offset {e.start}: expected a UTF-8 YAML file",
                              source=args.engine_config) from None
        except ConfigError as e:  # YAML parser messages span several lines: keep the CLI error on one
            raise ConfigError([" ".join(p.split()) for p in e.problems], source=e.source) from None
    else:
        base = EngineConfig()
    overrides: dict[str, Any] = {
        "engine": args.engine,
        "block_size": args.block_size,
        "num_gpu_blocks": args.num_gpu_blocks,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "speedup_ratio": args.speedup_ratio,
        "preemption_mode": args.preemption_mode,
        "timing": args.timing,
        "trace_block_size": args.trace_block_size,
        "dp_size": args.dp_size,
        "enable_prefix_caching": False if args.no_prefix_caching else None,
        "enable_chunked_prefill": False if args.no_chunked_prefill else None,
    }
    # KV-tier and capacity flags exist on `replay` only; other commands sharing this function omit them.
    for name in ("g1_backend", "num_g2_blocks", "num_g3_blocks", "offload_batch_size", "gpu_memory_fraction"):
        overrides[name] = getattr(args, name, None)
    overrides["g4"] = True if getattr(args, "g4", False) else None
    kb, mc = getattr(args, "kv_bytes_per_token", None), getattr(args, "model_config", None)
    if (getattr(args, "num_g2_blocks", None) or base.num_g2_blocks) and (kb is not None or mc is not None):
        # KVBM lower tiers size their transfers with the model's KV bytes per token (kv tiers owner's hook)
        if kb is not None and mc is not None:
            raise ConfigError("--kv-bytes-per-token and --model-config: give one of them, not both")
        if kb is None:
            from mocker.modelcfg import kv_bytes_per_token_from_file

            kb = kv_bytes_per_token_from_file(mc, args.kv_cache_dtype)
        overrides["kv_bytes_per_token"] = kb
    from mocker.kv.tiers import parse_bandwidth_flags  # KVBM flags (kv tiers owner's hook)
    from mocker.config import resolve_kv_capacity

    overrides.update(parse_bandwidth_flags(getattr(args, "tier_bandwidth", [])))
    return resolve_kv_capacity(base.replace(**overrides), blocks_given=args.num_gpu_blocks is not None)


def transfer_config_from_args(args: argparse.Namespace) -> Any:
    """(num_prefill_workers, num_decode_workers, KvTransferConfig | None) from the disaggregation flags.
    Raises ConfigError naming the flag on an inconsistent combination."""
    from mocker.modelcfg import kv_bytes_per_token_from_file
    from mocker.transfer import KvTransferConfig

    p, d = args.prefill_workers, args.decode_workers
    if (p is None) != (d is None):
        raise ConfigError("--prefill-workers and --decode-workers: give both for a disaggregated fleet (or neither)")
    if p is None:
        given = [f for f, v in (("--kv-transfer-bandwidth", args.kv_transfer_bandwidth),
                                ("--kv-bytes-per-token", args.kv_bytes_per_token),
                                ("--model-config", args.model_config)) if v is not None]
        if getattr(args, "num_g2_blocks", None):  # KVBM lower tiers use the KV size too (engine_config_from_args)
            given = [f for f in given if f == "--kv-transfer-bandwidth"]
        if given:
            raise ConfigError(f"{', '.join(given)}: only for a disaggregated fleet (give --prefill-workers and "
                              "--decode-workers) or KVBM lower tiers (--num-g2-blocks)")
        return 0, 0, None
    if args.kv_bytes_per_token is not None and args.model_config is not None:
        raise ConfigError("--kv-bytes-per-token and --model-config: give one of them, not both")
    kv_bytes = args.kv_bytes_per_token
    if args.model_config is not None:
        kv_bytes = kv_bytes_per_token_from_file(args.model_config, args.kv_cache_dtype)
    bw = args.kv_transfer_bandwidth or 0.0
    if bw > 0 and kv_bytes is None:
        raise ConfigError(f"--kv-transfer-bandwidth {bw:g}: needs --kv-bytes-per-token or --model-config")
    return p, d, check(lambda: KvTransferConfig(bandwidth_gbps=bw, kv_bytes_per_token=kv_bytes,
                                                timing=args.kv_transfer_timing, handoff=args.handoff))


# ---------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    """Run the replay. Returns the exit code (0 ok, 2 output not written); raises MockerError on bad input."""
    from mocker.report import build_report, render_table, report_to_json, write_per_request_jsonl, write_report_json
    from mocker.traces import load_trace

    trace_file = [] if args.trace.startswith("synthetic:") else [args.trace]
    trace_file += [args.engine_config] if args.engine_config else []
    trace_file += [args.rate_envelope] if args.rate_envelope else []
    check_output_paths([("--report-json", args.report_json), ("--per-request", args.per_request)], trace_file)
    engine = engine_config_from_args(args)
    n_prefill, n_decode, transfer = transfer_config_from_args(args)
    envelope = None
    if args.rate_envelope is not None:  # checked before the trace is read: a bad spec fails fast
        from mocker.traces import parse_rate_envelope

        envelope = parse_rate_envelope(args.rate_envelope)
    requests = load_trace(args.trace, trace_block_size=engine.trace_block_size, seed=args.seed)
    arrival_speedup = args.arrival_speedup
    if envelope is not None:  # --arrival-speedup first, then the envelope's warp (the fleet then replays as-is)
        from mocker.traces import apply_rate_envelope, scale_arrivals

        requests = apply_rate_envelope(scale_arrivals(requests, arrival_speedup), envelope)
        arrival_speedup = 1.0

    from mocker.fleet import FleetConfig, run_replay  # after input validation: user errors surface first
    fleet = check(lambda: FleetConfig(
        num_workers=args.workers,
        router=args.router,
        arrival_speedup=arrival_speedup,
        max_time_ms=None if args.max_time_s is None else args.max_time_s * 1000.0,
        single_step=args.single_step,
        seed=args.seed,
        kv_events=args.kv_events,
        kv_event_lag_ms=args.kv_event_lag_ms,
        num_prefill_workers=n_prefill,
        num_decode_workers=n_decode,
        transfer=transfer,
    ))
    if not args.quiet:  # rich only for the progress bar and the table (--quiet never loads it)
        from rich.console import Console

        err = Console(stderr=True)
    show_progress = not args.quiet and err.is_terminal
    if show_progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"), TimeElapsedColumn(),
            console=err, transient=True,
        ) as bar:
            task = bar.add_task("replay", total=len(requests))

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            result = run_replay(requests, engine, fleet, progress=progress)
    else:
        result = run_replay(requests, engine, fleet)

    report = build_report(result, sla_ttft_ms=args.sla_ttft_ms, sla_itl_ms=args.sla_itl_ms, sla_e2e_ms=args.sla_e2e_ms)
    if not args.quiet:
        Console().print(render_table(report))

    note = failed_requests_note(result.records, engine)
    if note:  # the engine rejects a prompt that can never fit its KV cache; say so rather than exit silently
        print(f"dynoplan replay: warning: {note}", file=sys.stderr)

    failures: list[str] = []
    json_saved = False
    if args.report_json:
        try:
            write_report_json(report, args.report_json)
            json_saved = True
        except OSError as e:
            failures.append(f"cannot write --report-json {args.report_json}: {e.strerror or e}")
    if args.per_request:
        try:
            write_per_request_jsonl(result.records, args.per_request)
        except OSError as e:
            failures.append(f"cannot write --per-request {args.per_request}: {e.strerror or e}")
    if failures and not json_saved:  # do not lose the computed result: the summary goes to stdout
        sys.stdout.write(report_to_json(report))
        sys.stdout.flush()
        failures[-1] += " (report printed to stdout)"
    for msg in failures:
        print(f"dynoplan replay: error: {msg}", file=sys.stderr)
    return 2 if failures else 0

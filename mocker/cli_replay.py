"""``dynoplan replay``: replay a request trace through a simulated fleet in virtual time.

Reads a trace (Azure CSV, Mooncake JSONL or a ``synthetic:`` spec, see :mod:`mocker.traces`), builds the
engine configuration (defaults < ``--engine-config`` YAML < command-line flags), runs
:func:`mocker.fleet.run_replay`, prints a table and writes ``--report-json`` / ``--per-request``.

Errors: every user mistake (bad flag value, missing or malformed trace, bad YAML, invalid engine setting)
is one line on stderr and exit code 2 — argparse errors through :func:`mocker.arguments.use_one_line_errors`, the
rest as :class:`dynoplan.errors.DynoplanError` caught by the ``dynoplan`` dispatcher. The output paths are checked
before the replay (:func:`mocker.arguments.check_output_paths`: a directory, or one where no file can be created, is
refused); the outputs are written all or none (:func:`dynoplan.outputs.write_flagged_outputs`), so a write that
still fails (a full disk) replaces no earlier file: the report JSON is printed to stdout so the computed result is not
lost, then the error line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from dynoplan.settings import check
from mocker.arguments import (
    MAX_POOL_ENGINE_CORES,
    MAX_WORKERS,
    RATE_ENVELOPE_HELP,
    ROUTERS,
    add_engine_arguments,
    add_transfer_arguments,
    check_output_paths,
    check_pool_engine_cores,
    dp_size_count,
    engine_config_from_args,
    failed_requests_note,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    transfer_config_from_args,
    use_one_line_errors,
    worker_count,
    write_report_outputs,
)
from mocker.config import MAX_DP_SIZE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``replay`` flags on ``parser`` (argparse errors become one stderr line, exit 2)."""
    use_one_line_errors(parser, "dynoplan replay")
    parser.epilog = (
        "TRACE is an Azure LLM inference CSV, a Mooncake JSONL file, or a synthetic workload such as "
        "'synthetic:poisson?rate=5&duration_s=600&isl=1000&osl=200&seed=1' (see docs/offline.md \"Trace formats\"). "
        "Engine settings: defaults < --engine-config YAML < flags."
    )
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--trace",
        required=True,
        metavar="TRACE",
        help="trace file or synthetic:KIND?key=value&... spec",
    )
    w.add_argument("--trace-block-size", type=positive_int, metavar="N", help="tokens per trace hash id (default 512)")
    w.add_argument(
        "--arrival-speedup",
        type=positive_float,
        default=1.0,
        metavar="R",
        help="divide arrival times by R (default 1.0)",
    )
    w.add_argument("--rate-envelope", metavar="SPEC", help=RATE_ENVELOPE_HELP)
    w.add_argument(
        "--seed", type=nonneg_int, default=0, metavar="N", help="seed for synthetic workloads and routers (default 0)"
    )

    f = parser.add_argument_group("fleet")
    f.add_argument(
        "--workers",
        type=worker_count,
        metavar="N",
        help=f"aggregated workers (default 1, at most {MAX_WORKERS}; not with --prefill-workers/--decode-workers)",
    )
    f.add_argument("--router", choices=ROUTERS, default="round_robin", help="request router (default round_robin)")
    f.add_argument("--max-time-s", type=positive_float, metavar="S", help="stop the simulation at S simulated seconds")
    f.add_argument("--kv-events", action="store_true", help="the kv router reads workers' KV events, not their caches")
    f.add_argument(
        "--kv-event-lag-ms",
        type=nonneg_float,
        metavar="MS",
        help="delay before the router sees a KV event (with --kv-events; default 0)",
    )
    f.add_argument(
        "--single-step", action="store_true", help="advance one engine pass at a time (reference mode, slower)"
    )

    d = parser.add_argument_group("disaggregation (prefill/decode pools) and data parallelism")
    d.add_argument(
        "--prefill-workers",
        type=worker_count,
        metavar="N",
        help="prefill workers (with --decode-workers: disaggregated fleet)",
    )
    d.add_argument("--decode-workers", type=worker_count, metavar="N", help="decode workers (with --prefill-workers)")
    add_transfer_arguments(d)
    d.add_argument(
        "--dp-size",
        type=dp_size_count,
        metavar="N",
        help=f"data-parallel ranks per worker, each at least one GPU (default 1, at most {MAX_DP_SIZE}; "
        f"workers x ranks at most {MAX_POOL_ENGINE_CORES} per pool)",
    )

    add_engine_arguments(parser)
    k = parser.add_argument_group("KV tiers (KVBM)")
    k.add_argument(
        "--g1-backend",
        choices=("native", "kvbm"),
        help="G1 block pool: native LRU or kvbm lineage-aware (default native)",
    )
    k.add_argument(
        "--num-g2-blocks",
        type=nonneg_int,
        metavar="N",
        help="G2 host blocks per worker (needs --g1-backend kvbm and --kv-bytes-per-token or --model-config)",
    )
    k.add_argument(
        "--num-g3-blocks", type=nonneg_int, metavar="N", help="G3 disk blocks, shared (needs --g1-backend kvbm)"
    )
    k.add_argument("--g4", action="store_true", help="G4 shared object tier (needs --g1-backend kvbm)")
    k.add_argument(
        "--offload-batch-size", type=positive_int, metavar="N", help="blocks per G1->G2 offload transfer (default 16)"
    )
    k.add_argument(
        "--tier-bandwidth",
        action="append",
        default=[],
        metavar="LINK=GBPS",
        help="link bandwidth, LINK one of g1_g2 g2_g1 g2_g3 g3_g2 g3_g4 g4_g2 (repeatable)",
    )

    o = parser.add_argument_group("output")
    o.add_argument("--report-json", metavar="FILE", help="write the summary report (reference key names)")
    o.add_argument("--per-request", metavar="FILE", help="write one JSON line per request")
    o.add_argument("--sla-ttft-ms", type=positive_float, metavar="MS", help="goodput target: TTFT <= MS")
    o.add_argument(
        "--sla-itl-ms", type=positive_float, metavar="MS", help="goodput target: the request's mean ITL <= MS"
    )
    o.add_argument("--sla-e2e-ms", type=positive_float, metavar="MS", help="goodput target: E2E latency <= MS")
    o.add_argument("--quiet", action="store_true", help="no progress bar and no table")


# ---------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    """Run the replay. Returns the exit code (0 ok, 2 output not written); raises DynoplanError on bad input."""
    # Imported here, not at module level: `dynoplan replay --help` needs only the flags (the engine, the fleet
    # and the trace readers are ~0.1 s of its start-up).
    from dynoplan.errors import ConfigError
    from mocker.fleet import FleetConfig, run_replay
    from mocker.report import build_report, render_table
    from mocker.traces import apply_rate_envelope, load_trace, parse_rate_envelope, scale_arrivals, time_limit_problem

    inputs = [("--engine-config", args.engine_config), ("--rate-envelope", args.rate_envelope)]
    if not args.trace.startswith("synthetic:"):
        inputs.insert(0, ("--trace", args.trace))
    check_output_paths([("--report-json", args.report_json), ("--per-request", args.per_request)], inputs)
    engine = engine_config_from_args(args)
    n_prefill, n_decode, transfer = transfer_config_from_args(args)
    if n_prefill and args.workers is not None:
        raise ConfigError(
            f"--workers={args.workers} with --prefill-workers/--decode-workers: give the aggregated or the "
            "disaggregated fleet, not both"
        )
    _check_kv_event_flags(args)
    pools = {"--prefill-workers": n_prefill, "--decode-workers": n_decode} if n_prefill else {}
    for flag, n in (pools or {"--workers": 1 if args.workers is None else args.workers}).items():
        check_pool_engine_cores(flag, n, engine, args)
    envelope = None
    if args.rate_envelope is not None:  # checked before the trace is read: a bad spec fails fast
        envelope = parse_rate_envelope(args.rate_envelope)
    requests = load_trace(args.trace, trace_block_size=engine.trace_block_size, seed=args.seed)
    arrival_speedup = args.arrival_speedup
    if envelope is not None:  # --arrival-speedup first, then the envelope's warp (the fleet then replays as-is)
        requests = apply_rate_envelope(scale_arrivals(requests, arrival_speedup), envelope)
        arrival_speedup = 1.0
    last_ms = max((r.arrival_ms for r in requests), default=0.0) / arrival_speedup
    too_long = time_limit_problem(last_ms)
    if too_long is not None:
        shaped = [f"--arrival-speedup={args.arrival_speedup:g}"] if args.arrival_speedup != 1.0 else []
        if envelope is not None:
            shaped.append(f"--rate-envelope {args.rate_envelope}")
        raise ConfigError(
            f"--trace {args.trace}{' after ' + ' and '.join(shaped) if shaped else ''}: the last arrival is at "
            f"{last_ms / 1000.0:g} s, {too_long}"
        )

    fleet = check(
        lambda: FleetConfig(
            num_workers=1 if args.workers is None else args.workers,
            router=args.router,
            arrival_speedup=arrival_speedup,
            max_time_ms=None if args.max_time_s is None else args.max_time_s * 1000.0,
            single_step=args.single_step,
            seed=args.seed,
            kv_events=args.kv_events,
            kv_event_lag_ms=0.0 if args.kv_event_lag_ms is None else args.kv_event_lag_ms,
            num_prefill_workers=n_prefill,
            num_decode_workers=n_decode,
            transfer=transfer,
        )
    )
    if not args.quiet:  # rich only for the progress bar and the table (--quiet never loads it)
        from rich.console import Console

        err = Console(stderr=True)
    show_progress = not args.quiet and err.is_terminal
    if show_progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("replaying"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("requests"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
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

    # all or none: a failed write leaves the earlier files as they were, and the report goes to stdout
    code = write_report_outputs("replay", args, report, result.records)
    if getattr(args, "_exit_process", False):  # the process's entry point (planner.cli.main from the console)
        exit_without_teardown(code)
    return code


def _check_kv_event_flags(args: argparse.Namespace) -> None:
    """Refuse a KV-event flag that would have no effect: ``--kv-event-lag-ms`` (no argparse default: any value
    given counts) without ``--kv-events``, and ``--kv-events`` with a router other than ``kv`` (only the kv
    router reads the workers' KV events, :mod:`mocker.kv.events`). Raises ConfigError naming the flag, its
    value and the missing prerequisite."""
    from dynoplan.errors import ConfigError

    if args.kv_event_lag_ms is not None and not args.kv_events:
        raise ConfigError(
            f"--kv-event-lag-ms {args.kv_event_lag_ms:g}: only with --kv-events (the delay before the kv router "
            "sees a KV event); expected --kv-events or no --kv-event-lag-ms"
        )
    if args.kv_events and args.router != "kv":
        raise ConfigError(
            f"--kv-events with --router {args.router}: only the kv router reads the workers' KV events; "
            "expected --router kv or no --kv-events"
        )


def exit_without_teardown(code: int) -> None:
    """End the process now with ``code``, skipping the interpreter's teardown (freeing every object of the
    replay one by one: millions of token times, about 0.1 s of CPU for the bundled Azure trace, and the
    modules). Returns, leaving the usual exit to the caller, when stdout or stderr cannot be flushed.

    Safe only once all output is complete, as at the end of :func:`run`: the output files are written and
    closed (``write_report_json``, ``write_per_request_jsonl``), stdout and stderr are flushed here, and the
    replay registers no ``atexit`` work, starts no process or thread and leaves no temporary file."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stream: the normal exit reports it
        return
    os._exit(code)

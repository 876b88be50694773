"""Command line of the live mocker: ``dynoplan mocker serve``, ``dynoplan frontend``, ``dynoplan loadgen``.

The ``dynoplan`` dispatcher (``planner/cli.py``) maps one module per subcommand, each with
``add_arguments(parser)`` / ``run(args)``; this module serves ``mocker`` (with the nested ``serve``),
and the thin modules :mod:`mocker.live.cli_frontend` / :mod:`mocker.live.cli_loadgen` re-export the
frontend and loadgen pairs below. What only a run needs (aiohttp, zmq, asyncio, the engines, the report
and trace readers) is imported in the ``run*`` functions, so that ``--help`` loads just the flags.

Every user mistake is one line on stderr and exit code 2 (argparse errors, ConfigError, TraceError).
Servers print ``listening on http://HOST:PORT`` on stdout once bound (so scripts can wait for it and
learn a port chosen with ``--port 0``), and stop cleanly on SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from typing import Any

from dynoplan.errors import ConfigError
from dynoplan.settings import check
from mocker.arguments import (
    add_worker_arguments,
    check_output_paths,
    engine_config_from_args,
    nonneg_int,
    positive_float,
    positive_int,
    use_one_line_errors,
    write_report_outputs,
)


# ---------------------------------------------------------------------------------------------- mocker serve
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``dynoplan mocker serve ...`` (nested subcommand)."""
    use_one_line_errors(parser, "dynoplan mocker")
    sub = parser.add_subparsers(dest="mocker_command", metavar="{serve}")
    sub.required = True
    p = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="run a live worker: OpenAI HTTP API, Prometheus metrics, FPM/KV events",
        description="Run one live mocker worker on the wall clock (see mocker.live.worker).",
    )
    use_one_line_errors(p, "dynoplan mocker serve")
    add_worker_arguments(p)


def run(args: argparse.Namespace) -> int:
    from mocker.engine import make_engine  # the engines (~0.05 s): not for `dynoplan mocker serve --help`
    from mocker.live.worker import WorkerSettings, serve  # aiohttp + pyzmq (~0.3 s): only when a worker starts

    cfg = engine_config_from_args(args).replace(worker_type=args.worker_type, dp_size=args.dp_size)
    s = check(
        lambda: WorkerSettings(
            engine=cfg,
            host=args.host,
            port=args.port,
            model_name=args.model_name,
            worker_id=args.worker_id,
            max_model_len=args.max_model_len,
            fpm_endpoint=None if args.fpm_endpoint == "off" else args.fpm_endpoint,
            kv_events_endpoint=None if args.kv_events_endpoint == "off" else args.kv_events_endpoint,
            heartbeat_s=args.heartbeat_s,
            kv_bytes_per_token=args.kv_bytes_per_token,
            kv_transfer_bandwidth_gbps=args.kv_transfer_bandwidth_gbps,
            bootstrap_port=args.bootstrap_port,
        )
    )
    make_engine(cfg)  # fail now, with the engine's own message, not at start-up
    return _serve_forever(lambda on_bound: serve(s, on_bound=on_bound), args.host)


def _run_loop(coro: Any) -> Any:
    """Run ``coro`` on uvloop when installed (about twice the asyncio throughput per core for the many
    small socket writes of token streaming), else on the standard asyncio loop."""
    try:
        import uvloop
    except ImportError:
        import asyncio  # here, not at module level: asyncio is ~0.03 s of every --help's start-up

        return asyncio.run(coro)
    return uvloop.run(coro)


def _serve_forever(make: Callable[[Callable[[int], None]], Any], host: str) -> int:
    import asyncio  # here, not at module level: asyncio is ~0.03 s of every --help's start-up

    def bound(port: int) -> None:
        print(f"listening on http://{host}:{port}", flush=True)

    async def main() -> None:
        task = asyncio.ensure_future(make(bound))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    try:
        _run_loop(main())
    except OSError as e:  # e.g. port in use
        raise ConfigError(f"cannot listen on {host}: {e.strerror or e}") from None
    return 0


# ---------------------------------------------------------------------------------------------- frontend
def add_frontend_arguments(parser: argparse.ArgumentParser) -> None:
    use_one_line_errors(parser, "dynoplan frontend")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=nonneg_int, default=8080, help="HTTP port, 0 = any free port (default 8080)")
    parser.add_argument("--workers", default="", metavar="URL[,URL...]", help="static worker base URLs")
    parser.add_argument(
        "--workers-file", metavar="FILE", help="file of worker URLs (one per line), re-read when it changes"
    )
    parser.add_argument(
        "--router",
        choices=("round_robin", "least_loaded", "kv"),
        default="round_robin",
        help="routing policy (default round_robin)",
    )
    parser.add_argument("--model-name", default="mocker", help="served model name (default mocker)")
    parser.add_argument("--poll-s", type=positive_float, default=0.5, help="discovery poll period (default 0.5 s)")
    parser.add_argument(
        "--pd-mode",
        choices=("direct", "bootstrap"),
        default="direct",
        help="disaggregated hand-off: direct (prefill then decode) or bootstrap (both at once; default direct)",
    )


def run_frontend(args: argparse.Namespace) -> int:
    from mocker.live.frontend import FrontendSettings, serve  # aiohttp (~0.3 s): only when a frontend starts

    s = check(
        lambda: FrontendSettings(
            host=args.host,
            port=args.port,
            workers=tuple(u for u in args.workers.split(",") if u),
            workers_file=args.workers_file,
            router=args.router,
            model_name=args.model_name,
            poll_s=args.poll_s,
            pd_mode=args.pd_mode,
        )
    )
    return _serve_forever(lambda on_bound: serve(s, on_bound=on_bound), args.host)


# ---------------------------------------------------------------------------------------------- loadgen
def add_loadgen_arguments(parser: argparse.ArgumentParser) -> None:
    use_one_line_errors(parser, "dynoplan loadgen")
    parser.add_argument(
        "--url", required=True, help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument(
        "--trace",
        required=True,
        metavar="TRACE",
        help="trace file (Azure CSV, Mooncake JSONL) or synthetic:KIND?... spec",
    )
    parser.add_argument(
        "--trace-block-size", type=positive_int, default=512, help="tokens per trace hash id (default 512)"
    )
    parser.add_argument("--seed", type=nonneg_int, default=0, help="seed of synthetic workloads (default 0)")
    parser.add_argument(
        "--time-compression",
        type=positive_float,
        default=1.0,
        metavar="R",
        help="divide arrival times by R (default 1)",
    )
    parser.add_argument("--max-requests", type=positive_int, metavar="N", help="send only the first N requests")
    parser.add_argument(
        "--max-concurrency", type=nonneg_int, default=0, help="max requests in flight, 0 = unbounded (default)"
    )
    parser.add_argument("--model", default="mocker", help="model name to request (default mocker)")
    parser.add_argument(
        "--endpoint", choices=("completions", "chat"), default="completions", help="API to call (default completions)"
    )
    parser.add_argument(
        "--prompt-mode",
        choices=("length", "text"),
        default="length",
        help="length: send input_length/hash_ids extension fields (dynoplan servers); text: a generated prompt",
    )
    parser.add_argument(
        "--scale-ms",
        type=positive_float,
        default=1.0,
        metavar="K",
        help="multiply reported times by K (e.g. the server's speedup ratio, to read simulated ms)",
    )
    parser.add_argument(
        "--request-timeout-s", type=positive_float, default=600.0, help="per-request timeout (default 600 s)"
    )
    parser.add_argument("--report-json", metavar="FILE", help="write the client-side report (offline report key names)")
    parser.add_argument("--per-request", metavar="FILE", help="write one JSON line per request (client-side times, ms)")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar and no table (failed requests are still summed up on stderr)",
    )
    parser.epilog = (
        "Exit code: 0 when every request completed, 1 when any request failed (the failures are "
        "summed up on stderr and listed in --report-json), 2 on a usage error or a --url that cannot "
        "be reached (checked once before the run)."
    )


def run_loadgen(args: argparse.Namespace) -> int:
    # aiohttp (~0.3 s), rich, the report and the trace readers: only when a load generator runs, not for --help
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mocker.live.loadgen import (
        LoadgenSettings,
        client_report,
        probe_server,
        run_load,
        scaled,
    )
    from mocker.report import render_table
    from mocker.traces import load_trace

    trace_file = [] if args.trace.startswith("synthetic:") else [("--trace", args.trace)]
    check_output_paths([("--report-json", args.report_json), ("--per-request", args.per_request)], trace_file)
    s = check(
        lambda: LoadgenSettings(
            url=args.url,
            model=args.model,
            endpoint=args.endpoint,
            time_compression=args.time_compression,
            max_concurrency=args.max_concurrency,
            prompt_mode=args.prompt_mode,
            request_timeout_s=args.request_timeout_s,
        )
    )
    reqs = load_trace(args.trace, trace_block_size=args.trace_block_size, seed=args.seed)
    if args.max_requests:
        reqs = reqs[: args.max_requests]
    why, served = _run_loop(probe_server(s.url))
    if why is not None:
        raise ConfigError(
            f"url={s.url!r}: cannot connect ({why}); expected a running OpenAI-compatible server "
            "(e.g. the frontend of `dynoplan up`)"
        )
    # length prompts carry hash_ids, which the workers refuse in another block size: say it once, before sending
    if s.prompt_mode == "length" and served is not None and served != args.trace_block_size:
        raise ConfigError(
            f"--trace-block-size {args.trace_block_size}: the server at {s.url} takes hash_ids of {served}-token "
            f"blocks (its workers' trace_block_size); expected --trace-block-size {served} (a trace file's hash_ids "
            "must have been written in the workers' block size)"
        )
    console = Console(stderr=True)
    if args.quiet:
        result = _run_loop(run_load(s, reqs, stop_on_signals=True))
    else:
        with Progress(
            TextColumn("loadgen"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as prog:
            task = prog.add_task("requests", total=len(reqs))
            result = _run_loop(
                run_load(s, reqs, progress=lambda done, total: prog.update(task, completed=done), stop_on_signals=True)
            )
    if args.scale_ms != 1.0:
        result = scaled(result, args.scale_ms)
    rep = client_report(result)
    if not args.quiet:
        Console().print(render_table(rep, title="dynoplan loadgen (client-side)", client_side=True))
        if rep["coalesced_itl_ratio"] > 0:
            console.print(
                f"note: {rep['coalesced_itl_ratio']:.1%} of inter-token gaps had both tokens in one network "
                "read (the server streams faster than the client resolves); ITL counts them as 0 ms, "
                "TPOT is unaffected",
                highlight=False,
            )
    if rep["failed_requests"]:  # also under --quiet: the exit code 1 says something failed, these lines say what
        # soft_wrap: one line each however long (rich would otherwise wrap at the terminal width, 80 in a pipe)
        console.print(
            f"[red]{rep['failed_requests']} requests failed: {rep['errors']}[/red]", highlight=False, soft_wrap=True
        )
        firsts = {f["reason"]: f for f in reversed(rep["failures"])}  # the first failure of each reason
        for reason, f in sorted(firsts.items()):
            console.print(
                f"  {reason}: request {f['request_id']}: {f['message']}", highlight=False, markup=False, soft_wrap=True
            )
    # paths checked up front (check_output_paths); written all or none, as replay's (a full disk replaces nothing)
    if write_report_outputs("loadgen", args, rep, result.records):
        return 2  # the measured result is not lost: the report went to stdout, then the one line
    if result.interrupted_by is not None:  # stopped by Ctrl-C or SIGTERM: what was measured is reported above
        sent, cancelled = len(result.records), sum(1 for r in result.records if r.status == "cancelled")
        console.print(
            f"dynoplan loadgen: interrupted after sending {sent} of {len(reqs)} requests ({cancelled} in flight, "
            "reported as failed); the table and the outputs hold the requests sent",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return 128 + int(result.interrupted_by)  # the shell's code for a process ended by that signal
    return 0 if rep["failed_requests"] == 0 else 1

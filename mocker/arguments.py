"""The command-line arguments shared by the ``dynoplan`` commands, and what they build — not a CLI module.

The mocker's commands (``replay``, ``mocker serve``, ``frontend``, ``loadgen``) and the planner's
(``simulate``, ``profile``, ``up``) take the same engine, KV-transfer and fleet-size flags with the same
names, types and meaning; they are defined once here: argparse value types (:func:`positive_int`, ...),
argument groups (:func:`add_engine_arguments`, :func:`add_transfer_arguments`,
:func:`add_worker_arguments`), and the readers that turn parsed flags into configuration
(:func:`engine_config_from_args`, :func:`transfer_config_from_args`, :func:`worker_from_argv`).

Library code that needs to know what a ``mocker serve`` worker would run (``planner.live.config``) calls
:func:`worker_from_argv`; no library module imports a ``cli_*`` module (import-linter contract in
pyproject.toml).

Errors: the value types raise ``argparse.ArgumentTypeError`` (argparse names the flag);
:func:`use_one_line_errors` makes a parser's errors one stderr line with exit code 2; the readers raise
:class:`dynoplan.errors.ConfigError` naming the flag or file.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from dynoplan.errors import ConfigError
from dynoplan.fields import MAX_INT64, float_text, int_text
from dynoplan.options import refuse_repeated_options
from dynoplan.outputs import writable_file_problem
from dynoplan.settings import check
from mocker.config import (
    ENGINES,
    MAX_DP_SIZE,
    MAX_SPEEDUP_RATIO,
    SPEEDUP_LIMIT_WHY,
    EngineConfig,
    resolve_kv_capacity,
)
from mocker.kv.tiers import parse_bandwidth_flags
from mocker.modelcfg import KV_CACHE_DTYPES, kv_bytes_per_token_from_file
from mocker.transfer import HANDOFF_PATHS, TIMING_MODES, KvTransferConfig

ROUTERS = ("round_robin", "least_loaded", "kv")
MAX_WORKERS = 4096
"""Upper bound of ``--workers`` / ``--prefill-workers`` / ``--decode-workers``: every worker is built up
front with its own KV cache and scheduler, so 100000 workers exhaust memory before the first request
(far above any fleet the planner scales to)."""
MAX_POOL_ENGINE_CORES = 65536
"""Upper bound of one pool's engine cores, workers x ``dp_size`` (``--workers`` / ``--prefill-workers`` /
``--decode-workers`` in ``replay``, ``--max-replicas`` in ``simulate``, times ``--dp-size``). Each DP rank is
an engine core built up front with its own scheduler and KV cache (about 2.8 KB at the default settings:
65536 cores take about 0.24 GB before the first request, 0.5 s as 64 x 1024 and 1.3 s as 4096 x 16; 4096 x
144 took 1.7 GB and 27 s) and holds at least one GPU. 65536 = :data:`MAX_WORKERS` workers of 16 ranks (two
8-GPU nodes each) = 64 workers of :data:`mocker.config.MAX_DP_SIZE` ranks; 65536 GPUs is about 30 times the
largest inference fleet published (DeepSeek's at its daily peak: 278 nodes of 8 GPUs). Without it
``--workers 4096 --dp-size 1000`` ended in a MemoryError traceback after two minutes."""


# ---------------------------------------------------------------------------------------------- arg types
def positive_int(text: str) -> int:
    """argparse type: an integer > 0 and at most :data:`dynoplan.fields.MAX_INT64` (the settings' bound)."""
    try:
        v = int_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    if v > MAX_INT64:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer <= {MAX_INT64}")
    return v


def worker_count(text: str) -> int:
    """argparse type: a worker count 1..:data:`MAX_WORKERS`."""
    v = positive_int(text)
    if v > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a worker count between 1 and {MAX_WORKERS}")
    return v


def dp_size_count(text: str) -> int:
    """argparse type of ``--dp-size``: data-parallel ranks per worker, 1..:data:`mocker.config.MAX_DP_SIZE`."""
    v = positive_int(text)
    if v > MAX_DP_SIZE:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a DP size between 1 and {MAX_DP_SIZE} (ranks per worker, each at least one GPU)"
        )
    return v


def check_pool_engine_cores(flag: str, workers: int, engine: EngineConfig, args: argparse.Namespace) -> None:
    """Refuse a pool of ``workers`` workers (the count ``flag`` gave) of ``engine.dp_size`` ranks each when it
    holds more than :data:`MAX_POOL_ENGINE_CORES` engine cores. Raises ConfigError naming ``flag``, the DP size's
    source (``--dp-size``, else the ``--engine-config`` file) and both values."""
    dp = engine.dp_size
    if workers * dp <= MAX_POOL_ENGINE_CORES:
        return
    if getattr(args, "dp_size", None) is not None:
        source = f"--dp-size={dp}"
    else:
        source = f"dp_size={dp} (--engine-config {getattr(args, 'engine_config', None)})"
    raise ConfigError(
        f"{flag}={workers} x {source} = {workers * dp} engine cores in one pool (each DP rank is a scheduler and "
        f"KV cache built up front, and at least one GPU); expected at most {MAX_POOL_ENGINE_CORES}: fewer workers "
        "or a smaller DP size"
    )


def check_output_paths(outputs: list[tuple[str, str | None]], inputs: list[tuple[str, str | None]]) -> None:
    """Refuse output paths before any work: each ``(flag, path)`` (``path`` None = not given) must be a
    non-empty path with an existing parent directory (one rule for every command, as ``profile --out``), must
    be able to take the file (:func:`dynoplan.outputs.writable_file_problem`: not a directory, a directory that
    takes a new file) and must not be one of the ``(flag, path)`` input files (a ``--per-request`` onto the trace
    would overwrite it). Raises ConfigError naming the flag and path, and for a clash the flag that reads the
    file."""
    for flag, path in outputs:
        if path is None:
            continue
        if not path.strip():
            raise ConfigError(f"{flag} {path!r}: empty, expected a file path (omit {flag} to write none)")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise ConfigError(
                f"{flag} {path}: parent directory {parent} does not exist or is not a directory; "
                "expected an existing directory"
            )
        for src_flag, src in inputs:
            if src and os.path.exists(path) and os.path.exists(src) and os.path.samefile(path, src):
                raise ConfigError(
                    f"{flag} {path}: is the {src_flag} file {src} (an input); expected a different output file"
                )
        problem = writable_file_problem(path)
        if problem is not None:
            raise ConfigError(f"{flag} {path}: {problem}")
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if path:
            real = os.path.realpath(path)
            if real in seen:
                raise ConfigError(f"{flag} {path}: same file as {seen[real]}; expected a different output file")
            seen[real] = flag


def write_report_outputs(command: str, args: argparse.Namespace, report: dict[str, Any], records: Sequence[Any]) -> int:
    """Write the outputs of ``dynoplan COMMAND`` (``replay``, ``loadgen``) that ``args`` gives, ``--report-json`` (the
    report) and ``--per-request`` (one line per record), all or none (:func:`dynoplan.outputs.write_flagged_outputs`;
    their paths were checked before the run by :func:`check_output_paths`). Returns 0 when written (or none given),
    2 when one could not be: the report is then on stdout, one line on stderr, and every earlier file as it was."""
    from dynoplan.outputs import write_flagged_outputs
    from mocker.report import report_to_json, write_per_request_jsonl, write_report_json

    outputs: list[tuple[str, str, Callable[[Path], object]]] = []
    if args.report_json:
        outputs.append(("--report-json", args.report_json, lambda p: write_report_json(report, p)))
    if args.per_request:
        outputs.append(("--per-request", args.per_request, lambda p: write_per_request_jsonl(records, p)))
    return write_flagged_outputs(command, outputs, report_to_json(report)) if outputs else 0


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0 and at most :data:`dynoplan.fields.MAX_INT64` (the settings' bound)."""
    try:
        v = int_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    if v > MAX_INT64:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0 and <= {MAX_INT64}")
    return v


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        v = float_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number > 0") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number > 0")
    return v


def speedup_ratio(text: str) -> float:
    """argparse type of ``--speedup-ratio``: a finite number > 0 and at most :data:`mocker.config.MAX_SPEEDUP_RATIO`
    (pass times are rounded to whole nanoseconds; beyond it the shortest would round to 0)."""
    v = positive_float(text)
    if v > MAX_SPEEDUP_RATIO:
        raise argparse.ArgumentTypeError(f"{text!r}: expected at most {MAX_SPEEDUP_RATIO:.0f} ({SPEEDUP_LIMIT_WHY})")
    return v


def positive_seconds(text: str) -> float:
    """argparse type: a duration, a finite number of seconds > 0 (the wording of the settings' seconds)."""
    try:
        v = float_text(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds > 0")
    return v


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        v = float_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0") from None
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0")
    return v


def use_one_line_errors(parser: argparse.ArgumentParser, prog: str) -> None:
    """Replace ``parser.error``: ``PROG: error: MESSAGE (see --help)`` on stderr, exit code 2."""

    def error(message: str) -> NoReturn:
        print(f"{prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)

    parser.error = error  # type: ignore[method-assign]  # on purpose: this parser's errors, not the class's


def failed_requests_note(records: Sequence[Any], engine: EngineConfig) -> str | None:
    """The warning text for requests the engine rejected, or None when none was; shared by ``dynoplan
    replay`` and ``dynoplan simulate`` (which prefix their own names).

    A request fails when its sequence — prompt plus the output tokens generated so far — can never fit one
    worker's KV cache (``num_gpu_blocks x block_size`` tokens; a request that outgrows it while decoding is
    preempted and then refused on re-admission), or, without chunked prefill, when its prompt exceeds
    ``max_num_batched_tokens``. The note names the failed request with the most prompt + output tokens."""
    failed = [r for r in records if r.status == "failed"]
    if not failed:
        return None
    big = max(failed, key=lambda r: (r.input_length + r.output_length, r.input_length))
    capacity = engine.num_gpu_blocks * engine.effective_block_size
    no_chunk = (
        ""
        if engine.enable_chunked_prefill
        else f", or a prompt above max_num_batched_tokens={engine.max_num_batched_tokens} (chunked prefill off)"
    )
    return (
        f"{len(failed)} of {len(records)} requests failed: prompt + output tokens that can never fit in a "
        f"worker's KV cache{no_chunk} (largest failed request: {big.input_length} prompt + {big.output_length} "
        f"output = {big.input_length + big.output_length} tokens; num_gpu_blocks={engine.num_gpu_blocks} x "
        f"block_size={engine.effective_block_size} = {capacity} tokens); they count as not completed"
    )


# ---------------------------------------------------------------------------------------------- parser
RATE_ENVELOPE_HELP = (
    "time-warp arrivals (after --arrival-speedup) by a rate multiplier m(t): "
    "periodic:period_s=P,low=A,high=B[,phase_s=S][,duration_s=D] (raised cosine from A to B; with D "
    "the trace is repeated to cover D s, then cut) or a CSV file time_s,multiplier (piecewise linear)"
)


def add_transfer_arguments(group: Any) -> None:
    """The prefill->decode KV-transfer flags (``--kv-transfer-bandwidth``, ``--kv-bytes-per-token``,
    ``--model-config``, ``--kv-cache-dtype``, ``--kv-transfer-timing``, ``--handoff``) on ``group`` (a parser or
    argument group); shared by ``dynoplan replay`` and ``dynoplan simulate``."""
    group.add_argument(
        "--kv-transfer-bandwidth",
        type=nonneg_float,
        metavar="GBPS",
        help="prefill->decode KV transfer bandwidth in GB/s (1e9 B/s); 0 = no delay (default 0)",
    )
    group.add_argument(
        "--kv-bytes-per-token", type=positive_int, metavar="N", help="KV bytes per token (or --model-config)"
    )
    group.add_argument(
        "--model-config",
        metavar="config.json",
        help="Hugging Face config.json: kv bytes/token = layers x 2 x kv_heads x head_dim x dtype bytes",
    )
    # No argparse defaults for the three choices (None = not given): a flag given where it has no effect (a
    # dtype without --model-config, a handoff without a disaggregated fleet) is refused, not ignored, even
    # when its value is the default (kv_transfer_from_args, transfer_config_from_args).
    group.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        help="KV cache dtype for --model-config (default auto = the model's torch_dtype)",
    )
    group.add_argument(
        "--kv-transfer-timing",
        choices=TIMING_MODES,
        help="tokens charged: whole prompt, or only blocks the decode worker lacks (default full_prompt)",
    )
    group.add_argument(
        "--handoff",
        choices=HANDOFF_PATHS,
        help="prefill->decode handoff path (default coordinated, the reference's timeline)",
    )


def add_engine_arguments(parser: argparse.ArgumentParser, title: str = "engine (override --engine-config)") -> None:
    """The engine flags shared by ``replay``, ``simulate``, ``profile`` and ``mocker serve`` (same names, same meaning).

    Read back with :func:`engine_config_from_args`.
    """
    e = parser.add_argument_group(title)
    e.add_argument("--engine-config", metavar="FILE.yaml", help="engine settings file (flat or {engine: {...}})")
    e.add_argument("--engine", choices=ENGINES, help="scheduler family (default vllm)")
    e.add_argument(
        "--block-size",
        "--page-size",
        type=positive_int,
        metavar="N",
        help="tokens per KV block (SGLang: page size; default: vllm 64, trtllm 32, sglang 1)",
    )
    e.add_argument(
        "--num-gpu-blocks", type=positive_int, metavar="N", help="KV cache capacity in blocks (default 16384)"
    )
    e.add_argument("--max-num-seqs", type=positive_int, metavar="N", help="max running sequences (default 256)")
    e.add_argument(
        "--max-num-batched-tokens", type=positive_int, metavar="N", help="per-pass token budget (default 8192)"
    )
    e.add_argument(
        "--speedup-ratio",
        type=speedup_ratio,
        metavar="R",
        help=f"divide every pass time by R (default 1.0; at most {MAX_SPEEDUP_RATIO:.0f}: pass times are rounded to "
        "whole nanoseconds, and the shortest, 1 ms, lasts 1 ns at 1e6)",
    )
    e.add_argument(
        "--preemption-mode", choices=("lifo", "fifo"), help="which request to recompute when KV runs out (default lifo)"
    )
    e.add_argument("--no-prefix-caching", action="store_true", help="disable prefix caching")
    e.add_argument("--no-chunked-prefill", action="store_true", help="disable chunked prefill")
    e.add_argument(
        "--timing",
        metavar="polynomial|FILE.npz|aic:SPEC",
        help="timing model (default polynomial; "
        "aic:model=...,system=...,backend=...,tp=...,quant=... = AIConfigurator)",
    )
    e.add_argument(
        "--gpu-memory-fraction",
        type=positive_float,
        metavar="F",
        help="with --timing aic:...: KV blocks from this share of GPU memory (when --num-gpu-blocks is not given)",
    )


def engine_config_from_args(args: argparse.Namespace, file_settings: Any = None) -> EngineConfig:
    """Defaults < ``--engine-config`` YAML < flags. ``file_settings``: the ``--engine-config`` file's mapping
    when the caller has read it already (each input is read once), else the file is read here by
    :func:`dynoplan.settings_text.load_file` (the one grammar of every settings file). Raises ConfigError
    naming the field, or the flag and the file."""
    if args.engine_config:
        source = f"--engine-config {args.engine_config}"
        if file_settings is None:
            from dynoplan.settings_text import load_file

            file_settings = load_file(args.engine_config, source, "engine config file")
        base = EngineConfig.from_mapping(file_settings, source=source)
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
        # --trace-block-size / --dp-size: each command places them in its own group (or omits them)
        "trace_block_size": getattr(args, "trace_block_size", None),
        "dp_size": getattr(args, "dp_size", None),
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
        if mc is not None:  # then kb is None
            kb = kv_bytes_per_token_from_file(mc, args.kv_cache_dtype or "auto")
        overrides["kv_bytes_per_token"] = kb
    overrides.update(parse_bandwidth_flags(getattr(args, "tier_bandwidth", [])))
    return resolve_kv_capacity(base.replace(**overrides), blocks_given=args.num_gpu_blocks is not None)


def transfer_config_from_args(args: argparse.Namespace) -> tuple[int, int, KvTransferConfig | None]:
    """(num_prefill_workers, num_decode_workers, KvTransferConfig | None) from the disaggregation flags
    (``--prefill-workers`` / ``--decode-workers`` and :func:`add_transfer_arguments`'s). Raises ConfigError
    naming the flag on an inconsistent combination, and naming each flag and its value when a flag would have
    no effect: a KV-transfer flag without a disaggregated fleet (``--kv-bytes-per-token`` / ``--model-config``
    also size the KVBM lower tiers, so ``--num-g2-blocks`` takes them), ``--kv-cache-dtype`` without
    ``--model-config``."""
    p, d = args.prefill_workers, args.decode_workers
    if (p is None) != (d is None):
        raise ConfigError("--prefill-workers and --decode-workers: give both for a disaggregated fleet (or neither)")
    if p is None:
        transfer_only = given_flags(args, ("--kv-transfer-bandwidth", "--kv-transfer-timing", "--handoff"))
        kv_size = given_flags(args, ("--kv-bytes-per-token", "--model-config", "--kv-cache-dtype"))
        if getattr(args, "num_g2_blocks", None):  # KVBM lower tiers use the KV size too (engine_config_from_args)
            kv_size = []
        if transfer_only or kv_size:
            tiers = "" if transfer_only else " or KVBM lower tiers"
            raise ConfigError(
                f"{', '.join(transfer_only + kv_size)}: only for a disaggregated fleet{tiers}; expected "
                f"--prefill-workers and --decode-workers{', or --num-g2-blocks' if tiers else ''}, or none of "
                "these flags"
            )
        _check_kv_cache_dtype(args)
        return 0, 0, None
    return p, d, kv_transfer_from_args(args)


def given_flags(args: argparse.Namespace, flags: Sequence[str]) -> list[str]:
    """``FLAG VALUE`` for each of ``flags`` given on the command line (its parsed value is not None: for flags
    without an argparse default, as :func:`add_transfer_arguments`'s), for a message refusing them; numbers
    as ``%g``."""
    out = []
    for flag in flags:
        v = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if v is not None:
            out.append(f"{flag} {v:g}" if isinstance(v, float) else f"{flag} {v}")
    return out


def _check_kv_cache_dtype(args: argparse.Namespace) -> None:
    """Refuse ``--kv-cache-dtype`` without ``--model-config``: the dtype only turns a model's config.json into
    KV bytes per token (``--kv-bytes-per-token`` is already a byte count). Raises ConfigError naming both."""
    if args.kv_cache_dtype is not None and args.model_config is None:
        raise ConfigError(
            f"--kv-cache-dtype {args.kv_cache_dtype}: only with --model-config (it sets the bytes per KV value of "
            "the model's config.json); expected --model-config or no --kv-cache-dtype"
        )


def kv_transfer_from_args(args: argparse.Namespace) -> KvTransferConfig:
    """The prefill->decode KV transfer of a disaggregated fleet from :func:`add_transfer_arguments`'s flags
    (a flag not given: :class:`mocker.transfer.KvTransferConfig`'s default). Raises ConfigError naming the
    flag (both ``--kv-bytes-per-token`` and ``--model-config``, a bandwidth without a KV size,
    ``--kv-cache-dtype`` without ``--model-config``)."""
    if args.kv_bytes_per_token is not None and args.model_config is not None:
        raise ConfigError("--kv-bytes-per-token and --model-config: give one of them, not both")
    _check_kv_cache_dtype(args)
    kv_bytes = args.kv_bytes_per_token
    if args.model_config is not None:
        kv_bytes = kv_bytes_per_token_from_file(args.model_config, args.kv_cache_dtype or "auto")
    bw = args.kv_transfer_bandwidth or 0.0
    if bw > 0 and kv_bytes is None:
        raise ConfigError(f"--kv-transfer-bandwidth {bw:g}: needs --kv-bytes-per-token or --model-config")
    chosen = {k: v for k, v in (("timing", args.kv_transfer_timing), ("handoff", args.handoff)) if v is not None}
    return check(lambda: KvTransferConfig(bandwidth_gbps=bw, kv_bytes_per_token=kv_bytes, **chosen))


# ---------------------------------------------------------------------------------------------- a live worker
WORKER_TYPES = ("aggregated", "prefill", "decode")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of one live ``mocker serve`` worker (HTTP/metrics/event endpoints, the decode role's KV
    transfer, the engine of :func:`add_engine_arguments` and the worker layout); read back by
    ``mocker.cli_live.run`` and :func:`worker_from_argv`."""
    p = parser
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=nonneg_int, default=8000, help="HTTP port, 0 = any free port (default 8000)")
    p.add_argument("--model-name", default="mocker", help="served model name (default mocker)")
    p.add_argument("--worker-id", type=nonneg_int, default=0, help="worker id in FPM and KV events (default 0)")
    p.add_argument(
        "--max-model-len", type=positive_int, help="max prompt+output tokens (default: one rank's KV capacity)"
    )
    p.add_argument(
        "--fpm-endpoint", default="tcp://127.0.0.1:0", help="ZMQ PUB endpoint for ForwardPassMetrics ('off' to disable)"
    )
    p.add_argument(
        "--kv-events-endpoint", default="tcp://127.0.0.1:0", help="ZMQ PUB endpoint for KV events ('off' to disable)"
    )
    p.add_argument("--heartbeat-s", type=positive_float, default=1.0, help="idle FPM heartbeat period (default 1 s)")
    p.add_argument(
        "--kv-bytes-per-token",
        type=nonneg_int,
        default=0,
        help="decode role: KV bytes per prompt token (0 = no transfer delay)",
    )
    p.add_argument(
        "--kv-transfer-bandwidth-gbps",
        type=nonneg_float,
        default=0.0,
        help="decode role: KV transfer GB/s (0 = no delay)",
    )
    p.add_argument(
        "--bootstrap-port", type=nonneg_int, help="prefill role: TCP port of the bootstrap handoff (0 = any free port)"
    )
    add_engine_arguments(parser, "engine (as in replay; override --engine-config)")
    e = parser.add_argument_group("worker layout")
    e.add_argument(
        "--trace-block-size",
        type=positive_int,
        metavar="N",
        help="tokens per prompt block id (hash_ids) in requests and KV events (default 512)",
    )
    e.add_argument("--worker-type", choices=WORKER_TYPES, help="role in a disaggregated pool (default aggregated)")
    e.add_argument(
        "--dp-size",
        type=dp_size_count,
        metavar="N",
        help=f"data-parallel ranks, each its own scheduler and KV cache (default 1, at most {MAX_DP_SIZE})",
    )


class WorkerArgvError(ConfigError):
    """Flags that ``mocker serve``'s parser rejects (``problems``: argparse's message)."""


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """What a ``mocker serve`` worker started with some argv runs: its engine (role and DP size applied) and
    the decode role's KV transfer flags (``kv_transfer_bandwidth_gbps`` GB/s, ``kv_bytes_per_token`` bytes;
    0 = no transfer delay)."""

    engine: EngineConfig
    kv_transfer_bandwidth_gbps: float
    kv_bytes_per_token: int

    @property
    def worker_type(self) -> str:
        """``aggregated``, ``prefill`` or ``decode``."""
        return self.engine.worker_type


def worker_from_argv(argv: Sequence[str], worker_type: str | None = None) -> WorkerLaunch:
    """Parse ``argv`` (the flags after ``dynoplan mocker serve``) exactly as the worker does and build its
    engine: defaults < ``--engine-config`` (paths relative to the current directory, as for the worker) <
    flags; ``worker_type`` (one of :data:`WORKER_TYPES`), when given, is the ``--worker-type`` placed before
    ``argv``, as ``dynoplan up``'s local connector places it on the worker's command line (so a ``--worker-type`` in
    ``argv`` too is a flag given twice, which the worker refuses). Flags the worker does not know are ignored (its
    own start-up reports them).

    Raises :class:`WorkerArgvError` for flags the worker's parser rejects (a bad value, a flag given twice),
    ConfigError for an invalid engine setting or ``--engine-config`` file.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)

    def error(message: str) -> NoReturn:
        raise WorkerArgvError(message)

    parser.error = error  # type: ignore[method-assign]  # on purpose: this parser raises, argparse's exits
    refuse_repeated_options(parser)  # as the worker's own parser (planner.cli)
    add_worker_arguments(parser)
    role = ["--worker-type", worker_type] if worker_type is not None else []
    ns, _ = parser.parse_known_args([*role, *argv])
    engine = engine_config_from_args(ns).replace(worker_type=ns.worker_type, dp_size=ns.dp_size)
    return WorkerLaunch(engine, float(ns.kv_transfer_bandwidth_gbps), int(ns.kv_bytes_per_token))

"""The command-line arguments and inputs shared by the planner's commands (``simulate``, ``profile``, ``up``).

Not a CLI module (library code may import it; no library module imports a ``planner.cli*`` module, see
the import-linter contracts in pyproject.toml). The mocker's shared flags (engine, KV transfer, value
types) are :mod:`mocker.arguments`; this module adds what the planner's commands share on top:
the engine-layout group, ``--out`` versus input files, and the warm-start trace reader (one trace reader
for ``--trace`` and ``--warm-start``: :func:`mocker.traces.load_trace`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from dynoplan.errors import SimulationConfigError
from dynoplan.fields import float_text
from mocker import arguments as mocker_arguments
from mocker.arguments import positive_int
from mocker.config import MAX_DP_SIZE
from mocker.traces import DEFAULT_TRACE_BLOCK_SIZE, load_trace
from planner.core.config import ATTAINMENT_LIMIT_WHY, MAX_ATTAINMENT_TARGET
from planner.core.observations import TrafficWindow
from planner.core.traces import bucket_intervals


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags of ``dynoplan replay`` (:func:`mocker.arguments.add_engine_arguments`: same names and
    meaning), plus trace block size and DP ranks (``engine layout``); read back with
    :func:`mocker.arguments.engine_config_from_args`."""
    mocker_arguments.add_engine_arguments(parser, "engine (override --engine-config; as in dynoplan replay)")
    e = parser.add_argument_group("engine layout")
    e.add_argument("--trace-block-size", type=positive_int, metavar="N", help="tokens per trace hash id (default 512)")
    e.add_argument(
        "--dp-size",
        type=mocker_arguments.dp_size_count,
        metavar="N",
        help=f"data-parallel ranks per worker, each at least one GPU (default 1, at most {MAX_DP_SIZE})",
    )


def add_transfer_arguments(parser: argparse.ArgumentParser) -> None:
    """The KV-transfer flags of ``dynoplan replay`` (disaggregated mode), same names, choices and defaults
    (:func:`mocker.arguments.add_transfer_arguments`); the pool sizes (replay's --prefill-workers /
    --decode-workers) are the policy's. Read back with :func:`mocker.arguments.kv_transfer_from_args`."""
    mocker_arguments.add_transfer_arguments(
        parser.add_argument_group("KV transfer (--mode disagg; as in dynoplan replay)")
    )


def check_out_not_inputs(out: str, inputs: dict[str, str | None], outputs: dict[str, str]) -> None:
    """Refuse an ``--out`` where an output file would overwrite an input file (``--trace``, ``--config``,
    ``--profile``, ``--timing``, ...): compared by ``os.path.samefile`` / realpath. ``outputs`` maps each
    output's name to its path (``dynoplan simulate``: its files inside the directory ``out``; ``dynoplan
    profile``: its one ``.npz`` file). Raises SimulationConfigError naming ``--out`` and the input's flag."""
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
                    raise SimulationConfigError(
                        f"--out {out}: would overwrite {flag} {path}, expected an output "
                        f"path different from every input file"
                    )
                raise SimulationConfigError(
                    f"--out {out}: would overwrite {flag} {path} ({name}), expected an output "
                    f"directory that holds none of the input files"
                )


def warm_start_windows(
    path: str | Path, interval_s: float, *, trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE
) -> list[TrafficWindow]:
    """A warm-start trace bucketed into ``interval_s`` windows for ``Planner(warm_start=...)``.

    The trace is read by :func:`mocker.traces.load_trace` — the reader of ``--trace``: same formats (Azure
    CSV, Mooncake JSONL with its aliases ``created_time`` / ``input_tokens`` / ``output_tokens``), same
    validation and errors — with ``trace_block_size`` tokens per hash id (a Mooncake ``input_length`` above
    ``len(hash_ids) x trace_block_size`` is clamped, as for the simulated fleet). Arrivals are taken
    relative to the first request and bucketed by :func:`planner.core.traces.bucket_intervals`.
    Raises :class:`~dynoplan.errors.TraceError` naming the file, line and field.
    """
    reqs = load_trace(path, trace_block_size=trace_block_size)
    arrival_ms = np.fromiter((r.arrival_ms for r in reqs), dtype=np.float64, count=len(reqs))
    isl = np.fromiter((r.input_length for r in reqs), dtype=np.float64, count=len(reqs))
    osl = np.fromiter((r.output_length for r in reqs), dtype=np.float64, count=len(reqs))
    return bucket_intervals((arrival_ms - arrival_ms[0]) / 1000.0, isl, osl, interval_s)


ATTAINMENT_EXPECTED = f"a share 0 < F <= {MAX_ATTAINMENT_TARGET:g} or off ({ATTAINMENT_LIMIT_WHY})"
"""What an attainment target's text must be (:func:`attainment_text`), as the error lines of its flag and of a
``planner:`` variant say it."""


def attainment_text(text: str) -> float | None:
    """The text of an attainment target (``--attainment-target``, ``planner:attainment_target=``): a share
    0 < F <= :data:`planner.core.config.MAX_ATTAINMENT_TARGET` (the bound of ``sla_attainment_target``), or ``off``
    or a YAML null (``null``, ``~``, empty; docs/architecture.md "Settings text") for none (None: closed-form
    sizing). Raises ValueError for any other text."""
    from dynoplan.settings_text import scalar  # the YAML reader only when a value is read

    t = text.strip(" \t")
    if t.lower() == "off" or scalar(t) is None:
        return None
    v = float_text(t)
    if not 0 < v <= MAX_ATTAINMENT_TARGET:
        raise ValueError(f"{text!r} is not {ATTAINMENT_EXPECTED}")
    return v

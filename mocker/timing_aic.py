"""Optional timing source: NVIDIA AIConfigurator (PyPI ``aiconfigurator-core``) predictions, offline.

``timing="aic:model=Qwen/Qwen3-8B,system=h200_sxm,backend=vllm,tp=1,quant=bf16"`` samples AIConfigurator's
per-pass latency on a grid once, stores it as a timing profile ``.npz`` (the arrays of
:class:`mocker.timing.NpzTiming`) in a cache directory (:func:`ensure_profile`), and
:func:`mocker.timing.load_timing` interpolates it from then on, so a replay never calls AIConfigurator per pass.
Grid (see :func:`sample_profile`):

* prefill: ``run_static(mode="static_ctx")`` at batch 1 over new-token counts -> ``ttft`` (ms);
* decode: ``run_static(mode="static_gen")`` at (batch size, context length) -> ``tpot`` (ms), stored at
  active KV tokens = batch * context.

KV capacity when blocks are not given: ``(GPU memory * gpu_memory_fraction - non-KV memory) /
(kv bytes per token * block size)``, GPU memory and the memory split from AIConfigurator's system spec and
``_get_memory_usage`` (the same estimate Dynamo's planner AIC estimator uses), see :func:`aic_num_gpu_blocks`.

Where AIConfigurator runs: in this interpreter when ``aiconfigurator_core`` imports, otherwise in the
interpreter named by the environment variable ``DYNOPLAN_AIC_PYTHON`` (a separate venv: aiconfigurator-core
0.12 needs numpy >= 2.1), running this file as a script. Neither available -> :class:`ConfigError` naming the
missing package and the import error.

Spec keys and their defaults: :mod:`mocker.timing_spec` (which parses them).

This module imports only the standard library, numpy and the leaf :mod:`mocker.timing_spec` at top level so that
it runs as a script in the AIConfigurator venv: ``python mocker/timing_aic.py SPEC OUT.npz [--grid small|default]``
(the repository root is put on ``sys.path`` then).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

if not __package__:  # run as a script in the AIConfigurator venv: import the leaf spec parser from the repository
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynoplan.errors import AicSpecError, ConfigError
from mocker.timing_spec import parse_aic_spec

GRIDS: dict[str, dict[str, list[int]]] = {
    "default": {
        "prefill": [16, 128, 512, 1024, 2048, 4096, 8192, 16384],
        "batch": [1, 8, 32, 128, 256],
        "context": [128, 1024, 4096, 16384],
    },
    "small": {"prefill": [128, 1024, 4096], "batch": [1, 16], "context": [512, 4096]},
}
"""Sample points: prefill new tokens; decode batch sizes x context lengths (tokens)."""


# ---------------------------------------------------------------------------------------------- AIC side
def _aic(spec: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(sdk config module, backend, database, model) for a spec. Needs aiconfigurator_core."""
    import logging

    logging.disable(logging.WARNING)  # AIConfigurator logs low-fidelity fallbacks per table
    import aiconfigurator_core.sdk.backends.factory as factory
    import aiconfigurator_core.sdk.common as common
    import aiconfigurator_core.sdk.config as config
    import aiconfigurator_core.sdk.models as models
    import aiconfigurator_core.sdk.perf_database as perf_database

    version = spec["version"] or perf_database.get_latest_database_version(spec["system"], spec["backend"])
    db = perf_database.get_database(system=spec["system"], backend=spec["backend"], version=version)
    if not db:
        raise AicSpecError(
            f"no AIConfigurator database for system={spec['system']!r} backend={spec['backend']!r} version={version!r}"
        )
    kw: dict[str, Any] = {"tp_size": spec["tp"]}
    if spec["quant"] not in ("bf16", "bfloat16", None):
        try:
            kw["gemm_quant_mode"] = common.GEMMQuantMode[spec["quant"]]
        except KeyError:
            names = ", ".join(m.name for m in common.GEMMQuantMode)
            raise AicSpecError(f"quant={spec['quant']!r}: expected one of {names}") from None
    model = models.get_model(spec["model"], config.ModelConfig(**kw), spec["backend"])
    return config, factory.get_backend(spec["backend"]), db, model


def sample_profile(spec: dict[str, Any], grid: str = "default") -> dict[str, Any]:
    """Sample AIConfigurator on the grid; returns the NpzTiming arrays plus capacity facts:
    ``gpu_mem_bytes``, ``non_kv_bytes`` (weights, activations, runtime; bytes) and ``kv_bytes_per_token``."""
    config, backend, db, model = _aic(spec)
    g = GRIDS[grid]

    def run(bs: int, isl: int, osl: int, mode: str) -> dict[str, Any]:
        rc = config.RuntimeConfig(batch_size=bs, beam_width=1, isl=isl, osl=osl)
        return backend.run_static(model, db, rc, mode, stride=32).get_summary_df().to_dict(orient="records")[0]

    prefill = [float(run(1, n, 2, "static_ctx")["ttft"]) for n in g["prefill"]]
    itl = np.array([[float(run(b, c, 2, "static_gen")["tpot"]) for c in g["context"]] for b in g["batch"]])
    # decode grid for NpzTiming: rows = active KV tokens (batch * context), columns = context length.
    # For a rectangular grid the rows use the batch sizes at the median context; ITL at (A, C) is read at
    # batch = A / C by linear interpolation over the sampled batch sizes.
    ctx = np.array(g["context"], dtype=np.float64)
    batches = np.array(g["batch"], dtype=np.float64)
    active = np.unique(np.outer(batches, ctx).ravel())
    z = np.empty((len(active), len(ctx)))
    for j, c in enumerate(ctx):
        z[:, j] = np.interp(active / c, batches, itl[:, j])
    mem = backend._get_memory_usage(model, db, 1, 1, 1024, 2)  # GiB; kvcache covers isl + osl tokens
    gib = 1024**3
    return {
        "prefill_isl": np.array(g["prefill"], dtype=np.float64),
        "prefill_ttft_ms": np.array(prefill),
        "decode_active_kv_tokens": active,
        "decode_context_length": ctx,
        "decode_itl": z,
        "gpu_mem_bytes": np.float64(db.system_spec["gpu"]["mem_capacity"]),
        "non_kv_bytes": np.float64((mem["total"] - mem["kvcache"]) * gib),
        "kv_bytes_per_token": np.float64(mem["kvcache"] * gib / 1026),
    }


# ---------------------------------------------------------------------------------------------- mocker side
def cache_dir() -> Path:
    """``$DYNOPLAN_AIC_CACHE`` or ``~/.cache/dynoplan/aic``."""
    return Path(os.environ.get("DYNOPLAN_AIC_CACHE") or Path.home() / ".cache" / "dynoplan" / "aic")


def profile_path(timing: str, grid: str = "default") -> Path:
    """Where the sampled profile of ``timing`` is cached (keyed by the parsed spec and grid)."""
    spec = parse_aic_spec(timing)
    key = hashlib.sha256(json.dumps([spec, grid], sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{key}.npz"


def aic_available() -> str | None:
    """None when AIConfigurator can run (in process or via DYNOPLAN_AIC_PYTHON), else the reason."""
    try:
        import aiconfigurator_core.sdk.perf_database  # noqa: F401

        return None
    except Exception as e:  # ImportError, or numpy ABI errors from a mismatched install
        err = f"{type(e).__name__}: {e}"
    py = os.environ.get("DYNOPLAN_AIC_PYTHON")
    if py:
        if Path(py).is_file():
            return None
        return f"DYNOPLAN_AIC_PYTHON={py!r}: file not found"
    return (
        f"needs the optional package aiconfigurator-core (pip install 'dynoplan[aic]', or set "
        f"DYNOPLAN_AIC_PYTHON to a python that has it): {err}"
    )


def ensure_profile(timing: str, grid: str = "default") -> Path:
    """Path of the cached profile, sampling AIConfigurator first when missing. Raises ConfigError."""
    spec = parse_aic_spec(timing)
    path = profile_path(timing, grid)
    if path.is_file():
        return path
    why = aic_available()
    if why is not None:
        raise ConfigError(f"timing={timing!r}: {why}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    try:
        import aiconfigurator_core  # noqa: F401

        np.savez(tmp, **sample_profile(spec, grid))
    except ImportError:
        r = subprocess.run(
            [os.environ["DYNOPLAN_AIC_PYTHON"], __file__, timing, str(tmp), "--grid", grid],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ConfigError(f"timing={timing!r}: AIConfigurator failed: {last}") from None
    tmp.replace(path)
    return path


def aic_num_gpu_blocks(timing: str, block_size: int, gpu_memory_fraction: float = 0.9, grid: str = "default") -> int:
    """KV blocks that fit: floor((GPU memory * fraction - non-KV memory) / (kv bytes/token * block size)).
    Raises ConfigError when the model does not fit at that fraction."""
    d = np.load(ensure_profile(timing, grid))
    free = float(d["gpu_mem_bytes"]) * gpu_memory_fraction - float(d["non_kv_bytes"])
    blocks = int(free // (float(d["kv_bytes_per_token"]) * block_size))
    if blocks <= 0:
        raise ConfigError(
            f"gpu_memory_fraction={gpu_memory_fraction!r}: the model ({timing}) leaves no room for "
            f"KV blocks ({free / 1e9:.2f} GB left); expected a larger fraction or more TP"
        )
    return blocks


def _main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        allow_abbrev=False, description="sample AIConfigurator into a dynoplan timing profile (.npz)"
    )
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="default")
    a = ap.parse_args(argv)
    try:
        np.savez(a.out, **sample_profile(parse_aic_spec(a.spec), a.grid))
    except AicSpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

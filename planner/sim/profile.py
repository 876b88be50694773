"""Pre-deployment profiling of the simulated engine: writes the planner's ``.npz`` profile (no GPU).

Sweeps one engine core (:func:`mocker.engine.make_engine`, the same configuration and timing source the
fleet uses, so ``--timing FILE.npz`` profiles a calibrated model):

- prefill, over ISL: one request of ISL tokens on an idle engine; ``prefill_ttft_ms`` = its TTFT,
  ``prefill_thpt_per_gpu = ISL / TTFT / gpus_per_engine`` (prompt tokens / s / GPU; Dynamo profiler's
  definition);
- decode, over KV usage x context length: ``n = round(usage x KV capacity / context)`` requests (capped at
  ``max_num_seqs``, at least 1) of ISL = context arrive together and each generates ``decode_tokens``
  plus as many as the prefill passes of the whole batch (so all ``n`` overlap in decode);
  ``decode_itl_ms`` = mean pass time while all ``n`` decode together (after the last first token, before
  the first finish), ``decode_thpt_per_gpu = n / ITL / gpus_per_engine`` (output tokens / s / GPU).
  Where ``max_num_seqs`` caps ``n`` below the grid usage, the point holds the capped measurement (that
  usage is not reachable at that context).

Array names and units: :mod:`planner.core.interpolation`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynoplan.errors import SimulationConfigError
from mocker.config import EngineConfig
from mocker.engine import make_engine
from mocker.records import TraceRequest
from planner.core import PerformanceProfile, profile_from_arrays

DEFAULT_ISL: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_KV_USAGE: tuple[float, ...] = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
)
DEFAULT_CONTEXT: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class ProfileSweep:
    """Grids of the sweep (tokens / fractions) and GPUs per engine."""

    isl_tokens: tuple[int, ...] = DEFAULT_ISL
    kv_usage: tuple[float, ...] = DEFAULT_KV_USAGE
    context_tokens: tuple[int, ...] = DEFAULT_CONTEXT
    decode_tokens: int = 16
    gpus_per_engine: int = 1

    def __post_init__(self) -> None:
        p = []
        if (
            not self.isl_tokens
            or any(x <= 0 for x in self.isl_tokens)
            or list(self.isl_tokens) != sorted(set(self.isl_tokens))
        ):
            p.append(f"isl_tokens={self.isl_tokens!r}: expected strictly increasing positive integers")
        if (
            not self.kv_usage
            or any(not 0 < x < 1 for x in self.kv_usage)
            or list(self.kv_usage) != sorted(set(self.kv_usage))
        ):
            p.append(f"kv_usage={self.kv_usage!r}: expected strictly increasing fractions in (0, 1)")
        if (
            not self.context_tokens
            or any(x <= 0 for x in self.context_tokens)
            or list(self.context_tokens) != sorted(set(self.context_tokens))
        ):
            p.append(f"context_tokens={self.context_tokens!r}: expected strictly increasing positive integers")
        if self.decode_tokens < 4:
            p.append(f"decode_tokens={self.decode_tokens!r}: expected an integer >= 4")
        if self.gpus_per_engine < 1:
            p.append(f"gpus_per_engine={self.gpus_per_engine!r}: expected an integer >= 1")
        if p:
            raise SimulationConfigError(p)


def _prefill_ttft_ms(cfg: EngineConfig, isl: int) -> float:
    core = make_engine(cfg)
    rec = core.add_request(TraceRequest(0, 0.0, isl, 2), 0.0)
    core.advance_until(float("inf"))
    if rec.first_token_ms is None:
        raise SimulationConfigError(
            f"profile: a request of ISL {isl} tokens never got its first token on this engine "
            "(does it fit the KV cache?)"
        )
    return float(rec.first_token_ms)


def _decode_point(cfg: EngineConfig, n: int, context: int, osl: int) -> float:
    core = make_engine(cfg)
    recs = [core.add_request(TraceRequest(k, 0.0, context, osl), 0.0) for k in range(n)]
    core.advance_until(float("inf"))
    core.finalize()
    firsts = [r.first_token_ms for r in recs if r.first_token_ms is not None]
    fins = [r.finish_ms for r in recs if r.finish_ms is not None]
    if len(firsts) < len(recs) or len(fins) < len(recs):
        raise SimulationConfigError(f"profile: {n} requests of context {context} did not all finish")
    start = max(firsts)
    stop = min(fins)
    ends = core.pass_end_times()
    sel = ends[(ends > start) & (ends <= stop)]
    if sel.size >= 1:
        prev = np.concatenate([[start], sel[:-1]])
        return float(np.mean(sel - prev))
    gaps = [np.diff(r.token_times_ms) for r in recs if len(r.token_times_ms) > 1]
    return float(np.mean(np.concatenate(gaps)))


def profile_engine(
    cfg: EngineConfig, sweep: ProfileSweep = ProfileSweep(), remedy: tuple[str, str] = ("--isl", "--context")
) -> PerformanceProfile:
    """Sweep ``cfg`` (module docstring) and return the profile. Raises SimulationConfigError when fewer than two
    points of a grid fit the KV cache, ending with ``remedy`` (what to change, for the ISL grid and the context
    grid: the flags of ``dynoplan profile`` by default; a caller without them names its own)."""
    cap_tokens = cfg.total_kv_tokens
    isl = [x for x in sweep.isl_tokens if x + 2 <= cap_tokens * 0.95]
    if len(isl) < 2:
        raise SimulationConfigError(
            f"profile: ISL grid {list(sweep.isl_tokens)}: {len(isl)} point(s) fit the KV cache of "
            f"{cap_tokens} tokens (ISL + 2 <= 95 %), expected at least 2 ({remedy[0]})"
        )
    ttft = np.array([_prefill_ttft_ms(cfg, x) for x in isl])
    isl_a = np.array(isl, dtype=float)
    ctx = [c for c in sweep.context_tokens if c + sweep.decode_tokens <= cap_tokens * 0.9]
    if len(ctx) < 2:
        raise SimulationConfigError(
            f"profile: context grid {list(sweep.context_tokens)}: {len(ctx)} length(s) fit the KV "
            f"cache of {cap_tokens} tokens (context + {sweep.decode_tokens} <= 90 %), expected "
            f"at least 2 ({remedy[1]})"
        )
    usage = list(sweep.kv_usage)
    itl = np.zeros((len(usage), len(ctx)))
    thpt = np.zeros_like(itl)
    for a, u in enumerate(usage):
        for b, c in enumerate(ctx):
            n = int(min(cfg.max_num_seqs, max(1, round(u * cap_tokens / (c + sweep.decode_tokens / 2)))))
            # enough output that the first request is still decoding when the last one is prefilled
            prefill_passes = -(-n * c // max(1, cfg.max_num_batched_tokens - n)) + 2
            ms = _decode_point(cfg, n, c, sweep.decode_tokens + prefill_passes)
            itl[a, b] = ms
            thpt[a, b] = n / (ms / 1000.0) / sweep.gpus_per_engine
    return profile_from_arrays(
        {
            "prefill_isl": isl_a,
            "prefill_ttft_ms": ttft,
            "prefill_thpt_per_gpu": isl_a / (ttft / 1000.0) / sweep.gpus_per_engine,
            "decode_kv_usage": np.array(usage),
            "decode_context_length": np.array(ctx, dtype=float),
            "decode_itl_ms": itl,
            "decode_thpt_per_gpu": thpt,
            "decode_max_kv_tokens": np.array([float(cap_tokens)]),
        },
        source=f"dynoplan profile ({cfg.engine}, timing {cfg.timing})",
    )

"""Write the planner performance profile (.npz) of a default live mocker worker (vLLM-shaped, polynomial
timing, 16384 KV blocks x 64 tokens, max_num_seqs 256), so a planner can size mocker fleets.

Prefill: TTFT(ISL) = the mocker's prefill pass time for one request of ISL new tokens; throughput per GPU
= ISL / TTFT. Decode: at KV usage u and context length c, concurrency = min(u x KV tokens / c, 256),
ITL = the mocker's decode pass time at u x KV tokens active; throughput per GPU = concurrency / ITL.
(Timing formulas: docs/architecture.md "Polynomial timing baseline", implemented in mocker.timing.)

Usage: python examples/profiles/make_mocker_profile.py OUT.npz
"""

from __future__ import annotations

import sys

import numpy as np

from mocker.timing import PolynomialTiming
from planner.core import profile_from_arrays, save_profile

KV_TOKENS = 16384 * 64
MAX_NUM_SEQS = 256


def arrays() -> dict[str, np.ndarray]:
    timing = PolynomialTiming(KV_TOKENS)
    isl = np.array([128, 256, 512, 1024, 2048, 4096, 8192], dtype=float)
    ttft = np.array([timing.prefill_ms(1, int(x), 0) for x in isl])
    usage = np.linspace(0.05, 1.0, 20)
    ctx = np.array([256, 512, 1024, 2048, 4096, 8192], dtype=float)
    uu, cc = np.meshgrid(usage, ctx, indexing="ij")
    itl = timing.decode_ms_array((uu * KV_TOKENS).ravel(), cc.ravel()).reshape(uu.shape)
    conc = np.minimum(uu * KV_TOKENS / cc, MAX_NUM_SEQS)
    return {
        "prefill_isl": isl,
        "prefill_ttft_ms": ttft,
        "prefill_thpt_per_gpu": isl / ttft * 1000.0,
        "decode_kv_usage": usage,
        "decode_context_length": ctx,
        "decode_itl_ms": itl,
        "decode_thpt_per_gpu": conc / itl * 1000.0,
        "decode_max_kv_tokens": np.array([float(KV_TOKENS)]),
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_mocker_profile.py OUT.npz")
    save_profile(profile_from_arrays(arrays(), source="mocker polynomial"), sys.argv[1])
    print(sys.argv[1])

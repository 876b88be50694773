"""Routers of the virtual-time fleet: which aggregated worker gets an arriving request.

Registry (plain dict): ``ROUTERS = {"round_robin": RoundRobinRouter, "least_loaded": LeastLoadedRouter,
"kv": KvRouter}``. A router sees the workers as they are at the arrival time (the fleet advances them first
when ``needs_state`` is true).

- round_robin: request k (in arrival order) -> worker k mod N (the reference's order).
- least_loaded: fewest active KV blocks plus blocks of queued prompts, then fewest requests, then lowest id.
- kv: Dynamo KV router cost (overlap_score_weight 1.0, temperature 0):
  ``logit_w = prefill_blocks_w + decode_blocks_w`` where ``prefill_blocks_w = (tokens still to prefill on
  w + ISL - overlap_w * block) / block`` and ``decode_blocks_w = active blocks on w + ceil(ISL / block) -
  overlap_w``; ``overlap_w`` = leading prompt blocks found in w's prefix cache (active or inactive). The
  lowest logit wins; ties are broken by the fleet's seeded generator.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from mocker.engine.vllm import VllmCore
from mocker.kv.manager import engine_block_keys
from mocker.records import TraceRequest
from mocker.request import State


class Router(Protocol):
    needs_state: bool

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore]) -> int: ...


class RoundRobinRouter:
    needs_state = False

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers
        self.k = 0

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore]) -> int:
        w = self.k % self.n
        self.k += 1
        return w


def _queued_prefill_tokens(w: VllmCore) -> int:
    t = 0
    for r in w.waiting:
        t += r.seq_len
    for r in w.running:
        if r.state == State.PREFILLING:
            t += r.seq_len - r.computed
    return t


class LeastLoadedRouter:
    needs_state = True

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore]) -> int:
        best, best_key = 0, None
        for i, w in enumerate(workers):
            bs = w.block_size
            queued_blocks = sum(-(-r.seq_len // bs) for r in w.waiting)
            key = (w.active_blocks() + queued_blocks, len(w.running) + len(w.waiting), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best


class KvRouter:
    needs_state = True
    overlap_score_weight = 1.0

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers
        self.rng = np.random.default_rng(seed)

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore]) -> int:
        w0 = workers[0]
        bs = w0.block_size
        keys = engine_block_keys(req.hash_ids, req.input_length, bs, w0.trace_block_size) if req.hash_ids else None
        req_blocks = -(-req.input_length // bs)
        logits = []
        for w in workers:
            overlap = w.kv.match_prefix(keys)[0] if keys else 0
            prefill_tokens = _queued_prefill_tokens(w) + req.input_length - overlap * bs
            decode_blocks = w.active_blocks() + req_blocks - overlap
            logits.append(self.overlap_score_weight * prefill_tokens / bs + decode_blocks)
        m = min(logits)
        best = [i for i, v in enumerate(logits) if v == m]
        if len(best) == 1:
            return best[0]
        return best[int(self.rng.integers(len(best)))]


ROUTERS: dict[str, type] = {"round_robin": RoundRobinRouter, "least_loaded": LeastLoadedRouter, "kv": KvRouter}

"""Routers of the virtual-time fleet: which aggregated worker gets an arriving request.

Registry (plain dict): ``ROUTERS = {"round_robin": RoundRobinRouter, "least_loaded": LeastLoadedRouter,
"kv": KvRouter}``. A router sees the engine cores (one per DP rank of every ready worker of a pool, in
readiness order) as they are at the arrival time (the fleet advances them first when ``needs_state`` is
true) and returns an index into that list. The list may change between calls (workers added, removed);
routers keep per-core state keyed by ``(worker_id, dp_rank)``, never by position.

- round_robin: request k (in arrival order) -> core k mod N, N = cores offered now (the reference's order).
- least_loaded: fewest active KV blocks plus blocks of queued prompts, then fewest requests, then lowest id.
- kv: Dynamo KV router cost (overlap_score_weight 1.0, temperature 0):
  ``logit_w = prefill_blocks_w + decode_blocks_w`` with ``prefill_blocks_w = (prompt tokens the router has
  sent to w that are not prefilled yet + ISL - overlap_w * block) / block`` and ``decode_blocks_w`` = unique
  prompt blocks of the requests routed to w and not finished, plus this request's blocks not among them
  (the router's own bookkeeping, like Dynamo's ActiveSequences); ``overlap_w`` = leading prompt blocks
  found in w's prefix cache (active or inactive, what the KV events report). The lowest logit wins; ties
  are broken by the fleet's seeded generator (Dynamo picks randomly among ties).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from mocker.engine.sglang import SglangCore
from mocker.engine.vllm import VllmCore
from mocker.kv.events import KvEventIndex
from mocker.kv.manager import engine_block_keys
from mocker.records import RequestRecord, TraceRequest
from mocker.request import State


class Router(Protocol):
    needs_state: bool

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int: ...


class RoundRobinRouter:
    needs_state = False

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers
        self.k = 0

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int:
        w = self.k % (len(workers) or self.n)
        self.k += 1
        return w


def _queued_prefill_tokens(w: VllmCore | SglangCore) -> int:
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

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int:
        best, best_key = 0, None
        for i, w in enumerate(workers):
            bs = w.block_size
            queued_blocks = sum(-(-r.seq_len // bs) for r in w.waiting)
            key = (w.active_blocks() + queued_blocks, len(w.running) + len(w.waiting), i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best


class _RouterWorkerView:
    """The KV router's own book of one worker (as Dynamo's router keeps ActiveSequences): unique prompt
    blocks of requests routed there and not finished, and prompt tokens still to prefill."""

    __slots__ = ("blocks", "unique", "prefill_tokens", "entries")

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}
        self.unique = 0
        self.prefill_tokens = 0
        self.entries: list[list] = []  # [record, keys, new_tokens, n_unique, prefill_done]

    def refresh(self) -> None:
        keep = []
        for e in self.entries:
            rec = e[0]
            if not e[4] and rec.first_token_ms is not None:
                e[4] = True
                self.prefill_tokens -= e[2]
            if rec.finish_ms is not None:
                if not e[4]:
                    self.prefill_tokens -= e[2]
                blocks = self.blocks
                for k in e[1]:
                    c = blocks[k] - 1
                    if c:
                        blocks[k] = c
                    else:
                        del blocks[k]
                self.unique -= e[3]
                continue
            keep.append(e)
        self.entries = keep

    def active_blocks(self) -> int:
        return len(self.blocks) + self.unique

    def new_blocks(self, keys: list[int], n_unique: int) -> int:
        blocks = self.blocks
        return sum(1 for k in keys if k not in blocks) + n_unique


class KvRouter:
    needs_state = True
    overlap_score_weight = 1.0
    track_active_blocks = True
    """False: the decode-blocks term is left out (Dynamo's prefill router in a disaggregated fleet)."""

    def __init__(self, num_workers: int, seed: int = 0) -> None:
        self.n = num_workers
        self.rng: Any = np.random.default_rng(seed)
        """Any, not Generator: numpy's stubs type ``integers(n)`` as ``int`` but it returns ``numpy.int64``, which
        compiled code (docs/architecture.md "Compiled modules") would refuse where an ``int`` is declared."""
        self.views: dict[tuple[int, int], _RouterWorkerView] = {}
        """The router's book per engine core, keyed (worker_id, dp_rank): cores come and go with the fleet."""
        self._cores_ref: object = None  # the core list seen last (the fleet builds a new list on every change)
        self._cores_views: list[_RouterWorkerView] = []
        self._pending: tuple[_RouterWorkerView, list[int], int, int] | None = None
        self.index: KvEventIndex | None = None
        """A :class:`mocker.kv.events.KvEventIndex`: prefix overlaps come from KV events instead of the cores."""

    def choose(self, req: TraceRequest, now_ms: float, workers: Sequence[VllmCore | SglangCore]) -> int:
        w0 = workers[0]
        bs = w0.block_size
        keys = engine_block_keys(req.hash_ids, req.input_length, bs, w0.trace_block_size) if req.hash_ids else None
        if keys is None:
            keys_l: list[int] = []
            n_unique = -(-req.input_length // bs)
        else:
            keys_l = keys
            n_unique = 0  # the router tracks full-block hashes only (Dynamo's sequence hashes for tracking)
        logits = []
        overlaps = []
        if workers is not self._cores_ref or len(workers) != len(self._cores_views):  # the fleet's core list changed
            views = self.views
            cv = []
            for w in workers:
                view = views.get((w.worker_id, w.dp_rank))
                if view is None:
                    view = views[(w.worker_id, w.dp_rank)] = _RouterWorkerView()
                cv.append(view)
            self._cores_ref, self._cores_views = workers, cv
        chosen_views = self._cores_views
        index = self.index
        for w, view in zip(workers, chosen_views, strict=True):
            view.refresh()
            if not keys_l:
                overlap = 0
            elif index is None:
                overlap = w.kv.match_prefix(keys_l)[0]
            else:
                overlap = index.overlap(w.worker_id, keys_l, w.dp_rank)
            overlaps.append(overlap)
            prefill_tokens = view.prefill_tokens + req.input_length - overlap * bs
            decode_blocks = view.active_blocks() + view.new_blocks(keys_l, n_unique) if self.track_active_blocks else 0
            logits.append(self.overlap_score_weight * prefill_tokens / bs + decode_blocks)
        m = min(logits)
        best = [i for i, v in enumerate(logits) if v == m]
        choice = best[0] if len(best) == 1 else best[int(self.rng.integers(len(best)))]
        self._pending = (chosen_views[choice], keys_l, req.input_length - overlaps[choice] * bs, n_unique)
        return choice

    def on_routed(self, record: RequestRecord) -> None:
        """Book the request just placed by :meth:`choose` (its record tells when prefill and decode end)."""
        if self._pending is None:
            return
        view, keys, new_tokens, n_unique = self._pending
        self._pending = None
        for k in keys:
            view.blocks[k] = view.blocks.get(k, 0) + 1
        view.unique += n_unique
        view.prefill_tokens += new_tokens
        view.entries.append([record, keys, new_tokens, n_unique, False])


ROUTERS: dict[str, type] = {"round_robin": RoundRobinRouter, "least_loaded": LeastLoadedRouter, "kv": KvRouter}

"""KVBM lower KV tiers (G2 host, G3 disk, G4 object) and their processor-shared links; metadata only.

Tiers (docs/architecture.md "KVBM tiers"): G1 is the device block pool of the engine core; G2 is per-worker host memory
(``num_g2_blocks`` each); G3 is a disk tier shared by the fleet (``num_g3_blocks``); G4 is a shared object
tier of unbounded size (``g4=True``). Blocks are identified by their prefix-cache key; only keys move, never
content. Flow modelled here:

* offload: a cached block leaving G1 is queued for G2; every ``offload_batch_size`` queued blocks become one
  transfer on the worker's G1->G2 link and land in G2 when it completes. A block evicted from a full G2 (LRU)
  moves to G3 over the G2->G3 link, one from a full G3 to G4 over G3->G4 (dropped when the next tier is
  absent).
* onboard: for a prompt's keys after its G1 hits, the leading run found in G2, G3 or G4 is brought back.
  G3/G4 blocks are first staged into the worker's G2 (G3->G2 / G4->G2 links), then all of them cross the
  G2->G1 link; the ticket completes when that last transfer does.

Links: each directional link has its own bandwidth and is processor-shared (docs/architecture.md
"KVBM tiers"): n transfers in flight progress at bandwidth/n each, so a transfer speeds up when a peer
finishes. Time of a lone transfer = bytes / bandwidth (1 MB at 1 GB/s = 1 ms, decimal units). G1<->G2 links
are per worker (each GPU's host link); G2<->G3, G2<->G4 and G3->G4 links are shared by the fleet (one disk,
one object store). Bandwidth 0 means the link is instantaneous.

Defaults of the bandwidths are assumptions, not reference values: 25 GB/s host<->device (PCIe Gen4 x16
effective), 5 GB/s host<->disk (NVMe), 1 GB/s to/from object storage.

Nothing reads a clock: every method takes ``now_ms`` and a driver advances the hierarchy with
:meth:`TierHierarchy.advance`.

Wiring (``g1_backend='kvbm'`` with ``num_g2_blocks > 0`` and ``kv_bytes_per_token`` set; bytes per block =
block size x kv_bytes_per_token): the vLLM core (:meth:`mocker.engine.vllm.VllmCore.attach_tiers`) is one
worker of a hierarchy. Its kvbm pool appends every evicted cached block to the core's offload list, sent with
:meth:`TierHierarchy.offload` at the end of the pass, at the pass's start time. At admission (the request
fits), after the G1 prefix hits, :meth:`TierHierarchy.onboard` starts a ticket for the leading run found
below G1 (never the prompt's last token, as for G1 hits); the request takes its G1 blocks at once and waits
outside the queues; at the first pass start after the ticket is done it joins the running batch with those
tokens computed (not charged as prefill) and the blocks join the prefix cache. A standalone core (live
worker rank) gets a private one-worker hierarchy; the offline aggregated fleet (:mod:`mocker.fleet`) shares
one hierarchy among all its cores (one G2 per core = per DP rank) and runs their passes one at a time in
global time order so every transfer is submitted in time order. Counters: :attr:`TierHierarchy.offloaded_blocks`,
``onboarded_blocks`` (per tier found), ``spilled_blocks``, ``onboard_tickets`` (the replay report's
``kvbm_*`` keys). Not wired: SGLang (its radix cache has no kvbm pool), TensorRT-LLM (no-evict reservations
do not cover onboarding blocks) and disaggregated fleets (rejected with a ConfigError).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from heapq import heappop, heappush
from math import inf
from typing import Generic, Literal, TypeVar

from pydantic import Field

from dynoplan.errors import ConfigError, SimulationError
from dynoplan.settings import Problems, check, settings
from mocker.config import TIER_LINKS, EngineConfig, LinkGBps, PositiveInt, TierBlocks, tier_problems

GB = 1e9
"""Bytes per GB (decimal, as link bandwidths are quoted)."""

TagT = TypeVar("TagT")
"""What a link's caller attaches to a transfer and gets back when it completes."""


# ---------------------------------------------------------------------------------------------- links
class ProcessorSharingLink(Generic[TagT]):
    """One directional link of ``bandwidth_gbps`` GB/s shared equally by the transfers in flight.

    Exact processor sharing in virtual time: between events every active transfer receives
    bandwidth / n bytes per ms. As every active transfer gets the same service, the link keeps one counter
    (bytes served to each transfer since the link was created) and a heap of each transfer's finishing value
    of that counter, so a submission or completion costs O(log n) even with thousands in flight (a shared
    disk link can fall far behind). Completion times are exact up to float rounding (completions within
    1e-6 bytes, relative 1e-12, are merged).
    """

    __slots__ = ("name", "bytes_per_ms", "now_ms", "_heap", "_served", "_seq", "transfers", "bytes_moved")

    def __init__(self, name: str, bandwidth_gbps: float) -> None:
        if not isinstance(bandwidth_gbps, (int, float)) or isinstance(bandwidth_gbps, bool) or not bandwidth_gbps >= 0:
            raise ConfigError(f"{name} bandwidth={bandwidth_gbps!r}: expected a number >= 0 (GB/s; 0 = instantaneous)")
        self.name = name
        self.bytes_per_ms = bandwidth_gbps * GB / 1000.0
        self.now_ms = 0.0
        self._heap: list[tuple[float, int, TagT]] = []
        """(value of _served at which the transfer is done, transfer id, tag)"""
        self._served = 0.0
        """bytes served to every transfer in flight since the link was created"""
        self._seq = 0
        self.transfers = 0
        self.bytes_moved = 0.0

    @property
    def in_flight(self) -> int:
        """Transfers currently sharing the link."""
        return len(self._heap)

    def _progress(self, to_ms: float) -> None:
        dt = to_ms - self.now_ms
        if dt > 0:
            if self._heap:
                self._served += self.bytes_per_ms * dt / len(self._heap)
            self.now_ms = to_ms

    def next_completion_ms(self) -> float | None:
        """When the next in-flight transfer finishes if nothing else arrives (None when idle)."""
        heap = self._heap
        if not heap:
            return None
        if self.bytes_per_ms == 0:
            return self.now_ms
        rem = heap[0][0] - self._served
        return self.now_ms + (rem if rem > 0 else 0.0) * len(heap) / self.bytes_per_ms

    def submit(self, now_ms: float, nbytes: float, tag: TagT) -> int:
        """Start a transfer of ``nbytes`` bytes at ``now_ms`` (must not precede earlier calls). Returns its id.

        Call :meth:`advance` to ``now_ms`` first so that completions before it are reported in order.
        """
        if now_ms < self.now_ms - 1e-9:
            raise SimulationError(f"link {self.name}: submit at {now_ms} ms before link time {self.now_ms} ms")
        if nbytes < 0:
            raise SimulationError(f"link {self.name}: negative transfer size {nbytes}")
        self._progress(now_ms)
        self._seq += 1
        heappush(self._heap, (self._served + float(nbytes), self._seq, tag))
        self.transfers += 1
        self.bytes_moved += nbytes
        return self._seq

    def advance(self, to_ms: float) -> list[tuple[float, TagT]]:
        """Move the link to ``to_ms``; return (finish time ms, tag) of every transfer finished by then, in
        finish order (ties by submission order)."""
        done: list[tuple[float, TagT]] = []
        heap = self._heap
        while heap:
            t = self.next_completion_ms()
            assert t is not None
            if t > to_ms:
                break
            self._progress(t)
            if self.bytes_per_ms == 0:
                lim = inf
            else:
                lim = self._served + 1e-6 + 1e-12 * abs(self._served)
            first = heappop(heap)  # the smallest always finishes here (float rounding included)
            done.append((t, first[2]))
            while heap and heap[0][0] <= lim:
                done.append((t, heappop(heap)[2]))
        self._progress(to_ms)
        return done


# ---------------------------------------------------------------------------------------------- config
_ENGINE = EngineConfig()
"""Tier defaults come from :class:`mocker.config.EngineConfig` (one place; see its field descriptions)."""


@settings
class TierConfig:
    """Lower-tier settings (``g1_backend=kvbm`` only): the tier fields of an :class:`EngineConfig` plus the
    block size in bytes. Build it with :meth:`from_engine`; defaults, bounds and the G3/G4-need-G2 rule are
    EngineConfig's (:func:`mocker.config.tier_problems`). Bad values: pydantic's ``ValidationError`` when
    constructed directly, ConfigError from :meth:`from_engine`."""

    bytes_per_block: PositiveInt = Field(description="KV bytes of one block = block_size * kv_bytes_per_token (bytes).")
    num_g2_blocks: TierBlocks = Field(default=_ENGINE.num_g2_blocks, description="Host blocks per worker (0 = no G2).")
    num_g3_blocks: TierBlocks = Field(
        default=_ENGINE.num_g3_blocks,
        description="Disk blocks shared by the fleet (0 = no G3; needs G2, as G3 hits stage through it).",
    )
    g4: bool = Field(default=_ENGINE.g4, description="Shared object tier of unbounded size (needs G2).")
    offload_batch_size: PositiveInt = Field(
        default=_ENGINE.offload_batch_size, description="Blocks per G1->G2 offload transfer (blocks)."
    )
    bw_g1_g2_gbps: LinkGBps = Field(
        default=_ENGINE.bw_g1_g2_gbps, description="Device->host (offload) bandwidth per worker (GB/s)."
    )
    bw_g2_g1_gbps: LinkGBps = Field(
        default=_ENGINE.bw_g2_g1_gbps, description="Host->device (onboard) bandwidth per worker (GB/s)."
    )
    bw_g2_g3_gbps: LinkGBps = Field(default=_ENGINE.bw_g2_g3_gbps, description="Host->disk bandwidth, shared (GB/s).")
    bw_g3_g2_gbps: LinkGBps = Field(default=_ENGINE.bw_g3_g2_gbps, description="Disk->host bandwidth, shared (GB/s).")
    bw_g3_g4_gbps: LinkGBps = Field(default=_ENGINE.bw_g3_g4_gbps, description="Disk->object bandwidth, shared (GB/s).")
    bw_g4_g2_gbps: LinkGBps = Field(default=_ENGINE.bw_g4_g2_gbps, description="Object->host bandwidth, shared (GB/s).")

    def __post_init__(self) -> None:
        p = tier_problems(self.num_g2_blocks, self.num_g3_blocks, self.g4)
        if p:
            raise Problems(p)

    @classmethod
    def from_engine(cls, cfg: EngineConfig) -> TierConfig:
        """The tier settings of ``cfg`` (bytes per block = effective block size x ``cfg.kv_bytes_per_token``).
        Raises ConfigError when ``kv_bytes_per_token`` is missing or a setting is invalid."""
        kb = cfg.kv_bytes_per_token
        if kb is None:
            raise ConfigError("kv_bytes_per_token=null: KVBM tier transfers need the model's KV bytes per token")
        names = [f.name for f in fields(cls) if f.name != "bytes_per_block"]
        return check(lambda: cls(bytes_per_block=cfg.effective_block_size * kb, **{n: getattr(cfg, n) for n in names}))


@dataclass(slots=True)
class OnboardTicket:
    """A prompt's blocks being brought back to G1 from lower tiers."""

    worker_id: int
    keys: list[int]
    """Keys onboarded, prompt order (all end up in G1)."""
    from_tier: dict[str, int]
    """Blocks found per tier ('G2', 'G3', 'G4')."""
    start_ms: float
    staged_ms: float | None = None
    """When every G3/G4 block reached G2 (== start when none)."""
    done_ms: float | None = None
    """When the G2->G1 transfer finished."""
    _pending: int = 0


TransferTag = (
    tuple[Literal["g2"], int, list[int]]
    | tuple[Literal["g3", "g4"], list[int]]
    | tuple[Literal["stage"], OnboardTicket, list[int]]
    | tuple[Literal["onboard"], OnboardTicket]
)
"""A hierarchy transfer: ("g2", worker id, keys) an offload batch to G2; ("g3"|"g4", keys) a spill down;
("stage", ticket, keys) an onboard's G3/G4 part reaching G2; ("onboard", ticket) the G2->G1 copy."""

TierListener = Callable[[str, str, int, Sequence[int]], None]
"""listener(kind 'stored'|'removed', tier 'G2'|'G3'|'G4', worker_id (-1 shared), keys)."""


class TierHierarchy:
    """G2 per worker, shared G3 and G4, and their links, for ``num_workers`` workers (ids 0..n-1)."""

    def __init__(self, cfg: TierConfig, num_workers: int, listener: TierListener | None = None) -> None:
        self.cfg = cfg
        self.listener = listener
        self.g2: list[OrderedDict[int, None]] = []
        """per worker: resident host blocks, LRU first"""
        self.g3: OrderedDict[int, None] = OrderedDict()
        self.g4: set[int] = set()
        self._pending_offload: list[list[int]] = []
        self._in_flight_g2: list[set[int]] = []
        self.links: dict[str, ProcessorSharingLink[TransferTag]] = {}
        for name, bw in (
            ("G2->G3", cfg.bw_g2_g3_gbps),
            ("G3->G2", cfg.bw_g3_g2_gbps),
            ("G3->G4", cfg.bw_g3_g4_gbps),
            ("G4->G2", cfg.bw_g4_g2_gbps),
        ):
            self.links[name] = ProcessorSharingLink(name, bw)
        self._links: list[ProcessorSharingLink[TransferTag]] = list(self.links.values())
        self.now_ms = 0.0
        self.offloaded_blocks = 0
        """Blocks sent G1->G2 (count; blocks already in or on the way to G2 are not sent again)."""
        self.spilled_blocks = {"G3": 0, "G4": 0}
        """Blocks sent down from a full G2 to G3 and from a full G3 to G4 (count)."""
        self.onboarded_blocks = {"G2": 0, "G3": 0, "G4": 0}
        """Blocks onboarded to G1, by the tier they were found in (count, at the ticket's start)."""
        self.onboard_tickets = 0
        for _ in range(num_workers):
            self.add_worker()

    def add_worker(self) -> int:
        """Add a worker (its G2 and its G1<->G2 links; an engine core of a DP rank counts as one). Returns its id
        (0, 1, 2, ... in call order)."""
        w = len(self.g2)
        self.g2.append(OrderedDict())
        self._pending_offload.append([])
        self._in_flight_g2.append(set())
        for name, bw in ((f"G1->G2/{w}", self.cfg.bw_g1_g2_gbps), (f"G2->G1/{w}", self.cfg.bw_g2_g1_gbps)):
            link = self.links[name] = ProcessorSharingLink(name, bw)
            link.now_ms = self.now_ms
        self._links = list(self.links.values())
        return w

    # ------------------------------------------------------------------ helpers
    def _emit(self, kind: str, tier: str, worker: int, keys: Sequence[int]) -> None:
        if self.listener is not None and keys:
            self.listener(kind, tier, worker, keys)

    def _insert_g2(self, w: int, keys: Sequence[int]) -> None:
        g2 = self.g2[w]
        stored = [k for k in keys if k not in g2]
        for k in keys:
            g2[k] = None
            g2.move_to_end(k)
        self._emit("stored", "G2", w, stored)
        over = len(g2) - self.cfg.num_g2_blocks
        if over > 0:
            evicted = [g2.popitem(last=False)[0] for _ in range(over)]
            self._emit("removed", "G2", w, evicted)
            if self.cfg.num_g3_blocks:
                down = [k for k in evicted if k not in self.g3]
                if down:
                    self.spilled_blocks["G3"] += len(down)
                    self.links["G2->G3"].submit(self.now_ms, len(down) * self.cfg.bytes_per_block, ("g3", down))

    def _insert_g3(self, keys: Sequence[int]) -> None:
        g3 = self.g3
        stored = [k for k in keys if k not in g3]
        for k in keys:
            g3[k] = None
            g3.move_to_end(k)
        self._emit("stored", "G3", -1, stored)
        over = len(g3) - self.cfg.num_g3_blocks
        if over > 0:
            evicted = [g3.popitem(last=False)[0] for _ in range(over)]
            self._emit("removed", "G3", -1, evicted)
            if self.cfg.g4:
                down = [k for k in evicted if k not in self.g4]
                if down:
                    self.spilled_blocks["G4"] += len(down)
                    self.links["G3->G4"].submit(self.now_ms, len(down) * self.cfg.bytes_per_block, ("g4", down))

    # ------------------------------------------------------------------ driver
    def next_event_ms(self) -> float | None:
        """Earliest pending link completion (None when every link is idle)."""
        best: float | None = None
        for link in self._links:
            if link._heap:
                t = link.next_completion_ms()
                if t is not None and (best is None or t < best):
                    best = t
        return best

    def advance(self, to_ms: float) -> list[OnboardTicket]:
        """Process every link completion up to ``to_ms`` in time order; return onboard tickets completed."""
        out: list[OnboardTicket] = []
        while True:
            t = self.next_event_ms()
            if t is None or t > to_ms:
                break
            if t > self.now_ms:
                self.now_ms = t
            for name, link in self.links.items():
                if link._heap:
                    for fin_ms, tag in link.advance(t):
                        self._complete(name, fin_ms, tag, out)
        if to_ms > self.now_ms:  # links need no update: each progresses itself at its next submission
            self.now_ms = to_ms
        return out

    def _complete(self, link: str, fin_ms: float, tag: TransferTag, out: list[OnboardTicket]) -> None:
        if tag[0] == "g2":  # offload batch landed in host memory
            _, w, keys = tag
            self._in_flight_g2[w].difference_update(keys)
            self._insert_g2(w, keys)
        elif tag[0] == "g3":
            self._insert_g3(tag[1])
        elif tag[0] == "g4":
            new = [k for k in tag[1] if k not in self.g4]
            self.g4.update(new)
            self._emit("stored", "G4", -1, new)
        elif tag[0] == "stage":  # a G3/G4 part of an onboard reached G2
            ticket = tag[1]
            self._insert_g2(ticket.worker_id, tag[2])
            ticket._pending -= 1
            if ticket._pending == 0:
                self._start_onboard(ticket, fin_ms)
        elif tag[0] == "onboard":
            ticket = tag[1]
            ticket.done_ms = fin_ms
            out.append(ticket)
        else:  # pragma: no cover - internal tags only
            raise SimulationError(f"unknown transfer tag {tag!r} on {link}")

    def _start_onboard(self, ticket: OnboardTicket, now_ms: float) -> None:
        ticket.staged_ms = now_ms
        g2 = self.g2[ticket.worker_id]
        for k in ticket.keys:  # recently used: onboarded blocks stay in G2 as most recent
            if k in g2:
                g2.move_to_end(k)
        self.links[f"G2->G1/{ticket.worker_id}"].submit(
            now_ms, len(ticket.keys) * self.cfg.bytes_per_block, ("onboard", ticket)
        )

    # ------------------------------------------------------------------ operations
    def offload(self, now_ms: float, worker_id: int, keys: Sequence[int], *, flush: bool = False) -> int:
        """Queue cached blocks leaving G1 for G2; start one G1->G2 transfer per full batch (all of the queue
        when ``flush``). Returns the transfers started. Blocks already in (or on the way to) G2 are skipped."""
        if not self.cfg.num_g2_blocks:
            return 0
        self.advance(now_ms)
        q = self._pending_offload[worker_id]
        g2, fl = self.g2[worker_id], self._in_flight_g2[worker_id]
        for k in keys:
            if k in g2:
                g2.move_to_end(k)
            elif k not in fl:
                q.append(k)
                fl.add(k)
        b = self.cfg.offload_batch_size
        started = 0
        while len(q) >= b or (flush and q):
            batch, q[:] = q[:b], q[b:]
            self.offloaded_blocks += len(batch)
            self.links[f"G1->G2/{worker_id}"].submit(
                now_ms, len(batch) * self.cfg.bytes_per_block, ("g2", worker_id, batch)
            )
            started += 1
        return started

    def lookup(self, worker_id: int, keys: Sequence[int]) -> list[str]:
        """Tier of each leading key found below G1 ('G2', 'G3', 'G4'), stopping at the first miss."""
        g2 = self.g2[worker_id]
        tiers: list[str] = []
        for k in keys:
            if k in g2:
                tiers.append("G2")
            elif k in self.g3:
                tiers.append("G3")
            elif k in self.g4:
                tiers.append("G4")
            else:
                break
        return tiers

    def onboard(self, now_ms: float, worker_id: int, keys: Sequence[int]) -> OnboardTicket | None:
        """Start bringing the leading run of ``keys`` (the prompt's keys after its G1 hits) found in lower
        tiers back to G1. Returns None when the first key is in no tier. G3/G4 blocks are staged through G2
        first (their transfers run concurrently); then one G2->G1 transfer carries the whole run."""
        self.advance(now_ms)
        tiers = self.lookup(worker_id, keys)
        if not tiers:
            return None
        run = list(keys[: len(tiers)])
        count: dict[str, int] = {t: tiers.count(t) for t in ("G2", "G3", "G4") if t in tiers}
        for t, n in count.items():
            self.onboarded_blocks[t] += n
        self.onboard_tickets += 1
        ticket = OnboardTicket(worker_id, run, count, now_ms)
        for tier, link in (("G3", "G3->G2"), ("G4", "G4->G2")):
            part = [k for k, t in zip(run, tiers) if t == tier]
            if part:
                ticket._pending += 1
                self.links[link].submit(now_ms, len(part) * self.cfg.bytes_per_block, ("stage", ticket, part))
        if ticket._pending == 0:
            self._start_onboard(ticket, now_ms)
        return ticket

    def run_until_idle(self) -> list[OnboardTicket]:
        """Advance until no transfer is in flight; return tickets completed meanwhile."""
        out: list[OnboardTicket] = []
        while (t := self.next_event_ms()) is not None:
            out += self.advance(t)
        return out

    def check_invariants(self) -> None:
        """G2/G3 within capacity; every offload queue entry is tracked as in flight."""
        for w, g2 in enumerate(self.g2):
            if len(g2) > self.cfg.num_g2_blocks:
                raise SimulationError(f"G2 of worker {w} holds {len(g2)} > {self.cfg.num_g2_blocks} blocks")
            if not set(self._pending_offload[w]) <= self._in_flight_g2[w]:
                raise SimulationError(f"worker {w}: queued offloads not tracked")
        if len(self.g3) > self.cfg.num_g3_blocks:
            raise SimulationError(f"G3 holds {len(self.g3)} > {self.cfg.num_g3_blocks} blocks")


LINKS: tuple[str, ...] = TIER_LINKS


def parse_bandwidth_flags(items: Sequence[str]) -> dict[str, float]:
    """``["g2_g1=12.5", ...]`` -> ``{"bw_g2_g1_gbps": 12.5}``. Raises ConfigError naming the bad item."""
    out: dict[str, float] = {}
    for item in items:
        link, sep, val = item.partition("=")
        try:
            v = float(val)
        except ValueError:
            v = -1.0
        if not sep or link not in LINKS or not v >= 0:
            raise ConfigError(
                f"--tier-bandwidth {item!r}: expected LINK=GBPS with LINK one of {', '.join(LINKS)} "
                f"and GBPS a number >= 0"
            )
        key = f"bw_{link}_gbps"
        if key in out:
            given = next(i for i in items if i.partition("=")[0] == link)
            raise ConfigError(f"--tier-bandwidth {link}: given twice ({given!r} and {item!r}), expected each link once")
        out[key] = v
    return out


def tier_config(cfg: EngineConfig) -> TierConfig:
    """:meth:`TierConfig.from_engine` (kept as a function for callers that import it)."""
    return TierConfig.from_engine(cfg)


__all__ = [
    "GB",
    "LINKS",
    "ProcessorSharingLink",
    "TierConfig",
    "TierHierarchy",
    "OnboardTicket",
    "TierListener",
    "parse_bandwidth_flags",
    "tier_config",
]

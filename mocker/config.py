"""Engine settings: one frozen, validated settings class per simulated engine (:func:`dynoplan.settings.settings`).

Defaults are the reference mocker's (NVIDIA Dynamo Mocker, ``_normalize_mocker_config`` defaults and the
"DynoSim Simulation Model" docs): 16384 GPU blocks; block size 64 (vLLM), 32 (TensorRT-LLM), 1 (SGLang
page size); max_num_seqs 256; max_num_batched_tokens 8192; prefix caching and chunked prefill on; LIFO
recompute preemption (vLLM v1 default); speedup ratio 1.0. Each field states its unit, bound, default and
source once, in its ``Field(default=...)``.

Validation happens at construction: the field checks are declarative (strict types, bounds); the cross-field
checks (a block fits the token budget, KV-tier combinations, ``gpu_memory_fraction`` needing an ``aic:``
timing, the timing spec, :mod:`mocker.timing_spec`) are in ``__post_init__``. Code that builds settings from
user input goes through :meth:`EngineConfig.from_mapping` / :meth:`EngineConfig.replace` (or
:func:`dynoplan.settings.build`), which raise :class:`dynoplan.errors.ConfigError` with every problem, one
``field=value: expected ...`` line each; constructing ``EngineConfig(...)`` directly with a bad value raises
pydantic's ``ValidationError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

from dynoplan.errors import ConfigError
from dynoplan.fields import MAX_INT64
from dynoplan.settings import Problems, build, check, settings, spell, upper_bound_why
from mocker.timing_spec import is_aic, timing_spec_problems

EngineKind = Literal["vllm", "trtllm", "sglang"]
ENGINES: tuple[str, ...] = ("vllm", "trtllm", "sglang")
DEFAULT_BLOCK_SIZE: dict[str, int] = {"vllm": 64, "trtllm": 32, "sglang": 1}

MAX_DP_SIZE = 1024
"""Upper bound of ``dp_size`` (``--dp-size``): data-parallel ranks per worker. Each rank holds at least one
GPU (GPUs per worker = ``dp_size`` in :mod:`mocker.report`; the planner counts ``gpus_per_engine >=
dp_size``), and the ranks of one worker are one engine instance stepping together (attention data
parallelism with expert-parallel all-to-all in every layer): the largest published is DeepSeek-V3/R1's
decode unit, EP144/DP144 over 18 nodes of 8 GPUs (DeepSeek's inference-system overview, 2025); 1024 is
seven times that. Every rank is built up front with its own scheduler and KV cache, so an unbounded value
(``--dp-size 10000000``) ended in a MemoryError traceback after filling about 8 GB before the first
request (100000 ranks: 0.33 GB)."""

MAX_SPEEDUP_RATIO = 1e6
"""Upper bound of ``speedup_ratio`` (``--speedup-ratio``). Every pass time is divided by it and then rounded to whole
nanoseconds, as the reference does through a Rust ``Duration`` (:mod:`mocker.timing`): the simulated clock's
resolution is 1 ns. The shortest pass either timing model gives is 1 ms (the decode floor,
:data:`mocker.timing.DECODE_MIN_MS`; a polynomial prefill takes at least 16.5 ms), which at 1e6 lasts exactly 1 ns.
Above 1e6 the rounding lengthens such a pass (up to twice its scaled length) and from 2e6 on it rounds to 0 ns: a pass
that takes no time, so a replay reports inter-token latencies of 0 and ``dynoplan profile`` divided by its zero ITL
(``--speedup-ratio 3e7``: a ZeroDivisionError traceback; ``simulate`` the same from its profile at 1e8)."""

SPEEDUP_LIMIT_WHY = (
    "pass times are divided by it and rounded to whole nanoseconds: the shortest pass, 1 ms, lasts 1 ns at 1e6 and "
    "rounds to 0 ns from 2e6 on"
)
"""Why ``speedup_ratio`` stops at :data:`MAX_SPEEDUP_RATIO`, as the error lines say it."""

PositiveInt = Annotated[int, Field(gt=0, le=MAX_INT64)]
"""An integer > 0 and <= :data:`dynoplan.fields.MAX_INT64` (a bool is not one)."""
TierBlocks = Annotated[int, Field(ge=0, le=MAX_INT64)]
"""A KVBM tier's block count (blocks, 0 <= value <= :data:`dynoplan.fields.MAX_INT64`; 0 = no such tier)."""
LinkGBps = Annotated[float, Field(ge=0)]
"""A KVBM link's bandwidth (GB/s = 1e9 bytes/s, finite, >= 0; 0 = instantaneous). Defaults are assumptions,
not reference values (:mod:`mocker.kv.tiers`)."""

TIER_LINKS: tuple[str, ...] = ("g1_g2", "g2_g1", "g2_g3", "g3_g2", "g3_g4", "g4_g2")
"""Directional KVBM links; each has a ``bw_<link>_gbps`` setting."""


def tier_problems(num_g2_blocks: int, num_g3_blocks: int, g4: bool) -> list[str]:
    """The cross-field rule of the KVBM lower tiers shared by :class:`EngineConfig` and
    :class:`mocker.kv.tiers.TierConfig`: G3 and G4 hits stage through G2, so they need it."""
    if (num_g3_blocks or g4) and not num_g2_blocks:
        return [f"num_g2_blocks={num_g2_blocks!r}: G3/G4 hits stage through G2; expected num_g2_blocks > 0"]
    return []


@settings
class SGLangConfig:
    """SGLang scheduler knobs (defaults: SGLang's ServerArgs as the reference mocker models them)."""

    schedule_policy: Literal["fifo", "lpm"] = Field(
        default="fifo", description="Waiting-queue order: fifo or longest-prefix-match lpm."
    )
    chunked_prefill_size: PositiveInt = Field(
        default=8192, description="Max prompt tokens computed per request per extend pass (tokens)."
    )
    max_prefill_tokens: PositiveInt = Field(
        default=16384, description="Max prompt tokens admitted in one extend pass (tokens)."
    )
    clip_max_new_tokens: PositiveInt = Field(
        default=4096, description="Cap on the output-length estimate used when reserving tokens at admission (tokens)."
    )
    schedule_conservativeness: float = Field(
        default=1.0, ge=0, description="Multiplier on the initial new_token_ratio (dimensionless, >= 0)."
    )
    init_new_token_ratio: float = Field(
        default=0.7, ge=0, description="Initial share of max output reserved at admission (SGLang default 0.7)."
    )
    min_new_token_ratio_factor: float = Field(
        default=0.14, ge=0, description="new_token_ratio decays to init * factor (SGLang default 0.14)."
    )
    new_token_ratio_decay_steps: PositiveInt = Field(
        default=600, description="Decode steps over which new_token_ratio decays linearly (SGLang default 600)."
    )


@settings
class EngineConfig:
    """Configuration of one simulated engine (one DP rank); defaults and sources in the module docstring.

    Raises pydantic's ``ValidationError`` when constructed directly with a bad value; :meth:`from_mapping`
    and :meth:`replace` raise :class:`ConfigError` with every problem.
    """

    engine: EngineKind = Field(default="vllm", description="Scheduler family: vllm, trtllm or sglang.")
    num_gpu_blocks: PositiveInt = Field(default=16384, description="KV-cache capacity in blocks (pages for SGLang).")
    block_size: PositiveInt | None = Field(
        default=None,
        description="Tokens per KV block; None = engine default (vLLM 64, TRT-LLM 32, SGLang page size 1).",
    )
    max_num_seqs: PositiveInt = Field(default=256, description="Max running sequences per pass.")
    max_num_batched_tokens: PositiveInt = Field(
        default=8192,
        description="Per-pass token budget shared by prefill chunks and decode tokens (tokens; >= one block "
        "except SGLang).",
    )
    enable_prefix_caching: bool = Field(default=True, description="Reuse KV blocks of identical prompt prefixes.")
    enable_chunked_prefill: bool = Field(
        default=True, description="Split prompts larger than the remaining budget across passes."
    )
    preemption_mode: Literal["lifo", "fifo"] = Field(
        default="lifo",
        description="Which running request is recomputed when blocks run out: newest (lifo) or oldest (fifo).",
    )
    speedup_ratio: float = Field(
        default=1.0,
        gt=0,
        le=MAX_SPEEDUP_RATIO,
        description="All pass times are divided by this (dimensionless, 0 < value <= 1e6: pass times are rounded to "
        "whole nanoseconds, and the shortest pass, 1 ms, lasts 1 ns at 1e6).",
    )
    timing: str = Field(
        default="polynomial",
        description="Timing source: 'polynomial' (docs/architecture.md \"Polynomial timing baseline\"), "
        "a path to a .npz profile or 'aic:model=...,system=...' (mocker.timing_spec).",
    )
    trace_block_size: PositiveInt = Field(
        default=512, description="Tokens represented by one trace hash_id (Mooncake: 512)."
    )
    worker_type: Literal["aggregated", "prefill", "decode"] = Field(
        default="aggregated", description="Role of the worker in a (dis)aggregated fleet."
    )
    dp_size: int = Field(
        default=1,
        gt=0,
        le=MAX_DP_SIZE,
        description="Data-parallel ranks per logical worker, each with independent scheduler and KV state "
        "(1..MAX_DP_SIZE = 1024: each rank is at least one GPU).",
    )
    sglang: SGLangConfig = Field(default_factory=SGLangConfig, description="SGLang-only knobs.")
    g1_backend: Literal["native", "kvbm"] = Field(
        default="native",
        description="G1 (device) block pool: native (LRU inactive pool) or kvbm (lineage-aware, mocker.kv.kvbm).",
    )
    num_g2_blocks: TierBlocks = Field(
        default=0, description="KVBM G2 host blocks per worker (0 = none; needs g1_backend='kvbm')."
    )
    num_g3_blocks: TierBlocks = Field(
        default=0, description="KVBM G3 disk blocks shared by the fleet (0 = none; needs g1_backend='kvbm' and G2)."
    )
    g4: bool = Field(default=False, description="KVBM G4 shared object tier (needs g1_backend='kvbm' and G2).")
    offload_batch_size: PositiveInt = Field(default=16, description="Blocks per G1->G2 offload transfer (blocks).")
    bw_g1_g2_gbps: LinkGBps = Field(
        default=25.0,
        description="Device->host link bandwidth per worker (GB/s; 0 = instantaneous; assumption: PCIe Gen4 "
        "x16 effective).",
    )
    bw_g2_g1_gbps: LinkGBps = Field(default=25.0, description="Host->device link bandwidth per worker (GB/s).")
    bw_g2_g3_gbps: LinkGBps = Field(
        default=5.0, description="Host->disk link bandwidth, shared (GB/s; assumption: NVMe)."
    )
    bw_g3_g2_gbps: LinkGBps = Field(default=5.0, description="Disk->host link bandwidth, shared (GB/s).")
    bw_g3_g4_gbps: LinkGBps = Field(default=1.0, description="Disk->object link bandwidth, shared (GB/s; assumption).")
    bw_g4_g2_gbps: LinkGBps = Field(default=1.0, description="Object->host link bandwidth, shared (GB/s).")
    kv_bytes_per_token: PositiveInt | None = Field(
        default=None,
        description="KV bytes of one token (layers x 2 x KV heads x head dim x dtype bytes, docs/architecture.md "
        '"KV transfer"); sizes the KVBM tier transfers (bytes per block = block size x this). '
        "Required with lower tiers; None otherwise.",
    )
    gpu_memory_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="With timing='aic:...': size num_gpu_blocks from this share of GPU memory (0 < f <= 1).",
    )

    _speedup_why = upper_bound_why("speedup_ratio", SPEEDUP_LIMIT_WHY)

    def __post_init__(self) -> None:
        """Cross-field checks; raises :class:`dynoplan.settings.Problems` with every line."""
        p: list[str] = []
        if self.engine != "sglang" and self.max_num_batched_tokens < self.effective_block_size:
            p.append(
                f"max_num_batched_tokens={self.max_num_batched_tokens}: smaller than one block "
                f"(block_size={self.effective_block_size}); expected >= block_size"
            )
        if self.total_kv_tokens > MAX_INT64:  # each factor is bounded, their product is not
            p.append(
                f"num_gpu_blocks={self.num_gpu_blocks}: {self.num_gpu_blocks} blocks x block_size="
                f"{self.effective_block_size} = {self.total_kv_tokens} KV tokens; expected at most {MAX_INT64} tokens"
            )
        p += timing_spec_problems(self.timing)
        f = self.gpu_memory_fraction
        if f is not None and not is_aic(self.timing):
            p.append(
                f"gpu_memory_fraction={f!r}: sizes the KV cache from an AIConfigurator model; expected timing='aic:...'"
            )
        p += self._kv_tier_problems()
        if p:
            raise Problems(p)

    # ------------------------------------------------------------------ derived
    @property
    def effective_block_size(self) -> int:
        """Block size in tokens after applying the per-engine default."""
        return self.block_size if self.block_size is not None else DEFAULT_BLOCK_SIZE.get(self.engine, 64)

    @property
    def total_kv_tokens(self) -> int:
        """KV capacity in tokens = num_gpu_blocks * block size."""
        return self.num_gpu_blocks * self.effective_block_size

    def _kv_tier_problems(self) -> list[str]:
        """G1 backend and KVBM lower-tier combinations (docs/architecture.md "KVBM tiers")."""
        p = tier_problems(self.num_g2_blocks, self.num_g3_blocks, self.g4)
        lower = [f"{n}={spell(getattr(self, n))}" for n in ("num_g2_blocks", "num_g3_blocks", "g4") if getattr(self, n)]
        if self.g1_backend == "native" and lower:
            p.append(
                f'g1_backend="native": lower KV tiers configured ({", ".join(lower)}); '
                'expected g1_backend="kvbm" (KVBM owns G2/G3/G4)'
            )
        if self.g1_backend == "kvbm" and self.engine == "sglang":
            p.append(
                'g1_backend="kvbm": modelled for the vllm and trtllm block pools; '
                'expected "native" with engine="sglang"'
            )
        elif self.g1_backend == "kvbm" and self.engine == "trtllm" and lower:
            p.append(
                f'engine="trtllm" with lower KV tiers ({", ".join(lower)}): onboarding is wired into the vLLM '
                "core only (TensorRT-LLM's no-evict reservations do not cover onboarding blocks); "
                'expected engine="vllm"'
            )
        if self.kv_bytes_per_token is None and self.num_g2_blocks and self.g1_backend == "kvbm":
            p.append(
                "kv_bytes_per_token=null: KVBM tier transfers move block_size x kv_bytes_per_token bytes per "
                "block; expected the model's KV bytes per token (--kv-bytes-per-token N or --model-config FILE)"
            )
        return p

    @property
    def has_lower_tiers(self) -> bool:
        """True when KVBM lower tiers are configured (G2 present; G3/G4 need it)."""
        return self.g1_backend == "kvbm" and bool(self.num_g2_blocks)

    def replace(self, **changes: Any) -> EngineConfig:
        """A validated copy with ``changes`` applied (``None`` values are ignored). Raises ConfigError."""
        return check(lambda: dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None}))

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str | None = None) -> EngineConfig:
        """Build from a dict (e.g. parsed YAML) with :func:`dynoplan.settings.build`: unknown keys, bad types
        and bounds are ConfigError lines (``source`` prefixed), all at once.

        Accepts the reference's nesting ``{"engine": {"backend": ..., ...}}`` as well as a flat mapping;
        ``backend`` is an alias of ``engine``. A key given both inside ``engine:`` and at the top level is
        ambiguous: ConfigError naming it (neither silently wins). A problem of a key given under ``engine:``
        is named ``engine.<key>`` (with the did-you-mean in the same spelling). Settings files are read by
        :func:`dynoplan.settings_text.load_file`.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a mapping of engine settings, got {type(data).__name__}", source=source)
        flat: dict[str, Any] = dict(data)
        inner_keys: set[str] = set()
        if isinstance(flat.get("engine"), Mapping):
            inner = dict(flat.pop("engine"))
            both = sorted(str(k) for k in set(inner) & set(flat))
            if both:
                raise ConfigError(
                    [
                        f"{k}: given both under engine: ({spell(inner[k])}) and at the top level ({spell(flat[k])}), "
                        "expected it in one place"
                        for k in both
                    ],
                    source=source,
                )
            flat = {**flat, **inner}
            inner_keys = {str(k) for k in inner}
        if "backend" in flat:
            flat["engine"] = flat.pop("backend")
        try:
            return build(cls, flat, source=source)
        except ConfigError as e:
            if not inner_keys:
                raise
            raise ConfigError([_under_engine(p, inner_keys) for p in e.problems], source=source) from None


def _under_engine(problem: str, inner_keys: set[str]) -> str:
    """``problem`` (``key=...: ...`` / ``key: ...``) spelled ``engine.key`` when ``key`` was given under
    ``engine:``, its did-you-mean too."""
    key = problem.split("=", 1)[0].split(":", 1)[0].split(".", 1)[0]
    if key not in inner_keys:
        return problem
    return "engine." + problem.replace("(did you mean ", "(did you mean engine.")


def resolve_kv_capacity(cfg: EngineConfig, *, blocks_given: bool) -> EngineConfig:
    """``cfg`` with num_gpu_blocks sized by :func:`mocker.timing_aic.aic_num_gpu_blocks` when
    ``cfg.gpu_memory_fraction`` is set and the blocks were not given explicitly; otherwise ``cfg`` unchanged.
    Raises ConfigError (AIConfigurator unavailable, the model does not fit)."""
    if cfg.gpu_memory_fraction is None or blocks_given:
        return cfg
    # here, not at module level: only an aic: timing samples AIConfigurator
    from mocker.timing_aic import aic_num_gpu_blocks

    return cfg.replace(num_gpu_blocks=aic_num_gpu_blocks(cfg.timing, cfg.effective_block_size, cfg.gpu_memory_fraction))

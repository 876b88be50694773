"""Engine configuration: one frozen, validated settings dataclass per simulated engine.

Defaults are the reference mocker's (NVIDIA Dynamo Mocker, ``_normalize_mocker_config`` defaults and the
"DynoSim Simulation Model" docs): 16384 GPU blocks; block size 64 (vLLM), 32 (TensorRT-LLM), 1 (SGLang
page size); max_num_seqs 256; max_num_batched_tokens 8192; prefix caching and chunked prefill on; LIFO
recompute preemption (vLLM v1 default); speedup ratio 1.0.

Every problem is collected and raised at once as :class:`mocker.errors.ConfigError`, each message naming
the field, the bad value and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Mapping

from mocker.errors import ConfigError

EngineKind = Literal["vllm", "trtllm", "sglang"]
ENGINES: tuple[str, ...] = ("vllm", "trtllm", "sglang")
DEFAULT_BLOCK_SIZE: dict[str, int] = {"vllm": 64, "trtllm": 32, "sglang": 1}


@dataclass(frozen=True, slots=True)
class SGLangConfig:
    """SGLang scheduler knobs (defaults from SGLang's ServerArgs as modelled by the reference)."""

    schedule_policy: Literal["fifo", "lpm"] = "fifo"
    """Waiting-queue order: ``fifo`` or longest-prefix-match ``lpm``."""
    chunked_prefill_size: int = 8192
    """Max prompt tokens computed per request per extend pass (tokens)."""
    max_prefill_tokens: int = 16384
    """Max prompt tokens admitted in one extend pass (tokens)."""
    clip_max_new_tokens: int = 4096
    """Cap on the output-length estimate used when reserving tokens at admission (tokens)."""
    schedule_conservativeness: float = 1.0
    """Multiplier on the initial new_token_ratio (dimensionless)."""
    init_new_token_ratio: float = 0.7
    """Initial share of max output reserved at admission (SGLang default 0.7)."""
    min_new_token_ratio_factor: float = 0.14
    """new_token_ratio decays to init * factor (SGLang default 0.14)."""
    new_token_ratio_decay_steps: int = 600
    """Decode steps over which new_token_ratio decays linearly (SGLang default 600)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Configuration of one simulated engine (one DP rank).

    Raises :class:`ConfigError` from :meth:`validate` / :meth:`from_mapping` on invalid values.
    """

    engine: str = "vllm"
    """Scheduler family: ``vllm``, ``trtllm`` or ``sglang``."""
    num_gpu_blocks: int = 16384
    """KV-cache capacity in blocks (pages for SGLang)."""
    block_size: int | None = None
    """Tokens per KV block; ``None`` = engine default (vLLM 64, TRT-LLM 32, SGLang page size 1)."""
    max_num_seqs: int = 256
    """Max running sequences per pass."""
    max_num_batched_tokens: int = 8192
    """Per-pass token budget shared by prefill chunks and decode tokens (tokens)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of identical prompt prefixes."""
    enable_chunked_prefill: bool = True
    """Split prompts larger than the remaining budget across passes."""
    preemption_mode: Literal["lifo", "fifo"] = "lifo"
    """Which running request is recomputed when blocks run out: newest (lifo) or oldest (fifo)."""
    speedup_ratio: float = 1.0
    """All pass times are divided by this (dimensionless, > 0)."""
    timing: str = "polynomial"
    """Timing source: ``polynomial`` (DESIGN.md baseline) or a path to a ``.npz`` profile."""
    trace_block_size: int = 512
    """Tokens represented by one trace ``hash_id`` (Mooncake: 512)."""
    worker_type: Literal["aggregated", "prefill", "decode"] = "aggregated"
    """Role of the worker in a (dis)aggregated fleet."""
    dp_size: int = 1
    """Data-parallel ranks per logical worker, each with independent scheduler and KV state."""
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    """SGLang-only knobs."""
    g1_backend: Literal["native", "kvbm"] = "native"
    """G1 (device) block pool: ``native`` (LRU inactive pool) or ``kvbm`` (lineage-aware, :mod:`mocker.kv.kvbm`)."""
    num_g2_blocks: int = 0
    """KVBM G2 host blocks per worker (0 = none; needs g1_backend='kvbm')."""
    num_g3_blocks: int = 0
    """KVBM G3 disk blocks shared by the fleet (0 = none; needs g1_backend='kvbm' and G2)."""
    g4: bool = False
    """KVBM G4 shared object tier (needs g1_backend='kvbm' and G2)."""
    offload_batch_size: int = 16
    """Blocks per G1->G2 offload transfer (blocks)."""
    bw_g1_g2_gbps: float = 25.0
    """Device->host link bandwidth per worker (GB/s; 0 = instantaneous). Defaults: see mocker.kv.tiers."""
    bw_g2_g1_gbps: float = 25.0
    """Host->device link bandwidth per worker (GB/s)."""
    bw_g2_g3_gbps: float = 5.0
    """Host->disk link bandwidth, shared (GB/s)."""
    bw_g3_g2_gbps: float = 5.0
    """Disk->host link bandwidth, shared (GB/s)."""
    bw_g3_g4_gbps: float = 1.0
    """Disk->object link bandwidth, shared (GB/s)."""
    bw_g4_g2_gbps: float = 1.0
    """Object->host link bandwidth, shared (GB/s)."""
    kv_bytes_per_token: int | None = None
    """KV bytes of one token (layers x 2 x KV heads x head dim x dtype bytes, DESIGN.md "KV transfer"); sizes
    the KVBM tier transfers (bytes per block = block size x this). Required with lower tiers; None otherwise."""
    gpu_memory_fraction: float | None = None
    """With ``timing='aic:...'``: size num_gpu_blocks from this share of GPU memory (0 < f <= 1)."""

    # ------------------------------------------------------------------ derived
    @property
    def effective_block_size(self) -> int:
        """Block size in tokens after applying the per-engine default."""
        return self.block_size if self.block_size is not None else DEFAULT_BLOCK_SIZE.get(self.engine, 64)

    @property
    def total_kv_tokens(self) -> int:
        """KV capacity in tokens = num_gpu_blocks * block size."""
        return self.num_gpu_blocks * self.effective_block_size

    # ------------------------------------------------------------------ validation
    def problems(self) -> list[str]:
        """Every problem with this configuration, as readable strings (empty when valid)."""
        p: list[str] = []
        if self.engine not in ENGINES:
            p.append(f"engine={self.engine!r}: unknown engine, expected one of {', '.join(ENGINES)}")
        if not _is_int(self.num_gpu_blocks) or self.num_gpu_blocks <= 0:
            p.append(f"num_gpu_blocks={self.num_gpu_blocks!r}: expected a positive integer")
        if self.block_size is not None and (not _is_int(self.block_size) or self.block_size <= 0):
            p.append(f"block_size={self.block_size!r}: expected a positive integer")
        if not _is_int(self.max_num_seqs) or self.max_num_seqs <= 0:
            p.append(f"max_num_seqs={self.max_num_seqs!r}: expected a positive integer")
        if not _is_int(self.max_num_batched_tokens) or self.max_num_batched_tokens <= 0:
            p.append(f"max_num_batched_tokens={self.max_num_batched_tokens!r}: expected a positive integer")
        elif (
            self.engine != "sglang"
            and (self.block_size is None or (_is_int(self.block_size) and self.block_size > 0))
            and self.max_num_batched_tokens < self.effective_block_size
        ):
            p.append(
                f"max_num_batched_tokens={self.max_num_batched_tokens}: smaller than one block "
                f"(block_size={self.effective_block_size}); expected >= block_size"
            )
        if self.preemption_mode not in ("lifo", "fifo"):
            p.append(f"preemption_mode={self.preemption_mode!r}: expected 'lifo' or 'fifo'")
        for name in ("enable_prefix_caching", "enable_chunked_prefill"):  # YAML "false" is a string, not False
            if not isinstance(getattr(self, name), bool):
                p.append(f"{name}={getattr(self, name)!r}: expected a boolean (true/false)")
        if not _is_finite_number(self.speedup_ratio) or not self.speedup_ratio > 0:
            p.append(f"speedup_ratio={self.speedup_ratio!r}: expected a finite number > 0")
        if not isinstance(self.timing, str) or not (self.timing == "polynomial" or self.timing.endswith(".npz")
                                                    or self.timing.startswith("aic:")):
            p.append(f"timing={self.timing!r}: expected 'polynomial', a path to a .npz profile or 'aic:model=...,system=...'")
        elif self.timing.startswith("aic:"):
            from mocker.timing_aic import AicSpecError, parse_spec

            try:
                parse_spec(self.timing)
            except AicSpecError as e:
                p.append(str(e))
        elif self.timing.endswith(".npz") and not Path(self.timing).is_file():
            p.append(f"timing={self.timing!r}: profile file not found")
        f = self.gpu_memory_fraction
        if f is not None and (not _is_finite_number(f) or not 0 < f <= 1):
            p.append(f"gpu_memory_fraction={f!r}: expected a number in (0, 1]")
        elif f is not None and not (isinstance(self.timing, str) and self.timing.startswith("aic:")):
            p.append(f"gpu_memory_fraction={f!r}: sizes the KV cache from an AIConfigurator model; expected timing='aic:...'")
        p += self._kv_tier_problems()
        if not _is_int(self.trace_block_size) or self.trace_block_size <= 0:
            p.append(f"trace_block_size={self.trace_block_size!r}: expected a positive integer")
        if self.worker_type not in ("aggregated", "prefill", "decode"):
            p.append(f"worker_type={self.worker_type!r}: expected 'aggregated', 'prefill' or 'decode'")
        if not _is_int(self.dp_size) or self.dp_size <= 0:
            p.append(f"dp_size={self.dp_size!r}: expected a positive integer")
        s = self.sglang
        if s.schedule_policy not in ("fifo", "lpm"):
            p.append(f"sglang.schedule_policy={s.schedule_policy!r}: expected 'fifo' or 'lpm'")
        for name in ("chunked_prefill_size", "max_prefill_tokens", "clip_max_new_tokens", "new_token_ratio_decay_steps"):
            v = getattr(s, name)
            if not _is_int(v) or v <= 0:
                p.append(f"sglang.{name}={v!r}: expected a positive integer")
        for name in ("schedule_conservativeness", "init_new_token_ratio", "min_new_token_ratio_factor"):
            v = getattr(s, name)
            if not _is_finite_number(v) or v < 0:
                p.append(f"sglang.{name}={v!r}: expected a finite number >= 0")
        return p

    def _kv_tier_problems(self) -> list[str]:
        """G1 backend and KVBM lower-tier settings (DESIGN.md "KVBM tiers")."""
        p: list[str] = []
        if self.g1_backend not in ("native", "kvbm"):
            p.append(f"g1_backend={self.g1_backend!r}: expected 'native' or 'kvbm'")
            return p
        p += kv_tier_problems(self)
        lower = [f"{n}={getattr(self, n)!r}" for n in ("num_g2_blocks", "num_g3_blocks", "g4") if getattr(self, n)]
        if self.g1_backend == "native" and lower:
            p.append(f"g1_backend='native': lower KV tiers configured ({', '.join(lower)}); "
                     f"expected g1_backend='kvbm' (KVBM owns G2/G3/G4)")
        if self.g1_backend == "kvbm" and self.engine == "sglang":
            p.append("g1_backend='kvbm': modelled for the vllm and trtllm block pools; expected 'native' with engine='sglang'")
        elif self.g1_backend == "kvbm" and self.engine == "trtllm" and lower:
            p.append(f"engine='trtllm' with lower KV tiers ({', '.join(lower)}): onboarding is wired into the vLLM "
                     "core only (TensorRT-LLM's no-evict reservations do not cover onboarding blocks); expected engine='vllm'")
        kb = self.kv_bytes_per_token
        if kb is not None and (not _is_int(kb) or kb <= 0):
            p.append(f"kv_bytes_per_token={kb!r}: expected a positive integer (bytes) or None")
        elif kb is None and self.num_g2_blocks and self.g1_backend == "kvbm":
            p.append("kv_bytes_per_token=None: KVBM tier transfers move block_size x kv_bytes_per_token bytes per "
                     "block; expected the model's KV bytes per token (--kv-bytes-per-token N or --model-config FILE)")
        return p

    @property
    def has_lower_tiers(self) -> bool:
        """True when KVBM lower tiers are configured (G2 present; G3/G4 need it)."""
        return self.g1_backend == "kvbm" and bool(self.num_g2_blocks)

    def validate(self) -> "EngineConfig":
        """Return self, or raise :class:`ConfigError` listing every problem."""
        p = self.problems()
        if p:
            raise ConfigError(p)
        return self

    def replace(self, **changes: Any) -> "EngineConfig":
        """A validated copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None}).validate()

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str | None = None) -> "EngineConfig":
        """Build from a dict (e.g. parsed YAML). Unknown keys are errors.

        Accepts the reference's nesting ``{"engine": {"backend": ..., ...}}`` as well as a flat mapping;
        ``backend`` is an alias of ``engine``. A key given both inside ``engine:`` and at the top level is
        ambiguous: ConfigError naming it (neither silently wins).
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a mapping of engine settings, got {type(data).__name__}", source=source)
        flat: dict[str, Any] = dict(data)
        if isinstance(flat.get("engine"), Mapping):
            inner = dict(flat.pop("engine"))
            both = sorted(str(k) for k in set(inner) & set(flat))
            if both:
                raise ConfigError([f"{k}: given both under engine: ({inner[k]!r}) and at the top level ({flat[k]!r}), "
                                   "expected it in one place" for k in both], source=source)
            flat = {**flat, **inner}
        if "backend" in flat:
            flat["engine"] = flat.pop("backend")
        known = {f.name for f in fields(cls)}
        problems = [f"{k}: unknown setting, expected one of {', '.join(sorted(known))}" for k in flat if k not in known]
        sg = flat.pop("sglang", None)
        if sg is not None:
            if not isinstance(sg, Mapping):
                problems.append(f"sglang={sg!r}: expected a mapping")
            else:
                sknown = {f.name for f in fields(SGLangConfig)}
                problems += [f"sglang.{k}: unknown setting, expected one of {', '.join(sorted(sknown))}" for k in sg if k not in sknown]
                if not problems:
                    flat["sglang"] = SGLangConfig(**dict(sg))
        if problems:
            raise ConfigError(problems, source=source)
        cfg = cls(**{k: v for k, v in flat.items() if k in known})
        p = cfg.problems()
        if p:
            raise ConfigError(p, source=source)
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path) -> "EngineConfig":
        """Load from a YAML (or JSON) file. Raises ConfigError naming the file on any problem."""
        import yaml  # here, not at module level: only a config file needs the YAML parser (~30 ms to import)

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"engine config file not found", source=str(path)) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"not valid YAML: {e}", source=str(path)) from None
        return cls.from_mapping(data or {}, source=str(path))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_finite_number(v: object) -> bool:
    """An int or float (not bool) that is neither NaN nor infinite (YAML ``.inf`` / ``.nan`` are floats)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


TIER_LINKS: tuple[str, ...] = ("g1_g2", "g2_g1", "g2_g3", "g3_g2", "g3_g4", "g4_g2")
"""Directional KVBM links; each has a ``bw_<link>_gbps`` setting."""


def kv_tier_problems(cfg: Any) -> list[str]:
    """Problems of the KVBM lower-tier settings shared by :class:`EngineConfig` and
    :class:`mocker.kv.tiers.TierConfig` (one definition): block counts, G4 flag, offload batch, bandwidths,
    and G3/G4 needing G2 (their hits stage through it)."""
    p: list[str] = []
    for name in ("num_g2_blocks", "num_g3_blocks"):
        v = getattr(cfg, name)
        if not _is_int(v) or v < 0:
            p.append(f"{name}={v!r}: expected an integer >= 0")
    if not isinstance(cfg.g4, bool):
        p.append(f"g4={cfg.g4!r}: expected true or false")
    if not _is_int(cfg.offload_batch_size) or cfg.offload_batch_size <= 0:
        p.append(f"offload_batch_size={cfg.offload_batch_size!r}: expected a positive integer")
    for link in TIER_LINKS:
        name = f"bw_{link}_gbps"
        v = getattr(cfg, name)
        if not _is_finite_number(v) or not v >= 0:
            p.append(f"{name}={v!r}: expected a finite number >= 0 (GB/s; 0 = instantaneous)")
    if (cfg.num_g3_blocks or cfg.g4) and not cfg.num_g2_blocks:
        p.append(f"num_g2_blocks={cfg.num_g2_blocks!r}: G3/G4 hits stage through G2; expected num_g2_blocks > 0")
    return p

"""KV bytes per token from a Hugging Face ``config.json``.

Formula (docs/architecture.md "KV transfer"; the per-token KV footprint of standard attention)::

    kv_bytes_per_token = num_hidden_layers * 2 (K and V) * num_key_value_heads * head_dim * dtype_bytes

- ``num_key_value_heads`` defaults to ``num_attention_heads`` (multi-head attention, no GQA);
- ``head_dim`` defaults to ``hidden_size // num_attention_heads``;
- multi-head latent attention (DeepSeek: ``kv_lora_rank`` present) stores one latent vector per layer:
  ``num_hidden_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes``;
- a multimodal config with a ``text_config`` section is read from that section;
- ``dtype``: the KV cache dtype (``--kv-cache-dtype``); ``auto`` = the model's ``torch_dtype`` (or
  ``dtype``). Bytes: float32 4; bfloat16 / float16 2; fp8 variants 1 (vLLM's ``--kv-cache-dtype`` names).

Errors: :class:`ConfigError` naming the file and the missing or bad key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynoplan.errors import ConfigError

KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "float32",
    "bfloat16",
    "float16",
    "fp8",
    "fp8_ds_mla",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
)
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_ds_mla": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def _pos_int(cfg: Mapping[str, Any], key: str, source: str) -> int:
    v = cfg.get(key)
    if v is None:
        raise ConfigError(f"{key}: missing from the model config, expected a positive integer", source=source)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{key}={v!r}: expected a positive integer", source=source)
    return v


def kv_bytes_per_token_from_mapping(
    cfg: Mapping[str, Any], kv_cache_dtype: str = "auto", *, source: str = "config.json"
) -> int:
    """KV bytes per token of the model described by ``cfg`` (a parsed HF config). Raises ConfigError."""
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"expected a JSON object, got {type(cfg).__name__}", source=source)
    if isinstance(cfg.get("text_config"), Mapping) and "num_hidden_layers" not in cfg:
        cfg = {
            **cfg["text_config"],
            **{k: v for k, v in cfg.items() if k in ("torch_dtype", "dtype") and k not in cfg["text_config"]},
        }
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype={kv_cache_dtype!r}: expected one of {', '.join(KV_CACHE_DTYPES)}")
    if kv_cache_dtype == "auto":
        dt = cfg.get("torch_dtype", cfg.get("dtype"))
        if dt is None:
            raise ConfigError(
                "torch_dtype: missing from the model config (needed by --kv-cache-dtype auto); "
                "give --kv-cache-dtype explicitly",
                source=source,
            )
        if not isinstance(dt, str) or dt.removeprefix("torch.") not in DTYPE_BYTES:
            raise ConfigError(
                f"torch_dtype={dt!r}: unknown dtype, expected one of {', '.join(sorted(DTYPE_BYTES))}", source=source
            )
        nbytes = DTYPE_BYTES[dt.removeprefix("torch.")]
    else:
        nbytes = DTYPE_BYTES[kv_cache_dtype]
    layers = _pos_int(cfg, "num_hidden_layers", source)
    if cfg.get("kv_lora_rank") is not None:
        rank = _pos_int(cfg, "kv_lora_rank", source)
        rope = _pos_int(cfg, "qk_rope_head_dim", source)
        return layers * (rank + rope) * nbytes
    heads = _pos_int(cfg, "num_attention_heads", source)
    kv_heads = _pos_int(cfg, "num_key_value_heads", source) if cfg.get("num_key_value_heads") is not None else heads
    if cfg.get("head_dim") is not None:
        head_dim = _pos_int(cfg, "head_dim", source)
    else:
        hidden = _pos_int(cfg, "hidden_size", source)
        if hidden % heads:
            raise ConfigError(
                f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}; give head_dim", source=source
            )
        head_dim = hidden // heads
    return layers * 2 * kv_heads * head_dim * nbytes


def kv_bytes_per_token_from_file(path: str | Path, kv_cache_dtype: str = "auto") -> int:
    """:func:`kv_bytes_per_token_from_mapping` of a ``config.json`` file. Raises ConfigError naming the file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError("model config file not found", source=str(p)) from None
    except OSError as e:
        raise ConfigError(f"cannot read model config: {e.strerror or e}", source=str(p)) from None
    except UnicodeDecodeError:
        raise ConfigError("not a text file (not UTF-8), expected a Hugging Face config.json", source=str(p)) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"not valid JSON: {e.msg} at line {e.lineno}", source=str(p)) from None
    return kv_bytes_per_token_from_mapping(data, kv_cache_dtype, source=str(p))

"""KV-cache transfer model of a disaggregated (prefill/decode) fleet.

After a prefill worker has computed a request's prompt (and its first token), the prompt's KV cache moves
to a decode worker. The transfer takes (docs/architecture.md "KV transfer"; Dynamo Mocker's
``kv_transfer_bandwidth`` / ``kv_transfer_bytes_per_token``)::

    transfer_ms = charged_tokens * kv_bytes_per_token / (bandwidth_gbps * 1e9 B/s) * 1000

rounded to whole nanoseconds like every pass time (:func:`mocker.timing.kv_transfer_ms`). ``charged_tokens``:

- ``full_prompt``: the whole prompt (ISL);
- ``destination_missing``: only the prompt blocks the destination's prefix cache lacks (a full hit costs 0).

Bandwidth 0 disables the delay. Checked against the reference: 374 tokens x 131072 B at 64 GB/s = 0.765952 ms
between the end of the prefill pass and the decode admission; 1000 tokens -> 2.048 ms.

Handoff paths (:class:`KvTransferConfig.handoff`):

- ``direct``: the prefill request completes and frees its KV at the end of its pass; the decode worker is
  chosen then, and the request joins its waiting queue after the transfer (admitted like any arrival).
- ``coordinated`` (default; the reference replay's timeline): at the end of the prefill pass the source
  keeps (holds) the prompt KV; the destination reserves capacity for it at its next pass boundary (at once
  if idle) and the transfer starts then; when it ends the destination activates the request (it joins the
  decode core and is admitted at the next pass start) and then the source releases its hold. Reference
  facts (per-request ``source_held_ms``, ``destination_reserved_ms``, ``destination_activated_ms``): a
  91-token prompt held at 4727.8866 ms, reserved at the busy destination's pass end 4729.2151 ms, admitted
  at its following pass start 4734.9790 ms. vLLM orders the steps source-first (hold, then reserve). SGLang
  is destination-first (reference replay, backend sglang): the destination reserves the prompt when the
  request arrives (waiting for room, one reservation per pass boundary of a busy destination), the prefill
  starts only then, and at its end the source holds and the transfer starts; ISL 374 alone: prefill ends at
  22.238914 ms, activation 23.004866, first token 29.964348 (one SGLang decode pass later). Every hold and
  reservation is released exactly once — on activation (a reservation becomes the request's KV), on
  cancellation or on failure.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dynoplan.settings import Problems, settings
from mocker.timing import kv_transfer_ms

TIMING_MODES: tuple[str, ...] = ("full_prompt", "destination_missing")
HANDOFF_PATHS: tuple[str, ...] = ("direct", "coordinated")


@settings
class KvTransferConfig:
    """How prompt KV moves from a prefill to a decode worker. Bad values: pydantic's ``ValidationError`` when
    constructed directly; wrap user input in :func:`dynoplan.settings.check` (or ``build``) for ConfigError."""

    bandwidth_gbps: float = Field(
        default=0.0,
        ge=0,
        description="Link bandwidth (GB/s, 1 GB/s = 1e9 bytes/s, finite, >= 0); 0 disables the transfer "
        "delay (Dynamo Mocker's kv_transfer_bandwidth).",
    )
    kv_bytes_per_token: int | None = Field(
        default=None,
        gt=0,
        description="KV bytes per token (layers x 2 x kv_heads x head_dim x dtype bytes, mocker.modelcfg); "
        "required when bandwidth_gbps > 0 (Dynamo Mocker's kv_transfer_bytes_per_token).",
    )
    timing: Literal["full_prompt", "destination_missing"] = Field(
        default="full_prompt",
        description="Which prompt tokens are charged: all, or only those whose blocks the destination lacks.",
    )
    handoff: Literal["direct", "coordinated"] = Field(
        default="coordinated", description="Handoff path (module docstring)."
    )

    def __post_init__(self) -> None:
        if self.bandwidth_gbps > 0 and self.kv_bytes_per_token is None:
            raise Problems(
                f"kv_bytes_per_token=null: needed when bandwidth_gbps={self.bandwidth_gbps!r} > 0 "
                "(set it directly or from a model config.json)"
            )

    @property
    def enabled(self) -> bool:
        """True when transfers take time (bandwidth > 0)."""
        return self.bandwidth_gbps > 0

    def transfer_ms(self, charged_tokens: int) -> float:
        """Transfer time in ms of ``charged_tokens`` tokens of KV (0.0 when disabled or nothing charged)."""
        if not self.bandwidth_gbps > 0:
            return 0.0
        assert self.kv_bytes_per_token is not None  # required with a bandwidth (__post_init__)
        return kv_transfer_ms(charged_tokens, self.kv_bytes_per_token, self.bandwidth_gbps)

    def charged_tokens(self, prompt_tokens: int, destination_hit_tokens: int) -> int:
        """Tokens charged for a prompt of ``prompt_tokens`` when the destination already holds the first
        ``destination_hit_tokens`` of it (block-aligned prefix-cache hit)."""
        if self.timing == "full_prompt":
            return prompt_tokens
        return max(0, prompt_tokens - destination_hit_tokens)

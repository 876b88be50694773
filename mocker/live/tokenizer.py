"""A tiny deterministic tokenizer for the live mocker.

The simulated engines only need *how many* prompt tokens a request has and *which* prompt blocks are
shared with earlier requests (prefix caching). Real tokenizers are large; this one is a documented
stand-in that is stable across processes and platforms:

- pieces: an optional leading space plus 1-4 alphanumeric characters, an optional leading space plus
  one other non-space character, or a run of whitespace (regex below). English text averages roughly
  four characters per token, the rule of thumb OpenAI gives for its BPE tokenizers;
- token id of a piece = CRC-32 of its UTF-8 bytes (``zlib.crc32``), so equal text gives equal ids in
  every process;
- prompt block ids (``hash_ids``) are chained: block ``i`` hashes the 64-bit id of block ``i-1`` and the
  token ids of its own ``block_tokens`` tokens (BLAKE2b, 8-byte digest), so two prompts share block ``i``
  exactly when they share the first ``(i+1)*block_tokens`` tokens — the prefix-caching rule of vLLM's
  chained block hashes.

Chat requests are rendered with a fixed template (``<|role|>\\ncontent\\n`` per message, then
``<|assistant|>\\n``) before tokenizing.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterable, Sequence

_PIECE = re.compile(r" ?[^\W_]{1,4}| ?[^\s]|\s+", re.UNICODE)


def tokenize(text: str) -> list[int]:
    """Token ids (uint32) of ``text``; ``len(tokenize(t))`` is the prompt length in tokens."""
    return [zlib.crc32(p.encode("utf-8")) for p in _PIECE.findall(text)]


def count_tokens(text: str) -> int:
    """Number of tokens of ``text`` (same rule as :func:`tokenize`, without hashing)."""
    return len(_PIECE.findall(text))


def render_chat(messages: Sequence[tuple[str, str]]) -> str:
    """The prompt text of a chat: ``<|role|>\\ncontent\\n`` per (role, content), then the assistant tag."""
    return "".join(f"<|{role}|>\n{content}\n" for role, content in messages) + "<|assistant|>\n"


def block_hash_ids(token_ids: Iterable[int], block_tokens: int) -> tuple[int, ...]:
    """Chained 63-bit ids of consecutive ``block_tokens``-token blocks (the last block may be partial).

    Raises ValueError when ``block_tokens`` < 1.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens={block_tokens}: expected a positive integer")
    ids: list[int] = []
    parent = 0
    block: list[int] = []
    for t in token_ids:
        block.append(t & 0xFFFFFFFF)
        if len(block) == block_tokens:
            parent = _chain(parent, block)
            ids.append(parent)
            block = []
    if block:
        ids.append(_chain(parent, block))
    return tuple(ids)


def _chain(parent: int, block: list[int]) -> int:
    h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(b"".join(t.to_bytes(4, "little") for t in block))
    return int.from_bytes(h.digest(), "little") & 0x7FFFFFFFFFFFFFFF


_WORDS = ("the", " model", " says", " hello", " to", " a", " simulated", " world", ",", " and", " then", " more", ".")


def output_piece(index: int) -> str:
    """Text of the ``index``-th generated token (a fixed cycle of short words; the mocker has no model)."""
    return _WORDS[index % len(_WORDS)]


_OUTPUT_TOKEN_MARK = 0x80000000
"""Set in the stand-in token id of the ``j``-th generated token (``_OUTPUT_TOKEN_MARK | j``) when a
continued prompt's blocks are hashed (:func:`continuation_hash_ids`); prompt token ids are CRC-32 values,
so a generated token's id names its position in the output, which is what determines its text here
(:func:`output_piece`)."""


def continuation_hash_ids(
    hash_ids: Sequence[int], input_length: int, produced: int, block_tokens: int
) -> tuple[int, ...]:
    """Block ids of a prompt continued after ``produced`` generated tokens (a stream moved to another worker).

    The continued prompt is the original ``input_length`` prompt tokens followed by the first ``produced``
    output tokens, ``input_length + produced`` tokens in all, so it needs
    ``ceil((input_length + produced) / block_tokens)`` ids (the worker refuses fewer:
    :func:`mocker.live.protocol.parse_request`). The ids of the prompt's *full* blocks are kept (their
    content is unchanged, so another worker that cached them reuses them); every later block holds the
    prompt's partial tail (if any) and output tokens, and gets a new chained id — as
    :func:`block_hash_ids` chains blocks: BLAKE2b of the previous block's id and the block's token ids,
    where a generated token ``j`` stands as ``_OUTPUT_TOKEN_MARK | j`` and the prompt's partial tail as its
    original id (split into two 32-bit words). Equal prompts continued after equal counts get equal ids
    (the mocker's output text depends only on the token's index), as a real prefix cache would see them.

    Raises ValueError when ``block_tokens`` < 1, ``input_length`` < 1, ``produced`` < 0 or ``hash_ids``
    covers fewer than ``input_length`` tokens.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens={block_tokens}: expected a positive integer")
    if input_length < 1 or produced < 0:
        raise ValueError(f"input_length={input_length}, produced={produced}: expected >= 1 and >= 0")
    if len(hash_ids) * block_tokens < input_length:
        raise ValueError(
            f"hash_ids has {len(hash_ids)} ids of {block_tokens} tokens, fewer than the prompt's {input_length} tokens"
        )
    full = input_length // block_tokens
    ids = list(hash_ids[:full])
    total = -(-(input_length + produced) // block_tokens)
    parent = ids[-1] if ids else 0
    for b in range(full, total):
        start, end = b * block_tokens, min((b + 1) * block_tokens, input_length + produced)
        block: list[int] = []
        if start < input_length:  # the prompt's partial last block, known by its original id
            tail = int(hash_ids[full])
            block += [tail & 0xFFFFFFFF, (tail >> 32) & 0xFFFFFFFF]
        block += [_OUTPUT_TOKEN_MARK | (j - input_length) for j in range(max(start, input_length), end)]
        parent = _chain(parent, block)
        ids.append(parent)
    return tuple(ids)

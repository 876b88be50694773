"""Write load.jsonl, the load of this example (README.md): a Mooncake-format trace of constant-rate phases.

    .venv/bin/python examples/live-scaling/make_load.py   # rewrites examples/live-scaling/load.jsonl

Phases (trace seconds; `dynoplan loadgen` sends them in real time): 2 req/s for 40 s, 12 req/s for 120 s,
2 req/s for 120 s; every request has a 1024-token prompt (no shared prefix) and asks for 64 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

PHASES = ((2.0, 40.0), (12.0, 120.0), (2.0, 120.0))
"""(requests per second, seconds) of each phase."""
ISL_TOKENS, OSL_TOKENS = 1024, 64


def lines() -> list[str]:
    """One JSON object per request: ``timestamp`` (ms, evenly spaced within a phase), ``input_length``,
    ``output_length``."""
    out, t0_ms = [], 0.0
    for rate, dur in PHASES:
        for i in range(int(round(rate * dur))):
            out.append(
                json.dumps(
                    {
                        "timestamp": round(t0_ms + i * 1000.0 / rate, 3),
                        "input_length": ISL_TOKENS,
                        "output_length": OSL_TOKENS,
                    }
                )
            )
        t0_ms += dur * 1000.0
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("load.jsonl")
    path.write_text("\n".join(lines()) + "\n")
    print(f"wrote {path}: {len(lines())} requests")

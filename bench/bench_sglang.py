"""Fidelity and speed of ``dynoplan``'s SGLang engine mode against the reference (Dynamo Mocker 1.6.1 replay,
``--engine '{"engine":{"backend":"sglang"}}'``), both run in this session, side by side. The cases and the
comparison live in ``bench_replay.py`` (one runner for every engine):

  (s)  Azure conversation trace, 4 workers, round_robin (target: aggregates within 3%, speed >= 1.0)
  (sk) Mooncake conversation trace (prefix sharing), 4 workers, KV-aware routing, num_gpu_blocks 262144 (slow:
       the reference needs ~6 minutes; not in the default set)
  (ds) Azure, 2 prefill + 2 decode SGLang workers, KV transfer 64 GB/s x 131072 B/token

Usage:  .venv/bin/python bench/bench_sglang.py [--cases s[,sk,ds]] [--repeat N] [--json OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_replay as br  # noqa: E402  (shared cases, child runner, comparison and report)

if __name__ == "__main__":
    br.main(default_cases="s", description=__doc__.split("\n\n")[0])

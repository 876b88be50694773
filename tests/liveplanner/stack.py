"""Helpers of the live-planner tests: a hand-computable profile, stack files, ``dynoplan up`` as a real
process, and the orphan check.

Profile (agg mode, correction off, constant predictor): prefill 1000 tokens/s/GPU at any ISL, decode
20000 x usage tokens/s/GPU (never the binding constraint here). So with ISL 200 tokens the throughput
loop asks for ceil(rps x 200 / 1000) = ceil(rps / 5) replicas: 12 req/s -> 3, 2 req/s -> 1. That is the
closed-form sizing, which these stack files select (``simulated_sizing: false``): the live default sizes by
simulating the workers' own engine (``FAST_WORKER``), which serves those loads on one worker
(tests/liveplanner/test_up_sizing.py runs that default).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from planner.core import profile_from_arrays, save_profile
from tests.infra._proc import start_process, tail, wait_until

DYNOPLAN = [sys.executable, "-m", "planner.cli"]
FAST_WORKER = ["--speedup-ratio", "20", "--num-gpu-blocks", "2048", "--block-size", "16", "--trace-block-size", "16"]


def write_profile(path: Path) -> Path:
    save_profile(
        profile_from_arrays(
            {
                "prefill_isl": np.array([50.0, 4000.0]),
                "prefill_ttft_ms": np.array([20.0, 200.0]),
                "prefill_thpt_per_gpu": np.array([1000.0, 1000.0]),
                "decode_kv_usage": np.array([0.0, 1.0]),
                "decode_context_length": np.array([10.0, 10000.0]),
                "decode_itl_ms": np.array([[5.0, 5.0], [20.0, 20.0]]),
                "decode_thpt_per_gpu": np.array([[0.0, 0.0], [20000.0, 20000.0]]),
                "decode_max_kv_tokens": np.array([100000.0]),
            }
        ),
        path,
    )
    return path


def stack_file(dir_: Path, planner: dict[str, Any] | None = None, **sections: Any) -> Path:
    """A stack YAML in ``dir_`` (profile written next to it); ``sections`` override top-level keys."""
    write_profile(dir_ / "profile.npz")
    doc: dict[str, Any] = {
        "planner": {
            "mode": "agg",
            "adjustment_interval_s": 3,
            "load_adjustment_interval_s": 1,
            "predictor": "constant",
            "correction_enabled": False,
            "simulated_sizing": False,
            "agg": {"min_replicas": 1, "max_replicas": 3},
            **(planner or {}),
        },
        "profile": "profile.npz",
        "state_dir": "state",
        "service": {"port": 0},
        "frontend": {"port": 0, "poll_s": 0.2},
        "fleet": {"initial": {"agg": 1}, "worker_args": {"agg": FAST_WORKER}, "drain_grace_s": 1.0},
        "prometheus": {"scrape_interval_s": 0.5},
    }
    doc.update(sections)
    p = dir_ / "stack.yaml"
    p.write_text(yaml.dump(doc, Dumper=_NoAliasDumper))
    return p


class _NoAliasDumper(yaml.SafeDumper):
    """Writes a list shared by two pools (``FAST_WORKER``) out twice: settings files refuse aliases
    (docs/architecture.md "Settings text"), and safe_dump would write ``&id001`` / ``*id001``."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def step_trace(path: Path, phases: list[tuple[float, float]], isl: int = 200, osl: int = 20) -> int:
    """A Mooncake JSONL trace of constant-rate phases [(req/s, seconds), ...]; returns the request count."""
    lines, t_ms, hid = [], 0.0, 0
    for rate, dur in phases:
        n = int(round(rate * dur))
        for i in range(n):
            blocks = (isl + 15) // 16
            lines.append(
                json.dumps(
                    {
                        "timestamp": round(t_ms + i * 1000.0 / rate, 3),
                        "input_length": isl,
                        "output_length": osl,
                        "hash_ids": list(range(hid, hid + blocks)),
                    }
                )
            )
            hid += blocks
        t_ms += dur * 1000.0
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page: (name, sorted labels) -> value."""
    out = {}
    for fam in text_string_to_metric_families(requests.get(url + "/metrics", timeout=5).text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(m: dict, name: str, **labels: str) -> float:
    return sum(v for (n, lb), v in m.items() if n == name and all(dict(lb).get(k) == x for k, x in labels.items()))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class UpStack:
    """``dynoplan up --config STACK`` as a real process; records every pid it ever sees."""

    def __init__(
        self, config: Path, state_dir: Path | None = None, log_name: str = "up.log", env: dict[str, str] | None = None
    ) -> None:
        self.config = config
        self.state = state_dir or config.parent / "state"
        self.log = config.parent / log_name
        self.proc = start_process(DYNOPLAN + ["up", "--config", str(config)], self.log, env=env)
        self.seen_pids: set[int] = set()
        try:
            wait_until(lambda: "ready" in self.log.read_text().splitlines(), 120, "dynoplan up", self.proc, self.log)
        except BaseException:
            self.stop()
            raise
        self.info = self.stack_info()
        self.planner_url: str = self.info["planner_url"]
        self.frontend_url: str = self.info["frontend_url"]
        self.prometheus_url: str | None = self.info.get("prometheus_url")

    def __enter__(self) -> UpStack:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stack_info(self) -> dict[str, Any]:
        info = json.loads((self.state / "stack.json").read_text())
        self.seen_pids |= {int(v) for k, v in info.items() if k.endswith("_pid")}
        return info

    def fleet(self) -> dict[str, Any]:
        data = json.loads((self.state / "fleet.json").read_text())
        self.seen_pids |= {int(w["pid"]) for w in data["workers"]}
        return data

    def state_json(self) -> dict[str, Any]:
        self.fleet()
        return requests.get(self.planner_url + "/api/state", timeout=5).json()

    def spec(self, pool: str = "agg") -> int | None:
        pools = self.state_json()["pools"]
        return pools[pool]["spec"] if pools else None

    def loadgen(self, trace: Path, *flags: str, timeout_s: float = 240) -> tuple[int, dict[str, Any], str]:
        out = trace.with_suffix(".report.json")
        p = subprocess.run(
            DYNOPLAN
            + [
                "loadgen",
                "--quiet",
                "--url",
                self.frontend_url,
                "--trace",
                str(trace),
                "--trace-block-size",
                "16",
                "--report-json",
                str(out),
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        return p.returncode, (json.loads(out.read_text()) if out.exists() else {}), p.stderr

    def stop(self) -> None:
        """SIGTERM ``up`` (as Ctrl-C would), wait for it; every pid it ever ran must be gone."""
        try:
            self.stack_info()
            self.fleet()
        except (OSError, ValueError, KeyError):
            pass
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                raise
        left = sorted(p for p in self.seen_pids if p != self.proc.pid and pid_alive(p))
        for p in left:  # leave nothing behind even when the assertion fails
            try:
                os.killpg(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        assert left == [], f"orphan processes after dynoplan up stopped: {left}\n{tail(self.log)}"

    def wait(self, check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
        wait_until(check, timeout_s, what, self.proc, self.log, interval_s=0.2)


def tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))

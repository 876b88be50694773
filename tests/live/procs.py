"""Real processes of the live stack for integration tests and benches: workers, frontend, loadgen.

Every process is started in its own session (``tests.infra._proc.start_process``) with its log in a temp
dir, waited for on ``/ready`` (never a fixed sleep), and stopped (SIGTERM, then SIGKILL of the group) by
:meth:`LiveStack.stop`.
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

import requests

from tests.infra._proc import free_port, start_process, stop_process, tail, wait_until

DYNOPLAN = [sys.executable, "-m", "planner.cli"]


class LiveStack:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dynoplan-live-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}

    def __enter__(self) -> LiveStack:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _start(self, name: str, argv: list[str], ready_path: str = "/ready", timeout_s: float = 60.0) -> str:
        port = free_port()
        log = self.dir / f"{name}.log"
        proc = start_process(DYNOPLAN + argv + ["--port", str(port)], log)
        self.procs[name] = proc
        self.ports[name] = port
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(url + ready_path, timeout=2).status_code == 200, timeout_s, name, proc, log)
        return url

    def worker(self, name: str, *flags: str) -> str:
        """Start ``dynoplan mocker serve`` with ``flags``; returns its base URL once ready."""
        return self._start(name, ["mocker", "serve", *flags])

    def frontend(self, name: str, *flags: str, wait_workers: int = 1) -> str:
        url = self._start(name, ["frontend", *flags], ready_path="/health")
        wait_until(
            lambda: requests.get(url + "/ready", timeout=2).json()["workers"] >= wait_workers,
            30,
            name + " workers",
            self.procs[name],
            self.dir / f"{name}.log",
        )
        return url

    def kill(self, name: str, hard: bool = False) -> None:
        """Stop a process: SIGTERM (servers drain in-flight requests first) or, ``hard``, SIGKILL (a crash)."""
        proc = self.procs.pop(name)
        if hard:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        stop_process(proc)

    def log(self, name: str) -> str:
        return tail(self.dir / f"{name}.log")

    def loadgen(self, *flags: str, timeout_s: float = 300.0) -> tuple[int, dict[str, Any], str]:
        """Run ``dynoplan loadgen`` to completion; returns (exit code, report dict, stderr)."""
        out = self.dir / f"loadgen-{len(list(self.dir.glob('loadgen-*.json')))}.json"
        p = subprocess.run(
            DYNOPLAN + ["loadgen", "--quiet", "--report-json", str(out), *flags],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        rep = json.loads(out.read_text()) if out.exists() else {}
        return p.returncode, rep, p.stderr

    def stop(self) -> None:
        for name in list(self.procs):
            stop_process(self.procs.pop(name))

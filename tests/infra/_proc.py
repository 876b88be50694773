"""Process helpers shared by the real-component fixtures: free loopback ports, readiness polling,
clean termination of a process group (no orphans).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_process(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``argv`` in its own session (so the whole group can be signalled), stdout+stderr to ``log_path``."""
    log = open(log_path, "ab")  # noqa: SIM115 - closed by the child's exit; the parent keeps no handle
    try:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    finally:
        log.close()


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 15.0) -> None:
    """SIGTERM the process group of ``proc``, wait up to ``timeout_s``, then SIGKILL. Idempotent."""
    if proc is None or proc.poll() is not None:
        if proc is not None:
            _kill_group(proc.pid, signal.SIGKILL)  # reap any leftover children of an exited leader
        return
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)
    _kill_group(proc.pid, signal.SIGKILL)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, n_chars: int = 4000) -> str:
    """Last ``n_chars`` of a log file (for failure messages); '' if it does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    return data[-n_chars:].decode("utf-8", "replace")


def wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    proc: subprocess.Popen | None = None,
    log_path: Path | None = None,
    interval_s: float = 0.1,
) -> None:
    """Poll ``check()`` until it returns True.

    Raises:
        RuntimeError: ``proc`` exited first, or ``timeout_s`` elapsed; the message names ``what``
            and quotes the tail of ``log_path``.
    """
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"{what}: process exited with code {proc.returncode} before becoming ready;"
                f" log tail:\n{tail(log_path) if log_path else ''}"
            )
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - connection refused etc. while starting
            last_exc = exc
        time.sleep(interval_s)
    raise RuntimeError(
        f"{what}: not ready after {timeout_s:.0f} s (last error: {last_exc!r});"
        f" log tail:\n{tail(log_path) if log_path else ''}"
    )

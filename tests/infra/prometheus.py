"""A real Prometheus server (Debian package ``prometheus``) on a free loopback port, for tests.

The server scrapes the targets it is given every ``scrape_interval_s`` (default 1 s) with a generated
config, stores into a private temp directory and can be stopped, started and restarted (fault tests)
or re-pointed at other targets (``set_targets``; applied with a config reload, no restart).

Usage::

    from tests.infra.prometheus import PrometheusServer
    with PrometheusServer.start({"mocker": ["127.0.0.1:8001"]}) as prom:
        prom.wait_for_targets_up()
        value = prom.client().custom_query("up")   # prometheus_api_client.PrometheusConnect
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import requests
import yaml

from tests.infra._proc import free_port, start_process, stop_process, wait_until

Targets = Mapping[str, Sequence[str]] | Sequence[str]


def prometheus_binary() -> str:
    """Path of the ``prometheus`` executable (``DYNOPLAN_PROMETHEUS`` overrides ``PATH`` lookup).

    Raises:
        FileNotFoundError: not installed; ``make test`` installs Debian's ``prometheus`` package.
    """
    path = os.environ.get("DYNOPLAN_PROMETHEUS") or shutil.which("prometheus")
    if not path:
        raise FileNotFoundError(
            "prometheus not found on PATH; install it with `apt-get install -y prometheus`"
            " (tools/install-system-deps.sh, run by `make test`)"
        )
    return path


def _normalise_targets(targets: Targets) -> dict[str, list[str]]:
    if isinstance(targets, Mapping):
        out = {str(job): [str(t) for t in ts] for job, ts in targets.items()}
    else:
        out = {"targets": [str(t) for t in targets]}
    for job, ts in out.items():
        for t in ts:
            if "://" in t or ":" not in t:
                raise ValueError(f"scrape target {t!r} of job {job!r}: expected 'host:port' (no scheme)")
    return out


class PrometheusServer:
    """One Prometheus process; see the module docstring.

    Attributes:
        url: ``http://127.0.0.1:<port>`` (the port stays the same across restarts).
        base_dir: temp dir with ``prometheus.yml``, ``data/`` and ``prometheus.log``; removed by stop().
    """

    def __init__(
        self,
        targets: Targets = (),
        scrape_interval_s: float = 1.0,
        metrics_path: str = "/metrics",
        base_dir: Path | None = None,
    ) -> None:
        if not scrape_interval_s > 0:
            raise ValueError(f"scrape_interval_s={scrape_interval_s!r}: expected a positive number of seconds")
        self.binary = prometheus_binary()
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="dynoplan-prom-"))
        self.scrape_interval_s = float(scrape_interval_s)
        self.metrics_path = metrics_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = self.base_dir / "prometheus.yml"
        self.log_path = self.base_dir / "prometheus.log"
        self.proc: subprocess.Popen | None = None
        self.targets = _normalise_targets(targets)
        self._write_config()

    @classmethod
    def start(
        cls, targets: Targets = (), scrape_interval_s: float = 1.0, timeout_s: float = 60.0, **kw
    ) -> PrometheusServer:
        """Create and start a server, wait until ``/-/ready``; on failure, clean up and raise."""
        server = cls(targets, scrape_interval_s, **kw)
        try:
            server.start_process(timeout_s)
        except BaseException:
            server.stop()
            raise
        return server

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- config
    def _write_config(self) -> None:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        doc = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {"job_name": job, "metrics_path": self.metrics_path, "static_configs": [{"targets": ts}]}
                for job, ts in sorted(self.targets.items())
            ],
        }
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.config_path)

    def set_targets(self, targets: Targets) -> None:
        """Replace the scrape targets; a running server reloads its config (``POST /-/reload``)."""
        self.targets = _normalise_targets(targets)
        self._write_config()
        if self.running:
            r = requests.post(f"{self.url}/-/reload", timeout=10)
            r.raise_for_status()

    # ---------------------------------------------------------------- lifecycle
    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start_process(self, timeout_s: float = 60.0) -> None:
        """Start the process (same port, same data dir) and wait for ``/-/ready``."""
        if self.running:
            raise RuntimeError("prometheus is already running")
        self.proc = start_process(
            [
                self.binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.base_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
            self.log_path,
        )
        wait_until(self.is_ready, timeout_s, "prometheus", self.proc, self.log_path)

    def is_ready(self) -> bool:
        return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200

    def stop_process(self) -> None:
        """SIGTERM (SIGKILL after 15 s). Data already flushed to the TSDB head/WAL survives a restart."""
        stop_process(self.proc)
        self.proc = None

    def restart(self, down_s: float = 0.0, timeout_s: float = 60.0) -> None:
        """Stop, stay down ``down_s`` seconds (scrapes and queries fail meanwhile), start again."""
        self.stop_process()
        if down_s > 0:
            time.sleep(down_s)
        self.start_process(timeout_s)

    def stop(self) -> None:
        """Stop the process and remove the temp dir (when it made it). Idempotent."""
        self.stop_process()
        if self._own_dir and self.base_dir.exists():
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # ---------------------------------------------------------------- queries
    def client(self):
        """A ``prometheus_api_client.PrometheusConnect`` for this server."""
        from prometheus_api_client import PrometheusConnect

        return PrometheusConnect(url=self.url, disable_ssl=True)

    def query_scalar(self, promql: str) -> float | None:
        """Instant query that must return at most one series; its value, or None when empty.

        Raises:
            ValueError: the query returned more than one series.
        """
        result = self.client().custom_query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise ValueError(f"query {promql!r} returned {len(result)} series; expected at most one")
        return float(result[0]["value"][1])

    def active_targets(self) -> list[dict]:
        """``/api/v1/targets`` active targets (each has ``scrapeUrl``, ``health``, ``lastError``...)."""
        r = requests.get(f"{self.url}/api/v1/targets", timeout=5)
        r.raise_for_status()
        return r.json()["data"]["activeTargets"]

    def wait_for_targets_up(self, timeout_s: float = 30.0) -> None:
        """Wait until every configured target has been scraped successfully at least once."""
        wanted = sum(len(ts) for ts in self.targets.values())

        def ok() -> bool:
            active = self.active_targets()
            return len(active) == wanted and all(t["health"] == "up" for t in active)

        wait_until(ok, timeout_s, f"prometheus targets {self.targets} up", self.proc, self.log_path, interval_s=0.25)

    def wait_for_scrapes(self, n: int = 2, timeout_s: float = 30.0) -> None:
        """Wait until ``n`` more scrape intervals have passed with all targets up (fresh samples)."""
        self.wait_for_targets_up(timeout_s)
        time.sleep(n * self.scrape_interval_s)

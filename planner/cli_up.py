"""``dynoplan up`` (the whole local stack from one file) and ``dynoplan planner`` (the planner service).

``dynoplan planner --config stack.yaml``
    Runs :class:`planner.live.service.PlannerService` until SIGINT/SIGTERM: the core on the wall clock,
    traffic from Prometheus (``--prometheus-url`` or ``prometheus.url``) or, without one, scraped from
    the frontend directly (``--frontend-url``), FPM from the workers, decisions applied through the
    stack's connector (``local``: adopts the fleet recorded in ``state_dir``; ``virtual``: the HTTP
    protocol). Prints ``planner listening on http://HOST:PORT`` once serving and writes
    ``state_dir/planner.json`` (pid, url).

``dynoplan up --config stack.yaml``
    1. the frontend (``dynoplan frontend --workers-file state_dir/workers.txt``), waited on ``/health``;
    2. Prometheus when ``prometheus.enabled`` is ``auto`` and the binary is installed (or ``true``),
       scraping the frontend, the planner and the workers (``file_sd``); otherwise a notice and the
       planner scrapes the frontend directly; ``prometheus.url`` uses an existing server instead;
    3. the initial workers (``fleet.initial``), waited on ``/ready`` (readiness, not a sleep);
    4. the planner (``dynoplan planner``), which adopts those workers; it is restarted if it exits on
       its own (and adopts the fleet again);
       Prometheus started by ``up`` is supervised too: when it exits it is restarted on the same port and
       data directory after a back-off (:data:`PROMETHEUS_BACKOFF_S` doubling up to
       :data:`PROMETHEUS_BACKOFF_MAX_S`, back to the start after it ran :data:`PROMETHEUS_STABLE_S`), each
       exit and restart logged as one ``notice:`` line and counted in ``stack.json``
       (``prometheus_restarts``); the planner holds (``hold_metrics_unknown``) meanwhile and resumes at its
       first tick whose reads succeed;
    5. on Ctrl-C / SIGTERM: the planner, every worker recorded in ``fleet.json``, the frontend and
       Prometheus are stopped (SIGTERM to each process group, SIGKILL after 10 s): no orphans.
    ``state_dir/stack.json`` lists every URL and pid. Every child runs in its own session with its log
    in ``state_dir/logs``.

User mistakes (bad stack file, missing profile, port in use) print one line and exit 2. A start that fails
after the checks (a worker flag the worker rejects, a child that exits before it is ready) stops what it started
and removes the state dir if this run created it (the error quotes the failing log's telling line); a state dir
that existed before keeps the run's files and logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from dynoplan.errors import ConfigError, ProfileError
from dynoplan.fields import int_text
from dynoplan.settings import spell
from mocker.arguments import nonneg_int
from planner.arguments import warm_start_windows
from planner.core import Planner, load_profile
from planner.live.config import load_stack_config, worker_engines

# The connectors, traffic sources, service, what-if evaluator, prometheus_client and requests are imported
# where used: with aiohttp, pyzmq and requests they cost ~0.5 s that `up --help` / `planner --help` need not pay.

DYNOPLAN = (sys.executable, "-m", "planner.cli")

PROMETHEUS_BACKOFF_S = 1.0
"""Delay before the first restart of an exited Prometheus (s); doubled after each further exit."""
PROMETHEUS_BACKOFF_MAX_S = 30.0
"""Longest delay between Prometheus restarts (s)."""
PROMETHEUS_STABLE_S = 60.0
"""A Prometheus that ran this long before it exited restarts after :data:`PROMETHEUS_BACKOFF_S` again."""


# ============================================================================== dynoplan planner
def _port_arg(text: str) -> int:
    try:
        v = int_text(text)
    except ValueError:
        v = -1
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a TCP port from 0 (any free port) to 65535")
    return v


def _state_dir_arg(text: str) -> str:
    """argparse type of ``--state-dir``: a path that is not empty or blank (``Path('')`` is the current
    directory, and ``--state-dir ''`` used to fall back silently to the stack file's ``state_dir``; the stack
    file refuses an empty one too)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r}: empty, expected a directory path (omit --state-dir for the stack file's state_dir)"
        )
    return text


def _stack_file_arg(text: str) -> str:
    """argparse type of ``--config``: a path that is not empty or blank (``Path('')`` is the current directory,
    and ``--config ''`` used to say that the current directory could not be read as a stack file)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: empty, expected a stack file path")
    return text


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config STACK.yaml`` and ``--state-dir DIR``, the flags ``dynoplan planner`` and ``dynoplan up`` share."""
    parser.add_argument(
        "--config",
        required=True,
        type=_stack_file_arg,
        metavar="STACK.yaml",
        help="stack file (see docs/live-planner.md)",
    )
    parser.add_argument("--state-dir", type=_state_dir_arg, metavar="DIR", help="override state_dir of the stack file")


def add_planner_arguments(parser: argparse.ArgumentParser) -> None:
    add_stack_arguments(parser)
    parser.add_argument("--host", help="override service.host")
    parser.add_argument("--port", type=_port_arg, help="override service.port (0 = any free port)")
    parser.add_argument("--prometheus-url", help="read traffic from this Prometheus (overrides prometheus.url)")
    parser.add_argument("--frontend-url", help="without Prometheus: scrape this frontend's /metrics directly")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def _build_planner(stack: Any, with_evaluator: bool = True) -> Any:
    try:
        profile = load_profile(stack.profile) if stack.profile else None
    except (ProfileError, OSError, ValueError) as e:
        msg = str(e).removeprefix(f"{stack.profile}: ")
        raise ConfigError(
            f"profile={str(stack.profile)!r}: expected a performance profile .npz "
            f"(`dynoplan profile --out FILE`): {msg}"
        ) from None
    try:
        warm = (
            warm_start_windows(stack.warm_start_trace, stack.planner.adjustment_interval_s)
            if stack.warm_start_trace
            else ()
        )
    except (OSError, ValueError) as e:
        msg = str(e).removeprefix(f"{stack.warm_start_trace}: ")
        raise ConfigError(f"warm_start_trace={str(stack.warm_start_trace)!r}: cannot read the trace: {msg}") from None
    return Planner(
        stack.planner, profile, warm_start=warm, evaluator=_build_evaluator(stack) if with_evaluator else None
    )


log = logging.getLogger("dynoplan.planner")


def _build_evaluator(stack: Any) -> Any:
    """The sizing by simulation's engine model (:class:`planner.whatif.EngineFleetEvaluator`): the engines the
    stack's workers run (:func:`planner.live.config.worker_engines`), the frontend's router, the decode workers'
    KV transfer and the planner's SLA targets. None (closed-form sizing, with a warning) when a pool's worker
    flags do not give an engine, or when the throughput loop is off."""
    # The engines and the fleet (~0.1 s) imported here, not at module level: not for `planner`/`up` --help
    from planner.whatif import EngineFleetEvaluator

    cfg = stack.planner
    if not cfg.throughput_enabled:
        return None
    engines, transfer, problems = worker_engines(stack)
    if problems:
        log.warning("sizing by simulation off (closed-form sizing instead): %s", "; ".join(problems))
        return None
    try:
        return EngineFleetEvaluator(
            engines, ttft_ms=cfg.ttft_ms, itl_ms=cfg.itl_ms, router=stack.frontend_router, transfer=transfer
        )
    except Exception as e:  # noqa: BLE001 - mocker's ConfigError: settings the engine fleet refuses
        log.warning("sizing by simulation off (closed-form sizing instead): %s", " ".join(str(e).split()))
        return None


class RecordingTrafficSource:
    """A traffic source (``read(window_s) -> TrafficWindow | None``) that keeps the last known window it
    returned (``last``) for :func:`sizing_collector`; every other attribute is the wrapped source's."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.last: Any = None

    def read(self, window_s: float) -> Any:
        tw = self.source.read(window_s)
        if tw is not None:
            self.last = tw
        return tw

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def sizing_collector(planner: Any, last_window: Any) -> Any:
    """A prometheus_client collector of how the throughput loop sizes (read at each scrape):

    - ``dynoplan_planner_sizing_by_simulation``: 1 when it sizes by simulation (``Planner.simulating``), else 0;
    - ``dynoplan_planner_sizing_evaluations_total`` / ``dynoplan_planner_sizing_replayed_requests_total``:
      candidate fleets simulated and requests replayed through them (:class:`planner.whatif.EngineFleetEvaluator`);
    - ``dynoplan_planner_observed_interarrival_gaps`` / ``dynoplan_planner_observed_inflight_requests``: the
      gap-histogram count and the in-flight requests of the last traffic window the planner read (absent
      before the first; in-flight NaN when the frontend does not report it).

    ``last_window``: a callable returning the last TrafficWindow read (or None)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

    class _Sizing:
        def collect(self) -> Iterator[Metric]:
            yield GaugeMetricFamily(
                "dynoplan_planner_sizing_by_simulation",
                "1 when the throughput loop sizes fleets by simulation, 0 closed-form",
                value=1.0 if planner.simulating else 0.0,
            )
            ev = planner.evaluator
            yield CounterMetricFamily(
                "dynoplan_planner_sizing_evaluations",
                "Candidate fleets simulated",
                value=float(getattr(ev, "evaluations", 0)),
            )
            yield CounterMetricFamily(
                "dynoplan_planner_sizing_replayed_requests",
                "Sampled requests replayed through candidate fleets",
                value=float(getattr(ev, "replayed_requests", 0)),
            )
            tw = last_window()
            if tw is not None:
                yield GaugeMetricFamily(
                    "dynoplan_planner_observed_interarrival_gaps",
                    "Gaps in the inter-arrival histogram of the last traffic window read",
                    value=float(sum(c for _, c in tw.gap_buckets)),
                )
                yield GaugeMetricFamily(
                    "dynoplan_planner_observed_inflight_requests",
                    "Requests in flight at the end of the last traffic window read",
                    value=float(tw.num_inflight),
                )

    return _Sizing()


def run_planner(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    stack = load_stack_config(args.config)
    state_dir = Path(args.state_dir).resolve() if args.state_dir is not None else stack.state_dir
    host, port = args.host or stack.service_host, stack.service_port if args.port is None else args.port
    bad = _port_in_use(host, port) if port else None
    if bad:  # before anything starts (the local connector starts the fleet before the service listens)
        key = "--port" if args.port is not None else "service.port"
        raise ConfigError(
            f"{key}={port}: cannot listen on {host}:{port} ({bad[1]}); expected a free port (or 0 for any free port)",
            source=str(args.config),
        )
    created = _make_state_dir(state_dir)
    try:
        return _run_planner(args, stack, state_dir)
    except ConfigError:
        _remove_empty_dirs(created)  # a refused start (e.g. port in use) leaves no empty state dir behind
        raise


def _run_planner(args: argparse.Namespace, stack: Any, state_dir: Path) -> int:
    planner = _build_planner(stack)
    cfg = stack.planner
    if stack.connector == "local":
        from planner.connectors.local import LocalConnector, LocalFleetSettings

        kw = {k: getattr(stack, k) for k in ("drain_grace_s", "drain_timeout_s", "ready_timeout_s")}
        connector: Any = LocalConnector(
            LocalFleetSettings(
                state_dir=state_dir, pools=cfg.pools, worker_args=stack.worker_args, model_name=stack.model_name, **kw
            ),
            initial=stack.initial,
        )
    else:
        from planner.connectors.virtual import VirtualConnector

        connector = VirtualConnector(cfg.pools, stack.initial, token=stack.token, state_file=state_dir / "virtual.json")
    traffic: Any = None
    prom_url = args.prometheus_url or stack.prometheus_url
    if cfg.throughput_enabled:
        if prom_url:
            from planner.sources.prometheus import PrometheusSourceSettings, PrometheusTrafficSource

            traffic = PrometheusTrafficSource(
                PrometheusSourceSettings(
                    url=prom_url,
                    model=stack.model_name,
                    namespace=stack.prometheus_namespace,
                    timeout_s=stack.prometheus_timeout_s,
                    bearer_token=stack.prometheus_bearer_token,
                    ca_file=stack.prometheus_ca_file,
                )
            )
        elif args.frontend_url:
            from planner.sources.prometheus import DirectScrapeTrafficSource

            print(f"notice: no Prometheus; scraping {args.frontend_url}/metrics directly", file=sys.stderr, flush=True)
            traffic = DirectScrapeTrafficSource(
                args.frontend_url, model=stack.model_name, scrape_interval_s=min(1.0, cfg.adjustment_interval_s / 4)
            ).start()
        else:
            print(
                "notice: no traffic source: set prometheus.url in the stack file (or pass --prometheus-url or "
                "--frontend-url); until then the throughput loop holds with hold_metrics_unknown",
                file=sys.stderr,
                flush=True,
            )
    if traffic is not None:
        traffic = RecordingTrafficSource(traffic)
    fpm = None
    if stack.fpm and stack.connector == "local":
        from planner.sources.fpm import FpmSubscriber

        fpm = FpmSubscriber(stale_s=cfg.engine_stale_s)
    from planner.live.service import PlannerService

    svc = PlannerService(
        planner,
        connector,
        traffic,
        fpm,
        host=args.host or stack.service_host,
        port=stack.service_port if args.port is None else args.port,
    )
    svc.registry.register(sizing_collector(planner, lambda: traffic.last if traffic is not None else None))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            port = await svc.start()
        except (OSError, OverflowError) as e:
            await svc.stop()
            raise ConfigError(f"cannot listen on {svc.host}:{svc.port}: {getattr(e, 'strerror', None) or e}") from None
        url = f"http://{svc.host}:{port}"
        (state_dir / "planner.json").write_text(json.dumps({"pid": os.getpid(), "url": url}))
        print(f"planner listening on {url}", flush=True)
        await stop.wait()
        await svc.stop()

    asyncio.run(main())
    return 0


# ============================================================================== dynoplan up
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_stack_arguments(parser)
    parser.add_argument(
        "--max-planner-restarts",
        type=nonneg_int,
        default=20,
        help="restart the planner at most this many times when it exits on its own (default 20)",
    )


def _free_port() -> int:
    from planner.connectors.local import free_port

    return free_port()


def _get_ok(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


class _Stack:
    """The child processes of ``up`` and how to stop them."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.logs = state_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.info: dict[str, Any] = {"pid": os.getpid()}
        self.log_start: dict[str, int] = {}
        self.stopping = False
        """Set by SIGINT/SIGTERM; start-up waits stop at once (KeyboardInterrupt) instead of finishing."""
        self.keep_logs = True
        """False when a failed start removes the state dir (and these logs): errors then name no log path."""

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log_path = self.logs / f"{name}.log"
        self.log_start[name] = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as f:
            p = subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.procs[name] = p
        self.info[f"{name}_pid"] = p.pid
        self.save()
        return p

    def save(self) -> None:
        from planner.connectors.local import write_atomic

        write_atomic(self.dir / "stack.json", json.dumps(self.info, indent=1))

    def wait_ok(self, name: str, url: str, timeout_s: float) -> None:
        p = self.procs[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.stopping:
                raise KeyboardInterrupt
            if p.poll() is not None:
                log_path = self.logs / f"{name}.log"
                raise ConfigError(
                    f"{name} exited with code {p.returncode} during start-up: "
                    f"{_last_error_line(log_path, self.log_start.get(name, 0))}{self.log_ref(name)}"
                )
            if _get_ok(url):
                return
            time.sleep(0.1)
        raise ConfigError(
            f"{name} not ready at {url} after {timeout_s:g} s: "
            f"{_last_error_line(self.logs / (name + '.log'), self.log_start.get(name, 0))}"
            f"{self.log_ref(name)}"
        )

    def log_ref(self, name: str) -> str:
        """`` (log: PATH)`` when the logs outlive a failed start (:attr:`keep_logs`), else empty."""
        return f" (log: {self.logs / (name + '.log')})" if self.keep_logs else ""

    def stop(self, name: str) -> None:
        from planner.connectors.local import stop_pids

        p = self.procs.pop(name, None)
        if p is not None:
            stop_pids([p.pid])
            p.wait(timeout=5)

    def stop_all(self) -> None:
        from planner.connectors.local import read_fleet_file, stop_pids

        self.stop("planner")
        workers = [int(w["pid"]) for w in read_fleet_file(self.dir).get("workers", [])]
        stop_pids(workers)
        for name in ("frontend", "prometheus"):
            self.stop(name)
        for name in list(self.procs):
            self.stop(name)


class _Supervised:
    """A child of ``up`` that is restarted with back-off when it exits (Prometheus; see the module docstring)."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name, self.argv = name, argv
        self.restarts = 0
        self.failures = 0
        """Consecutive exits after short runs (sets the back-off)."""
        self.started_s = time.monotonic()
        self.due_s: float | None = None

    def supervise(self, st: _Stack, now_s: float) -> None:
        """Notice an exit (schedule the restart) or restart when due; call it often."""
        p = st.procs.get(self.name)
        if p is not None and p.poll() is not None:
            st.procs.pop(self.name)
            if now_s - self.started_s >= PROMETHEUS_STABLE_S:
                self.failures = 0
            delay = min(PROMETHEUS_BACKOFF_MAX_S, PROMETHEUS_BACKOFF_S * 2.0**self.failures)
            self.failures += 1
            self.due_s = now_s + delay
            print(
                f"notice: {self.name} exited with code {p.returncode} after {now_s - self.started_s:.1f} s; "
                f"restarting it in {delay:g} s "
                f"({_last_error_line(st.logs / (self.name + '.log'), st.log_start.get(self.name, 0))})",
                file=sys.stderr,
                flush=True,
            )
        if self.due_s is not None and now_s >= self.due_s:
            self.due_s = None
            self.restarts += 1
            self.started_s = now_s
            q = st.spawn(self.name, self.argv)
            st.info[f"{self.name}_restarts"] = self.restarts
            st.save()
            print(f"notice: {self.name} restarted (pid {q.pid}, restart {self.restarts})", file=sys.stderr, flush=True)


def _last_error_line(log_path: Path, start: int = 0) -> str:
    """The most telling line a child wrote to its log since byte ``start``: its last ``error:`` line
    (our CLIs print user mistakes that way), else its last non-empty line, else ``(no output)``."""
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    errs = [ln for ln in lines if "error:" in ln.lower()]
    return (errs or lines or ["(no output)"])[-1][:400]


def _port_in_use(host: str, port: int) -> tuple[str, str] | None:
    """None when ``host:port`` can be bound now, else ``(what is wrong: "host" | "port", reason)``."""
    with socket.socket() as s:
        # as the servers do (aiohttp, Prometheus): connections in TIME_WAIT from a previous run do not block
        # the port, a listening socket does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as e:
            return "host", e.strerror or str(e)
        except OSError as e:
            return ("host" if e.errno == 99 else "port"), e.strerror or str(e)  # 99: EADDRNOTAVAIL
    return None


def _make_state_dir(path: Path) -> list[Path]:
    """Create ``path`` (and its missing parents) and check it is writable; returns the directories created,
    deepest first. Raises ConfigError naming ``state_dir``."""
    created = []
    p = path
    while not p.exists() and p != p.parent:
        created.append(p)
        p = p.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / ".write-test").write_text("")
        (path / ".write-test").unlink()
    except OSError as e:
        raise ConfigError(f"state_dir={str(path)!r}: expected a writable directory ({e.strerror or e})") from None
    return created


def _remove_empty_dirs(dirs: list[Path]) -> None:
    """Remove the directories :func:`_make_state_dir` created, deepest first, as long as they are empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


def _prometheus_problem(stack_cfg: Any) -> str | None:
    """None when the configured Prometheus answers one query, else the source's reason (one line)."""
    from planner.sources.prometheus import PrometheusSourceSettings, PrometheusTrafficSource

    src = PrometheusTrafficSource(
        PrometheusSourceSettings(
            url=stack_cfg.prometheus_url,
            timeout_s=min(stack_cfg.prometheus_timeout_s, 3.0),
            bearer_token=stack_cfg.prometheus_bearer_token,
            ca_file=stack_cfg.prometheus_ca_file,
        )
    )
    try:
        src.query("vector(1)")
    except Exception as e:  # noqa: BLE001 - reported, not fatal: the planner retries every tick
        return src._reason(e)
    return None


def _running_up(state_dir: Path) -> int | None:
    """Pid of a live ``dynoplan up`` that recorded itself in ``state_dir/stack.json`` (not this process)."""
    from planner.connectors.local import pid_alive

    try:
        pid = int(json.loads((state_dir / "stack.json").read_text())["pid"])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    is_up = b"up" in argv and any(a.endswith((b"dynoplan", b"planner.cli")) for a in argv)
    return pid if pid != os.getpid() and is_up and pid_alive(pid) else None


def _leftover_stack_pids(state_dir: Path) -> list[int]:
    """Pids of a previous ``up`` in ``state_dir`` (stack.json) that still run *and* are still ours
    (their command line names this state dir), e.g. after ``up`` itself was SIGKILLed."""
    try:
        info = json.loads((state_dir / "stack.json").read_text())
    except (OSError, ValueError):
        return []
    out = []
    for k, v in info.items():
        if not k.endswith("_pid") or k == "pid" or not isinstance(v, int):
            continue
        try:
            cmd = Path(f"/proc/{v}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(state_dir) in cmd:
            out.append(v)
    return out


def _prometheus_binary() -> str | None:
    """``$DYNOPLAN_PROMETHEUS`` (must be an executable file) or ``prometheus`` on PATH (None if absent)."""
    env = os.environ.get("DYNOPLAN_PROMETHEUS")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise ConfigError(f"DYNOPLAN_PROMETHEUS={env!r}: expected the path of an executable prometheus binary")
        return env
    return shutil.which("prometheus")


def _write_prometheus_config(path: Path, scrape_s: float, frontend: str, planner: str, workers_sd: Path) -> None:
    iv = f"{max(1, int(scrape_s * 1000))}ms"
    doc = {
        "global": {"scrape_interval": iv, "scrape_timeout": iv, "evaluation_interval": iv},
        "scrape_configs": [
            {"job_name": "frontend", "static_configs": [{"targets": [frontend]}]},
            {"job_name": "planner", "static_configs": [{"targets": [planner]}]},
            {"job_name": "workers", "file_sd_configs": [{"files": [str(workers_sd)], "refresh_interval": "1s"}]},
        ],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _start_initial_workers(
    stack_cfg: Any, state_dir: Path, stopping: Any = lambda: False, keep_logs: bool = True
) -> list[subprocess.Popen[bytes]]:
    """Start the initial fleet through the same LocalConnector the planner uses; wait until ready.
    Returns the worker processes (``up`` is their parent and reaps them when they exit)."""
    from planner.connectors.local import LocalConnector, LocalFleetSettings

    cfg = stack_cfg.planner
    kw = {k: getattr(stack_cfg, k) for k in ("drain_grace_s", "drain_timeout_s", "ready_timeout_s")}
    conn = LocalConnector(
        LocalFleetSettings(
            state_dir=state_dir,
            pools=cfg.pools,
            worker_args=stack_cfg.worker_args,
            model_name=stack_cfg.model_name,
            **kw,
        ),
        initial=stack_cfg.initial,
    )

    async def go() -> None:
        await conn.start()
        try:
            deadline = time.monotonic() + stack_cfg.ready_timeout_s
            while True:
                if stopping():
                    raise KeyboardInterrupt
                died = [e for e in conn.events if e["event"] == "died" and e.get("state") == "starting"]
                if died:
                    e = died[0]
                    log_path = state_dir / "logs" / f"{e['worker']}.log"
                    raise ConfigError(
                        f"fleet.worker_args.{e['pool']}={spell(list(stack_cfg.worker_args.get(e['pool'], ())))}: "
                        f"worker {e['worker']} exited during start-up: {_last_error_line(log_path)}"
                    )
                pools = await conn.observe()
                if pools and all(pools[p].ready_replicas == stack_cfg.initial.get(p, 0) for p in cfg.pools):
                    return
                if time.monotonic() > deadline:
                    late = [w for w in conn.workers if w.state == "starting"]
                    tail = (
                        f": worker {late[0].name}: {_last_error_line(state_dir / 'logs' / f'{late[0].name}.log')}"
                        if late
                        else ""
                    )
                    raise ConfigError(
                        f"fleet.ready_timeout_s={stack_cfg.ready_timeout_s:g}: initial workers not "
                        f"ready after {stack_cfg.ready_timeout_s:g} s{tail}"
                        + (f" (logs in {state_dir / 'logs'})" if keep_logs else "")
                    )
                await asyncio.sleep(0.1)
        finally:
            await conn.close(stop_workers=False)

    asyncio.run(go())
    return [w.proc for w in conn.workers if w.proc is not None]


def run(args: argparse.Namespace) -> int:
    """Start the local stack of ``--config`` (frontend, Prometheus, initial workers, planner) and supervise it
    until SIGINT/SIGTERM. Returns 0 (stopped), 1 (the planner kept exiting); raises ConfigError for a refused
    start — every refusal comes before the state dir is created (:func:`_refuse_or_clean_up`)."""
    cfg_path = Path(args.config).resolve()
    stack_cfg = load_stack_config(cfg_path)
    state_dir, binary = _refuse_or_clean_up(args, cfg_path, stack_cfg)
    created = _new_state_dir(state_dir)
    st = _Stack(state_dir)
    # a failed start removes the state dir it created (with its logs: the error quotes the failing log's telling
    # line); a state dir that existed before keeps what this run wrote, logs included
    st.keep_logs = not created
    ready = False

    def on_signal(signum: int, frame: Any) -> None:
        st.stopping = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        fe_port = stack_cfg.frontend_port or _free_port()
        fe_url = f"http://127.0.0.1:{fe_port}"
        st.spawn(
            "frontend",
            [
                *DYNOPLAN,
                "frontend",
                "--host",
                "127.0.0.1",
                "--port",
                str(fe_port),
                "--workers-file",
                str(state_dir / "workers.txt"),
                "--router",
                stack_cfg.frontend_router,
                "--poll-s",
                str(stack_cfg.frontend_poll_s),
                "--model-name",
                stack_cfg.model_name,
            ],
        )
        st.wait_ok("frontend", fe_url + "/health", 60)
        st.info["frontend_url"] = fe_url
        pl_port = stack_cfg.service_port or _free_port()
        pl_url = f"http://{stack_cfg.service_host}:{pl_port}"
        prom_url, prom_argv = _start_prometheus(st, stack_cfg, binary, fe_port, pl_port)
        initial_workers = _start_initial_workers(stack_cfg, state_dir, lambda: st.stopping, st.keep_logs)
        planner_argv = [
            *DYNOPLAN,
            "planner",
            "--config",
            str(cfg_path),
            "--state-dir",
            str(state_dir),
            "--port",
            str(pl_port),
            "--frontend-url",
            fe_url,
        ]
        if prom_url:
            planner_argv += ["--prometheus-url", prom_url]
        st.spawn("planner", planner_argv)
        st.wait_ok("planner", pl_url + "/health", 120)
        st.info["planner_url"] = pl_url
        st.info["dashboard_url"] = pl_url + "/"
        st.save()
        print(
            f"frontend   {fe_url}\nplanner    {pl_url}  (dashboard {pl_url}/)\n"
            f"prometheus {prom_url or '-- (direct scraping)'}\nstate      {state_dir}\nready",
            flush=True,
        )
        ready = True
        return _supervise(st, args.max_planner_restarts, planner_argv, initial_workers, prom_argv)
    except KeyboardInterrupt:
        ready = True  # stopped by the user during start-up, not a failed start: the state dir stays
        raise
    finally:
        st.stop_all()
        if not ready and created:
            shutil.rmtree(created[-1], ignore_errors=True)  # the topmost directory this run created
        for s, h in old.items():
            signal.signal(s, h)


def _refuse_or_clean_up(args: argparse.Namespace, cfg_path: Path, stack_cfg: Any) -> tuple[Path, str | None]:
    """Every check of ``dynoplan up`` before anything starts or is created: the profile and warm start (one
    line each; worker flags are the workers' start-up's), the connector, another ``up`` on the state dir,
    the fixed ports, the Prometheus binary. Processes a previous run left behind are stopped. Returns the
    state dir and the Prometheus binary (None: none wanted or none installed). Raises ConfigError."""
    from planner.connectors.local import pid_alive, read_fleet_file, stop_pids

    _build_planner(stack_cfg, with_evaluator=False)
    if stack_cfg.connector != "local":
        raise ConfigError(
            f"connector={stack_cfg.connector!r}: `dynoplan up` runs a local fleet; expected local "
            "(run `dynoplan planner` for the virtual connector)",
            source=str(cfg_path),
        )
    state_dir = Path(args.state_dir).resolve() if args.state_dir is not None else stack_cfg.state_dir
    other = _running_up(state_dir)
    if other is not None:
        raise ConfigError(
            f"state_dir={str(state_dir)!r}: another `dynoplan up` (pid {other}) runs this stack; "
            "expected it stopped first (Ctrl-C) or another state_dir (--state-dir)"
        )
    left = [int(w["pid"]) for w in read_fleet_file(state_dir).get("workers", []) if pid_alive(int(w["pid"]))]
    left += _leftover_stack_pids(state_dir)
    if left:
        print(
            f"notice: stopping {len(left)} process(es) left by a previous run in {state_dir}",
            file=sys.stderr,
            flush=True,
        )
        stop_pids(left)
    fixed_ports = [
        ("frontend.port", "127.0.0.1", stack_cfg.frontend_port),
        ("service.port", stack_cfg.service_host, stack_cfg.service_port),
    ]
    if stack_cfg.prometheus_url is None and stack_cfg.prometheus_enabled != "false":
        fixed_ports.append(("prometheus.port", "127.0.0.1", stack_cfg.prometheus_port))
    for key, host, port in fixed_ports:
        bad = _port_in_use(host, port or 0)
        if bad and bad[0] == "host":
            raise ConfigError(
                f"{key.split('.')[0]}.host={spell(host)}: cannot listen on it ({bad[1]}); expected a local "
                "address such as 127.0.0.1",
                source=str(cfg_path),
            )
        if bad and port:
            raise ConfigError(
                f"{key}={port}: cannot listen on {host}:{port} ({bad[1]}); expected a free port "
                "(or 0 for any free port)",
                source=str(cfg_path),
            )
    want_prometheus = stack_cfg.prometheus_url is None and stack_cfg.prometheus_enabled != "false"
    binary = _prometheus_binary() if want_prometheus else None
    if want_prometheus and binary is None and stack_cfg.prometheus_enabled == "true":
        raise ConfigError(
            "prometheus.enabled=true: expected a `prometheus` binary on PATH "
            "(apt-get install -y prometheus) or DYNOPLAN_PROMETHEUS",
            source=str(cfg_path),
        )
    return state_dir, binary


def _new_state_dir(state_dir: Path) -> list[Path]:
    """Create the state dir (:func:`_make_state_dir`: returns the directories created, deepest first) with an empty
    fleet file, workers file and Prometheus worker targets."""
    from planner.connectors.local import write_atomic

    created = _make_state_dir(state_dir)
    write_atomic(state_dir / "fleet.json", json.dumps({"spec": {}, "workers": [], "next_worker_id": 1}))
    (state_dir / "workers.txt").write_text("")
    write_atomic(state_dir / "prometheus_workers.json", "[]")
    return created


def _start_prometheus(
    st: Any, stack_cfg: Any, binary: str | None, fe_port: int, pl_port: int
) -> tuple[str | None, list[str] | None]:
    """Start the stack's own Prometheus (scraping the frontend, the planner and the workers) unless the stack
    names one (``prometheus.url``: a notice when it does not answer) or none is wanted or installed (the
    planner then scrapes the frontend directly). Returns (Prometheus URL or None, its argv when started)."""
    prom_url = stack_cfg.prometheus_url
    prom_argv: list[str] | None = None
    state_dir = st.dir
    if prom_url is None and stack_cfg.prometheus_enabled != "false":
        if binary is None:
            print(
                "notice: prometheus is not installed; the planner scrapes the frontend's /metrics directly",
                file=sys.stderr,
                flush=True,
            )
        else:
            pr_port = stack_cfg.prometheus_port or _free_port()
            pdir = state_dir / "prometheus"
            pdir.mkdir(exist_ok=True)
            _write_prometheus_config(
                pdir / "prometheus.yml",
                stack_cfg.prometheus_scrape_interval_s,
                f"127.0.0.1:{fe_port}",
                f"127.0.0.1:{pl_port}",
                state_dir / "prometheus_workers.json",
            )
            prom_argv = [
                binary,
                f"--config.file={pdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={pdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{pr_port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ]
            st.spawn("prometheus", prom_argv)
            prom_url = f"http://127.0.0.1:{pr_port}"
            st.wait_ok("prometheus", prom_url + "/-/ready", 60)
    st.info["prometheus_url"] = prom_url
    st.save()
    if stack_cfg.prometheus_url:
        why = _prometheus_problem(stack_cfg)
        if why:
            print(
                f"notice: prometheus.url={stack_cfg.prometheus_url!r} does not answer ({why}); the planner "
                "holds with hold_metrics_unknown until it does",
                file=sys.stderr,
                flush=True,
            )
    return prom_url, prom_argv


def _supervise(
    st: Any, max_planner_restarts: int, planner_argv: list[str], initial_workers: list[Any], prom_argv: list[str] | None
) -> int:
    """Until SIGINT/SIGTERM: restart an exited planner (it adopts the fleet) up to ``max_planner_restarts``
    times (then 1), reap exited initial workers, note an exited frontend, supervise Prometheus. Returns 0
    when stopped."""
    restarts = 0
    prom = _Supervised("prometheus", prom_argv) if prom_argv else None
    while not st.stopping:
        p = st.procs["planner"]
        if p.poll() is not None:
            if restarts >= max_planner_restarts:
                print(
                    f"dynoplan up: planner exited with code {p.returncode} {restarts + 1} times; stopping",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            restarts += 1
            print(
                f"notice: planner exited with code {p.returncode}; restarting it (it adopts the fleet)",
                file=sys.stderr,
                flush=True,
            )
            st.spawn("planner", planner_argv)
            st.info["planner_restarts"] = restarts
            st.save()
        for w in initial_workers:
            w.poll()  # reap a worker that exited (else it stays a zombie child of up)
        q = st.procs.get("frontend")
        if q is not None and q.poll() is not None:
            print(f"notice: frontend exited with code {q.returncode}", file=sys.stderr, flush=True)
            st.procs.pop("frontend")
        if prom is not None:
            prom.supervise(st, time.monotonic())
        time.sleep(0.2)
    print("stopping", flush=True)
    return 0

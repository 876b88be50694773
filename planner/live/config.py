"""The stack file of ``dynoplan up`` / ``dynoplan planner``: one YAML for the whole local stack.

```yaml
planner:            # PlannerConfig fields (planner.core.config), e.g. mode, adjustment_interval_s, ttft_ms
  mode: agg
  adjustment_interval_s: 30
  # engine_stale_s defaults to 5 here (LIVE_ENGINE_STALE_S), not the core's 30
profile: profile.npz          # performance profile (needed by the throughput loop); relative to this file
warm_start_trace: null        # optional trace for the predictors' warm start
connector: local              # local (process fleet) | virtual (HTTP protocol, an external system applies)
state_dir: .dynoplan          # fleet.json, workers.txt, logs (relative to this file)
service: {host: 127.0.0.1, port: 8090, token: null}   # planner HTTP: dashboard, /api/state, /metrics, /v1/virtual
frontend: {port: 8080, router: least_loaded, poll_s: 0.25, model_name: mocker}
fleet:
  initial: {agg: 1}                 # replicas started by `up` (and the VirtualConnector's initial state)
  worker_args: {agg: ["--speedup-ratio", "10"]}   # mocker serve flags; also the engine the sizing by
                                                  # simulation replays (worker_engines)
  drain_grace_s: 1.5
  drain_timeout_s: 60
  ready_timeout_s: 60
prometheus:
  enabled: auto             # auto: start one if the `prometheus` binary is installed, else scrape directly
  url: null                 # use an existing server instead of starting one
  port: 0                   # 0 = a free port
  scrape_interval_s: 1
  timeout_s: 5
  namespace: null
  bearer_token: null
  ca_file: null
fpm: true                   # subscribe to the workers' ForwardPassMetrics streams
```

:func:`load_stack_config` validates everything at once and raises :class:`~planner.errors.ConfigError`
naming each bad field, its value and what was expected.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from planner.core import PlannerConfig, config_from_mapping
from planner.core.config import MODES
from planner.errors import ConfigError

LIVE_ENGINE_STALE_S = 5.0
"""``planner.engine_stale_s`` when the stack file does not set it (the core's default is 30 s): live workers
send a ForwardPassMetrics heartbeat every second (``mocker serve --heartbeat-s``), so an engine silent for 5 s
is gone; with 30 s a stopped worker's last idle pass kept the load loop from scaling up for 30 s after
every scale-down (it needs every engine over the SLA)."""

def _load_interval_default(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """``planner.load_adjustment_interval_s`` when the load loop is off and the file does not set it: the
    core's default (5 s) unless that is not shorter than ``adjustment_interval_s``, then half of it. With the
    load loop off the setting only paces the throughput loop's retry of a goal not yet reached
    (``Planner._next_tick``), so a short ``adjustment_interval_s`` (``5``) must not be refused because of a
    loop the user did not turn on nor configure. Set explicitly, or with the load loop on, it is validated as
    given."""
    if "load_adjustment_interval_s" in raw or raw.get("load_enabled") is True:
        return raw
    ai = raw.get("adjustment_interval_s")
    default = PlannerConfig().load_adjustment_interval_s
    if isinstance(ai, (int, float)) and not isinstance(ai, bool) and 0 < ai <= default:
        return {**raw, "load_adjustment_interval_s": ai / 2.0}
    return raw


_TOP_KEYS = {"planner", "profile", "warm_start_trace", "connector", "state_dir", "service", "frontend", "fleet",
             "prometheus", "fpm"}


@dataclass(frozen=True)
class StackConfig:
    """Parsed stack file (see the module docstring); paths are absolute."""

    planner: PlannerConfig
    profile: Path | None = None
    warm_start_trace: Path | None = None
    connector: str = "local"
    state_dir: Path = Path(".dynoplan")
    service_host: str = "127.0.0.1"
    service_port: int = 8090
    token: str | None = None
    frontend_port: int = 8080
    frontend_router: str = "least_loaded"
    frontend_poll_s: float = 0.25
    model_name: str = "mocker"
    initial: Mapping[str, int] = field(default_factory=dict)
    worker_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    drain_grace_s: float = 1.5
    drain_timeout_s: float = 60.0
    ready_timeout_s: float = 60.0
    prometheus_enabled: str = "auto"
    prometheus_url: str | None = None
    prometheus_port: int = 0
    prometheus_scrape_interval_s: float = 1.0
    prometheus_timeout_s: float = 5.0
    prometheus_namespace: str | None = None
    prometheus_bearer_token: str | None = None
    prometheus_ca_file: str | None = None
    fpm: bool = True


def _section(data: Mapping[str, Any], name: str, keys: set[str], problems: list[str]) -> dict[str, Any]:
    sec = data.get(name) or {}
    if not isinstance(sec, Mapping):
        problems.append(f"{name}={sec!r}: expected a mapping")
        return {}
    for k in sec:
        if k not in keys:
            problems.append(f"{name}.{k}: unknown setting (expected one of {', '.join(sorted(keys))})")
    return dict(sec)


def stack_config_from_mapping(data: Mapping[str, Any], base_dir: Path, source: str | None = None) -> StackConfig:
    """Validate plain data (parsed YAML) into a :class:`StackConfig`; relative paths against ``base_dir``."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    for k in data:
        if k not in _TOP_KEYS:
            problems.append(f"{k}: unknown setting (expected one of {', '.join(sorted(_TOP_KEYS))})")
    planner_raw = data.get("planner") or {}
    if not isinstance(planner_raw, Mapping):
        problems.append(f"planner={planner_raw!r}: expected a mapping of planner settings (PlannerConfig fields)")
        # nothing to judge the pools and the profile of the other sections against
        planner, mode_known, throughput_on = PlannerConfig(), False, False
    else:
        if "engine_stale_s" not in planner_raw:
            planner_raw = {**planner_raw, "engine_stale_s": LIVE_ENGINE_STALE_S}
        planner_raw = _load_interval_default(planner_raw)
        try:
            planner = config_from_mapping(planner_raw, source=None)
            mode_known, throughput_on = True, planner.throughput_enabled
        except ConfigError as e:
            problems.extend("planner." + p for p in e.problems)
            mode = planner_raw.get("mode", "disagg")  # keep checking the other sections against the intended mode
            mode_known = mode in MODES
            throughput_on = planner_raw.get("throughput_enabled", True) is not False
            planner = PlannerConfig(mode=mode) if mode_known else PlannerConfig()
    kw: dict[str, Any] = {}
    # a pool of another mode under a defaulted mode: the fix is usually planner.mode, so say it was not set
    mode_unset = not isinstance(planner_raw, Mapping) or "mode" not in planner_raw
    unset_note = f"planner.mode unset, default {planner.mode}; " if mode_unset else ""

    def path(key: str, v: Any) -> Path | None:
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            problems.append(f"{key}={v!r}: expected a path")
            return None
        p = Path(v)
        return p if p.is_absolute() else (base_dir / p).resolve()

    kw["profile"] = path("profile", data.get("profile"))
    if kw["profile"] is not None and not kw["profile"].exists():
        problems.append(f"profile={str(kw['profile'])!r}: file not found")
    if throughput_on and kw["profile"] is None:
        problems.append("profile=None: expected a performance profile (.npz) when planner.throughput_enabled is true")
    kw["warm_start_trace"] = path("warm_start_trace", data.get("warm_start_trace"))
    kw["state_dir"] = path("state_dir", data.get("state_dir", ".dynoplan")) or base_dir / ".dynoplan"
    conn = data.get("connector", "local")
    if conn not in ("local", "virtual"):
        problems.append(f"connector={conn!r}: expected local or virtual")
    kw["connector"] = conn

    def num(key: str, v: Any, integer: bool = False, minimum: float = 0.0, strict: bool = True) -> Any:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (not integer or isinstance(v, int))
        ok = ok and (v > minimum if strict else v >= minimum)
        if not ok:
            problems.append(f"{key}={v!r}: expected {'an integer' if integer else 'a number'} "
                            f"{'>' if strict else '>='} {minimum:g}")
        return v

    def port(key: str, v: Any) -> Any:
        if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 65535):
            problems.append(f"{key}={v!r}: expected a TCP port, an integer from 0 (any free port) to 65535")
        return v

    def text(key: str, v: Any) -> str | None:
        if v is not None and not (isinstance(v, str) and v):
            problems.append(f"{key}={v!r}: expected a non-empty string (quote it in YAML)")
            return None
        return v

    svc = _section(data, "service", {"host", "port", "token"}, problems)
    kw["service_host"] = text("service.host", svc.get("host", "127.0.0.1")) or "127.0.0.1"
    kw["service_port"] = port("service.port", svc.get("port", 8090))
    kw["token"] = text("service.token", svc.get("token"))
    fe = _section(data, "frontend", {"port", "router", "poll_s", "model_name"}, problems)
    kw["frontend_port"] = port("frontend.port", fe.get("port", 8080))
    kw["frontend_router"] = fe.get("router", "least_loaded")
    if kw["frontend_router"] not in ("round_robin", "least_loaded", "kv"):
        problems.append(f"frontend.router={kw['frontend_router']!r}: expected round_robin, least_loaded or kv")
    kw["frontend_poll_s"] = num("frontend.poll_s", fe.get("poll_s", 0.25))
    kw["model_name"] = text("frontend.model_name", fe.get("model_name", "mocker")) or "mocker"
    fl = _section(data, "fleet", {"initial", "worker_args", "drain_grace_s", "drain_timeout_s", "ready_timeout_s"}, problems)
    initial = fl.get("initial") or {}
    if not isinstance(initial, Mapping):
        problems.append(f"fleet.initial={initial!r}: expected a mapping pool -> replicas")
        initial = {}
    init: dict[str, int] = {}
    for p in planner.pools:
        lim = planner.limits(p)
        v = initial.get(p, lim.min_replicas or 1)
        init[p] = num(f"fleet.initial.{p}", v, True, 0, strict=False)
        hi = lim.max_replicas
        # below min_replicas is fine (the planner raises the fleet at its first tick); above max is a mistake
        if isinstance(v, int) and not isinstance(v, bool) and hi is not None and v > hi:
            problems.append(f"fleet.initial.{p}={v}: expected at most planner.{p}.max_replicas={hi}")
    for p in initial if mode_known else ():
        if p not in planner.pools:
            problems.append(f"fleet.initial.{p}: pool not planned in mode {planner.mode!r} "
                            f"({unset_note}expected {', '.join(planner.pools)})")
    kw["initial"] = init
    wa = fl.get("worker_args") or {}
    if not isinstance(wa, Mapping) or not all(isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v)
                                              for v in wa.values()):
        problems.append(f"fleet.worker_args={wa!r}: expected a mapping pool -> list of flags")
        wa = {}
    kw["worker_args"] = {p: tuple(str(x) for x in v) for p, v in wa.items()}
    for p in kw["worker_args"] if mode_known else ():
        if p not in planner.pools:
            problems.append(f"fleet.worker_args.{p}: pool not planned in mode {planner.mode!r} "
                            f"({unset_note}expected {', '.join(planner.pools)})")
        elif planner.mode == "disagg" and _worker_engine(kw["worker_args"][p]) == "trtllm":
            problems.append(f"fleet.worker_args.{p}: engine trtllm: disaggregated serving is not supported for "
                            f"TensorRT-LLM (replay and simulate reject it too), expected vllm or sglang")
    for k in ("drain_grace_s", "drain_timeout_s", "ready_timeout_s"):
        if k in fl:
            kw[k] = num(f"fleet.{k}", fl[k])
    pr = _section(data, "prometheus", {"enabled", "url", "port", "scrape_interval_s", "timeout_s", "namespace",
                                       "bearer_token", "ca_file"}, problems)
    en = pr.get("enabled", "auto")
    en = {True: "true", False: "false"}.get(en, en)
    if en not in ("auto", "true", "false"):
        problems.append(f"prometheus.enabled={en!r}: expected auto, true or false")
    kw["prometheus_enabled"] = en
    kw["prometheus_url"] = text("prometheus.url", pr.get("url"))
    if kw["prometheus_url"] is not None and not kw["prometheus_url"].startswith(("http://", "https://")):
        problems.append(f"prometheus.url={kw['prometheus_url']!r}: expected an http:// or https:// URL")
    kw["prometheus_port"] = port("prometheus.port", pr.get("port", 0))
    kw["prometheus_scrape_interval_s"] = num("prometheus.scrape_interval_s", pr.get("scrape_interval_s", 1.0))
    kw["prometheus_timeout_s"] = num("prometheus.timeout_s", pr.get("timeout_s", 5.0))
    kw["prometheus_namespace"] = text("prometheus.namespace", pr.get("namespace"))
    kw["prometheus_bearer_token"] = text("prometheus.bearer_token", pr.get("bearer_token"))
    ca = path("prometheus.ca_file", pr.get("ca_file"))
    if ca is not None and not ca.is_file():
        problems.append(f"prometheus.ca_file={str(ca)!r}: file not found (expected a PEM CA bundle)")
    kw["prometheus_ca_file"] = str(ca) if ca is not None else None
    # the stack's own listeners must not share a port: each would start, and the later one fail on
    # "Address already in use" (the planner only in its log, restarted over and over). 0 = a free port each.
    # Workers take free ports (planner.connectors.local.free_port), so they cannot collide with these.
    own_ports = [("frontend.port", kw["frontend_port"]), ("service.port", kw["service_port"])]
    if kw["prometheus_url"] is None and en != "false":  # only a Prometheus `up` starts listens on prometheus.port
        own_ports.append(("prometheus.port", kw["prometheus_port"]))
    seen: dict[int, str] = {}
    for key, v in own_ports:
        if not (isinstance(v, int) and not isinstance(v, bool)) or v == 0:
            continue
        if v in seen:
            problems.append(f"{key}={v}: same port as {seen[v]}, expected distinct ports (or 0 for any free port)")
        else:
            seen[v] = key
    fpm = data.get("fpm", True)
    if not isinstance(fpm, bool):
        problems.append(f"fpm={fpm!r}: expected true or false")
    kw["fpm"] = bool(fpm)
    if mode_known and planner.load_enabled and conn == "virtual":
        problems.append("planner.load_enabled=True: expected false with connector virtual (the load loop reads the "
                        "workers' ForwardPassMetrics, which only the local connector discovers)")
    elif mode_known and planner.load_enabled and fpm is False:
        problems.append("fpm=False: expected true when planner.load_enabled is true (the load loop reads the "
                        "workers' ForwardPassMetrics)")
    if problems:
        raise ConfigError(problems, source=source)
    return StackConfig(planner=planner, **kw)


def _worker_namespace(argv: tuple[str, ...], pool: str | None = None) -> Any:
    """``argv`` of a ``mocker serve`` worker (of ``pool``: with its ``--worker-type``) parsed by the worker's
    own argument parser; raises SystemExit on flags it rejects."""
    import argparse
    import contextlib
    import io

    from mocker import cli_live
    from planner.connectors.local import WORKER_TYPE  # the role the local connector starts the pool's workers with

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    cli_live.add_arguments(parser)
    role = ["--worker-type", WORKER_TYPE[pool]] if pool is not None else []
    with contextlib.redirect_stderr(io.StringIO()):
        ns, _ = parser.parse_known_args(["serve", *role, *argv])
    return ns


def _worker_engine(argv: tuple[str, ...]) -> str | None:
    """The engine family (``vllm``/``sglang``/``trtllm``) a ``mocker serve`` worker started with ``argv``
    would run (its ``--engine`` / ``--engine-config``, relative to the current directory as for the worker),
    parsed by the worker's own argument parser; None when the flags do not parse (the worker's start-up then
    reports them)."""
    from mocker import cli_live

    try:
        return str(cli_live.engine_config_from_args(_worker_namespace(argv)).engine)
    except (SystemExit, Exception):  # noqa: BLE001 - not ours to report: the worker's start-up does
        return None


def worker_engines(stack: StackConfig) -> tuple[dict[str, Any], Any, list[str]]:
    """The engine each planned pool's workers run, as ``mocker serve`` builds it from ``fleet.worker_args``
    (defaults < ``--engine-config`` < flags; role from the pool, DP size from ``--dp-size``), and the KV
    transfer of the decode workers' ``--kv-transfer-bandwidth-gbps`` / ``--kv-bytes-per-token``.

    Returns ``({pool: mocker.config.EngineConfig}, mocker.transfer.KvTransferConfig | None, problems)``:
    a pool without worker flags (e.g. the virtual connector's external workers) gets the mocker's default
    engine; a pool whose flags the worker's parser rejects is left out and named in ``problems`` (its
    workers' start-up reports the flag itself). Paths in the flags are relative to the current directory,
    as for the workers."""
    from mocker import cli_live
    from mocker.transfer import KvTransferConfig

    engines: dict[str, Any] = {}
    problems: list[str] = []
    transfer = None
    for pool in stack.planner.pools:
        argv = tuple(stack.worker_args.get(pool, ()))
        try:
            ns = _worker_namespace(argv, pool)
            engines[pool] = cli_live.engine_config_from_args(ns).replace(worker_type=ns.worker_type,
                                                                          dp_size=ns.dp_size)
            if pool == "decode" and ns.kv_transfer_bandwidth_gbps > 0:
                # the live frontend's default pd_mode "direct": the prefill leg completes, then the decode leg
                transfer = KvTransferConfig(bandwidth_gbps=float(ns.kv_transfer_bandwidth_gbps),
                                            kv_bytes_per_token=int(ns.kv_bytes_per_token) or None, handoff="direct")
        except SystemExit:
            problems.append(f"fleet.worker_args.{pool}={list(argv)!r}: flags mocker serve rejects")
        except Exception as e:  # noqa: BLE001 - mocker's ConfigError / OSError of an --engine-config file
            problems.append(f"fleet.worker_args.{pool}: {' '.join(str(e).split())}")
    return engines, transfer, problems


def load_stack_config(path: str | Path) -> StackConfig:
    """Read and validate a stack YAML file. Raises ConfigError naming the file."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read stack file: {e.strerror}", source=str(p)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"cannot read stack file: byte 0x{e.object[e.start]:02x} at offset {e.start}: expected UTF-8 "
                          "text", source=str(p)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and cmark is not None and cmark is not mark:
            context += f" started at line {cmark.line + 1}, column {cmark.column + 1}"
        raise ConfigError(f"cannot parse stack file{where}: {what}" + (f" ({context})" if context else "")
                          + "; expected YAML (see examples/stack.yaml)", source=str(p)) from None
    return stack_config_from_mapping(data or {}, p.resolve().parent, source=str(p))

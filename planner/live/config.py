"""The stack file of ``dynoplan up`` / ``dynoplan planner``: one YAML for the whole local stack.

```yaml
planner:            # PlannerConfig fields (planner.core.config), e.g. mode, adjustment_interval_s, ttft_ms
  mode: agg
  adjustment_interval_s: 30
profile: profile.npz          # performance profile (needed by the throughput loop); relative to this file
connector: local              # local (process fleet) | virtual (HTTP protocol, an external system applies)
service: {port: 8090}         # planner HTTP: dashboard, /api/state, /metrics, /v1/virtual
frontend: {router: least_loaded}
fleet:
  initial: {agg: 1}                 # replicas started by `up` (and the VirtualConnector's initial state)
  worker_args: {agg: ["--speedup-ratio", "10"]}   # mocker serve flags; also the engine the sizing by
                                                  # simulation replays (worker_engines)
prometheus: {enabled: auto}
```

Each section is a :func:`dynoplan.settings.settings` model (:class:`StackFileSettings` and its
:class:`ServiceSection`, :class:`FrontendSection`, :class:`FleetSection`, :class:`PrometheusSection`); every
default is in its ``Field``. The ``planner:`` section is a :class:`~planner.core.config.PlannerConfig` with two
defaults of the live stack (:data:`LIVE_ENGINE_STALE_S`, :func:`_load_interval_default`).
:func:`load_stack_config` validates everything at once and raises :class:`~dynoplan.errors.ConfigError`
naming each bad field, its value and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

from pydantic import AfterValidator, BeforeValidator, Field

from dynoplan.errors import ConfigError
from dynoplan.fields import HttpUrl
from dynoplan.settings import build, settings, spell
from planner.core import PlannerConfig, config_from_mapping
from planner.core.config import MODES

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


def _bool_text(v: Any) -> Any:
    """YAML's ``true``/``false`` as the text ``"true"``/``"false"`` (``prometheus.enabled``)."""
    return {True: "true", False: "false"}[v] if isinstance(v, bool) else v


def _non_empty(v: str) -> str:
    if not v:
        raise ValueError("expected a non-empty string (quote it in YAML)")
    return v


Text = Annotated[str, AfterValidator(_non_empty)]
"""A non-empty string."""
Flag = Annotated[
    str, BeforeValidator(lambda v: str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
]
"""A command-line flag or its value; a YAML number (``10``) is its text (``"10"``)."""
Port = Annotated[int, Field(ge=0, le=65535)]
"""A TCP port; 0 = any free port."""
Seconds = Annotated[float, Field(gt=0)]
"""A duration in seconds, > 0."""


@settings
class ServiceSection:
    """``service:``: the planner's HTTP listener (dashboard, ``/api/state``, ``/metrics``, ``/v1/virtual``)."""

    host: Text = Field(default="127.0.0.1", description="Address the planner listens on (default 127.0.0.1).")
    port: Port = Field(default=8090, description="TCP port, 0..65535 (default 8090; 0 = a free port).")
    token: Text | None = Field(
        default=None, description="Bearer token the HTTP API requires; null (the default) = none."
    )


@settings
class FrontendSection:
    """``frontend:``: the OpenAI-compatible frontend ``dynoplan up`` starts in front of the workers."""

    port: Port = Field(default=8080, description="TCP port, 0..65535 (default 8080; 0 = a free port).")
    router: Literal["round_robin", "least_loaded", "kv"] = Field(
        default="least_loaded",
        description=("Request routing across workers: round_robin, least_loaded (the default) or kv."),
    )
    poll_s: Seconds = Field(default=0.25, description="Worker discovery poll period, seconds > 0 (default 0.25).")
    model_name: Text = Field(default="mocker", description="Model name the frontend serves (default mocker).")


@settings
class FleetSection:
    """``fleet:``: the workers ``dynoplan up`` starts and how they are stopped."""

    initial: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description=(
            "Replicas started per pool (and the VirtualConnector's initial state), each >= 0; a pool not named "
            "starts with its planner.<pool>.min_replicas, or 1 when that is 0."
        ),
    )
    worker_args: dict[str, tuple[Flag, ...]] = Field(
        default_factory=dict,
        description=(
            "mocker serve flags per pool; also the engine the sizing by simulation replays (worker_engines). "
            "Default none."
        ),
    )
    drain_grace_s: Seconds = Field(
        default=1.5,
        description="Time a worker removed from routing gets to finish its "
        "requests before it is stopped, seconds > 0 (default 1.5).",
    )
    drain_timeout_s: Seconds = Field(
        default=60.0, description="Longest wait for a stopped worker to exit, seconds > 0 (default 60)."
    )
    ready_timeout_s: Seconds = Field(
        default=60.0, description="Longest wait for a started worker's /ready, seconds > 0 (default 60)."
    )


@settings
class PrometheusSection:
    """``prometheus:``: where the planner's metrics come from."""

    enabled: Annotated[Literal["auto", "true", "false"], BeforeValidator(_bool_text)] = Field(
        default="auto",
        description=(
            "auto (the default): start a Prometheus if the prometheus binary is installed, else scrape the workers "
            "directly; true: start one (the binary is required); false: scrape directly."
        ),
    )
    url: HttpUrl | None = Field(
        default=None,
        description=(
            "An existing server's http:// or https:// URL to use instead of starting one; null (the default) = "
            "start or scrape as enabled says."
        ),
    )
    port: Port = Field(
        default=0, description="Port of the Prometheus `up` starts, 0..65535 (0, the default, = a free port)."
    )
    scrape_interval_s: Seconds = Field(default=1.0, description="Scrape interval, seconds > 0 (default 1).")
    timeout_s: Seconds = Field(default=5.0, description="HTTP timeout of one query, seconds > 0 (default 5).")
    namespace: Text | None = Field(
        default=None,
        description="Metrics namespace (prefix) of the workers' series; null (the default) = the mocker's.",
    )
    bearer_token: Text | None = Field(
        default=None, description="Bearer token sent to the server; null (the default) = none."
    )
    ca_file: Text | None = Field(
        default=None,
        description="PEM CA bundle for an https:// server, relative to the stack "
        "file; null (the default) = the system's.",
    )


def _no_settings() -> dict[str, Any]:
    return {}


@settings
class StackFileSettings:
    """The stack file as written (paths unresolved); :func:`stack_config_from_mapping` resolves it into a
    :class:`StackConfig`."""

    planner: dict[str, Any] = Field(
        default_factory=_no_settings,
        description=(
            "PlannerConfig fields (planner.core.config); engine_stale_s defaults to 5 here (LIVE_ENGINE_STALE_S)."
        ),
    )
    profile: Text | None = Field(
        default=None,
        description="Performance profile (.npz), relative to this file; needed by the throughput loop. Default none.",
    )
    warm_start_trace: Text | None = Field(
        default=None, description="Trace for the predictors' warm start, relative to this file; default none."
    )
    connector: Literal["local", "virtual"] = Field(
        default="local",
        description=("local (the default: a process fleet) or virtual (HTTP protocol, an external system applies)."),
    )
    state_dir: Text = Field(
        default=".dynoplan", description="fleet.json, workers.txt, logs, relative to this file (default .dynoplan)."
    )
    service: ServiceSection = Field(default_factory=ServiceSection, description=ServiceSection.__doc__)
    frontend: FrontendSection = Field(default_factory=FrontendSection, description=FrontendSection.__doc__)
    fleet: FleetSection = Field(default_factory=FleetSection, description=FleetSection.__doc__)
    prometheus: PrometheusSection = Field(default_factory=PrometheusSection, description=PrometheusSection.__doc__)
    fpm: bool = Field(default=True, description="Subscribe to the workers' ForwardPassMetrics streams (default true).")


@settings
class StackConfig:
    """The resolved stack file (see the module docstring): paths absolute, the planner section validated.
    Built by :func:`stack_config_from_mapping` only; the defaults are those of :class:`StackFileSettings`."""

    planner: PlannerConfig
    profile: Path | None
    warm_start_trace: Path | None
    connector: str
    state_dir: Path
    service_host: str
    service_port: int
    token: str | None
    frontend_port: int
    frontend_router: str
    frontend_poll_s: float
    model_name: str
    initial: Mapping[str, int]
    worker_args: Mapping[str, tuple[str, ...]]
    drain_grace_s: float
    drain_timeout_s: float
    ready_timeout_s: float
    prometheus_enabled: str
    prometheus_url: str | None
    prometheus_port: int
    prometheus_scrape_interval_s: float
    prometheus_timeout_s: float
    prometheus_namespace: str | None
    prometheus_bearer_token: str | None
    prometheus_ca_file: str | None
    fpm: bool


def _without(data: Any, paths: list[list[str]]) -> Any:
    """``data`` with the keys at ``paths`` removed (a path is cut where the data is no longer a mapping)."""
    if not isinstance(data, Mapping):
        return {}
    out = dict(data)
    for path in paths:
        cur: dict[str, Any] = out
        for i, key in enumerate(path):
            if key not in cur:
                break
            if i == len(path) - 1 or not isinstance(cur[key], Mapping):
                del cur[key]
                break
            cur[key] = dict(cur[key])
            cur = cur[key]
    return out


def _problem_path(line: str) -> list[str]:
    """The field path of a ``field=value: expected ...`` / ``field: ...`` line."""
    cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=len(line))
    return line[:cut].split(".")


def stack_config_from_mapping(data: Mapping[str, Any], base_dir: Path, source: str | None = None) -> StackConfig:
    """Validate plain data (parsed YAML) into a :class:`StackConfig`; relative paths against ``base_dir``.

    The sections' fields are checked by :class:`StackFileSettings` and the planner section by
    :func:`~planner.core.config.config_from_mapping`; the checks across sections (pools of the planner's mode,
    files found, distinct ports, the load loop's inputs) then run on the valid values (an invalid value is
    replaced by its default for them), so every problem is reported at once. Raises ConfigError."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", source=source)
    problems: list[str] = []
    f = _file_settings(data, problems, source)
    planner, throughput_on, mode_known, unset_note = _planner_section(data, problems)
    profile = _resolve_path(base_dir, f.profile)
    if profile is not None and not profile.exists():
        problems.append(f"profile={spell(str(profile))}: file not found (make it with: {profile_command(profile, f)})")
    if throughput_on and profile is None:
        problems.append("profile=null: expected a performance profile (.npz) when planner.throughput_enabled is true")
    init = _initial_replicas(f.fleet, planner, problems)
    worker_args = dict(f.fleet.worker_args)
    _check_fleet_pools(f.fleet, worker_args, planner, mode_known, unset_note, problems)
    ca = _resolve_path(base_dir, f.prometheus.ca_file)
    if ca is not None and not ca.is_file():
        problems.append(f"prometheus.ca_file={spell(str(ca))}: file not found (expected a PEM CA bundle)")
    _check_ports(f, problems)
    _check_load_loop_inputs(f, planner, mode_known, problems)
    if problems:
        raise ConfigError(problems, source=source)
    return _stack_config(f, base_dir, planner, profile, init, worker_args, ca)


def _file_settings(data: Mapping[str, Any], problems: list[str], source: str | None) -> StackFileSettings:
    """The sections' fields as :class:`StackFileSettings`; each invalid field's problem line is appended to
    ``problems`` and the rest judged without it (its default). Raises ConfigError with ``problems`` when
    even that fails."""
    try:
        return build(StackFileSettings, data)
    except ConfigError as e:
        problems.extend(e.problems)
        try:  # the rest judged without the invalid values
            return build(StackFileSettings, _without(data, [_problem_path(p) for p in e.problems]))
        except ConfigError:
            raise ConfigError(problems, source=source) from None


def _planner_section(data: Mapping[str, Any], problems: list[str]) -> tuple[PlannerConfig, bool, bool, str]:
    """The planner section as ``(planner, throughput_on, mode_known, unset_note)``.

    Live defaults: ``engine_stale_s`` = ``LIVE_ENGINE_STALE_S`` and the load loop's interval
    (:func:`_load_interval_default`). On invalid fields their lines are appended to ``problems`` (prefixed
    ``planner.``) and the other sections are checked against the intended mode's defaults; ``mode_known``
    is False when the mode itself is unknown or the section is not a mapping. ``unset_note`` prefixes the
    pool messages when ``planner.mode`` was not set (the fix is usually to set it).
    """
    planner_raw = data.get("planner") or {}
    mode_known = isinstance(planner_raw, Mapping)
    if not isinstance(planner_raw, Mapping):  # named above: nothing to judge the pools and the profile against
        planner, throughput_on = PlannerConfig(), False
    else:
        if "engine_stale_s" not in planner_raw:
            planner_raw = {**planner_raw, "engine_stale_s": LIVE_ENGINE_STALE_S}
        planner_raw = _load_interval_default(planner_raw)
        try:
            planner = config_from_mapping(planner_raw, source=None)
            throughput_on = planner.throughput_enabled
        except ConfigError as e:
            problems.extend("planner." + p for p in e.problems)
            mode = planner_raw.get("mode", "disagg")  # keep checking the other sections against the intended mode
            mode_known = mode in MODES
            throughput_on = planner_raw.get("throughput_enabled", True) is not False
            planner = PlannerConfig(mode=mode) if mode_known else PlannerConfig()
    # a pool of another mode under a defaulted mode: the fix is usually planner.mode, so say it was not set
    mode_unset = not (isinstance(planner_raw, Mapping) and "mode" in planner_raw)
    unset_note = f"planner.mode unset, default {planner.mode}; " if mode_unset else ""
    return planner, throughput_on, mode_known, unset_note


def profile_command(profile: Path, f: StackFileSettings) -> str:
    """The ``dynoplan profile`` command that writes the stack's missing ``profile``, as docs/local-stack.md
    gives it for examples/stack.yaml: ``--out`` the profile (relative to the current directory when inside
    it) and the workers' engine flags from ``fleet.worker_args`` (the flags ``dynoplan profile`` takes:
    :func:`planner.arguments.add_engine_arguments`), when every pool's workers run with the same flags;
    otherwise the pools' flags are left to the user (``... ENGINE-FLAGS``)."""
    import argparse
    import shlex

    from planner.arguments import add_engine_arguments

    class HintParser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # raise, not print and exit: this only builds a hint
            raise ValueError(message)

    try:
        out = profile.relative_to(Path.cwd())
    except ValueError:
        out = profile
    cmd = f"dynoplan profile --out {shlex.quote(str(out))}"
    argvs = {tuple(argv) for argv in f.fleet.worker_args.values()}
    if len(argvs) != 1:
        return cmd + " ENGINE-FLAGS" if argvs else cmd
    argv = list(argvs.pop())
    parser = HintParser(add_help=False, allow_abbrev=False)
    add_engine_arguments(parser)
    try:
        _, others = parser.parse_known_args(argv)
    except (ValueError, argparse.ArgumentError):  # an engine flag with a bad value: the workers' start-up names it
        others = []
    kept: list[str] = []
    for token in argv:  # the flags as written, without those dynoplan profile does not take
        if others and token == others[0]:
            others.pop(0)
        else:
            kept.append(token)
    return " ".join([cmd, shlex.join(kept)]) if kept else cmd


def _resolve_path(base_dir: Path, v: str | None) -> Path | None:
    """``v`` as a path, relative ones resolved against ``base_dir``; None stays None."""
    if v is None:
        return None
    p = Path(v)
    return p if p.is_absolute() else (base_dir / p).resolve()


def _initial_replicas(fl: FleetSection, planner: PlannerConfig, problems: list[str]) -> dict[str, int]:
    """Replicas ``up`` starts per planned pool: ``fleet.initial``, default the pool's ``min_replicas`` (or 1).

    Below ``min_replicas`` is fine (the planner raises the fleet at its first tick); above ``max_replicas``
    is a mistake, appended to ``problems``.
    """
    init: dict[str, int] = {}
    for p in planner.pools:
        lim = planner.limits(p)
        v = init[p] = fl.initial.get(p, lim.min_replicas or 1)
        if lim.max_replicas is not None and v > lim.max_replicas:
            problems.append(f"fleet.initial.{p}={v}: expected at most planner.{p}.max_replicas={lim.max_replicas}")
    return init


def _check_fleet_pools(
    fl: FleetSection,
    worker_args: Mapping[str, tuple[str, ...]],
    planner: PlannerConfig,
    mode_known: bool,
    unset_note: str,
    problems: list[str],
) -> None:
    """Append a problem for each ``fleet.initial`` / ``fleet.worker_args`` pool the planner's mode does not
    plan, and for TensorRT-LLM workers in disaggregated mode (not supported); skipped when the mode is
    unknown."""
    for what, pools in (("initial", fl.initial), ("worker_args", worker_args)):
        for p in pools if mode_known else ():
            if p not in planner.pools:
                problems.append(
                    f"fleet.{what}.{p}: pool not planned in mode {planner.mode!r} "
                    f"({unset_note}expected {', '.join(planner.pools)})"
                )
            elif what == "worker_args" and planner.mode == "disagg" and _worker_engine(worker_args[p]) == "trtllm":
                problems.append(
                    f"fleet.worker_args.{p}: engine trtllm: disaggregated serving is not supported for "
                    f"TensorRT-LLM (replay and simulate reject it too), expected vllm or sglang"
                )


def _check_ports(f: StackFileSettings, problems: list[str]) -> None:
    """Append a problem for each of the stack's own listeners that shares a port with an earlier one.

    Each would start, and the later one fail on "Address already in use" (the planner only in its log,
    restarted over and over). 0 = a free port each. Workers take free ports
    (planner.connectors.local.free_port), so they cannot collide with these.
    """
    own_ports = [("frontend.port", f.frontend.port), ("service.port", f.service.port)]
    # only a Prometheus `up` starts listens on prometheus.port
    if f.prometheus.url is None and f.prometheus.enabled != "false":
        own_ports.append(("prometheus.port", f.prometheus.port))
    seen: dict[int, str] = {}
    for key, port in own_ports:
        if port and port in seen:
            problems.append(
                f"{key}={port}: same port as {seen[port]}, expected distinct ports (or 0 for any free port)"
            )
        elif port:
            seen[port] = key


def _check_load_loop_inputs(
    f: StackFileSettings, planner: PlannerConfig, mode_known: bool, problems: list[str]
) -> None:
    """Append a problem when the load loop is on but cannot read the workers' ForwardPassMetrics: with the
    virtual connector (only the local one discovers workers) or with ``fpm`` off."""
    if mode_known and planner.load_enabled and f.connector == "virtual":
        problems.append(
            "planner.load_enabled=true: expected false with connector virtual (the load loop reads the "
            "workers' ForwardPassMetrics, which only the local connector discovers)"
        )
    elif mode_known and planner.load_enabled and f.fpm is False:
        problems.append(
            "fpm=false: expected true when planner.load_enabled is true (the load loop reads the "
            "workers' ForwardPassMetrics)"
        )


def _stack_config(
    f: StackFileSettings,
    base_dir: Path,
    planner: PlannerConfig,
    profile: Path | None,
    init: dict[str, int],
    worker_args: dict[str, tuple[str, ...]],
    ca: Path | None,
) -> StackConfig:
    """The validated :class:`StackConfig` from the file's sections and the values resolved above
    (``state_dir`` defaults to ``base_dir``; paths resolved against it)."""
    fl, pr = f.fleet, f.prometheus
    return StackConfig(
        planner=planner,
        profile=profile,
        warm_start_trace=_resolve_path(base_dir, f.warm_start_trace),
        connector=f.connector,
        state_dir=_resolve_path(base_dir, f.state_dir) or base_dir,
        service_host=f.service.host,
        service_port=f.service.port,
        token=f.service.token,
        frontend_port=f.frontend.port,
        frontend_router=f.frontend.router,
        frontend_poll_s=f.frontend.poll_s,
        model_name=f.frontend.model_name,
        initial=init,
        worker_args=worker_args,
        drain_grace_s=fl.drain_grace_s,
        drain_timeout_s=fl.drain_timeout_s,
        ready_timeout_s=fl.ready_timeout_s,
        prometheus_enabled=pr.enabled,
        prometheus_url=pr.url,
        prometheus_port=pr.port,
        prometheus_scrape_interval_s=pr.scrape_interval_s,
        prometheus_timeout_s=pr.timeout_s,
        prometheus_namespace=pr.namespace,
        prometheus_bearer_token=pr.bearer_token,
        prometheus_ca_file=str(ca) if ca is not None else None,
        fpm=f.fpm,
    )


def _worker_engine(argv: tuple[str, ...]) -> str | None:
    """The engine family (``vllm``/``sglang``/``trtllm``) a ``mocker serve`` worker started with ``argv``
    would run (its ``--engine`` / ``--engine-config``, relative to the current directory as for the worker),
    as :func:`mocker.arguments.worker_from_argv` builds it; None when the flags do not parse or the engine is
    invalid (the worker's start-up then reports them)."""
    from mocker.arguments import worker_from_argv

    try:
        return str(worker_from_argv(argv).engine.engine)
    except Exception:  # noqa: BLE001 - not ours to report: the worker's start-up does
        return None


def worker_engines(stack: StackConfig) -> tuple[dict[str, Any], Any, list[str]]:
    """The engine each planned pool's workers run, as ``mocker serve`` builds it from ``fleet.worker_args``
    (:func:`mocker.arguments.worker_from_argv`: defaults < ``--engine-config`` < flags; role from the pool,
    DP size from ``--dp-size``), and the KV transfer of the decode workers' ``--kv-transfer-bandwidth-gbps`` /
    ``--kv-bytes-per-token``.

    Returns ``({pool: mocker.config.EngineConfig}, mocker.transfer.KvTransferConfig | None, problems)``:
    a pool without worker flags (e.g. the virtual connector's external workers) gets the mocker's default
    engine; a pool whose flags the worker's parser rejects is left out and named in ``problems`` (its
    workers' start-up reports the flag itself). Paths in the flags are relative to the current directory,
    as for the workers."""
    from mocker.arguments import WorkerArgvError, worker_from_argv
    from mocker.transfer import KvTransferConfig
    from planner.connectors.local import WORKER_TYPE  # the role the local connector starts the pool's workers with

    engines: dict[str, Any] = {}
    problems: list[str] = []
    transfer = None
    for pool in stack.planner.pools:
        argv = tuple(stack.worker_args.get(pool, ()))
        try:
            worker = worker_from_argv(argv, WORKER_TYPE[pool])
        except WorkerArgvError as e:
            problems.append(f"fleet.worker_args.{pool}={spell(list(argv))}: flags mocker serve rejects ({e})")
            continue
        except Exception as e:  # noqa: BLE001 - mocker's ConfigError / OSError of an --engine-config file
            problems.append(f"fleet.worker_args.{pool}: {' '.join(str(e).split())}")
            continue
        engines[pool] = worker.engine
        if pool == "decode" and worker.kv_transfer_bandwidth_gbps > 0:
            # the live frontend's default pd_mode "direct": the prefill leg completes, then the decode leg
            transfer = KvTransferConfig(
                bandwidth_gbps=worker.kv_transfer_bandwidth_gbps,
                kv_bytes_per_token=worker.kv_bytes_per_token or None,
                handoff="direct",
            )
    return engines, transfer, problems


def load_stack_config(path: str | Path) -> StackConfig:
    """Read and validate a stack YAML file (:func:`dynoplan.settings_text.load_file`, the one grammar of every
    settings file: a key given twice anywhere is refused). Raises ConfigError naming the file."""
    from dynoplan.settings_text import load_file

    p = Path(path)
    data = load_file(p, str(p), "stack file", "YAML (see examples/stack.yaml)")
    return stack_config_from_mapping(data or {}, p.resolve().parent, source=str(p))

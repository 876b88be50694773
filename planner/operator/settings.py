"""``OperatorSettings``: every knob of the operator process (the Helm values ``operator:`` mirror it).

Built from the environment (``DYNOPLAN_OPERATOR_<FIELD>``, upper case) or CLI flags; validated at
construction, all problems reported at once (:class:`~planner.operator.errors.SettingsError`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from planner.operator.errors import SettingsError

ENV_PREFIX = "DYNOPLAN_OPERATOR_"


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """Operator process settings. Units are in the names."""

    namespace: str = ""
    """Namespace watched (the Helm release namespace); "" = every namespace (needs a ClusterRole)."""
    reconcile_dgd: bool = True
    """Reconcile each DGD into Deployments + Services; False where a real Dynamo operator owns DGDs
    (the planner then only patches ``spec.services.<name>.replicas``)."""
    dgd_resync_s: float = 10.0
    """Period of the level-triggered DGD reconcile (children and status), seconds."""
    planner_min_sleep_s: float = 0.5
    """Shortest sleep between planner ticks, seconds (guards against a tight loop)."""
    planner_max_sleep_s: float = 5.0
    """Longest sleep between planner ticks, seconds (readiness and manual edits are seen this often)."""
    prometheus_url: str = "http://prometheus:9090"
    """Default Prometheus URL for planners whose spec has no ``metrics.prometheusUrl``."""
    prometheus_timeout_s: float = 5.0
    """HTTP timeout of one Prometheus query, seconds."""
    shared_gpu_budget: int = 0
    """Namespace-wide GPUs shared by every planner with ``budget.sharedBudget`` set (0 = off)."""
    worker_image: str = "dynoplan:latest"
    """Image of DGD service Deployments whose spec names no image."""
    planner_defaults_file: str = ""
    """YAML of PlannerConfig defaults (the Helm values ``planner:``); a DynoPlanner spec overrides them."""
    standalone: bool = False
    """Run without kopf peering (single replica, no KopfPeering resource)."""
    peering_name: str = "dynoplan"
    """kopf peering (namespaced KopfPeering) name for HA: one active operator per peering."""
    peering_priority: int = 0
    """This replica's kopf peering priority: the live peer with the highest priority is active, the others
    pause until it is gone. 0 = derived from the host name (the Pod name), so replicas differ: kopf pauses
    *every* operator when two peers have the same priority."""
    health_port: int = 8080
    """Port of the liveness/readiness endpoint ``/healthz`` (0 = off)."""
    metrics_port: int = 9100
    """Port of the Prometheus ``/metrics`` endpoint (0 = off)."""
    dashboard_port: int = 8090
    """Port of the live dashboard (the page ``dynoplan up`` serves, one per DynoPlanner: ``/?planner=ns/name``;
    0 = off)."""
    log_format: str = "json"
    """``json`` (structured) or ``plain``."""

    def __post_init__(self) -> None:
        p: list[str] = []
        for n in ("dgd_resync_s", "planner_min_sleep_s", "planner_max_sleep_s", "prometheus_timeout_s"):
            v = getattr(self, n)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
                p.append(f"{n}={v!r}: expected seconds > 0")
        if (not p) and self.planner_min_sleep_s > self.planner_max_sleep_s:
            p.append(f"planner_min_sleep_s={self.planner_min_sleep_s!r}: expected <= planner_max_sleep_s")
        for n in ("health_port", "metrics_port", "dashboard_port"):
            v = getattr(self, n)
            if not (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 65535):
                p.append(f"{n}={v!r}: expected a port 0..65535")
        if not (isinstance(self.peering_priority, int) and not isinstance(self.peering_priority, bool)
                and 0 <= self.peering_priority < 2**31):
            p.append(f"peering_priority={self.peering_priority!r}: expected an integer 0..2147483647 (0 = from the host name)")
        if not (isinstance(self.shared_gpu_budget, int) and self.shared_gpu_budget >= 0):
            p.append(f"shared_gpu_budget={self.shared_gpu_budget!r}: expected an integer >= 0")
        if self.log_format not in ("json", "plain"):
            p.append(f"log_format={self.log_format!r}: expected json or plain")
        if not self.prometheus_url.startswith(("http://", "https://")):
            p.append(f"prometheus_url={self.prometheus_url!r}: expected an http(s) URL")
        if p:
            raise SettingsError(p)


def effective_peering_priority(settings: OperatorSettings, host: str | None = None) -> int:
    """``settings.peering_priority``, or when 0 a stable value in 1..2**31-1 from ``host`` (default: the
    host name, which is the Pod name in Kubernetes): SHA-256 of the name, first 4 bytes, top bit cleared."""
    if settings.peering_priority:
        return settings.peering_priority
    import hashlib
    import socket

    name = host if host is not None else socket.gethostname()
    return max(1, int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") & 0x7FFFFFFF)


def settings_from_mapping(data: Mapping[str, Any]) -> OperatorSettings:
    """Settings from plain data (strings parsed as the field type). Raises SettingsError naming each
    unknown key or unparsable value."""
    problems: list[str] = []
    kw: dict[str, Any] = {}
    types = {f.name: f.type for f in fields(OperatorSettings)}
    for key, raw in data.items():
        k = key.replace("-", "_")
        if k not in types:
            problems.append(f"{k}: unknown operator setting (expected one of {', '.join(types)})")
            continue
        tp = types[k]
        try:
            if tp in (bool, "bool"):
                if isinstance(raw, bool):
                    kw[k] = raw
                elif str(raw).lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                    kw[k] = str(raw).lower() in ("true", "1", "yes", "on")
                else:
                    raise ValueError
            elif tp in (int, "int"):
                kw[k] = int(raw)
            elif tp in (float, "float"):
                kw[k] = float(raw)
            else:
                kw[k] = str(raw)
        except (TypeError, ValueError):
            problems.append(f"{k}={raw!r}: expected a {tp if isinstance(tp, str) else tp.__name__}")
    if problems:
        raise SettingsError(problems)
    try:
        return OperatorSettings(**kw)
    except SettingsError as e:
        raise SettingsError(problems + e.problems) from None


def settings_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> OperatorSettings:
    """Settings from ``DYNOPLAN_OPERATOR_<FIELD>`` variables, then ``overrides`` (e.g. CLI flags)."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    for f in fields(OperatorSettings):
        v = env.get(ENV_PREFIX + f.name.upper())
        if v is not None:
            data[f.name] = v
    data.update({k: v for k, v in overrides.items() if v is not None})
    return settings_from_mapping(data)


def field_names() -> list[str]:
    """Names of every setting (the Helm values ``operator:`` keys, camelCased)."""
    return [f.name for f in dataclasses.fields(OperatorSettings)]

"""``OperatorSettings``: every knob of the operator process (the Helm values ``operator:`` mirror it).

Built from the environment (``DYNOPLAN_OPERATOR_<FIELD>``, upper case) or CLI flags; validated at
construction, all problems reported at once (:class:`~dynoplan.errors.SettingsError`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from dynoplan.errors import ConfigError, SettingsError
from dynoplan.fields import HttpUrl
from dynoplan.settings import Problems, build, settings

ENV_PREFIX = "DYNOPLAN_OPERATOR_"


@settings
class OperatorSettings:
    """Operator process settings. Units are in the names; each field's default and bound are in its ``Field``.

    Direct construction raises pydantic's ``ValidationError``; :func:`settings_from_mapping` and
    :func:`settings_from_env` raise :class:`~dynoplan.errors.SettingsError` with every problem."""

    namespace: str = Field(
        default="",
        description='Namespace watched (the Helm release namespace); "" (the default) = '
        "every namespace (needs a ClusterRole).",
    )
    reconcile_dgd: bool = Field(
        default=True,
        description="Reconcile each DGD into Deployments + Services (default true); "
        "false where a real Dynamo operator owns DGDs (the planner then "
        "only patches spec.services.<name>.replicas).",
    )
    dgd_resync_s: float = Field(
        default=10.0,
        gt=0,
        description="Period of the level-triggered DGD reconcile (children and status), seconds > 0 (default 10).",
    )
    planner_min_sleep_s: float = Field(
        default=0.5,
        gt=0,
        description="Shortest sleep between planner ticks, seconds > 0 "
        "(default 0.5; guards against a tight loop); <= "
        "planner_max_sleep_s.",
    )
    planner_max_sleep_s: float = Field(
        default=5.0,
        gt=0,
        description="Longest sleep between planner ticks, seconds > 0 "
        "(default 5; readiness and manual edits are seen this "
        "often).",
    )
    prometheus_url: HttpUrl = Field(
        default="http://prometheus:9090",
        description=(
            "Default Prometheus URL (http:// or https://) for planners whose spec has no metrics.prometheusUrl "
            "(default http://prometheus:9090)."
        ),
    )
    prometheus_timeout_s: float = Field(
        default=5.0, gt=0, description="HTTP timeout of one Prometheus query, seconds > 0 (default 5)."
    )
    shared_gpu_budget: int = Field(
        default=0,
        ge=0,
        description="Namespace-wide GPUs shared by every planner with "
        "budget.sharedBudget set, >= 0 (0, the default, = off).",
    )
    worker_image: str = Field(
        default="dynoplan:latest",
        description="Image of DGD service Deployments whose spec names no image (default dynoplan:latest).",
    )
    planner_defaults_file: str = Field(
        default="",
        description="YAML of PlannerConfig defaults (the Helm values planner:); "
        'a DynoPlanner spec overrides them. "" (the default) = '
        "the planner's own defaults.",
    )
    standalone: bool = Field(
        default=False, description="Run without kopf peering (single replica, no KopfPeering resource); default false."
    )
    peering_name: str = Field(
        default="dynoplan",
        description="kopf peering (namespaced KopfPeering) name for HA: one "
        "active operator per peering (default dynoplan).",
    )
    peering_priority: int = Field(
        default=0,
        ge=0,
        le=2**31 - 1,
        description=(
            "This replica's kopf peering priority, 0..2147483647: the live peer with the highest priority is active, "
            "the others pause until it is gone. 0 (the default) = derived from the host name (the Pod name), so "
            "replicas differ: kopf pauses every operator when two peers have the same priority."
        ),
    )
    health_port: int = Field(
        default=8080,
        ge=0,
        le=65535,
        description="Port of the liveness/readiness endpoint /healthz, 0..65535 (default 8080; 0 = off).",
    )
    metrics_port: int = Field(
        default=9100,
        ge=0,
        le=65535,
        description="Port of the Prometheus /metrics endpoint, 0..65535 (default 9100; 0 = off).",
    )
    dashboard_port: int = Field(
        default=8090,
        ge=0,
        le=65535,
        description=(
            "Port of the live dashboard (the page dynoplan up serves, one per DynoPlanner: /?planner=ns/name), "
            "0..65535 (default 8090; 0 = off)."
        ),
    )
    log_format: Literal["json", "plain"] = Field(default="json", description="json (structured, the default) or plain.")

    def __post_init__(self) -> None:
        """The cross-field check; raises :class:`~dynoplan.settings.Problems`."""
        if self.planner_min_sleep_s > self.planner_max_sleep_s:
            raise Problems(
                f"planner_min_sleep_s={self.planner_min_sleep_s!r}: expected <= planner_max_sleep_s="
                f"{self.planner_max_sleep_s!r}"
            )


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
    """Settings from plain data; keys are field names (``-`` read as ``_``). A string given for a setting that
    is not text (environment variables, CLI flags) is read by :func:`dynoplan.settings_text.text_value`, the
    grammar of every settings file, then validated as strictly (``"false"`` -> False, ``"16"`` -> 16, while
    ``"yes"``, ``"1"`` for a boolean and ``"1e3"`` for a port are refused as in a file). Raises SettingsError
    naming each unknown key (with the closest setting name) and each invalid value, all at once."""
    from dynoplan.settings_text import field_kinds, text_value

    kinds = field_kinds(OperatorSettings)
    kw: dict[str, Any] = {}
    for key, raw in data.items():
        k = str(key).replace("-", "_")
        kw[k] = text_value(raw, kinds.get(k, "")) if isinstance(raw, str) else raw
    try:
        return build(OperatorSettings, kw)
    except ConfigError as e:
        raise SettingsError(e.problems) from None


def settings_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> OperatorSettings:
    """Settings from ``DYNOPLAN_OPERATOR_<FIELD>`` variables, then ``overrides`` (e.g. CLI flags). Raises
    SettingsError: a variable whose bytes are not UTF-8 (naming it), and as :func:`settings_from_mapping`."""
    from dynoplan.settings_text import check_utf8

    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    for f in dataclasses.fields(OperatorSettings):
        v = env.get(ENV_PREFIX + f.name.upper())
        if v is not None:
            try:
                check_utf8(v, ENV_PREFIX + f.name.upper())
            except ConfigError as e:
                raise SettingsError(e.problems) from None
            data[f.name] = v
    data.update({k: v for k, v in overrides.items() if v is not None})
    return settings_from_mapping(data)


# Variables Kubernetes itself puts into every container for each Service of the namespace (the API's
# enableServiceLinks, on by default): <NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT[_<PORT NAME>] and the Docker-link
# style <NAME>_PORT[_<N>_<PROTO>[_ADDR|_PORT|_PROTO]]. A Service named dynoplan-operator gives
# DYNOPLAN_OPERATOR_SERVICE_HOST, DYNOPLAN_OPERATOR_PORT_8080_TCP, ...; they are not settings and never
# misspelled ones.
_SERVICE_LINK = re.compile(
    r"(?:SERVICE_HOST|SERVICE_PORT(?:_\w+)?|PORT(?:_\d+_(?:TCP|UDP|SCTP)(?:_ADDR|_PORT|_PROTO)?)?)"
)


def ignored_env_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """One warning line per ``DYNOPLAN_OPERATOR_*`` variable of ``env`` (default ``os.environ``) that names no
    setting, with the closest setting's variable when there is one (``DYNOPLAN_OPERATOR_NAMESPCE: not a
    setting, ignored; did you mean DYNOPLAN_OPERATOR_NAMESPACE?``). Not refused, because the prefix is also
    Kubernetes' own: the service-link variables of a Service named ``dynoplan-operator`` (``_SERVICE_HOST``,
    ``_PORT_<N>_TCP``, ...) are skipped here, and a variable nobody can tell from them must not stop the
    operator."""
    env = os.environ if env is None else env
    names = {ENV_PREFIX + f.upper() for f in field_names()}
    lines = []
    for var in sorted(env):
        rest = var.removeprefix(ENV_PREFIX)
        if rest == var or var in names or _SERVICE_LINK.fullmatch(rest):
            continue
        close = difflib.get_close_matches(rest, sorted(n.removeprefix(ENV_PREFIX) for n in names), n=1)
        hint = (
            f"; did you mean {ENV_PREFIX}{close[0]}?"
            if close
            else f" (settings: {ENV_PREFIX}<FIELD>, docs/operator.md)"
        )
        lines.append(f"{var}: not a setting, ignored{hint}")
    return lines


def field_names() -> list[str]:
    """Names of every setting (the Helm values ``operator:`` keys, camelCased)."""
    return [f.name for f in dataclasses.fields(OperatorSettings)]

"""``dynoplan operator``: run the Kubernetes operator (kopf) in the foreground.

Settings come from ``DYNOPLAN_OPERATOR_*`` environment variables (the Helm chart sets them) and these
flags (flags win); see :class:`planner.operator.settings.OperatorSettings`. The Kubernetes credentials
are the Pod's ServiceAccount in a cluster, else ``$KUBECONFIG``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from dynoplan.errors import ConfigError, SettingsError
from mocker.arguments import nonneg_int, positive_seconds


def _as_typed(check: Callable[[str], Any]) -> Callable[[str], str]:
    """argparse type: ``check`` the text (a shared flag type, its one-line refusal), keep it as written;
    the settings read it as they read an environment variable, and :func:`_settings` names the flag with
    that text when they refuse it."""

    def typed(text: str) -> str:
        check(text)
        return text

    typed.__name__ = check.__name__
    return typed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", help="namespace to watch (default: $DYNOPLAN_OPERATOR_NAMESPACE; '' = all)")
    p.add_argument(
        "--reconcile-dgd",
        choices=("true", "false"),
        default=None,
        help="reconcile DGDs into Deployments/Services (default true)",
    )
    p.add_argument("--prometheus-url", help="default Prometheus URL for planners")
    p.add_argument("--shared-gpu-budget", type=_as_typed(nonneg_int), help="namespace-wide shared GPU budget (0 = off)")
    p.add_argument("--planner-defaults-file", help="YAML of planner setting defaults")
    p.add_argument("--worker-image", help="image for DGD services that name none")
    p.add_argument(
        "--standalone", action="store_const", const="true", default=None, help="no kopf peering (single replica)"
    )
    p.add_argument("--peering-name", help="kopf peering name (HA)")
    p.add_argument(
        "--peering-priority",
        type=_as_typed(nonneg_int),
        help="kopf peering priority; the highest live peer is active (default 0 = from the host name)",
    )
    port = _as_typed(nonneg_int)
    p.add_argument("--health-port", type=port, help="liveness/readiness port (/healthz; 0 = off)")
    p.add_argument("--metrics-port", type=port, help="Prometheus /metrics port (0 = off)")
    p.add_argument("--dashboard-port", type=port, help="live dashboard port (/?planner=ns/name; 0 = off)")
    p.add_argument("--dgd-resync-s", type=_as_typed(positive_seconds), help="DGD reconcile period, s")
    seconds = _as_typed(positive_seconds)
    p.add_argument("--planner-max-sleep-s", type=seconds, help="longest sleep between planner steps, s")
    p.add_argument("--log-format", choices=("json", "plain"), default=None)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    keys = (
        "namespace",
        "reconcile_dgd",
        "prometheus_url",
        "shared_gpu_budget",
        "planner_defaults_file",
        "worker_image",
        "standalone",
        "peering_name",
        "peering_priority",
        "health_port",
        "metrics_port",
        "dashboard_port",
        "dgd_resync_s",
        "planner_max_sleep_s",
        "log_format",
    )
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def _settings(args: argparse.Namespace) -> Any:
    """The operator settings (environment, then flags). Raises ConfigError whose lines name each refused
    flag as typed (``--health-port=70000: expected <= 65535``); SettingsError when an environment variable
    is refused too."""
    from planner.operator.settings import settings_from_env

    flags = _overrides(args)
    try:
        return settings_from_env(None, **flags)
    except SettingsError as e:
        lines, all_flags = [], True
        for line in e.problems:
            name = line.partition("=")[0]
            if name in flags:
                lines.append(f"--{name.replace('_', '-')}={flags[name]}: {line.partition(': ')[2]}")
            else:
                lines.append(line)
                all_flags = False
        raise (ConfigError(lines) if all_flags else SettingsError(lines)) from None


def run(args: argparse.Namespace) -> int:
    import kopf
    import kubernetes
    from prometheus_client import CollectorRegistry, start_http_server

    from planner.core import PlannerConfig, load_config
    from planner.operator.handlers import build_registry
    from planner.operator.kube import Kube, load_client_configuration
    from planner.operator.loop import BudgetBook, LoopMetrics
    from planner.operator.settings import effective_peering_priority, ignored_env_variables

    s = _settings(args)
    defaults = load_config(s.planner_defaults_file) if s.planner_defaults_file else PlannerConfig()
    api = kubernetes.client.ApiClient(load_client_configuration())  # credentials first: a user error exits 2
    kopf.configure(log_format=kopf.LogFormat.JSON if s.log_format == "json" else kopf.LogFormat.FULL)
    logging.getLogger("dynoplan").setLevel(logging.INFO)
    for line in ignored_env_variables():
        logging.getLogger("dynoplan.operator").warning(line)
    registry = CollectorRegistry()
    loop_metrics = LoopMetrics()
    registry.register(loop_metrics)
    if s.metrics_port:
        start_http_server(s.metrics_port, registry=registry)
    memo = kopf.Memo(
        op_settings=s,
        kube=Kube(api),
        defaults=defaults,
        registry=registry,
        loop_metrics=loop_metrics,
        loops={},
        budget=BudgetBook(s.shared_gpu_budget) if s.shared_gpu_budget else None,
    )
    try:
        kopf.run(
            registry=build_registry(s),
            memo=memo,
            standalone=s.standalone,
            # kopf makes peering mandatory whenever a name is given (pausing without the CRD).
            peering_name=None if s.standalone else s.peering_name,
            priority=effective_peering_priority(s),
            namespaces=[s.namespace] if s.namespace else (),
            clusterwide=not s.namespace,
            liveness_endpoint=f"http://0.0.0.0:{s.health_port}/healthz" if s.health_port else None,
        )  # kopf handles SIGINT/SIGTERM itself
    finally:
        api.close()
    return 0

"""``dynoplan operator``: run the Kubernetes operator (kopf) in the foreground.

Settings come from ``DYNOPLAN_OPERATOR_*`` environment variables (the Helm chart sets them) and these
flags (flags win); see :class:`planner.operator.settings.OperatorSettings`. The Kubernetes credentials
are the Pod's ServiceAccount in a cluster, else ``$KUBECONFIG``.
"""

from __future__ import annotations

import argparse
import logging


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--namespace", help="namespace to watch (default: $DYNOPLAN_OPERATOR_NAMESPACE; '' = all)")
    p.add_argument(
        "--reconcile-dgd",
        choices=("true", "false"),
        default=None,
        help="reconcile DGDs into Deployments/Services (default true)",
    )
    p.add_argument("--prometheus-url", help="default Prometheus URL for planners")
    p.add_argument("--shared-gpu-budget", type=int, help="namespace-wide shared GPU budget (0 = off)")
    p.add_argument("--planner-defaults-file", help="YAML of planner setting defaults")
    p.add_argument("--worker-image", help="image for DGD services that name none")
    p.add_argument(
        "--standalone", action="store_const", const="true", default=None, help="no kopf peering (single replica)"
    )
    p.add_argument("--peering-name", help="kopf peering name (HA)")
    p.add_argument(
        "--peering-priority",
        type=int,
        help="kopf peering priority; the highest live peer is active (default 0 = from the host name)",
    )
    p.add_argument("--health-port", type=int, help="liveness/readiness port (/healthz; 0 = off)")
    p.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (0 = off)")
    p.add_argument("--dashboard-port", type=int, help="live dashboard port (/?planner=ns/name; 0 = off)")
    p.add_argument("--dgd-resync-s", type=float, help="DGD reconcile period, s")
    p.add_argument("--planner-max-sleep-s", type=float, help="longest sleep between planner steps, s")
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


def run(args: argparse.Namespace) -> int:
    import kopf
    import kubernetes
    from prometheus_client import CollectorRegistry, start_http_server

    from planner.core import PlannerConfig, load_config
    from planner.operator.handlers import build_registry
    from planner.operator.kube import Kube, load_client_configuration
    from planner.operator.loop import BudgetBook, LoopMetrics
    from planner.operator.settings import effective_peering_priority, settings_from_env

    s = settings_from_env(None, **_overrides(args))
    defaults = load_config(s.planner_defaults_file) if s.planner_defaults_file else PlannerConfig()
    api = kubernetes.client.ApiClient(load_client_configuration())  # credentials first: a user error exits 2
    kopf.configure(log_format=kopf.LogFormat.JSON if s.log_format == "json" else kopf.LogFormat.FULL)
    logging.getLogger("dynoplan").setLevel(logging.INFO)
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

"""kopf handlers, registered on a fresh ``kopf.OperatorRegistry`` by :func:`build_registry` (no import-time
side effects, no module globals). Handlers only translate: parse the body, call the pure reconcile
functions (:mod:`~planner.operator.reconcile`) or one planner step (:mod:`~planner.operator.loop`), and
write the result through :mod:`~planner.operator.kube`. Dependencies come from ``kopf.Memo``:

- ``memo.op_settings``: :class:`~planner.operator.settings.OperatorSettings`
- ``memo.kube``: :class:`~planner.operator.kube.Kube`
- ``memo.defaults``: the planner defaults (``PlannerConfig``)
- ``memo.registry``: the ``prometheus_client.CollectorRegistry`` served on ``/metrics``
- ``memo.loop_metrics``: :class:`~planner.operator.loop.LoopMetrics` (registered on ``memo.registry``)
- ``memo.budget``: the shared :class:`~planner.operator.loop.BudgetBook` (or None)
- ``memo.loops``: the running :class:`~planner.operator.loop.PlannerLoop` per (namespace, name) (the probe
  and the live dashboard, :mod:`~planner.operator.dashboard`, on ``dashboard_port``)

An invalid DGD becomes a ``Ready=False`` / ``InvalidSpec`` condition (no retry loop); API errors are
kopf temporary errors (retried with back-off).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
import urllib3
from kubernetes.client.rest import ApiException
from prometheus_client import Counter

from dynoplan.errors import SpecError
from planner.operator.kube import Gone, now_iso
from planner.operator.loop import PlannerLoop
from planner.operator.reconcile import (
    LABEL_DGD,
    LABEL_SERVICE,
    child_actions,
    desired_children,
    dgd_status,
    reconcile_problems,
    set_condition,
)
from planner.operator.settings import OperatorSettings
from planner.operator.spec import DGD_GROUP, DGD_PLURAL, DGD_VERSION, DPL_GROUP, DPL_PLURAL, DPL_VERSION, parse_dgd
from planner.sources.prometheus import PrometheusSourceSettings, PrometheusTrafficSource

log = logging.getLogger("dynoplan.operator")


async def reconcile_dgd(body: Any, memo: Any) -> dict[str, Any] | None:
    """Level-triggered DGD reconcile: apply/delete children, then patch the status when it changed.
    Returns the status written (None when unchanged)."""
    kube = memo.kube
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    prev = dict(body.get("status") or {})
    try:
        dgd = parse_dgd(body)
        problems = reconcile_problems(dgd, memo.op_settings.worker_image)
        if problems:
            raise SpecError(f"DynamoGraphDeployment {ns}/{name}", problems)
    except SpecError as e:
        status = {
            "state": "failed",
            "conditions": set_condition(
                prev.get("conditions"), "Ready", "False", "InvalidSpec", str(e), now_iso(), meta.get("generation")
            ),
        }
        if _differs(prev, status):
            await kube.patch_dgd_status(ns, name, status)
            await kube.event(body, "Warning", "InvalidSpec", str(e))
            return status
        return None
    desired = desired_children(dgd, memo.op_settings.worker_image)
    observed = await kube.list_children(ns, f"{LABEL_DGD}={name}")
    for act in child_actions(desired, observed):
        if act.verb == "apply":
            await kube.apply(act.body)
        else:
            await kube.delete(act.kind, ns, act.name)
        memo.reconciles.labels(kind="DynamoGraphDeployment", action=f"{act.verb}_{act.kind}").inc()
    deployments = {
        o["metadata"]["labels"][LABEL_SERVICE]: o
        for o in (await kube.list_children(ns, f"{LABEL_DGD}={name}") if desired else [])
        if o["kind"] == "Deployment" and (o["metadata"].get("labels") or {}).get(LABEL_SERVICE)
    }
    status = dgd_status(dgd, deployments, prev, now_iso())
    if _differs(prev, status):
        await kube.patch_dgd_status(ns, name, status)
        return status
    return None


async def _guarded_reconcile(body: Any, memo: Any) -> None:
    """reconcile_dgd with API and connection errors as kopf temporary errors (retried in 2 s)."""
    try:
        await reconcile_dgd(body, memo)
    except Gone:
        return
    except ApiException as e:
        raise kopf.TemporaryError(_api_error(e), delay=2) from None
    except (urllib3.exceptions.HTTPError, OSError) as e:  # apiserver down or restarting
        raise kopf.TemporaryError(f"API unreachable: {type(e).__name__}", delay=2) from None


def _api_error(e: ApiException) -> str:
    """One line from an API error: status, reason and the server's message."""
    import json

    try:
        msg = json.loads(e.body or "{}").get("message", "")
    except ValueError:
        msg = ""
    return f"API error {e.status} {e.reason}: {msg}".strip()


def _differs(prev: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(prev.get(k) != v for k, v in new.items())


def build_registry(settings: OperatorSettings) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers (the DGD reconciler only when ``reconcile_dgd``)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def startup(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING  # kopf's own Events only for problems
        settings.watching.connect_timeout = 5.0
        settings.watching.server_timeout = 60  # int: the apiserver rejects "60.0"
        settings.watching.client_timeout = 70.0
        settings.networking.request_timeout = 30.0
        settings.persistence.finalizer = "dynoplan.dev/finalizer"
        # A deleted DGD keeps kopf's finalizer until its resync timer (and a DynoPlanner until its daemon)
        # has exited. A timer caught mid-reconcile is re-checked only after `cancellation_polling` (kopf's
        # default 60 s): deletions then hung for a minute. Re-check every second instead.
        settings.background.cancellation_polling = 1.0
        settings.background.instant_exit_timeout = 0.1
        # No cluster-wide CRD/namespace scanning: the watched namespace and resources are fixed, so the
        # operator needs no cluster-scoped RBAC (kopf scans only for dynamic discovery).
        settings.scanning.disabled = bool(memo.op_settings.namespace)
        memo.reconciles = Counter(
            "dynoplan_operator_reconciles", "Reconcile actions taken", ["kind", "action"], registry=memo.registry
        )
        memo.dashboard = None
        if memo.op_settings.dashboard_port:
            from planner.operator import dashboard

            try:
                memo.dashboard = await dashboard.start(memo.loops, memo.op_settings.dashboard_port)
            except OSError as e:  # the page is an aid: a busy port must not stop the operator
                log.error("live dashboard not served: port %s: %s", memo.op_settings.dashboard_port, e)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "dashboard", None) is not None:
            await memo.dashboard.cleanup()
            memo.dashboard = None

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        # In a Pod: the mounted ServiceAccount token; elsewhere: $KUBECONFIG (same as kube.py).
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.probe(id="planners", registry=registry)
    def probe_planners(memo: kopf.Memo, **_: Any) -> int:
        return len(memo.loops)

    if settings.reconcile_dgd:

        @kopf.on.event(DGD_GROUP, DGD_VERSION, DGD_PLURAL, registry=registry)
        async def dgd_event(type: str, body: Any, memo: kopf.Memo, **_: Any) -> None:  # noqa: A002
            if type == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
                return
            await _guarded_reconcile(body, memo)

        @kopf.timer(DGD_GROUP, DGD_VERSION, DGD_PLURAL, interval=settings.dgd_resync_s, registry=registry)
        async def dgd_resync(body: Any, memo: kopf.Memo, **_: Any) -> None:
            await _guarded_reconcile(body, memo)

    @kopf.daemon(DPL_GROUP, DPL_VERSION, DPL_PLURAL, cancellation_timeout=10.0, registry=registry)
    async def planner_daemon(body: Any, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
        s: OperatorSettings = memo.op_settings
        key = (body["metadata"]["namespace"], body["metadata"]["name"])

        def traffic(plan: Any) -> PrometheusTrafficSource:
            return PrometheusTrafficSource(
                PrometheusSourceSettings(
                    url=plan.prometheus_url or s.prometheus_url,
                    model=plan.model,
                    namespace=plan.metrics_namespace,
                    timeout_s=s.prometheus_timeout_s,
                )
            )

        loop = PlannerLoop(
            body,
            memo.kube,
            defaults=memo.defaults,
            traffic_factory=traffic,
            metrics_registry=memo.loop_metrics,
            budget=memo.budget,
            min_sleep_s=s.planner_min_sleep_s,
            max_sleep_s=s.planner_max_sleep_s,
        )
        memo.loops[key] = loop
        log.info("planner started", extra={"planner": key[1], "namespace": key[0]})
        try:
            await loop.run(stopped)
        finally:
            await loop.close()
            memo.loops.pop(key, None)
            memo.loop_metrics.registries.pop(key, None)
            if memo.budget is not None:
                for k in [k for k in memo.budget.entries if k[0] == key[0] and k[2] == key[1]]:
                    memo.budget.forget(k)
            log.info("planner stopped", extra={"planner": key[1], "namespace": key[0]})

    return registry

"""The operator's only Kubernetes API client (the ``kubernetes`` package, calls run in a thread).

Every method is async (``asyncio.to_thread`` around the synchronous client), returns plain dicts and
maps "not found" to ``None`` / :class:`Gone`, a 409 to :class:`Conflict`; other API errors propagate as
``kubernetes.client.ApiException`` (the handlers map them to kopf temporary errors).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from dynoplan.errors import OperatorError
from planner.operator.spec import DGD_GROUP, DGD_PLURAL, DGD_VERSION, DPL_GROUP, DPL_PLURAL, DPL_VERSION

MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
FIELD_MANAGER = "dynoplan-operator"
REQUEST_TIMEOUT_S = (5.0, 15.0)
"""(connect, read) timeout of every API call, seconds: a call on a dead connection fails instead of
holding one of the event loop's worker threads forever."""


class Conflict(OperatorError):
    """409: the object changed since it was read (optimistic concurrency); re-read and re-plan."""


class Gone(OperatorError):
    """404: the object no longer exists."""


def now_iso() -> str:
    """UTC now, RFC 3339 with seconds (for conditions and events)."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def load_client_configuration() -> kubernetes.client.Configuration:
    """In-cluster ServiceAccount config when running in a Pod, else ``$KUBECONFIG`` / ``~/.kube/config``."""
    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    except kubernetes.config.ConfigException:
        try:
            kubernetes.config.load_kube_config(client_configuration=cfg)
        except (kubernetes.config.ConfigException, OSError) as e:
            raise OperatorError(f"no Kubernetes credentials: not in a Pod and no usable kubeconfig ({e})") from None
    return cfg


class Kube:
    """Typed calls the operator makes; one ``ApiClient`` shared by them (pass it in, close it after)."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api
        self.co = kubernetes.client.CustomObjectsApi(api)
        self.apps = kubernetes.client.AppsV1Api(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.discovery = kubernetes.client.DiscoveryV1Api(api)

    @staticmethod
    async def _call(fn: Any, *args: Any, **kw: Any) -> Any:
        kw.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except ApiException as e:
            if e.status == 404:
                raise Gone(f"{getattr(fn, '__name__', fn)}: not found") from None
            if e.status == 409:
                raise Conflict(f"{getattr(fn, '__name__', fn)}: conflict: {e.reason}") from None
            raise

    # ------------------------------------------------------------------ DGD
    async def get_dgd(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The DGD body, or None when it does not exist."""
        try:
            return await self._call(
                self.co.get_namespaced_custom_object, DGD_GROUP, DGD_VERSION, namespace, DGD_PLURAL, name
            )
        except Gone:
            return None

    async def patch_dgd(
        self, namespace: str, name: str, patch: Mapping[str, Any], resource_version: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch of the DGD spec; with ``resource_version`` the patch is conditional on it
        (the apiserver answers 409 -> :class:`Conflict` when someone changed the DGD meanwhile)."""
        body = dict(patch)
        if resource_version is not None:
            body["metadata"] = {**dict(body.get("metadata") or {}), "resourceVersion": resource_version}
        return await self._call(
            self.co.patch_namespaced_custom_object,
            DGD_GROUP,
            DGD_VERSION,
            namespace,
            DGD_PLURAL,
            name,
            body,
            _content_type=MERGE,
        )

    async def patch_dgd_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await self._call(
            self.co.patch_namespaced_custom_object_status,
            DGD_GROUP,
            DGD_VERSION,
            namespace,
            DGD_PLURAL,
            name,
            {"status": dict(status)},
            _content_type=MERGE,
        )

    # ------------------------------------------------------------------ DynoPlanner
    async def patch_planner_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        await self._call(
            self.co.patch_namespaced_custom_object_status,
            DPL_GROUP,
            DPL_VERSION,
            namespace,
            DPL_PLURAL,
            name,
            {"status": dict(status)},
            _content_type=MERGE,
        )

    # ------------------------------------------------------------------ children
    async def list_children(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Deployments and Services matching ``label_selector``, as plain dicts with kind set."""
        deps = await self._call(self.apps.list_namespaced_deployment, namespace, label_selector=label_selector)
        svcs = await self._call(self.core.list_namespaced_service, namespace, label_selector=label_selector)
        out: list[dict[str, Any]] = []
        for kind, items in (("Deployment", deps.items), ("Service", svcs.items)):
            for it in items:
                d = self.api.sanitize_for_serialization(it)
                d["kind"] = kind
                out.append(d)
        return out

    async def apply(self, body: Mapping[str, Any]) -> None:
        """Server-side apply a Deployment or Service (field manager ``dynoplan-operator``, forced)."""
        kind, ns, name = body["kind"], body["metadata"]["namespace"], body["metadata"]["name"]
        fn = {"Deployment": self.apps.patch_namespaced_deployment, "Service": self.core.patch_namespaced_service}[kind]
        await self._call(fn, name, ns, dict(body), field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        fn = {"Deployment": self.apps.delete_namespaced_deployment, "Service": self.core.delete_namespaced_service}[
            kind
        ]
        try:
            await self._call(fn, name, namespace)
        except Gone:
            pass

    async def list_endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """EndpointSlices of Service ``service`` (label ``kubernetes.io/service-name``), as plain dicts."""
        res = await self._call(
            self.discovery.list_namespaced_endpoint_slice,
            namespace,
            label_selector=f"kubernetes.io/service-name={service}",
        )
        return [self.api.sanitize_for_serialization(it) for it in res.items]

    # ------------------------------------------------------------------ events
    async def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``obj`` (a body with apiVersion, kind, metadata.name/namespace/uid)."""
        meta = obj["metadata"]
        ts = now_iso()
        ev = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
        }
        await self._call(self.core.create_namespaced_event, meta["namespace"], ev)

"""Pure, level-triggered reconcile functions: (desired, observed) -> actions / patches. No I/O.

- :func:`desired_children`: the Deployments and Services a DGD should own.
- :func:`child_actions`: which of them to apply or delete given what exists (idempotent: a child whose
  ``dynoplan.dev/spec-hash`` annotation matches is left alone).
- :func:`dgd_status`: the DGD status (per-service replicas, Ready condition, state) from its Deployments.
- :func:`replica_patch`: the JSON merge patch of ``spec.services.<name>.replicas`` for a decision.
- :func:`divide_budget`: a namespace-wide GPU budget divided by need, never exceeded.
- :func:`set_condition`: a condition list with one condition set (lastTransitionTime kept when unchanged).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planner.operator.spec import DGD_GROUP, DGD_KIND, DGD_VERSION, FPM_PORT_NAME, DgdSpec, ServiceSpec

LABEL_DGD = "dynoplan.dev/dgd"
LABEL_SERVICE = "dynoplan.dev/service"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGER = "dynoplan-operator"
HASH_ANNOTATION = "dynoplan.dev/spec-hash"
HTTP_PORT = 8000
"""Port every mocker role serves HTTP on inside its Pod (OpenAI API, /health, /ready, /metrics)."""
_FPM_FLAG = "--fpm-endpoint"


def fpm_port(args: Sequence[str]) -> int | None:
    """The TCP port of a ``--fpm-endpoint tcp://HOST:PORT`` (or ``--fpm-endpoint=...``) argument of a
    ``dynoplan mocker serve`` command line; None when absent, ``off``, not TCP or port 0 (any free port,
    which nothing outside the Pod could find)."""
    val = None
    for i, a in enumerate(args):
        if a == _FPM_FLAG and i + 1 < len(args):
            val = args[i + 1]
        elif a.startswith(_FPM_FLAG + "="):
            val = a.split("=", 1)[1]
    if not val or not val.startswith("tcp://"):
        return None
    port = val.rsplit(":", 1)[-1]
    return int(port) if port.isdigit() and 0 < int(port) <= 65535 else None


def child_name(dgd: str, service: str) -> str:
    """Deployment/Service name of DGD service ``service``: ``<dgd>-<service>`` lower-cased, '_' -> '-'."""
    return f"{dgd}-{service}".lower().replace("_", "-")[:63].rstrip("-")


def _owner(dgd: DgdSpec) -> dict[str, Any]:
    return {
        "apiVersion": f"{DGD_GROUP}/{DGD_VERSION}",
        "kind": DGD_KIND,
        "name": dgd.name,
        "uid": dgd.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def desired_children(dgd: DgdSpec, default_image: str) -> list[dict[str, Any]]:
    """Deployment + Service manifests for every non-planner service of ``dgd`` (sorted by service name).

    Each carries an owner reference to the DGD (garbage collection), the labels
    ``dynoplan.dev/dgd``/``dynoplan.dev/service`` and a spec hash annotation. Pods run non-root with a
    read-only root filesystem; readiness is the process's ``GET /ready`` on port 8000. The main container's
    ``lifecycle``, ``extraPodSpec.terminationGracePeriodSeconds`` and sidecar ``extraPodSpec.containers``
    are passed through (the chart's example drains workers with a preStop sleep). A service whose
    args publish FPM on a fixed TCP port (:func:`fpm_port`) also gets a container and Service port named
    ``fpm`` (the planner's load loop subscribes to it through the Service's EndpointSlices).
    """
    out: list[dict[str, Any]] = []
    for name in sorted(dgd.services):
        s = dgd.services[name]
        if s.component_type == "planner":  # the operator itself plans
            continue
        out.extend(_children_of(dgd, s, default_image))
    return out


def reconcile_problems(dgd: DgdSpec, default_image: str) -> list[str]:
    """What keeps the reconciler from running ``dgd``'s services (empty when none): a service that would
    run the operator's worker image (no image of its own, or that same image) with neither ``command`` nor
    ``args`` in ``extraPodSpec.mainContainer``. That image's entrypoint is ``dynoplan``, which needs a
    subcommand (``mocker serve``, ``frontend``): such a Pod would exit at once and crash-loop with empty
    logs. Services of componentType ``planner`` are not run (the operator plans)."""
    problems = []
    for name in sorted(dgd.services):
        s = dgd.services[name]
        if s.component_type == "planner" or s.command or s.args:
            continue
        if s.image is None or s.image == default_image:
            problems.append(
                f"spec.services.{name}.extraPodSpec.mainContainer: no command or args: expected the container's "
                f'command line, e.g. args: [mocker, serve, --port, "{HTTP_PORT}"] for a worker or [frontend, --port, '
                f'"{HTTP_PORT}", ...] (the image {s.image or default_image} runs `dynoplan`, which needs a subcommand)'
            )
    return problems


def _children_of(dgd: DgdSpec, s: ServiceSpec, default_image: str) -> list[dict[str, Any]]:
    cname = child_name(dgd.name, s.name)
    labels = {LABEL_DGD: dgd.name, LABEL_SERVICE: s.name, LABEL_MANAGED: MANAGER}
    selector = {LABEL_DGD: dgd.name, LABEL_SERVICE: s.name}
    env = [{"name": k, "value": v} for k, v in dict(dgd.envs + s.envs).items()]
    container: dict[str, Any] = {
        "name": "main",
        "image": s.image or default_image,
        "imagePullPolicy": s.image_pull_policy or "IfNotPresent",
        "ports": [{"name": "http", "containerPort": HTTP_PORT}],
        "env": env,
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if s.command:
        container["command"] = list(s.command)
    if s.args:
        container["args"] = list(s.args)
    fport = fpm_port(s.args)
    if fport is not None:
        container["ports"].append({"name": FPM_PORT_NAME, "containerPort": fport})
    if s.resources:
        container["resources"] = {k: dict(v) for k, v in s.resources.items() if k in ("requests", "limits") and v}
    if s.lifecycle:
        container["lifecycle"] = dict(s.lifecycle)
    pod_spec: dict[str, Any] = {
        "containers": [container, *(dict(c) for c in s.sidecars)],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if s.termination_grace_period_s is not None:
        pod_spec["terminationGracePeriodSeconds"] = int(s.termination_grace_period_s)
    container["volumeMounts"] = [{"name": "tmp", "mountPath": "/tmp"}]
    dep_spec = {
        "replicas": 1 if s.replicas is None else int(s.replicas),
        "selector": {"matchLabels": selector},
        "template": {
            "metadata": {
                "labels": labels,
                "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(HTTP_PORT)},
            },
            "spec": pod_spec,
        },
    }
    ports: list[dict[str, str | int]] = [{"name": "http", "port": HTTP_PORT, "targetPort": "http"}]
    svc_spec = {"selector": selector, "ports": ports}
    if fport is not None:
        ports.append({"name": FPM_PORT_NAME, "port": fport, "targetPort": FPM_PORT_NAME})
    meta = {"name": cname, "namespace": dgd.namespace, "labels": labels, "ownerReferences": [_owner(dgd)]}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "annotations": {HASH_ANNOTATION: _hash(dep_spec)}},
            "spec": dep_spec,
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {**meta, "annotations": {HASH_ANNOTATION: _hash(svc_spec)}},
            "spec": svc_spec,
        },
    ]


@dataclass(frozen=True, slots=True)
class ChildAction:
    """``verb`` is ``apply`` (server-side apply ``body``) or ``delete`` (``kind``/``name``)."""

    verb: str
    kind: str
    name: str
    body: Mapping[str, Any] | None = None


def child_actions(desired: Sequence[Mapping[str, Any]], observed: Sequence[Mapping[str, Any]]) -> list[ChildAction]:
    """Actions that make ``observed`` (the DGD's existing children, found by label) equal ``desired``.

    Idempotent: a child that exists with the same spec-hash annotation yields no action; children labelled
    for the DGD but no longer desired are deleted. Order: applies (desired order), then deletes.
    """
    seen = {
        (o["kind"], o["metadata"]["name"]): ((o["metadata"].get("annotations") or {}).get(HASH_ANNOTATION))
        for o in observed
    }
    want = {(d["kind"], d["metadata"]["name"]) for d in desired}
    acts = [
        ChildAction("apply", d["kind"], d["metadata"]["name"], d)
        for d in desired
        if seen.get((d["kind"], d["metadata"]["name"])) != d["metadata"]["annotations"][HASH_ANNOTATION]
    ]
    acts += [ChildAction("delete", k, n) for (k, n) in sorted(seen) if (k, n) not in want]
    return acts


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: str,
    reason: str,
    message: str,
    now_iso: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """``conditions`` with ``type_`` set; lastTransitionTime changes only when the status changes."""
    out = [dict(c) for c in (conditions or []) if c.get("type") != type_]
    prev = next((c for c in (conditions or []) if c.get("type") == type_), None)
    ltt = (
        prev.get("lastTransitionTime")
        if prev and prev.get("status") == status and prev.get("lastTransitionTime")
        else now_iso
    )
    c: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": ltt,
    }
    if generation is not None:
        c["observedGeneration"] = generation
    out.append(c)
    return sorted(out, key=lambda x: x["type"])


def dgd_status(
    dgd: DgdSpec, deployments: Mapping[str, Mapping[str, Any]], previous: Mapping[str, Any] | None, now_iso: str
) -> dict[str, Any]:
    """The DGD status from its Deployments (``deployments``: service name -> Deployment body or absent).

    ``services.<name>``: spec replicas of the DGD, and updated/ready/available replicas of the Deployment
    status (0 when absent). Ready is True when every planned service has ready == spec replicas; state
    ``successful`` then, else ``pending``.
    """
    services: dict[str, dict[str, int]] = {}
    not_ready: list[str] = []
    for name, s in sorted(dgd.services.items()):
        if s.component_type == "planner":
            continue
        want = 1 if s.replicas is None else int(s.replicas)
        st = (deployments.get(name) or {}).get("status") or {}
        ready = int(st.get("readyReplicas") or 0)
        services[name] = {
            "replicas": want,
            "updatedReplicas": int(st.get("updatedReplicas") or 0),
            "readyReplicas": ready,
            "availableReplicas": int(st.get("availableReplicas") or 0),
        }
        if ready != want or name not in deployments:
            not_ready.append(f"{name} {ready}/{want}")
    ok = not not_ready
    conds = set_condition(
        (previous or {}).get("conditions"),
        "Ready",
        "True" if ok else "False",
        "AllServicesReady" if ok else "ServicesNotReady",
        "every service has its replicas ready" if ok else "not ready: " + ", ".join(not_ready),
        now_iso,
        dgd.generation,
    )
    return {
        "state": "successful" if ok else "pending",
        "observedGeneration": dgd.generation,
        "services": services,
        "conditions": conds,
    }


def replica_patch(
    services: Mapping[str, str], current: Mapping[str, int], targets: Mapping[str, int]
) -> dict[str, Any] | None:
    """JSON merge patch ``{"spec": {"services": {<svc>: {"replicas": n}}}}`` for pools whose target
    differs from the current spec (``services``: pool -> DGD service name); None when nothing changes."""
    changed = {
        services[p]: {"replicas": int(n)}
        for p, n in sorted(targets.items())
        if p in services and current.get(p) != int(n)
    }
    return {"spec": {"services": changed}} if changed else None


def divide_budget(
    total_gpus: int, needs: Mapping[str, int], minimums: Mapping[str, int], current: Mapping[str, int]
) -> dict[str, int]:
    """Divide a shared GPU budget among planners, by need, never exceeding ``total_gpus``.

    Args:
        total_gpus: GPUs shared by the planners (>= 0).
        needs: planner -> GPUs it would use unconstrained (its throughput/load requirement).
        minimums: planner -> GPUs its min replicas occupy (always granted first, if they fit).
        current: planner -> GPUs its DGD spec occupies now.

    Returns planner -> GPU cap. Each gets its minimum, then the rest is split in proportion to
    ``need - minimum`` (largest remainder, ties by name), never more than it needs. Then, so the total
    is never exceeded even while others have not yet scaled down, each cap is clipped to
    ``total - sum(max(current, cap) of the others)`` (but not below its current use when that fits).
    Invariant: ``sum(max(current_i, cap_i)) <= total`` whenever ``sum(current) <= total``.
    """
    names = sorted(needs)
    mins = {n: max(0, int(minimums.get(n, 0))) for n in names}
    alloc = dict(mins)
    rest = total_gpus - sum(mins.values())
    extra = {n: max(0, int(needs[n]) - mins[n]) for n in names}
    want = sum(extra.values())
    if rest > 0 and want > 0:
        if want <= rest:
            for n in names:
                alloc[n] += extra[n]
        else:
            shares = {n: rest * extra[n] / want for n in names}
            floor = {n: math.floor(shares[n]) for n in names}
            left = rest - sum(floor.values())
            for n in sorted(names, key=lambda n: (-(shares[n] - floor[n]), n))[:left]:
                floor[n] += 1
            for n in names:
                alloc[n] += floor[n]
    # Headroom clip: a planner may grow only into GPUs nobody else still holds. Decreases are planned
    # first, so process the planners that shrink before those that grow.
    held = {n: max(int(current.get(n, 0)), alloc[n]) for n in names}
    for n in sorted(names, key=lambda n: (alloc[n] - int(current.get(n, 0)), n)):
        others = sum(held[m] for m in names if m != n)
        cap = max(min(alloc[n], total_gpus - others), min(int(current.get(n, 0)), alloc[n]))
        alloc[n] = max(0, cap)
        held[n] = max(int(current.get(n, 0)), alloc[n])
    return alloc

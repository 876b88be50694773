"""Parse DynamoGraphDeployment and DynoPlanner bodies into typed, validated config (no I/O).

Everything the CRD schema cannot express is checked here and raised as one
:class:`~dynoplan.errors.SpecError` listing every problem (the handlers turn it into a status
condition, not a retry loop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dynoplan.errors import ConfigError, SpecError
from planner.core import PlannerConfig, config_from_mapping

GPU_RESOURCE = "nvidia.com/gpu"
DGD_GROUP, DGD_VERSION, DGD_PLURAL, DGD_KIND = (
    "nvidia.com",
    "v1alpha1",
    "dynamographdeployments",
    "DynamoGraphDeployment",
)
DPL_GROUP, DPL_VERSION, DPL_PLURAL, DPL_KIND = "dynoplan.dev", "v1alpha1", "dynoplanners", "DynoPlanner"
FPM_PORT_NAME = "fpm"
"""Default name of the container/Service/EndpointSlice port of a worker's ForwardPassMetrics ZMQ PUB socket."""


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One DGD service: name, component types, replicas (None = unset, treated as 1), GPUs per engine
    (``nvidia.com/gpu`` limit, else request, else 1 -- mocker workers use no GPU but occupy an engine slot),
    image/command/args of the main container, envs, the main container's ``imagePullPolicy`` (None =
    the reconciler's ``IfNotPresent``, so an image loaded into kind with a ``:latest`` tag is not pulled)."""

    name: str
    component_type: str | None
    sub_component_type: str | None
    replicas: int | None
    gpus_per_engine: int
    image: str | None
    command: tuple[str, ...]
    args: tuple[str, ...]
    envs: tuple[tuple[str, str], ...]
    resources: Mapping[str, Any] | None = None
    image_pull_policy: str | None = None
    lifecycle: Mapping[str, Any] | None = None
    """The main container's ``lifecycle`` (e.g. a ``preStop`` that lets in-flight streams finish), verbatim."""
    termination_grace_period_s: int | None = None
    """``extraPodSpec.terminationGracePeriodSeconds`` (None = Kubernetes' 30 s)."""
    sidecars: tuple[Mapping[str, Any], ...] = ()
    """``extraPodSpec.containers``: extra containers of the Pod, verbatim (they may mount the ``tmp`` volume)."""


@dataclass(frozen=True, slots=True)
class DgdSpec:
    """A parsed DGD: ``namespace``, ``name``, ``uid``, ``generation``, services by name, backend."""

    namespace: str
    name: str
    uid: str
    generation: int
    backend: str | None
    services: Mapping[str, ServiceSpec]
    envs: tuple[tuple[str, str], ...] = ()


def _gpus(resources: Any, where: str, problems: list[str]) -> int:
    if not isinstance(resources, Mapping):
        return 1
    for part in ("limits", "requests"):
        v = (resources.get(part) or {}).get(GPU_RESOURCE)
        if v is None:
            continue
        try:
            n = int(str(v))
        except ValueError:
            n = -1
        if n < 1:
            problems.append(f"{where}.resources.{part}.{GPU_RESOURCE}={v!r}: expected an integer >= 1")
            return 1
        return n
    return 1


def _envs(raw: Any) -> tuple[tuple[str, str], ...]:
    return tuple(
        (str(e["name"]), str(e.get("value", ""))) for e in (raw or []) if isinstance(e, Mapping) and "name" in e
    )


def parse_dgd(body: Mapping[str, Any]) -> DgdSpec:
    """Typed view of a DGD body (the schema already checked types and bounds).

    Raises SpecError for what the schema cannot express (e.g. a non-integer GPU count).
    """
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    where = f"DynamoGraphDeployment {meta.get('namespace')}/{meta.get('name')}"
    problems: list[str] = []
    services: dict[str, ServiceSpec] = {}
    for name, s in (spec.get("services") or {}).items():
        s = s or {}
        extra = s.get("extraPodSpec") or {}
        main = extra.get("mainContainer") or {}
        grace = extra.get("terminationGracePeriodSeconds")
        if grace is not None and not (isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0):
            problems.append(
                f"spec.services.{name}.extraPodSpec.terminationGracePeriodSeconds={grace!r}: "
                "expected an integer >= 0 (seconds)"
            )
            grace = None
        sidecars = extra.get("containers") or []
        if not (isinstance(sidecars, list) and all(isinstance(c, dict) and c.get("name") for c in sidecars)):
            problems.append(
                f"spec.services.{name}.extraPodSpec.containers: expected a list of containers, each with a name"
            )
            sidecars = []
        services[name] = ServiceSpec(
            name=name,
            component_type=s.get("componentType"),
            sub_component_type=s.get("subComponentType"),
            replicas=s.get("replicas"),
            gpus_per_engine=_gpus(s.get("resources"), f"spec.services.{name}", problems),
            image=main.get("image"),
            command=tuple(main.get("command") or ()),
            args=tuple(main.get("args") or ()),
            envs=_envs(s.get("envs")),
            resources=s.get("resources"),
            image_pull_policy=main.get("imagePullPolicy"),
            lifecycle=main.get("lifecycle"),
            termination_grace_period_s=grace,
            sidecars=tuple(sidecars),
        )
    if not services:
        problems.append("spec.services={}: expected at least one service")
    if problems:
        raise SpecError(where, problems)
    return DgdSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        backend=spec.get("backendFramework"),
        services=services,
        envs=_envs(spec.get("envs")),
    )


@dataclass(frozen=True, slots=True)
class PlannerSpec:
    """A parsed DynoPlanner: target DGD, planner config, pool -> DGD service names (explicit ones only),
    advisory flag, metrics source, shared budget name, where the load loop finds the workers' FPM."""

    namespace: str
    name: str
    target: str
    config: PlannerConfig
    services: Mapping[str, str]
    advisory: bool
    prometheus_url: str | None
    model: str | None
    metrics_namespace: str | None
    shared_budget: str | None
    profile: str | None
    fpm_services: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """pool -> Kubernetes Service whose EndpointSlices list the pool's workers (``spec.load.fpmServices``;
    ``worker`` is the ``agg`` pool); pools not listed use the reconciler's ``<dgd>-<service>``."""
    fpm_port_name: str = FPM_PORT_NAME
    """EndpointSlice port name of the workers' FPM socket (``spec.load.fpmPortName``)."""


# spec path -> PlannerConfig key (the CRD's schema of each is generated from it: planner.operator.schemas)
SPEC_KEYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("mode",), "mode"),
    (("sla", "ttftMs"), "ttft_ms"),
    (("sla", "itlMs"), "itl_ms"),
    (("throughput", "enabled"), "throughput_enabled"),
    (("throughput", "adjustmentIntervalS"), "adjustment_interval_s"),
    (("throughput", "predictor"), "predictor"),
    (("throughput", "correctionFactors"), "correction_enabled"),
    (("load", "enabled"), "load_enabled"),
    (("load", "intervalS"), "load_adjustment_interval_s"),
    (("load", "scaleDownSensitivity"), "load_sensitivity"),
    (("replicas", "minPrefill"), "prefill_min_replicas"),
    (("replicas", "maxPrefill"), "prefill_max_replicas"),
    (("replicas", "minDecode"), "decode_min_replicas"),
    (("replicas", "maxDecode"), "decode_max_replicas"),
    (("replicas", "minWorker"), "agg_min_replicas"),
    (("replicas", "maxWorker"), "agg_max_replicas"),
    (("budget", "maxGpus"), "max_gpu_budget"),
    (("budget", "minGpus"), "min_gpu_budget"),
)


def _dig(d: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    cur: Any = d
    for p in path:
        if not isinstance(cur, Mapping) or p not in cur:
            return None
        cur = cur[p]
    return cur


def planner_overrides(spec: Mapping[str, Any]) -> dict[str, Any]:
    """PlannerConfig keys set by a DynoPlanner spec: the typed fields, then ``spec.settings`` (any
    PlannerConfig key, snake_case or camelCase) on top."""
    out: dict[str, Any] = {}
    for path, key in SPEC_KEYS:
        v = _dig(spec, path)
        if v is not None:
            out[key] = v
    for k, v in (spec.get("settings") or {}).items():
        out[_snake(k)] = v
    return out


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


_POOL_SPEC = {"agg": "Worker", "prefill": "Prefill", "decode": "Decode"}


def spec_field_names(spec: Mapping[str, Any]) -> dict[str, str]:
    """PlannerConfig setting name (``ttft_ms``, ``agg.min_replicas``, ...) -> the DynoPlanner field a user
    sets it with: the typed CRD field (``spec.sla.ttftMs``, ``spec.replicas.minWorker``), or
    ``spec.settings.<key as written>`` for keys set under ``spec.settings`` (they win over the typed
    fields) and for settings without a typed field."""
    from planner.core.config import PlannerConfig as _PC

    names: dict[str, str] = {}
    for f in dataclasses.fields(_PC):
        if f.name in _POOL_SPEC:
            for k in ("min_replicas", "max_replicas", "gpus_per_engine"):
                names[f"{f.name}.{k}"] = f"spec.settings.{f.name}.{k}"
        else:
            names[f.name] = f"spec.settings.{f.name}"
    for path, key in SPEC_KEYS:
        pool = next(
            (
                p
                for p in _POOL_SPEC
                if key.startswith(p + "_") and key[len(p) + 1 :] in ("min_replicas", "max_replicas")
            ),
            None,
        )
        names[f"{pool}.{key[len(pool) + 1 :]}" if pool else key] = "spec." + ".".join(path)
    for k, v in (spec.get("settings") or {}).items():
        sk = _snake(str(k))
        if sk in _POOL_SPEC and isinstance(v, Mapping):
            for pk in v:
                names[f"{sk}.{_snake(str(pk))}"] = f"spec.settings.{k}.{pk}"
        else:
            names[sk] = f"spec.settings.{k}"
            pool = next((p for p in _POOL_SPEC if sk.startswith(p + "_")), None)
            if pool:  # flat pool key, e.g. aggMinReplicas
                names[f"{pool}.{sk[len(pool) + 1 :]}"] = f"spec.settings.{k}"
    return names


def name_spec_fields(problems: list[str], spec: Mapping[str, Any]) -> list[str]:
    """``problems`` of the planner core with each setting name replaced by the DynoPlanner field that sets
    it (:func:`spec_field_names`), e.g. ``agg.min_replicas=5: expected <= agg.max_replicas=2`` ->
    ``spec.replicas.minWorker=5: expected <= spec.replicas.maxWorker=2``. A name is replaced where it is
    followed by ``=`` or ``:`` (a setting, not a word of the message)."""
    import re

    names = spec_field_names(spec)
    pattern = re.compile(
        r"(?<![\w.])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?=[=:])"
    )
    return [pattern.sub(lambda m: names[m.group(1)], p) for p in problems]


def parse_planner(body: Mapping[str, Any], defaults: PlannerConfig | None = None) -> PlannerSpec:
    """Typed view of a DynoPlanner body on top of ``defaults`` (the operator's planner defaults).

    Raises SpecError listing every invalid planner setting and a missing ``spec.targetRef.name`` at once,
    each named by its DynoPlanner field (:func:`name_spec_fields`), with the value and the expectation.
    """
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    where = f"DynoPlanner {meta.get('namespace')}/{meta.get('name')}"
    problems: list[str] = []
    try:
        cfg = config_from_mapping(planner_overrides(spec), base=defaults or PlannerConfig())
    except ConfigError as e:
        problems.extend(name_spec_fields(e.problems, spec))
    target = _dig(spec, ("targetRef", "name"))
    if not target:
        problems.append("spec.targetRef.name: expected the name of a DynamoGraphDeployment")
    if problems:
        raise SpecError(where, problems)
    m = spec.get("metrics") or {}
    b = spec.get("budget") or {}
    services = {k: str(v) for k, v in (spec.get("services") or {}).items() if v}
    if "worker" in services:
        services["agg"] = services.pop("worker")
    load = spec.get("load") or {}
    fpm_services = {("agg" if k == "worker" else k): str(v) for k, v in (load.get("fpmServices") or {}).items() if v}
    return PlannerSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        target=str(target),
        config=cfg,
        services=services,
        advisory=bool(spec.get("advisory", False)),
        prometheus_url=m.get("prometheusUrl"),
        model=m.get("model"),
        metrics_namespace=m.get("namespace"),
        shared_budget=b.get("sharedBudget"),
        profile=_dig(spec, ("throughput", "profile")),
        fpm_services=fpm_services,
        fpm_port_name=str(load.get("fpmPortName") or FPM_PORT_NAME),
    )


def resolve_pools(plan: PlannerSpec, dgd: DgdSpec) -> dict[str, ServiceSpec]:
    """Pool (prefill/decode/agg) -> the DGD service it scales.

    Explicit names from the planner spec win; otherwise the unique service with that
    ``subComponentType`` (prefill/decode), or for ``agg`` the unique ``worker`` service without one.
    Raises SpecError when a pool's service is missing or ambiguous.
    """
    problems: list[str] = []
    out: dict[str, ServiceSpec] = {}
    for pool in plan.config.pools:
        name = plan.services.get(pool)
        if name is not None:
            if name not in dgd.services:
                problems.append(
                    f"spec.services.{'worker' if pool == 'agg' else pool}={name!r}: no such service in "
                    f"DynamoGraphDeployment {dgd.name} (has {', '.join(sorted(dgd.services))})"
                )
                continue
            out[pool] = dgd.services[name]
            continue
        if pool == "agg":
            cands = [
                s for s in dgd.services.values() if s.component_type in ("worker", "main") and not s.sub_component_type
            ]
            expect = "one service with componentType worker and no subComponentType"
        else:
            cands = [s for s in dgd.services.values() if s.sub_component_type == pool or s.component_type == pool]
            expect = f"one service with subComponentType {pool}"
        if len(cands) != 1:
            problems.append(
                f"mode {plan.config.mode}: DynamoGraphDeployment {dgd.name} has {len(cands)} "
                f"{pool} services ({', '.join(s.name for s in cands) or 'none'}); expected {expect}"
                f" or spec.services.{'worker' if pool == 'agg' else pool}"
            )
            continue
        out[pool] = cands[0]
    if problems:
        raise SpecError(f"DynoPlanner {plan.namespace}/{plan.name}", problems)
    return out

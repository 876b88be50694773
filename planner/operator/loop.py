"""One planner loop per DynoPlanner: observe the DGD, Prometheus and the workers' FPM, ``Planner.tick``,
act, report.

:class:`KubernetesConnector` reads pools from the DGD (spec replicas, ready replicas from the DGD status)
and scales with a conditional JSON merge patch of ``spec.services.<name>.replicas``; a 409 (someone edited
the DGD since it was read) is reported, not retried blindly: the next tick re-reads and the planner
adopts the edit. It also finds the workers' ForwardPassMetrics endpoints (:meth:`KubernetesConnector.fpm_endpoints`:
the ready endpoints of each pool's Service, port named ``fpm``). :class:`FpmFeed` subscribes to them with
:class:`planner.sources.fpm.FpmSubscriber` for the load loop; traffic for the throughput loop comes from
:class:`planner.sources.prometheus.PrometheusTrafficSource`. :class:`PlannerLoop` owns the planner of one
DynoPlanner and runs until stopped.

Event reasons (constant): ``ScaledUp``, ``ScaledDown``, ``Rebalanced``, ``AdvisoryDecision``,
``ScaleConflict``, ``AdoptedExternalChange`` (replicas changed by someone else, adopted and left alone for
``external_change_grace_s``), ``InvalidSpec``, ``TargetNotFound``. Condition types on the DynoPlanner: ``SpecValid``,
``TargetFound``, ``MetricsAvailable``, ``Ready``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from dynoplan.errors import DynoplanError, SpecError
from planner.core import (
    Decision,
    Observations,
    PassObservation,
    Planner,
    PlannerConfig,
    PoolState,
    TickResult,
    TrafficWindow,
    load_profile,
)
from planner.core.metrics import PlannerMetrics
from planner.core.reasons import Reason
from planner.dashboard import DashboardHistory
from planner.operator.kube import Conflict, Gone, Kube, now_iso
from planner.operator.reconcile import child_name, divide_budget, replica_patch, set_condition
from planner.operator.spec import DgdSpec, PlannerSpec, ServiceSpec, parse_dgd, parse_planner, resolve_pools

log = logging.getLogger("dynoplan.operator.planner")

REASON_UP, REASON_DOWN, REASON_REBALANCE = "ScaledUp", "ScaledDown", "Rebalanced"
REASON_ADVISORY, REASON_CONFLICT = "AdvisoryDecision", "ScaleConflict"
REASON_INVALID, REASON_NOT_FOUND = "InvalidSpec", "TargetNotFound"
REASON_ADOPTED = "AdoptedExternalChange"
PROFILE_HINT = "/opt/dynoplan/profiles/mocker_vllm.npz"
"""The profile the project's image bakes in (a default mocker worker; docs/kubernetes.md, the chart's example)."""


@dataclass
class BudgetBook:
    """Namespace-wide shared GPU budget: every planner records its need/min/current; caps are divided by
    :func:`~planner.operator.reconcile.divide_budget`. One per operator process (in ``kopf.Memo``); ticks
    that touch it hold ``lock`` so caps and patches are computed one planner at a time."""

    total_gpus: int
    entries: dict[tuple[str, str, str], tuple[int, int, int]] = dataclasses.field(default_factory=dict)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    def record(self, key: tuple[str, str, str], need: int, minimum: int, current: int) -> None:
        """Record ``key``'s need/min/current GPUs (key = namespace, budget name, planner). Every planner
        records on every step, so all planners sharing a budget are known before any of them scales."""
        self.entries[key] = (need, minimum, current)

    def cap(self, key: tuple[str, str, str]) -> int:
        """``key``'s GPU cap from the recorded entries of its (namespace, budget) group."""
        group = {k[2]: v for k, v in self.entries.items() if k[:2] == key[:2]}
        alloc = divide_budget(
            self.total_gpus,
            {n: v[0] for n, v in group.items()},
            {n: v[1] for n, v in group.items()},
            {n: v[2] for n, v in group.items()},
        )
        return alloc[key[2]]

    def forget(self, key: tuple[str, str, str]) -> None:
        self.entries.pop(key, None)


@dataclass(frozen=True)
class Observed:
    """What one read of the DGD gave: body, typed spec, pool -> service, pool -> state."""

    body: dict[str, Any]
    dgd: DgdSpec
    services: dict[str, ServiceSpec]
    pools: dict[str, PoolState]


class KubernetesConnector:
    """Reads and scales the pools of one DGD."""

    def __init__(self, kube: Kube, plan: PlannerSpec) -> None:
        self.kube = kube
        self.plan = plan

    async def observe(self) -> Observed | None:
        """The DGD's pools, or None when the DGD does not exist. Raises SpecError when it lacks the
        services the planner's mode needs. Ready replicas come from ``status.services.<name>.readyReplicas``
        (None = unknown when the status has no entry)."""
        body = await self.kube.get_dgd(self.plan.namespace, self.plan.target)
        if body is None:
            return None
        dgd = parse_dgd(body)
        services = resolve_pools(self.plan, dgd)
        st = (body.get("status") or {}).get("services") or {}
        pools = {}
        for pool, s in services.items():
            ready = (st.get(s.name) or {}).get("readyReplicas")
            pools[pool] = PoolState(1 if s.replicas is None else int(s.replicas), None if ready is None else int(ready))
        return Observed(body, dgd, services, pools)

    async def scale(self, obs: Observed, targets: Mapping[str, int]) -> dict[str, Any] | None:
        """Merge-patch the changed pools' replicas, conditional on the resourceVersion read in ``obs``.

        Returns the patch applied (None when nothing changed). Raises Conflict (409) when the DGD changed
        since it was read, Gone when it was deleted.
        """
        patch = replica_patch(
            {p: s.name for p, s in obs.services.items()}, {p: st.replicas for p, st in obs.pools.items()}, targets
        )
        if patch is None:
            return None
        await self.kube.patch_dgd(
            self.plan.namespace, self.plan.target, patch, resource_version=obs.body["metadata"]["resourceVersion"]
        )
        return patch

    def fpm_service_names(self, obs: Observed) -> dict[str, str]:
        """pool -> the Kubernetes Service whose EndpointSlices list its workers."""
        return {
            pool: self.plan.fpm_services.get(pool) or child_name(obs.dgd.name, svc.name)
            for pool, svc in obs.services.items()
        }

    async def fpm_endpoints(self, obs: Observed) -> dict[str, str]:
        """``{zmq endpoint: pool}`` of every ready worker of the planned pools.

        The Service of pool ``p`` is ``spec.load.fpmServices.<p>`` or else ``<dgd>-<service>``
        (:func:`~planner.operator.reconcile.child_name`, the reconciler's name); its EndpointSlices (label
        ``kubernetes.io/service-name``) give the ready addresses and the port named ``spec.load.fpmPortName``
        (default ``fpm``) as ``tcp://<address>:<port>`` (IPv6 in brackets). Endpoints whose ``ready``
        condition is false are skipped (unknown counts as ready, as the EndpointSlice API says).
        """
        out: dict[str, str] = {}
        for pool, service in self.fpm_service_names(obs).items():
            for sl in await self.kube.list_endpoint_slices(self.plan.namespace, service):
                ports = [p.get("port") for p in (sl.get("ports") or []) if p.get("name") == self.plan.fpm_port_name]
                if not ports or ports[0] is None:
                    continue
                for ep in sl.get("endpoints") or []:
                    if (ep.get("conditions") or {}).get("ready") is False:
                        continue
                    for addr in ep.get("addresses") or []:
                        host = f"[{addr}]" if ":" in addr else addr
                        out[f"tcp://{host}:{int(ports[0])}"] = pool
        return out


class FpmFeed:
    """ForwardPassMetrics of one DGD's workers for the load loop, through one
    :class:`~planner.sources.fpm.FpmSubscriber` (its own receive thread; stamps on ``clock``).

    Every replica of a Deployment runs the same arguments, so the ``worker_id`` a worker puts in its FPM
    is not unique in Kubernetes. An engine is identified by its endpoint instead: each (endpoint,
    worker_id) pair gets a small integer id for the lifetime of the feed (never reused), which replaces
    ``worker_id`` in the passes handed to the core (DP ranks are kept).
    """

    SEP = "|"

    def __init__(self, clock: Callable[[], float], stale_s: float = 10.0) -> None:
        from planner.sources.fpm import FpmSubscriber

        self.sub = FpmSubscriber(stale_s=stale_s, clock=clock)
        self._ids: dict[tuple[str, int], int] = {}
        self._next_id = itertools.count()
        self.endpoints: dict[str, str] = {}
        self._latest: dict[tuple[int, int], tuple[str, PassObservation]] = {}

    def set_endpoints(self, endpoints: Mapping[str, str]) -> None:
        """Subscribe to exactly ``{endpoint: pool}`` (the subscriber tags passes with ``pool|endpoint``)."""
        self.endpoints = dict(endpoints)
        self.sub.set_endpoints({ep: f"{pool}{self.SEP}{ep}" for ep, pool in self.endpoints.items()})

    @property
    def ok(self) -> bool:
        return bool(self.sub.ok)

    def drain(self) -> tuple[PassObservation, ...]:
        """Passes received since the previous call, pool restored, worker ids made unique per endpoint."""
        out = []
        for p in self.sub.drain():
            pool, _, ep = p.pool.partition(self.SEP)
            key = (ep, p.worker_id)
            if key not in self._ids:
                self._ids[key] = next(self._next_id)
            q = msgspec.structs.replace(p, pool=pool, worker_id=self._ids[key])
            self._latest[(q.worker_id, q.dp_rank)] = (ep, q)
            out.append(q)
        return tuple(out)

    def latest(self) -> dict[tuple[int, int], PassObservation]:
        """The last drained pass per engine (feed id, DP rank) of the endpoints still subscribed."""
        return {k: p for k, (ep, p) in self._latest.items() if ep in self.endpoints}

    def close(self) -> None:
        self.sub.close()


class LoopMetrics:
    """Merges the per-planner registries into one collector (``PlannerMetrics`` registers fixed metric
    names, so each planner loop gets its own ``CollectorRegistry``; families of the same name are merged
    so ``/metrics`` carries one family with a series per planner label set)."""

    def __init__(self) -> None:
        self.registries: dict[tuple[str, str], Any] = {}

    def collect(self) -> Any:
        merged: dict[str, Any] = {}
        for reg in list(self.registries.values()):
            for fam in reg.collect():
                if fam.name in merged:
                    merged[fam.name].samples.extend(fam.samples)
                else:
                    merged[fam.name] = fam
        return list(merged.values())


def _num(x: float) -> float | None:
    return round(float(x), 6) if isinstance(x, (int, float)) and math.isfinite(x) else None


class PlannerLoop:
    """The planner of one DynoPlanner. ``step()`` is one iteration (returns seconds to sleep);
    ``run(stopped)`` repeats it until the kopf daemon's stop flag is set."""

    def __init__(
        self,
        body: Mapping[str, Any],
        kube: Kube,
        *,
        defaults: PlannerConfig,
        traffic_factory: Callable[[PlannerSpec], Any],
        metrics_registry: Any,
        budget: BudgetBook | None,
        min_sleep_s: float,
        max_sleep_s: float,
        clock: Callable[[], float] = time.monotonic,
        fpm_factory: Callable[[Callable[[], float]], Any] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``traffic_factory(plan)``: an object with a blocking ``read(window_s) -> TrafficWindow | None``
        (:class:`~planner.sources.prometheus.PrometheusTrafficSource`; called again only when the plan's
        metrics settings change). ``fpm_factory(clock)``: the FPM feed of the load loop (default
        :class:`FpmFeed`), created when a spec enables the load loop and closed by :meth:`close`.
        ``wall_clock``: Unix seconds for the dashboard's series (:attr:`history`)."""
        self.body = body  # kopf's live view of the DynoPlanner
        self.kube = kube
        self.defaults = defaults
        self.traffic_factory = traffic_factory
        self.fpm_factory = fpm_factory or (lambda clock: FpmFeed(clock))
        self._traffic: Any = None
        self._traffic_key: Any = None
        self.fpm: Any = None
        self.registry = metrics_registry
        self.budget = budget
        self.min_sleep_s, self.max_sleep_s = min_sleep_s, max_sleep_s
        self.clock = clock
        self.planner: Planner | None = None
        self._planner_key: Any = None
        self._metrics: PlannerMetrics | None = None
        self._sla: Any = None
        self._next_s = 0.0
        self._thpt_need: dict[str, int] = {}  # last throughput-loop requirement (ticks without it keep it)
        self.conditions: list[dict[str, Any]] = list(((body.get("status") or {}).get("conditions")) or [])
        self.last_result: TickResult | None = None
        self._last_status: dict[str, Any] | None = None
        # The live dashboard's series (planner.live.dashboard, served by planner.operator.dashboard).
        self.wall_clock = wall_clock
        self.history = DashboardHistory()
        self.started_wall_s = wall_clock()
        self._plan: PlannerSpec | None = None
        self._inputs_key: Any = None
        self._inputs_problems: list[str] = []
        self._profile: Any = None
        self._last_seen: dict[str, int] = {}  # pool -> spec replicas of the previous tick (for the adoption Event)
        # status.observed / status.predicted keep the last throughput-loop values between its ticks, and
        # across an operator restart (the new loop starts from the status the previous one wrote)
        st = body.get("status") or {}
        self._last_observed: dict[str, Any] = {
            k: (st.get("observed") or {}).get(k) for k in ("requestsPerSecond", "ttftMs", "itlMs")
        }
        self._last_predicted: dict[str, Any] = {
            "requestsPerSecond": (st.get("predicted") or {}).get("requestsPerSecond")
        }

    @property
    def ref(self) -> dict[str, Any]:
        m = self.body["metadata"]
        return {
            "apiVersion": self.body.get("apiVersion"),
            "kind": self.body.get("kind"),
            "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m.get("uid")},
        }

    def _cond(self, type_: str, ok: bool, reason: str, message: str) -> None:
        self.conditions = set_condition(self.conditions, type_, "True" if ok else "False", reason, message, now_iso())

    async def _status(self, extra: Mapping[str, Any] | None = None) -> None:
        m = self.body["metadata"]
        status = {"observedGeneration": m.get("generation"), "conditions": self.conditions, **(extra or {})}
        if status == self._last_status:
            return
        try:
            await self.kube.patch_planner_status(m["namespace"], m["name"], status)
            self._last_status = status
        except Gone:
            pass

    async def _invalid(self, err: SpecError, type_: str = "SpecValid", reason: str = REASON_INVALID) -> float:
        first = not any(
            c["type"] == type_ and c["status"] == "False" and c.get("message") == str(err) for c in self.conditions
        )
        self._cond(type_, False, reason, str(err))
        self._cond("Ready", False, reason, str(err))
        await self._status()
        if first:
            log.warning("invalid spec", extra={"planner": self.body["metadata"]["name"], "error": str(err)})
            try:
                await self.kube.event(self.ref, "Warning", reason, str(err))
            except Gone:
                pass
        return self.max_sleep_s

    def _input_problems(self, plan: PlannerSpec | None) -> list[str]:
        """Problems of the planner's inputs that need no DGD: ``spec.throughput.profile`` (required while the
        throughput loop is on, loadable, with the halves the mode needs) and ``spec.engine`` (the sizing by
        simulation's engine). Checked again only when they (or the config) change; the loaded profile is kept
        in ``self._profile``."""
        spec = self.body.get("spec") or {}
        thr = spec.get("throughput") or {}
        path = thr.get("profile")
        engine = spec.get("engine")
        if plan is not None:
            cfg, thpt_on = plan.config, plan.config.throughput_enabled
        else:  # the config itself is invalid: judge the profile and the engine on the defaults
            cfg = self.defaults
            thpt_on = thr["enabled"] if isinstance(thr.get("enabled"), bool) else self.defaults.throughput_enabled
        key = (cfg, thpt_on, path, repr(engine))
        if key == self._inputs_key:
            return self._inputs_problems
        problems: list[str] = []
        profile = None
        if path:
            try:
                profile = load_profile(path)
            except DynoplanError as e:
                msg = str(e)
                msg = msg[len(str(path)) + 2 :] if msg.startswith(f"{path}: ") else msg
                problems.append(f"spec.throughput.profile={path!r}: {msg}")
        elif thpt_on:
            problems.append(
                "spec.throughput.profile: required while the throughput loop is on (spec.throughput.enabled, default "
                "true): expected the path, in the operator Pod, of the workers' performance profile (.npz; the image "
                f"has {PROFILE_HINT}), or spec.throughput.enabled: false with spec.load.enabled: true"
            )
        if profile is not None and thpt_on:
            need = [
                h
                for h, pools in (("prefill", ("prefill", "agg")), ("decode", ("decode", "agg")))
                if any(p in pools for p in cfg.pools)
            ]
            missing = [h for h in need if getattr(profile, h, None) is None]
            if missing:
                what = (
                    "both halves, prefill and decode (aggregated workers do both)"
                    if cfg.mode == "agg"
                    else f"the {' and '.join(need)} " + ("halves" if len(need) > 1 else "half")
                )
                problems.append(
                    f"spec.throughput.profile={path!r}: mode {cfg.mode} needs a profile with {what}; "
                    f"this one has no {' and no '.join(missing)} half"
                )
        try:
            from planner.whatif import evaluator_from_spec

            evaluator_from_spec(engine, cfg)
        except DynoplanError as e:
            problems.extend(getattr(e, "problems", None) or [str(e)])
        self._inputs_key, self._inputs_problems, self._profile = key, problems, profile
        return problems

    async def step(self) -> float:
        """One iteration: parse, observe, tick when due, act, report. Returns seconds to sleep.

        Every spec problem (settings, ``spec.targetRef.name``, profile, engine) is reported at once, before
        the target DGD is looked up: a DynoPlanner whose DGD is missing still shows its spec problems."""
        m = self.body["metadata"]
        where = f"DynoPlanner {m.get('namespace')}/{m.get('name')}"
        try:
            plan: PlannerSpec | None = parse_planner(self.body, self.defaults)
            problems: list[str] = []
        except SpecError as e:
            plan, problems = None, list(e.problems)
        problems += self._input_problems(plan)
        if problems or plan is None:
            return await self._invalid(SpecError(where, problems))
        conn = KubernetesConnector(self.kube, plan)
        try:
            obs = await conn.observe()
        except SpecError as e:
            return await self._invalid(e)
        if obs is None:
            self._cond("TargetFound", False, REASON_NOT_FOUND, f"DynamoGraphDeployment {plan.target} not found")
            self._cond("Ready", False, REASON_NOT_FOUND, f"DynamoGraphDeployment {plan.target} not found")
            await self._status()
            return self.max_sleep_s
        self._cond("TargetFound", True, "Found", f"DynamoGraphDeployment {plan.target}")
        self._plan = plan
        self.history.record_sample(self.wall_clock(), obs.pools)

        cfg = plan.config.with_limits(
            {
                p: dataclasses.replace(plan.config.limits(p), gpus_per_engine=s.gpus_per_engine)
                for p, s in obs.services.items()
            }
        )
        if cfg.load_enabled:
            if self.fpm is None:
                self.fpm = self.fpm_factory(self.clock)
            self.fpm.set_endpoints(await conn.fpm_endpoints(obs))
        elif self.fpm is not None:
            await self.close()
        # sizing by simulation: the engine the DGD's workers run, from spec.engine (planner.whatif)
        engine = (self.body.get("spec") or {}).get("engine")
        key = (cfg, plan.profile, repr(engine))
        if self.planner is None or key != self._planner_key:
            try:
                from planner.whatif import evaluator_from_spec

                self.planner = Planner(cfg, self._profile, evaluator=evaluator_from_spec(engine, cfg))
            except DynoplanError as e:
                return await self._invalid(SpecError(f"DynoPlanner {plan.namespace}/{plan.name}", str(e)))
            self._planner_key = key
            self._next_s = self.clock()  # first tick now (the core warms up; throughput is due one interval later)
            if self._metrics is None and self.registry is not None:
                from prometheus_client import CollectorRegistry, Gauge

                own = CollectorRegistry()
                labels = {"namespace": plan.namespace, "planner": plan.name}
                self._metrics = PlannerMetrics(own, labels)
                self._sla = (
                    Gauge("dynoplan_planner_ttft_target_ms", "TTFT SLA target, ms", list(labels), registry=own),
                    Gauge("dynoplan_planner_itl_target_ms", "ITL SLA target, ms", list(labels), registry=own),
                    labels,
                )
                self.registry.registries[(plan.namespace, plan.name)] = own
            if self._metrics is not None:
                self._sla[0].labels(**self._sla[2]).set(cfg.ttft_ms)
                self._sla[1].labels(**self._sla[2]).set(cfg.itl_ms)

        self._cond("SpecValid", True, "Valid", "spec and target services valid")
        if self.budget is not None and plan.shared_budget:
            self.budget.record(*self._budget_entry(plan, obs, cfg))
        now = self.clock()
        if now < self._next_s:
            return min(max(self._next_s - now, self.min_sleep_s), self.max_sleep_s)

        if self.budget is not None and plan.shared_budget:
            return await self._tick_shared(plan, conn, obs, cfg, now)
        return await self._tick(plan, conn, obs, cfg, now)

    def _budget_entry(self, plan: PlannerSpec, obs: Observed, cfg: PlannerConfig) -> tuple[Any, int, int, int]:
        """(key, need, minimum, current) GPUs of this planner for the shared budget. Need = the last
        unconstrained throughput requirement (current spec before the first one)."""
        gpus = {p: cfg.limits(p).gpus_per_engine for p in cfg.pools}
        current = sum(obs.pools[p].replicas * gpus[p] for p in cfg.pools)
        minimum = sum(cfg.limits(p).min_replicas * gpus[p] for p in cfg.pools)
        prev = self._thpt_need
        need = sum(int(prev.get(p, obs.pools[p].replicas)) * gpus[p] for p in cfg.pools)
        return (plan.namespace, str(plan.shared_budget), plan.name), max(need, minimum), minimum, current

    async def _tick_shared(
        self, plan: PlannerSpec, conn: KubernetesConnector, obs: Observed, cfg: PlannerConfig, now: float
    ) -> float:
        """A tick under the shared budget: the cap is computed and the patch made while holding the
        book's lock, so no two planners of the group grow into the same free GPUs."""
        assert self.budget is not None and self.planner is not None
        async with self.budget.lock:
            key, need, minimum, current = self._budget_entry(plan, obs, cfg)
            self.budget.record(key, need, minimum, current)
            cap = self.budget.cap(key)
            self.planner.config = dataclasses.replace(
                cfg,
                max_gpu_budget=max(min(cap, cfg.max_gpu_budget), minimum),
                min_gpu_budget=min(cfg.min_gpu_budget, max(cap, minimum)),
            )
            delay = await self._tick(plan, conn, obs, self.planner.config, now, cap=cap)
            # Record what the spec holds now (a patch may have changed it) for the next planner's cap.
            key, need, minimum, _ = self._budget_entry(plan, obs, cfg)
            targets = self.last_result.decision.targets if self.last_result else None
            if targets is not None and not plan.advisory:
                gpus = {p: cfg.limits(p).gpus_per_engine for p in cfg.pools}
                current = sum(
                    max(int(targets.get(p, obs.pools[p].replicas)), obs.pools[p].replicas) * gpus[p] for p in cfg.pools
                )
            self.budget.record(key, need, minimum, current)
            return delay

    async def _tick(
        self,
        plan: PlannerSpec,
        conn: KubernetesConnector,
        obs: Observed,
        cfg: PlannerConfig,
        now: float,
        cap: int | None = None,
    ) -> float:
        assert self.planner is not None
        traffic, passes, passes_ok = await self._read_inputs(plan, conn, obs, cfg)
        result = await asyncio.to_thread(
            self.planner.tick, now, Observations(obs.pools, traffic, passes=passes, passes_ok=passes_ok)
        )
        self._record_result(result)
        # Events are emitted after the status is written: whoever reads an Event and then the status sees
        # the decision in both (the status carries desiredReplicas of the same decision).
        events = await self._apply_decision(plan, conn, obs, result.decision, now)
        events += self._adoption_events(obs, cfg, result.decision)
        await self._status(self._tick_status(plan, obs, cfg, result, cap))
        for ev in events:
            await self.kube.event(*ev)
        now2 = self.clock()
        return min(max(self._next_s - now2, self.min_sleep_s), self.max_sleep_s)

    async def _read_inputs(
        self, plan: PlannerSpec, conn: KubernetesConnector, obs: Observed, cfg: PlannerConfig
    ) -> tuple[TrafficWindow | None, tuple[PassObservation, ...], bool]:
        """The tick's observations ``(traffic, passes, passes_ok)``: the throughput interval from
        Prometheus over ``adjustment_interval_s`` (None = off or unknown; the reader is rebuilt when the
        URL, model or namespace changes) and the FPM drained since the previous tick (``passes_ok`` False
        = the subscriber failed); sets the MetricsAvailable condition."""
        traffic = None
        if cfg.throughput_enabled:
            tkey = (plan.prometheus_url, plan.model, plan.metrics_namespace)
            if self._traffic is None or tkey != self._traffic_key:
                self._traffic, self._traffic_key = self.traffic_factory(plan), tkey
            traffic = await asyncio.to_thread(self._traffic.read, cfg.adjustment_interval_s)
        passes: tuple[PassObservation, ...] = ()
        passes_ok = True
        if cfg.load_enabled and self.fpm is not None:
            passes, passes_ok = self.fpm.drain(), self.fpm.ok
        self._metrics_condition(plan, conn, obs, cfg, traffic is None, passes_ok)
        return traffic, passes, passes_ok

    def _metrics_condition(
        self,
        plan: PlannerSpec,
        conn: KubernetesConnector,
        obs: Observed,
        cfg: PlannerConfig,
        traffic_unknown: bool,
        passes_ok: bool,
    ) -> None:
        """Set MetricsAvailable: True ("Read", naming what was read) or False ("Unknown", naming each
        problem: the Prometheus read failed, the FPM subscriber failed, no FPM endpoint found)."""
        problems = []
        if cfg.throughput_enabled and traffic_unknown:
            err = getattr(self._traffic, "last_error", None)
            problems.append(f"Prometheus read unknown ({err})" if err else "Prometheus read unknown")
        if cfg.load_enabled and not passes_ok:
            problems.append("FPM subscriber error")
        if cfg.load_enabled and self.fpm is not None and not self.fpm.endpoints:
            names = ", ".join(sorted(set(conn.fpm_service_names(obs).values())))
            problems.append(
                f"no FPM endpoints: no ready endpoint with a port named {plan.fpm_port_name!r} in the "
                f"EndpointSlices of Service {names}"
            )
        read = [
            n
            for n, on in (
                ("traffic from Prometheus", cfg.throughput_enabled),
                (f"FPM from {len(self.fpm.endpoints) if self.fpm else 0} worker endpoints", cfg.load_enabled),
            )
            if on
        ]
        self._cond(
            "MetricsAvailable",
            not problems,
            "Unknown" if problems else "Read",
            "; ".join(problems) if problems else "read " + " and ".join(read),
        )

    def _record_result(self, result: TickResult) -> None:
        """Keep the tick's result: the dashboard history (and the engines' latest FPM), the throughput
        loop's replicas per pool, the next tick time (s, planner clock) and the Prometheus metrics."""
        self.last_result = result
        self.history.record_tick(self.wall_clock(), result)
        if self.fpm is not None and hasattr(self.fpm, "latest"):
            self.history.record_engines(self.fpm.latest())
        if result.diagnostics.throughput_replicas:
            self._thpt_need = {p: int(n) for p, n in result.diagnostics.throughput_replicas.items()}
        self._next_s = result.next_tick_s
        if self._metrics is not None:
            self._metrics.update(result)

    async def _apply_decision(
        self, plan: PlannerSpec, conn: KubernetesConnector, obs: Observed, d: Decision, now: float
    ) -> list[tuple[Mapping[str, Any], str, str, str]]:
        """Patch the replicas to ``d.targets`` (unless advisory or no targets) and return the Events to emit
        ``(object, type, reason, message)``: AdvisoryDecision, ScaledUp/ScaledDown/Rebalanced on the
        deployment and the planner, or a Conflict warning (409: the decision is withdrawn from the core, and
        the next step re-reads the DGD and re-plans at once, ``now``)."""
        events: list[tuple[Mapping[str, Any], str, str, str]] = []
        if d.targets is None:
            return events
        name = plan.name
        cur = {p: s.replicas for p, s in obs.pools.items()}
        change = ", ".join(
            f"{obs.services[p].name} {cur.get(p)}->{n}" for p, n in sorted(d.targets.items()) if cur.get(p) != n
        )
        why = ", ".join(r.value for r in d.reasons) or d.reason.value
        msg = f"decision {d.decision_id}: {change or 'no change'} ({why})"
        if plan.advisory:
            events.append((self.ref, "Normal", REASON_ADVISORY, msg))
            return events
        applied: dict[str, Any] | None = None
        try:
            applied = await conn.scale(obs, d.targets)
        except Conflict:
            # not applied: the core must not wait for it (it would hold_pending until pending_timeout_s)
            if self.planner is not None and d.decision_id is not None:
                self.planner.withdraw(d.decision_id)
            log.info("scale conflict; re-reading", extra={"planner": name, "decision": d.decision_id})
            events.append(
                (
                    self.ref,
                    "Warning",
                    REASON_CONFLICT,
                    f"decision {d.decision_id}: the DynamoGraphDeployment changed since it was read (409); re-planning",
                )
            )
            self._next_s = now  # re-read at once on the next step
        except Gone:
            if self.planner is not None and d.decision_id is not None:
                self.planner.withdraw(d.decision_id)
            applied = None
        if applied is not None:
            ups = any(d.targets[p] > cur.get(p, 0) for p in d.targets)
            downs = any(d.targets[p] < cur.get(p, 0) for p in d.targets)
            reason = REASON_REBALANCE if ups and downs else REASON_UP if ups else REASON_DOWN
            events.append((obs.body, "Normal", reason, msg))
            events.append((self.ref, "Normal", reason, msg))
            log.info(
                "scaled",
                extra={"planner": name, "decision": d.decision_id, "patch": applied, "reason": d.reason.value},
            )
        return events

    def _adoption_events(
        self, obs: Observed, cfg: PlannerConfig, d: Decision
    ) -> list[tuple[Mapping[str, Any], str, str, str]]:
        """The AdoptedExternalChange Event when ``d`` adopted replicas changed outside the planner (naming
        each pool's previous -> current spec replicas), else none; remembers this tick's spec replicas."""
        events: list[tuple[Mapping[str, Any], str, str, str]] = []
        cur_spec = {p: s.replicas for p, s in obs.pools.items()}
        if d.reason is Reason.ADOPTED_EXTERNAL_CHANGE:
            changed = [p for p, r in d.pool_reasons.items() if r is Reason.ADOPTED_EXTERNAL_CHANGE] or sorted(cur_spec)
            what = ", ".join(
                f"{obs.services[p].name} {self._last_seen.get(p, '?')}->{cur_spec[p]}"
                for p in sorted(changed)
                if p in obs.services
            )
            events.append(
                (
                    self.ref,
                    "Normal",
                    REASON_ADOPTED,
                    f"replicas changed outside the planner, adopted: {what}; left alone for "
                    f"external_change_grace_s={cfg.external_change_grace_s:g} s",
                )
            )
        self._last_seen = cur_spec
        return events

    def _tick_status(
        self, plan: PlannerSpec, obs: Observed, cfg: PlannerConfig, result: TickResult, cap: int | None
    ) -> dict[str, Any]:
        """The status fields of this tick: desiredReplicas (the targets, or the spec's replicas when the
        decision holds), the last observed/predicted throughput-loop values, lastDecision, the load loop's
        estimates (ms) and the shared budget's cap (GPUs); sets the Ready condition."""
        d = result.decision
        diag = result.diagnostics
        if diag.observed is not None:
            self._last_observed = {
                "requestsPerSecond": _num(diag.observed.requests_per_second),
                "ttftMs": _num(diag.observed.mean_ttft_ms),
                "itlMs": _num(diag.observed.mean_itl_ms),
            }
        predicted = _num(diag.predicted_requests_per_second)
        if predicted is not None:
            self._last_predicted = {"requestsPerSecond": predicted}
        desired = dict(d.targets) if d.targets is not None else {p: s.replicas for p, s in obs.pools.items()}
        self._cond("Ready", True, "Planning", f"last reason {d.reason.value}")
        status: dict[str, Any] = {
            "desiredReplicas": {("worker" if p == "agg" else p): int(n) for p, n in desired.items()},
            # the last throughput-loop values (kept between its ticks, so `kubectl get -w` shows them throughout)
            "observed": dict(self._last_observed),
            "predicted": dict(self._last_predicted),
            "lastDecision": {
                "reason": d.reason.value,
                "time": now_iso(),
                **({"id": int(d.decision_id)} if d.decision_id is not None else {}),
            },
        }
        if cfg.load_enabled:
            status["load"] = {
                "fpmEndpoints": len(self.fpm.endpoints) if self.fpm is not None else 0,
                "engines": len(diag.engines),
                "estimatedTtftMs": _num(diag.estimated_ttft_ms),
                "estimatedItlMs": _num(diag.estimated_itl_ms),
            }
        if cap is not None:
            status["sharedBudget"] = {"name": plan.shared_budget, "capGpus": int(cap)}
        return status

    def dashboard_state(self) -> dict[str, Any] | None:
        """The dashboard page's state (:meth:`planner.live.dashboard.DashboardHistory.state`), or None
        before the first valid spec. Pool names are the planner's (``agg`` / ``prefill`` / ``decode``)."""
        if self.planner is None or self._plan is None:
            return None
        plan = self._plan
        problems = [
            c.get("message") for c in self.conditions if c["type"] == "MetricsAvailable" and c["status"] == "False"
        ]
        return self.history.state(
            self.wall_clock(),
            self.started_wall_s,
            self.planner.config,
            1000,
            self.last_result,
            title=f"dynoplan planner {plan.namespace}/{plan.name} (DynamoGraphDeployment {plan.target})",
            traffic_error=problems[0] if problems else None,
            fleet=[],
            fleet_events=[],
        )

    async def close(self) -> None:
        """Stop the FPM feed (its receive thread), if any."""
        fpm, self.fpm = self.fpm, None
        if fpm is not None:
            await asyncio.to_thread(fpm.close)

    async def run(self, stopped: Any) -> None:
        """Repeat :meth:`step` until ``stopped`` (kopf ``DaemonStopped`` flag: ``stopped.wait(s)``)."""
        while not stopped:
            try:
                delay = await self.step()
            except (Conflict, Gone) as e:  # raced with an edit/deletion: re-read next step
                log.info("retrying after %s", type(e).__name__, extra={"planner": self.body["metadata"]["name"]})
                delay = self.min_sleep_s
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - API down/restarting etc.: keep the planner's state, retry
                log.warning(
                    "planner step failed: %s: %s",
                    type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "",
                    extra={"planner": self.body["metadata"]["name"]},
                )
                delay = self.max_sleep_s
            await stopped.wait(delay)

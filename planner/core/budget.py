"""Replica limits and the GPU budget, applied to every decision.

:func:`apply_limits` turns *desired* replicas per pool into *targets* that are safe to publish:

1. clamp each pool to [min_replicas, max_replicas];
2. if the total GPUs (replicas x gpus_per_engine) exceed ``max_gpu_budget``, shrink: scale every pool
   by budget / total (floor, not below its minimum), then hand leftover GPUs back one replica at a
   time to the pool furthest below its desire (ties: pool order) — reason ``capped_by_budget``;
3. if below ``min_gpu_budget``, grow the pool with the fewest GPUs first (respecting max_replicas) —
   reason ``raised_to_min_gpu_budget``;
4. transient safety: a connector may apply pool changes in any order, so the worst moment of a
   rebalance holds ``max(current, target)`` replicas of every pool, plus the ``draining`` workers a
   scale-down removed that still hold their GPUs until their requests finish. When
   ``sum((max(current_p, target_p) + draining_p) x gpus_p) > max_gpu_budget``, decreases go first and
   increases are cut to the headroom left by the current and draining fleet — reason
   ``rebalance_decrease_first``; the remaining increase follows once the decreases are reflected and the
   drained workers released. When the fleet is itself over budget (e.g. someone else scaled it), only
   decreases are published.

Invariant (hypothesis-tested): if ``sum((current_p + draining_p) x gpus_p) <= max_gpu_budget`` then
``sum((max(current_p, target_p) + draining_p) x gpus_p) <= max_gpu_budget``; otherwise ``target_p <= current_p``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.core.config import PlannerConfig


@dataclass(frozen=True)
class BudgetResult:
    targets: dict[str, int]
    """Replicas to publish per pool."""
    goal: dict[str, int]
    """Where the targets are heading once transient limits allow (after clamp and budget)."""
    reasons: tuple[str, ...]
    """Subset of capped_by_max_replicas, raised_to_min_replicas, capped_by_budget,
    raised_to_min_gpu_budget, rebalance_decrease_first."""


def gpus(replicas: Mapping[str, int], config: PlannerConfig) -> int:
    """Total GPUs of ``replicas`` (replicas x gpus_per_engine summed over pools)."""
    return sum(n * config.limits(p).gpus_per_engine for p, n in replicas.items())


def apply_limits(
    desired: Mapping[str, int],
    current: Mapping[str, int],
    config: PlannerConfig,
    draining: Mapping[str, int] | None = None,
) -> BudgetResult:
    """Safe targets for ``desired`` given the ``current`` (spec) replicas and the ``draining`` workers per pool
    (removed, still holding GPUs; default none) (module docstring)."""
    pools = config.pools
    reasons: list[str] = []
    g = {p: config.limits(p).gpus_per_engine for p in pools}
    lo = {p: config.limits(p).min_replicas for p in pools}
    hi = {p: config.limits(p).max_replicas for p in pools}
    goal: dict[str, int] = {}
    for p in pools:
        d = int(desired.get(p, current.get(p, lo[p])))
        cap = hi[p]
        if cap is not None and d > cap:
            d = int(cap)
            reasons.append("capped_by_max_replicas")
        if d < lo[p]:
            d = lo[p]
            reasons.append("raised_to_min_replicas")
        goal[p] = d
    budget = config.max_gpu_budget
    total = sum(goal[p] * g[p] for p in pools)
    if total > budget:
        reasons.append("capped_by_budget")
        want = dict(goal)
        scale = budget / total
        for p in pools:
            goal[p] = max(lo[p], int(goal[p] * scale))
        # floor to minimum may still exceed (only if mins alone are close to budget): trim largest first
        while sum(goal[p] * g[p] for p in pools) > budget:
            cands = [p for p in pools if goal[p] > lo[p]]
            if not cands:
                break
            p = max(cands, key=lambda q: (goal[q] * g[q], -pools.index(q)))
            goal[p] -= 1
        # hand back leftovers to the pool furthest below its desire
        while True:
            left = budget - sum(goal[p] * g[p] for p in pools)
            cands = [p for p in pools if goal[p] < want[p] and g[p] <= left]
            if not cands:
                break
            p = max(cands, key=lambda q: ((want[q] - goal[q]) / max(1, want[q]), -pools.index(q)))
            goal[p] += 1
    if config.min_gpu_budget > 0 and sum(goal[p] * g[p] for p in pools) < config.min_gpu_budget:
        reasons.append("raised_to_min_gpu_budget")
        while sum(goal[p] * g[p] for p in pools) < config.min_gpu_budget:
            left = budget - sum(goal[p] * g[p] for p in pools)
            cands = [p for p in pools if ((h := hi[p]) is None or goal[p] < h) and g[p] <= left]
            if not cands:
                break
            p = min(cands, key=lambda q: (goal[q] * g[q], pools.index(q)))
            goal[p] += 1
    # transient safety
    cur = {p: int(current.get(p, 0)) for p in pools}
    drain = {p: int((draining or {}).get(p, 0)) for p in pools}
    held = sum(drain[p] * g[p] for p in pools)
    targets = dict(goal)
    worst = sum(max(cur[p], targets[p]) * g[p] for p in pools) + held
    if worst > budget:
        reasons.append("rebalance_decrease_first")
        targets = {p: min(cur[p], goal[p]) for p in pools}
        headroom = budget - sum(cur[p] * g[p] for p in pools) - held
        for p in pools:  # partial increases within the headroom the current fleet leaves
            if goal[p] > cur[p] and headroom >= g[p]:
                step = min(goal[p] - cur[p], headroom // g[p])
                targets[p] = cur[p] + step
                headroom -= step * g[p]
    return BudgetResult(targets, goal, tuple(dict.fromkeys(reasons)))

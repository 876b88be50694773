"""TrafficWindow from a Prometheus-compatible HTTP API (``GET /api/v1/query``), for the planner loop.

Interval means follow DESIGN.md "Metrics facts": ``increase(X_sum[w]) / increase(X_count[w])`` of the
``dynamo_frontend_*`` histograms (summed over series), ``w`` = the throughput interval. The request count
is ``sum(increase(dynamo_frontend_requests_started_total[w]))`` (as developer I's
``planner.sources.prometheus``; this async twin runs inside the operator's event loop).

A failed read (HTTP error, timeout, non-success answer) or a count series that does not exist yet is
*unknown* (None), never zero demand; zero requests over an existing series gives ``num_requests=0`` and
NaN means.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import aiohttp

from planner.core import TrafficWindow

PREFIX = "dynamo_frontend_"


class PrometheusTraffic:
    """Reads one interval's traffic aggregates. ``selector``: extra label matchers, e.g. ``model="m"``."""

    def __init__(self, session: aiohttp.ClientSession, url: str, timeout_s: float = 5.0, selector: str = "") -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.selector = selector

    async def _scalar(self, query: str) -> float | None:
        """Sum of an instant vector; None when the read failed or the vector is empty."""
        try:
            async with self.session.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=self.timeout) as r:
                if r.status != 200:
                    return None
                body: Any = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        if not isinstance(body, dict) or body.get("status") != "success":
            return None
        data = body.get("data") or {}
        result = data.get("result")
        if data.get("resultType") == "scalar" and isinstance(result, list) and len(result) == 2:
            return float(result[1])
        if data.get("resultType") != "vector" or not isinstance(result, list) or not result:
            return None
        return float(sum(float(x["value"][1]) for x in result))

    def _inc(self, metric: str, window_s: float) -> str:
        sel = "{" + self.selector + "}" if self.selector else ""
        return f"sum(increase({PREFIX}{metric}{sel}[{int(round(window_s))}s]))"

    async def window(self, window_s: float) -> TrafficWindow | None:
        """The last ``window_s`` seconds' aggregates, or None when the count cannot be read."""
        names = ("requests_started_total", "request_duration_seconds_count", "input_sequence_tokens_sum", "input_sequence_tokens_count",
                 "output_sequence_tokens_sum", "output_sequence_tokens_count", "time_to_first_token_seconds_sum",
                 "time_to_first_token_seconds_count", "inter_token_latency_seconds_sum",
                 "inter_token_latency_seconds_count", "request_duration_seconds_sum")
        vals = dict(zip(names, await asyncio.gather(*(self._scalar(self._inc(n, window_s)) for n in names))))
        count = vals["requests_started_total"]
        if count is None or not math.isfinite(count):
            return None

        def mean(base: str, scale: float = 1.0) -> float:
            s, c = vals[f"{base}_sum"], vals[f"{base}_count"]
            if s is None or c is None or not c > 0:
                return math.nan
            return s / c * scale

        return TrafficWindow(
            duration_s=float(window_s), num_requests=max(0.0, count),
            mean_isl_tokens=mean("input_sequence_tokens"), mean_osl_tokens=mean("output_sequence_tokens"),
            mean_ttft_ms=mean("time_to_first_token_seconds", 1000.0),
            mean_itl_ms=mean("inter_token_latency_seconds", 1000.0),
            mean_request_duration_s=mean("request_duration_seconds"))

"""Prometheus metric definitions of the live worker and frontend (one registry per process).

Worker names follow the engine being simulated (docs/architecture.md "Metrics facts"): ``vllm:*`` for vLLM,
``trtllm:*`` (same suffixes) for TensorRT-LLM, ``sglang:*`` for SGLang; labels ``model_name`` and
``engine`` (the DP rank, as vLLM v1 labels its engine cores). Frontend names are Dynamo's
``dynamo_frontend_*`` (labels ``model``). Latency histograms are in seconds of wall time, so at speedup
ratio R they read R times smaller than the simulated GPU's.

Bucket bounds start at 0.1 ms (vLLM's start at 1 ms) because high speedup ratios compress latencies;
the planner reads the latency histograms' ``_sum`` / ``_count`` only, which buckets do not affect. It reads
the *buckets* of the frontend's input/output length histograms and of its inter-arrival histogram
``dynoplan_frontend_request_interarrival_seconds`` (bounds :data:`GAP_BUCKETS_S`): they shape the traffic
sample of the planner's sizing by simulation (``planner.core.sizing``). Of the cached-token histogram
``dynamo_frontend_cached_tokens`` (prompt tokens served from the prefix cache per request, Dynamo's metric) it
reads ``_sum`` against the input-length histogram's ``_sum``: the share of prompt tokens that hit the cache.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
GAP_BUCKETS_S: tuple[float, ...] = (0.0,) + tuple(0.001 * 2.0**k for k in range(18))
"""Upper bounds (seconds) of ``dynoplan_frontend_request_interarrival_seconds``: 1 ms x powers of 2 up to
131.072 s (prometheus_client adds +Inf). The planner's ``planner.core.sizing.GAP_BUCKETS_S`` are the same
bounds plus +Inf (defined twice because the mocker never imports the planner; a test checks they agree)."""
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


class WorkerMetrics:
    """Engine-shaped metrics of one live worker. All updates go through the methods below."""

    def __init__(self, engine: str, model_name: str, dp_size: int, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.engine = engine
        r = self.registry
        p = "sglang:" if engine == "sglang" else ("trtllm:" if engine == "trtllm" else "vllm:")
        lbl = ["model_name", "engine"]
        self.cache_hit_rate: Gauge | None
        if engine == "sglang":
            self.running = Gauge(p + "num_running_reqs", "Requests in the running batch.", lbl, registry=r)
            self.waiting = Gauge(p + "num_queue_reqs", "Requests waiting to be scheduled.", lbl, registry=r)
            self.kv_usage = Gauge(p + "token_usage", "Fraction of KV-cache tokens in use (0-1).", lbl, registry=r)
            self.cache_hit_rate = Gauge(
                p + "cache_hit_rate", "Prefix-cache hit rate over all prompts so far (0-1).", lbl, registry=r
            )
        else:
            self.running = Gauge(p + "num_requests_running", "Requests in the running batch.", lbl, registry=r)
            self.waiting = Gauge(p + "num_requests_waiting", "Requests waiting to be scheduled.", lbl, registry=r)
            self.kv_usage = Gauge(
                p + "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).", lbl, registry=r
            )
            self.cache_hit_rate = None
        self.preemptions = Counter(p + "num_preemptions", "Recompute preemptions.", lbl, registry=r)
        self.prefix_queries = Counter(
            p + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", lbl, registry=r
        )
        self.prefix_hits = Counter(p + "prefix_cache_hits", "Prompt tokens found in the prefix cache.", lbl, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests.", lbl, registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens.", lbl, registry=r)
        self.request_success = Counter(
            p + "request_success", "Finished requests.", lbl + ["finished_reason"], registry=r
        )
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Time to first token (engine side).",
            lbl,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            p + "inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            lbl,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            p + "e2e_request_latency_seconds", "Arrival to last token.", lbl, buckets=LATENCY_BUCKETS_S, registry=r
        )
        self.queue_time = Histogram(
            p + "request_queue_time_seconds", "Arrival to first admission.", lbl, buckets=LATENCY_BUCKETS_S, registry=r
        )
        self.prompt_len = Histogram(
            p + "request_prompt_tokens", "Prompt length of finished requests.", lbl, buckets=TOKEN_BUCKETS, registry=r
        )
        self.gen_len = Histogram(
            p + "request_generation_tokens",
            "Output length of finished requests.",
            lbl,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        # mocker-specific: KV-cache stats and the driver's own health
        self.kv_blocks_total = Gauge(
            "dynoplan_mocker_kv_blocks_total", "KV-cache capacity in blocks per DP rank.", lbl, registry=r
        )
        self.kv_active_tokens = Gauge(
            "dynoplan_mocker_kv_active_tokens",
            "KV tokens in active blocks (blocks referenced by running requests x block size).",
            lbl,
            registry=r,
        )
        self.passes = Counter("dynoplan_mocker_forward_passes", "Engine passes run.", lbl, registry=r)
        self.pass_time = Counter(
            "dynoplan_mocker_forward_pass_seconds", "Sum of pass durations (wall, after speedup).", lbl, registry=r
        )
        self.lag = Histogram(
            "dynoplan_mocker_driver_lag_seconds",
            "How late a pass's tokens were delivered versus the simulated timeline.",
            lbl,
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.rejected = Counter(
            "dynoplan_mocker_rejected_requests", "Requests rejected with a 4xx.", ["model_name", "code"], registry=r
        )
        self.cancelled = Counter(
            "dynoplan_mocker_cancelled_requests", "Requests cancelled (client disconnected).", lbl, registry=r
        )
        self.model_name = model_name
        for rank in range(dp_size):
            # make every per-rank series visible from the first scrape (zeros, not absent)
            for m in (
                self.running,
                self.waiting,
                self.kv_usage,
                self.preemptions,
                self.prefix_queries,
                self.prefix_hits,
                self.prompt_tokens,
                self.generation_tokens,
                self.passes,
                self.pass_time,
                self.cancelled,
            ):
                m.labels(model_name, str(rank))
            for h in (self.ttft, self.itl, self.e2e):
                h.labels(model_name, str(rank))


class FrontendMetrics:
    """Dynamo frontend metrics read by the planner's throughput loop (labels ``model``)."""

    def __init__(self, model: str = "mocker", registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        p = "dynamo_frontend_"
        self.ttft = Histogram(
            p + "time_to_first_token_seconds",
            "Time to first token (frontend view).",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            p + "inter_token_latency_seconds",
            "Inter-token latency (frontend view).",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.duration = Histogram(
            p + "request_duration_seconds", "Request duration.", ["model"], buckets=LATENCY_BUCKETS_S, registry=r
        )
        self.isl = Histogram(
            p + "input_sequence_tokens", "Input sequence length.", ["model"], buckets=TOKEN_BUCKETS, registry=r
        )
        self.osl = Histogram(
            p + "output_sequence_tokens", "Output sequence length.", ["model"], buckets=TOKEN_BUCKETS, registry=r
        )
        self.cached_tokens = Histogram(
            p + "cached_tokens",
            "Cached prompt tokens (prefix-cache hits) per request.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        """Prompt tokens served from the prefix cache per successful request (tokens; Dynamo's
        ``dynamo_frontend_cached_tokens``): the ``usage.prompt_tokens_details.cached_tokens`` of the worker leg
        that ran the prefill (0 when that worker does not report it). Same bounds as the input-length histogram."""
        self.started = Counter(p + "requests_started", "Requests started.", ["model"], registry=r)
        self.requests = Counter(
            p + "requests", "Requests finished, by status.", ["model", "endpoint", "request_type", "status"], registry=r
        )
        self.inflight = Gauge(p + "inflight_requests", "Requests in flight.", ["model"], registry=r)
        self.workers = Gauge(p + "workers", "Discovered workers by role.", ["role"], registry=r)
        self.retries = Counter(
            p + "request_retries",
            "Legs re-routed after a worker failed (the stream continues elsewhere).",
            ["model"],
            registry=r,
        )
        self.continuations = Counter(
            "dynoplan_frontend_stream_continuations",
            "Streams continued on another worker after a worker failed mid-stream (tokens already "
            "sent to the client; the prompt is extended by them)",
            ["model"],
            registry=r,
        )
        self.failures = Counter(
            "dynoplan_frontend_request_failures",
            "Accepted requests that failed, by reason (the client got an HTTP error or an SSE error "
            "event with this reason as its code)",
            ["model", "reason"],
            registry=r,
        )
        self.interarrival = Histogram(
            "dynoplan_frontend_request_interarrival_seconds",
            "Gap between a request's arrival and the previous request's arrival (wall seconds).",
            ["model"],
            buckets=GAP_BUCKETS_S,
            registry=r,
        )
        self._last_arrival_s: dict[str, float] = {}
        # series exist (at 0) from the first scrape, so increase() over a window sees the first requests
        for m in (
            self.ttft,
            self.itl,
            self.duration,
            self.isl,
            self.osl,
            self.cached_tokens,
            self.started,
            self.inflight,
            self.retries,
            self.continuations,
            self.interarrival,
        ):
            m.labels(model)

    def observe_arrival(self, model: str, t_s: float) -> None:
        """A request of ``model`` arrived at ``t_s`` (seconds on a monotonic clock): observe the gap since the
        previous arrival in ``dynoplan_frontend_request_interarrival_seconds`` (nothing for the first one).

        Arrivals reported out of order (a later request whose body was parsed first) observe a gap of 0 and
        leave the latest arrival in place, so the gaps of a window still add up to its span of arrivals."""
        last = self._last_arrival_s.get(model)
        if last is not None:
            self.interarrival.labels(model).observe(max(0.0, t_s - last))
        self._last_arrival_s[model] = t_s if last is None else max(last, t_s)

"""Metric sources of the live planner: where Observations come from outside a simulation.

- :mod:`planner.sources.prometheus`: :class:`PrometheusTrafficSource` (frontend interval averages via
  PromQL) and :class:`DirectScrapeTrafficSource` (the same figures from the frontend's ``/metrics``
  when no Prometheus server is available).
- :mod:`planner.sources.fpm`: :class:`FpmSubscriber`, ForwardPassMetrics from the workers' ZMQ streams.

A source that cannot read returns ``None`` ("unknown"), never zeros.
"""

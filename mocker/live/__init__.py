"""Live (wall-clock) mocker: worker server, frontend router and load generator.

- :mod:`mocker.live.driver`   — runs a clock-free engine core on the wall clock (where speedup applies)
- :mod:`mocker.live.worker`   — OpenAI-compatible worker process, Prometheus metrics, FPM / KV events
- :mod:`mocker.live.frontend` — OpenAI entry point: discovery, routing, P/D flow, dynamo_frontend_* metrics
- :mod:`mocker.live.loadgen`  — replays a trace or synthetic workload against any OpenAI endpoint
- :mod:`mocker.live.protocol`, :mod:`mocker.live.tokenizer`, :mod:`mocker.live.metrics`,
  :mod:`mocker.live.publish` — request parsing, the deterministic tokenizer, metric and wire definitions
"""

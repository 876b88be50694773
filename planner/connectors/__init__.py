"""Connectors: how the live planner applies a decision and reads the fleet back.

Every connector offers the same small async surface used by :mod:`planner.live.service`:

- ``await start()`` / ``await close()``;
- ``await observe() -> dict[pool, PoolState] | None`` (``None`` = the fleet could not be read);
- ``await apply(targets, decision_id, reason)``;
- ``applied_decision_id() -> int | None`` (VirtualConnector acknowledgements; None = applies directly);
- ``fpm_endpoints() -> dict[endpoint, pool]`` (workers' ForwardPassMetrics streams, when known).

Implementations: :class:`planner.connectors.local.LocalConnector` (starts/stops ``dynoplan mocker
serve`` processes) and :class:`planner.connectors.virtual.VirtualConnector` (an HTTP protocol an
external system implements; client: :class:`planner.connectors.virtual.VirtualConnectorClient`).
"""

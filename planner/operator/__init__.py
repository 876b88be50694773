"""planner.operator: the Kubernetes operator (kopf) that runs one planner loop per DynoPlanner.

Layers (each imports only the ones above it):

- :mod:`~dynoplan.errors`     -- ``OperatorError`` tree (``SpecError`` for invalid resources).
- :mod:`~planner.operator.settings`   -- ``OperatorSettings`` (frozen, validated; env ``DYNOPLAN_OPERATOR_*``).
- :mod:`~planner.operator.spec`       -- parse DGD / DynoPlanner bodies into typed, validated config.
- :mod:`~planner.operator.reconcile`  -- pure, level-triggered functions: desired children of a DGD, the
  DGD status from its Deployments, replica merge patches, the shared GPU budget division.
- :mod:`~planner.operator.kube`       -- the only module that talks to the Kubernetes API.
- :mod:`~planner.operator.loop`       -- one planner loop (observe -> ``Planner.tick`` -> act -> status);
  traffic from :mod:`planner.sources.prometheus`, the workers' FPM from :mod:`planner.sources.fpm`.
- :mod:`~planner.operator.handlers`   -- kopf handlers that only translate (built into a registry).

``planner.core`` stays pure: only this package imports kopf and kubernetes.
"""

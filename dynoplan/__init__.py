"""The foundation every dynoplan package builds on: the exception tree (:mod:`dynoplan.errors`), the
declarative settings base (:mod:`dynoplan.settings`) and the ForwardPassMetrics wire record the engines emit and
the planner reads (:mod:`dynoplan.fpm`). It imports nothing from ``mocker`` or ``planner``."""

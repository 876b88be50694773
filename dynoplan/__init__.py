"""The foundation every dynoplan package builds on: the exception tree (:mod:`dynoplan.errors`) and the
declarative settings base (:mod:`dynoplan.settings`). It imports nothing from ``mocker`` or ``planner``."""

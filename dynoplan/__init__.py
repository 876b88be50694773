"""The foundation every dynoplan package builds on: the exception tree (:mod:`dynoplan.errors`), the
declarative settings base (:mod:`dynoplan.settings`) and the ForwardPassMetrics wire record the engines emit and
the planner reads (:mod:`dynoplan.fpm`). It imports nothing from ``mocker`` or ``planner``.

Importing it sets one process default before numpy is imported (``mocker`` and ``planner`` import this package
first): ``OPENBLAS_NUM_THREADS=1`` unless the environment already sets it. numpy's and scipy's OpenBLAS start a
thread per core when they are first imported; nothing here does linear algebra large enough to use them (the
engine simulation is single-threaded Python, the predictors fit models of a few dozen points), and starting and
parking those threads cost about 0.07 s of CPU (system time) per process, a tenth of a short replay
(docs/architecture.md "Start-up").
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

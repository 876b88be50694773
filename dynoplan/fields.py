"""Upper bounds shared by the integer settings of every component (engine, fleet, planner).

Kept apart from :mod:`dynoplan.settings` (the validation machinery) so that a settings module states a
field's bound with ``Field(le=MAX_INT64)`` and nothing else.
"""

from __future__ import annotations

MAX_INT64 = 2**63 - 1
"""Largest integer setting accepted where no tighter bound applies (9223372036854775807): the largest
numpy ``int64`` and C ``ssize_t`` on a 64-bit machine. Block, token and point counts reach numpy int64
arrays (the engines' decode look-ahead, :func:`numpy.minimum` against the KV pool), ``collections.deque``
``maxlen`` and ``range``; a larger value fails there with an OverflowError in the middle of a run, or, as a
count no run reaches, silently disables what it gates."""

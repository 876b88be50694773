"""Command-line options given once: the ``dynoplan`` commands' one rule against a repeated single-value option.

argparse's default ``store`` action keeps the last value of an option given twice, silently: ``--config a.yaml
--config b.yaml`` dropped a.yaml, ``--workers 2 --workers 4`` ran 4. :func:`refuse_repeated_options` makes
:class:`GivenOnce` the default action of a parser, so every single-value option is refused when repeated
(argparse's error, one line, exit 2); an option meant to be repeated says so with its own action (``append``:
``--planner-set``, ``--tier-bandwidth``; ``extend``: ``--compare``; ``store_true``). ``planner.cli`` applies it to
every subcommand's parser, ``mocker.arguments.worker_from_argv`` to the worker's. Only argparse is imported here:
``dynoplan --help`` loads this module and nothing else of the commands.
"""

from __future__ import annotations

import argparse
from typing import Any

GIVEN_OPTIONS = "_given_options"
"""Namespace attribute of :class:`GivenOnce`: the destinations of the options given so far in this parse."""


class GivenOnce(argparse.Action):
    """argparse's ``store`` action for an option that may be given once: a second occurrence is argparse's error
    ``argument --trace: given twice ('A' and 'B'), expected it once`` (one line through
    :func:`mocker.arguments.use_one_line_errors`, exit 2) where ``store`` keeps the last value silently
    (``--config a.yaml --config b.yaml`` dropped a.yaml). :func:`refuse_repeated_options` makes it every option's
    default action; repeatable options say so with another action (``append``, ``extend``, ``count``,
    ``store_true``). Which options were given is kept on the namespace (:data:`GIVEN_OPTIONS`), so an option's
    default may be any value."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if self.option_strings:  # a positional argument is consumed once by construction
            given: set[str] = vars(namespace).setdefault(GIVEN_OPTIONS, set())
            if self.dest in given:
                previous = getattr(namespace, self.dest, None)
                raise argparse.ArgumentError(self, f"given twice ({previous!r} and {values!r}), expected it once")
            given.add(self.dest)
        setattr(namespace, self.dest, values)


def refuse_repeated_options(parser: argparse.ArgumentParser) -> None:
    """Make :class:`GivenOnce` the action of every option later added to ``parser`` (and to its argument groups,
    which share its registry) without an explicit action: each single-value option of the ``dynoplan`` commands
    is refused when given twice. Call it before the options are added (``planner.cli`` does, for every
    subcommand's parser and the parsers of their own subcommands; ``mocker.arguments.worker_from_argv`` for the
    worker's)."""
    parser.register("action", None, GivenOnce)
    parser.register("action", "store", GivenOnce)

"""The ``dynoplan`` console command: a thin dispatcher to each subcommand's own module.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported
lazily so that ``dynoplan replay`` does not import the planner's heavy dependencies (and vice versa).
User mistakes (any ``DynoplanError`` / ``DynoplanError``, or a path that cannot be read or created) print one
line to stderr and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import typing
from collections.abc import Sequence
from typing import Any

from dynoplan.errors import DynoplanError
from dynoplan.options import refuse_repeated_options

# name -> (module path, one-line help). Registry only: no import-time side effects.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("mocker.cli_replay", "replay a request trace through a simulated fleet (virtual time)"),
    "mocker": ("mocker.cli_live", "live mocker worker on the wall clock (dynoplan mocker serve ...)"),
    "frontend": ("mocker.live.cli_frontend", "OpenAI frontend: worker discovery, routing, dynamo_frontend_* metrics"),
    "loadgen": ("mocker.live.cli_loadgen", "replay a trace against an OpenAI endpoint and measure client-side latency"),
    "simulate": (
        "planner.cli_simulate",
        "closed loop: a trace through a fleet sized by the planner or a baseline policy",
    ),
    "profile": ("planner.cli_profile", "sweep the simulated engine and write the planner's .npz profile"),
    "up": ("planner.cli_up", "start a local stack from one file: frontend, workers, planner, Prometheus"),
    "planner": ("planner.cli_planner", "the live planner service: ticks, connector, /api/state, dashboard"),
    "operator": ("planner.cli_operator", "Kubernetes operator (kopf): DGD reconciler and one planner per DynoPlanner"),
}


def _user_error_types() -> tuple[type[BaseException], ...]:
    """The errors a user mistake raises: the root of the project's exception tree (dynoplan.errors)."""
    return (DynoplanError,)


_PATH_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
"""OSErrors that name a user-given path (``filename`` set); anything else is a bug and keeps its traceback."""


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse that reports a bad flag or value as one line on stderr (exit 2), without the usage dump, and refuses
    a single-value option given twice (:func:`dynoplan.options.refuse_repeated_options`). Every subcommand's parser
    is one (argparse makes a subparser of its parent's class), and so are the parsers of their own subcommands
    (``mocker serve``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        refuse_repeated_options(self)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _chosen_subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top-level parser takes no
    option but ``-h``), or None when there is none (``dynoplan``, ``dynoplan --help``)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``dynoplan`` parser. With ``argv`` given, only the subcommand it names imports its module and
    registers its flags (the others are listed by name and help only), so ``dynoplan replay --help`` does
    not import the planner, the operator or the live stack; with ``argv`` None, every subcommand's flags."""
    chosen = None if argv is None else _chosen_subcommand(argv)
    parser = _OneLineErrorParser(
        prog="dynoplan",
        allow_abbrev=False,
        description="SLA-driven autoscaler for LLM serving, and its engine simulator.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (mod, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(
            name, help=help_text, description=help_text, allow_abbrev=False
        )  # --mode is not --model-config
        p.set_defaults(_module=mod, _parser=p)
        if argv is None or name == chosen:
            importlib.import_module(mod).add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    process_entry = argv is None
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand that was given them (its name and --help), not by the top level
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # Called as the process's entry point (the console script): a subcommand may end the process itself once
    # its output is complete, skipping the interpreter's teardown (mocker.cli_replay.exit_without_teardown).
    args._exit_process = process_entry
    errors = _user_error_types()
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except KeyboardInterrupt:
        print("dynoplan: interrupted", file=sys.stderr)
        return 130
    except errors as e:  # a user mistake: one clear line, no traceback
        print(f"dynoplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except _PATH_ERRORS as e:
        if e.filename is None:
            raise
        # A path the user gave that cannot be read or created (e.g. --out under a missing or read-only
        # directory): one line naming the path. Subcommands that can save their result elsewhere should
        # catch this themselves first.
        print(f"dynoplan {args.command}: error: {e.filename}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``dynoplan planner`` (the dispatcher's module for it): see :mod:`planner.cli_up`."""

from planner.cli_up import add_planner_arguments as add_arguments
from planner.cli_up import run_planner as run

__all__ = ["add_arguments", "run"]

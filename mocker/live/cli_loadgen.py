"""``dynoplan loadgen`` (the dispatcher's module for it): see :mod:`mocker.cli_live`."""

from mocker.cli_live import add_loadgen_arguments as add_arguments
from mocker.cli_live import run_loadgen as run

__all__ = ["add_arguments", "run"]

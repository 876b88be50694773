"""The ``dynoplan`` dispatcher (planner/cli.py): a path error escaping a subcommand is one line, exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from dynoplan.options import GivenOnce
from planner import cli

FAKE = """
import errno, os

def add_arguments(p):
    p.add_argument("--out", required=True)
    p.add_argument("--kind", default="path")

def run(args):
    if args.kind == "path":
        os.makedirs(args.out)  # the real OSError, as an unwritable --out raises it
    raise OSError(errno.EIO, "I/O error")  # no filename: a bug, not a user path
"""


@pytest.fixture()
def fake_subcommand(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "fake_sub_for_dispatch.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "SUBCOMMANDS", {"fake": ("fake_sub_for_dispatch", "test")})
    yield tmp_path
    sys.modules.pop("fake_sub_for_dispatch", None)


def test_unwritable_path_is_one_line_exit_2(fake_subcommand: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = fake_subcommand / "a_file"
    blocker.write_text("x")
    target = blocker / "out"  # a directory under a regular file: NotADirectoryError / FileExistsError
    assert cli.main(["fake", "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"dynoplan fake: error: {target}: ")
    assert "Not a directory" in err or "File exists" in err


def test_oserror_without_path_keeps_its_traceback(fake_subcommand: Path) -> None:
    with pytest.raises(OSError, match="I/O error"):
        cli.main(["fake", "--out", str(fake_subcommand / "new"), "--kind", "other"])


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of every subcommand of ``parser``, their own subcommands included (mocker serve)."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield (*path, name), sub
                yield from _parsers(sub, (*path, name))


CANDIDATES = ("2", "0.5", "agg", "http://127.0.0.1:9", "a.yaml", "1,2", "128,512", "0.01,0.1", "x")
"""Texts tried, in this order, for a value an option's type and choices accept."""


def _valid_value(action: argparse.Action) -> tuple[str, object]:
    """(text, parsed value) of a value ``action`` accepts: its first choice, else the first candidate its type takes."""
    if action.choices:
        text = str(next(iter(action.choices)))
        return text, text
    for text in CANDIDATES:
        try:
            return text, action.type(text) if callable(action.type) else text
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
    raise AssertionError(f"no candidate value for {action.option_strings}")


def _single_value_options():
    out = []
    for path, parser in _parsers(cli.build_parser()):
        for a in parser._actions:
            if isinstance(a, GivenOnce):
                out.append(pytest.param(path, a.option_strings, id=" ".join((*path, a.option_strings[0]))))
    return out


REPEATABLE = (argparse._AppendAction, argparse._ExtendAction, argparse._StoreTrueAction, argparse._StoreConstAction)
"""The other actions of the commands' options: repeatable on purpose (a list, or a switch) -- and help."""


def test_every_option_of_every_subcommand_is_given_once_or_repeatable_on_purpose() -> None:
    kinds = {}
    for path, parser in _parsers(cli.build_parser()):
        for a in parser._actions:
            if a.option_strings and not isinstance(a, (GivenOnce, argparse._HelpAction)):
                assert isinstance(a, REPEATABLE), (path, a.option_strings, type(a))
                if isinstance(a, (argparse._AppendAction, argparse._ExtendAction)):
                    kinds[(*path, a.option_strings[0])] = type(a).__name__
    # the lists: repeatable by design (each occurrence adds)
    assert kinds == {
        ("replay", "--tier-bandwidth"): "_AppendAction",
        ("simulate", "--compare"): "_ExtendAction",
        ("simulate", "--planner-set"): "_AppendAction",
    }


@pytest.mark.parametrize(("path", "flags"), _single_value_options())
def test_a_single_value_option_given_twice_is_refused_naming_both_values(
    path: tuple[str, ...], flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # was: the last value kept silently (--config a.yaml --config b.yaml dropped a.yaml; --workers, --out, ...)
    parser = dict(_parsers(cli.build_parser()))[path]
    action = next(a for a in parser._actions if a.option_strings == flags)
    text, value = _valid_value(action)
    with pytest.raises(SystemExit) as e:
        cli.main([*path, flags[0], text, flags[-1], text])
    cap = capsys.readouterr()
    assert (e.value.code, cap.out) == (2, "")
    see = "--help" if path[0] not in ("up", "planner", "operator") else f"dynoplan {path[0]} --help"
    assert cap.err == (
        f"dynoplan {' '.join(path)}: error: argument {'/'.join(flags)}: given twice ({value!r} and {value!r}), "
        f"expected it once (see {see})\n"
    )

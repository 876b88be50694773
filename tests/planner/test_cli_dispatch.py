"""The ``dynoplan`` dispatcher (planner/cli.py): a path error escaping a subcommand is one line, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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

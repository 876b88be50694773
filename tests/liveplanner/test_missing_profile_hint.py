"""A stack whose profile is missing says how to make it: the ``dynoplan profile`` command of docs/local-stack.md,
which the README's "Local stack" section shows before ``dynoplan up`` too."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from dynoplan.errors import ConfigError
from planner.cli import main as cli_main
from planner.live.config import load_stack_config

ROOT = Path(__file__).resolve().parents[2]


def _doc_command(path: Path) -> str:
    """The ``dynoplan profile ...`` command of a Markdown file's code block (continuation lines joined,
    the trailing comment dropped)."""
    text = path.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("dynoplan profile "))
    return " ".join(line.split("#")[0].split())


@pytest.fixture
def fresh_clone(tmp_path, monkeypatch):
    """examples/stack.yaml in a directory without out/, as in a fresh clone; the current directory its root."""
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "stack.yaml", tmp_path / "examples" / "stack.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_missing_profile_names_the_docs_profile_command(fresh_clone):
    doc = _doc_command(ROOT / "docs" / "local-stack.md")
    assert doc == (
        "dynoplan profile --out out/stack-profile.npz --speedup-ratio 20 --num-gpu-blocks 2048 --block-size 16 "
        "--trace-block-size 16"
    )
    with pytest.raises(ConfigError) as e:
        load_stack_config("examples/stack.yaml")
    assert f'profile="{fresh_clone / "out" / "stack-profile.npz"}": file not found (make it with: {doc})' in (
        e.value.problems
    )


def test_up_on_a_fresh_clone_is_one_line_exit_2_with_the_command(fresh_clone, capsys):
    rc = cli_main(["up", "--config", "examples/stack.yaml"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.endswith(f"file not found (make it with: {_doc_command(ROOT / 'docs' / 'local-stack.md')})\n")
    assert len(err.splitlines()) == 1


def test_readme_makes_the_profile_before_up():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Local stack", 1)[1].split("\n## ", 1)[0]
    assert _doc_command(ROOT / "README.md") == _doc_command(ROOT / "docs" / "local-stack.md")
    assert re.search(r"dynoplan profile .*\n.*\ndynoplan up --config examples/stack.yaml", section)


def test_command_leaves_out_worker_flags_dynoplan_profile_does_not_take(tmp_path, monkeypatch):
    stack = tmp_path / "s.yaml"
    stack.write_text(
        "planner: {mode: agg}\nprofile: p.npz\n"
        'fleet: {worker_args: {agg: ["--speedup-ratio", "20", "--fpm-endpoint", "off", "--block-size=16"]}}\n'
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_stack_config(stack)
    assert (
        f'profile="{tmp_path / "p.npz"}": file not found (make it with: dynoplan profile --out p.npz '
        "--speedup-ratio 20 --block-size=16)"
    ) in e.value.problems

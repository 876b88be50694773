"""One grammar for every settings input (dynoplan/settings_text.py): the same bad value given to every entry
point -- a planner ``--config`` file, ``--planner-set``, the operator's planner defaults file, an
``--engine-config`` file of replay / simulate / profile / mocker serve, a ``dynoplan up`` stack file and the
operator's environment -- gets the same problem line (only the source in front differs) and exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.cli import main as cli_main
from tests.sim.cli_helpers import TRACE

# (what the user wrote, the kind of setting it is given to, the problem after "<field>")
BAD_VALUES = [
    ("1e3", "int", "=1000.0: expected an integer"),
    ("2.5", "int", "=2.5: expected an integer"),
    ("0x10", "int", '="0x10": expected an integer'),
    ("0o17", "int", '="0o17": expected an integer'),
    ("1_000", "int", '="1_000": expected an integer'),
    ('"8090"', "int", '="8090": expected an integer'),
    ("2023-01-01", "float", '="2023-01-01": expected a number'),
    ("12:30", "float", '="12:30": expected a number'),
    ("null", "float", "=null: expected a number"),
    ("1", "bool", "=1: expected a boolean (true/false)"),
    ("yes", "bool", '="yes": expected a boolean (true/false)'),
    ("off", "bool", '="off": expected a boolean (true/false)'),
]

PLANNER = {"int": "predictor_min_points", "float": "adjustment_interval_s", "bool": "load_enabled"}
ENGINE = {"int": "num_gpu_blocks", "float": "speedup_ratio", "bool": "enable_prefix_caching"}
STACK = {"int": "service.port", "float": "frontend.poll_s", "bool": "fpm"}
OPERATOR = {"int": "health_port", "float": "dgd_resync_s", "bool": "standalone"}

STACK_BASE = "planner:\n  throughput_enabled: false\n  load_enabled: true\n"
"""A stack file that is valid on its own (no profile needed), so the line holds only the problem under test."""


def _yaml(dotted: str, value: str) -> str:
    """``a.b: v`` as nested YAML."""
    *heads, last = dotted.split(".")
    out = "".join(f"{'  ' * i}{h}:\n" for i, h in enumerate(heads))
    return out + f"{'  ' * len(heads)}{last}: {value}\n"


def _file(tmp_path: Path, text: str, name: str = "settings.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = cli_main(list(argv))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


def _simulate(*extra: str) -> list[str]:
    return ["simulate", "--trace", TRACE, "--quiet", "--compare", "static:1", *extra]


def _operator(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], **env: str) -> str:
    for k in [k for k in os.environ if k.startswith("DYNOPLAN_OPERATOR_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv("DYNOPLAN_OPERATOR_" + k, v)
    return _run(capsys, "operator")


def _entry_points(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """(name, field for a kind, run(field, value text) -> the error line, the line's prefix before the field)."""
    planner_file = lambda f, v: _file(tmp_path, _yaml(f, v))  # noqa: E731
    engine_file = lambda f, v: _file(tmp_path, _yaml(f, v), "engine.yaml")  # noqa: E731
    e = str(tmp_path / "engine.yaml")
    s = str(tmp_path / "settings.yaml")
    return [
        (
            "simulate --config",
            PLANNER,
            lambda f, v: _run(capsys, *_simulate("--config", planner_file(f, v))),
            f"dynoplan simulate: error: --config {s}: ",
        ),
        (
            "simulate --planner-set",
            PLANNER,
            lambda f, v: _run(capsys, *_simulate("--planner-set", f"{f}={v}")),
            "dynoplan simulate: error: --planner-set ",
        ),
        (
            "operator planner defaults file",
            PLANNER,
            lambda f, v: _operator(monkeypatch, capsys, PLANNER_DEFAULTS_FILE=planner_file(f, v)),
            f"dynoplan operator: error: {s}: ",
        ),
        (
            "replay --engine-config",
            ENGINE,
            lambda f, v: _run(capsys, "replay", "--trace", TRACE, "--engine-config", engine_file(f, v)),
            f"dynoplan replay: error: --engine-config {e}: ",
        ),
        (
            "simulate --engine-config",
            ENGINE,
            lambda f, v: _run(capsys, *_simulate("--engine-config", engine_file(f, v))),
            f"dynoplan simulate: error: --engine-config {e}: ",
        ),
        (
            "profile --engine-config",
            ENGINE,
            lambda f, v: _run(
                capsys, "profile", "--engine-config", engine_file(f, v), "--out", str(tmp_path / "p.npz")
            ),
            f"dynoplan profile: error: --engine-config {e}: ",
        ),
        (
            "mocker serve --engine-config",
            ENGINE,
            lambda f, v: _run(capsys, "mocker", "serve", "--engine-config", engine_file(f, v)),
            f"dynoplan mocker: error: --engine-config {e}: ",
        ),
        (
            "up --config",
            STACK,
            lambda f, v: _run(
                capsys, "up", "--config", _file(tmp_path, STACK_BASE + _yaml(f, v)), "--state-dir", str(tmp_path / "st")
            ),
            f"dynoplan up: error: {s}: ",
        ),
        (
            "operator environment",
            OPERATOR,
            lambda f, v: _operator(monkeypatch, capsys, **{f.upper(): v}),
            "dynoplan operator: error: operator settings: ",
        ),
    ]


ENTRY_POINTS = [
    "simulate --config",
    "simulate --planner-set",
    "operator planner defaults file",
    "replay --engine-config",
    "simulate --engine-config",
    "profile --engine-config",
    "mocker serve --engine-config",
    "up --config",
    "operator environment",
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("value, kind, problem", BAD_VALUES, ids=[v for v, _, _ in BAD_VALUES])
def test_every_entry_point_refuses_the_same_value_with_the_same_line(
    tmp_path, capsys, monkeypatch, entry, value, kind, problem
):
    name, fields, run, prefix = next(x for x in _entry_points(tmp_path, capsys, monkeypatch) if x[0] == entry)
    field = fields[kind]
    assert run(field, value) == prefix + field + problem


NULLABLE = {"simulate --config": "sla_attainment_target", "simulate --planner-set": "sla_attainment_target"}
NULLABLE |= {"operator planner defaults file": "sla_attainment_target", "replay --engine-config": "gpu_memory_fraction"}
NULLABLE |= {"simulate --engine-config": "gpu_memory_fraction", "profile --engine-config": "gpu_memory_fraction"}
"""A setting of type ``float | None`` at each entry point that has one (null = off, or derived)."""


@pytest.mark.parametrize("entry", sorted(NULLABLE))
def test_a_number_that_may_be_null_says_so(tmp_path, capsys, monkeypatch, entry):
    # `off` is YAML 1.2 text, not false: refused as a number, and the line names null as the other way
    name, _, run, prefix = next(x for x in _entry_points(tmp_path, capsys, monkeypatch) if x[0] == entry)
    assert run(NULLABLE[entry], "off") == prefix + NULLABLE[entry] + '="off": expected a number or null'
    # out of bounds is not a type error: the bound alone (and for the attainment target, why it is there)
    bound = "<= 1.0" if NULLABLE[entry] == "gpu_memory_fraction" else f"<= 0.9999 ({WHY})"
    assert run(NULLABLE[entry], "2") == prefix + NULLABLE[entry] + f"=2: expected {bound}"


WHY = (
    "the sizing judges each candidate fleet on at least 2 z^2 / (1 - target) simulated requests: 54,119 at 0.9999, "
    "ten times more for each further nine"
)
"""Why the attainment target stops at four nines, as every error line about it says."""


@pytest.mark.parametrize("value", ["0.99999", "0.999999999", "1"])
def test_the_attainment_target_is_at_most_four_nines_at_every_entry_point(tmp_path, capsys, monkeypatch, value):
    # was: 0.99999 took 61 s and 1.9 GB, 0.999999 many minutes at 10 GB, 0.999999999 a numpy MemoryError traceback
    # (the sample of 2 z^2 / (1 - target) requests per look: 541,176, 5.4 million, 5.4 billion)
    f = "sla_attainment_target"
    s = _file(tmp_path, _yaml(f, value))
    for entry, prefix in (
        ("simulate --config", f"dynoplan simulate: error: --config {s}: "),
        ("simulate --planner-set", "dynoplan simulate: error: --planner-set "),
        ("operator planner defaults file", f"dynoplan operator: error: {s}: "),
    ):
        run = next(x for x in _entry_points(tmp_path, capsys, monkeypatch) if x[0] == entry)[2]
        assert run(f, value) == f"{prefix}{f}={value}: expected <= 0.9999 ({WHY})", entry
    # the other spellings of --planner-set, and the whole stack file of up / the live planner
    assert _run(capsys, *_simulate("--planner-set", f"sla-attainment-target={value}")) == (
        f"dynoplan simulate: error: --planner-set {f}={value}: expected <= 0.9999 ({WHY})"
    )
    stack = _file(tmp_path, f"planner:\n  throughput_enabled: false\n  load_enabled: true\n  {f}: {value}\n")
    for cmd in ("up", "planner"):
        assert _run(capsys, cmd, "--config", stack, "--state-dir", str(tmp_path / "st")) == (
            f"dynoplan {cmd}: error: {stack}: planner.{f}={value}: expected <= 0.9999 ({WHY})"
        )
    # the flag and the planner: variants read the text themselves (off is a value there)
    for key in ("attainment_target", f):
        assert _run(capsys, *_simulate("--compare", f"planner:{key}={value}")) == (
            f"dynoplan simulate: error: policy 'planner:{key}={value}': {key}={value!r}: expected a share "
            f"0 < F <= 0.9999 or off ({WHY})"
        )
    with pytest.raises(SystemExit) as e:
        cli_main(_simulate("--attainment-target", value))
    cap = capsys.readouterr()
    assert (e.value.code, cap.out) == (2, "")
    assert cap.err == (
        f"dynoplan simulate: error: argument --attainment-target: {value!r}: expected a share 0 < F <= 0.9999 or "
        f"off ({WHY}) (see --help)\n"
    )


def test_an_attainment_target_of_four_nines_is_accepted_everywhere(tmp_path):
    from planner.arguments import attainment_text
    from planner.core import config_from_mapping

    assert config_from_mapping({"sla_attainment_target": 0.9999}).sla_attainment_target == 0.9999
    assert config_from_mapping({"sla_attainment_target": "0.9999"}, cli=True).sla_attainment_target == 0.9999
    assert attainment_text("0.9999") == 0.9999


@pytest.mark.parametrize(
    "entry", [e for e in ENTRY_POINTS if e not in ("simulate --planner-set", "operator environment")]
)
def test_every_settings_file_refuses_a_key_given_twice_naming_both_lines(tmp_path, capsys, monkeypatch, entry):
    name, fields, run, prefix = next(x for x in _entry_points(tmp_path, capsys, monkeypatch) if x[0] == entry)
    field = fields["int"]
    *heads, last = field.split(".")
    # the key given twice inside the deepest mapping: "service:\n  port: 4\n  port: 8\n"
    text = _yaml(field, "4") + f"{'  ' * len(heads)}{last}: 8\n"
    first = (STACK_BASE.count("\n") if entry == "up --config" else 0) + len(heads) + 1
    line = run_text(run, entry, tmp_path, capsys, monkeypatch, text)
    assert line == (
        prefix + f"line {first + 1}: duplicate key {field!r} (first at line {first}), expected each setting once"
    )


def run_text(run, entry, tmp_path, capsys, monkeypatch, text):
    """Run ``entry`` on the whole settings ``text`` (not one field)."""
    if entry == "up --config":
        return _run(capsys, "up", "--config", _file(tmp_path, STACK_BASE + text), "--state-dir", str(tmp_path / "st"))
    if entry.endswith("--engine-config"):
        path = _file(tmp_path, text, "engine.yaml")
        argv = {
            "replay --engine-config": ["replay", "--trace", TRACE, "--engine-config", path],
            "simulate --engine-config": _simulate("--engine-config", path),
            "profile --engine-config": ["profile", "--engine-config", path, "--out", str(tmp_path / "p.npz")],
            "mocker serve --engine-config": ["mocker", "serve", "--engine-config", path],
        }[entry]
        return _run(capsys, *argv)
    path = _file(tmp_path, text)
    if entry == "simulate --config":
        return _run(capsys, *_simulate("--config", path))
    return _operator(monkeypatch, capsys, PLANNER_DEFAULTS_FILE=path)


def test_a_stack_file_refuses_a_key_given_twice_at_the_top_level(tmp_path, capsys):
    path = _file(tmp_path, STACK_BASE + "connector: local\nconnector: virtual\n")
    line = _run(capsys, "up", "--config", path, "--state-dir", str(tmp_path / "st"))
    assert line == (
        f"dynoplan up: error: {path}: line 5: duplicate key 'connector' (first at line 4), expected each setting once"
    )


def test_planner_set_key_value_mistakes(capsys):
    assert _run(capsys, *_simulate("--planner-set", "ttft_ms=100", "--planner-set", "ttft-ms=200")) == (
        "dynoplan simulate: error: --planner-set ttft-ms=200: ttft-ms given twice (first ttft_ms=100), "
        "expected each setting once"
    )
    assert _run(capsys, *_simulate("--planner-set", "=5")) == (
        "dynoplan simulate: error: --planner-set '=5': expected KEY=VALUE"
    )
    assert _run(capsys, *_simulate("--planner-set", "ttft_ms")) == (
        "dynoplan simulate: error: --planner-set 'ttft_ms': expected KEY=VALUE"
    )
    # argv keeps bytes that are not UTF-8 as lone surrogates (os.fsdecode); the line names the key
    assert _run(capsys, *_simulate("--planner-set", "ttft_ms=" + "\udcff")) == (
        "dynoplan simulate: error: --planner-set ttft_ms: byte 0xff at offset 0: expected UTF-8 text"
    )
    # the did-you-mean of a dotted key, as the same key under an agg: section of a file gets it
    assert _run(capsys, *_simulate("--planner-set", "agg.max_replica=2")) == (
        "dynoplan simulate: error: --planner-set agg.max_replica=2: unknown setting (did you mean agg.max_replicas?)"
    )


def test_planner_file_unknown_pool_key_has_the_same_did_you_mean(tmp_path, capsys):
    path = _file(tmp_path, "agg:\n  max_replica: 2\n")
    assert _run(capsys, *_simulate("--config", path)) == (
        f"dynoplan simulate: error: --config {path}: agg.max_replica: unknown setting (did you mean agg.max_replicas?)"
    )


def test_one_invalid_list_item_is_one_problem(tmp_path, capsys):
    path = _file(tmp_path, "auto_candidates: [foo]\n")
    assert _run(capsys, *_simulate("--config", path)) == (
        f'dynoplan simulate: error: --config {path}: auto_candidates.0="foo": expected one of '
        "'constant', 'arima', 'kalman' or 'prophet'"
    )
    # an empty list is too short, and says so
    path = _file(tmp_path, "auto_candidates: []\n")
    assert _run(capsys, *_simulate("--config", path)) == (
        f"dynoplan simulate: error: --config {path}: auto_candidates=[]: expected at least 1 items"
    )


def test_engine_section_problems_carry_the_section_prefix(tmp_path, capsys):
    path = _file(tmp_path, "engine: {block_size: 16, bogus: 1, num_gpu_block: 8}\n", "engine.yaml")
    assert _run(capsys, "replay", "--trace", TRACE, "--engine-config", path) == (
        f"dynoplan replay: error: --engine-config {path}: engine.bogus: unknown setting; "
        "engine.num_gpu_block: unknown setting (did you mean engine.num_gpu_blocks?)"
    )


def test_nullable_fields_are_the_fields_typed_with_none_nested_ones_by_their_dotted_path():
    from dynoplan.settings import nullable_fields
    from mocker.config import EngineConfig
    from planner.core.config import PlannerConfig

    assert nullable_fields(PlannerConfig) == {
        "sla_attainment_target",
        "early_sizing_s",
        "agg.max_replicas",
        "prefill.max_replicas",
        "decode.max_replicas",
    }
    assert nullable_fields(EngineConfig) == {"block_size", "gpu_memory_fraction", "kv_bytes_per_token"}
    assert nullable_fields(int) == frozenset()  # not a settings class: none

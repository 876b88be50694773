"""Trace fields a reader would otherwise resolve silently: a CSV column named twice, a JSON field given twice
in one object, a field together with its alias. Each is refused with one line naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynoplan.errors import TraceError
from mocker.traces import load_trace
from planner.cli import main as cli_main

ROW = '{"timestamp": %d, "input_length": 10, "output_length": 3}'


def _refusal(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as e:
        load_trace(path)
    return str(e.value).replace(str(path), name)


def test_csv_column_named_twice_is_refused(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens,contexttokens\n2023-11-16 18:15:46.680590,10,5,7\n"
    assert _refusal(tmp_path, "t.csv", text) == (
        "t.csv:1: field 'ContextTokens' column given 2 times in the header (columns 2, 4 of "
        "'TIMESTAMP,ContextTokens,GeneratedTokens,contexttokens'), expected each column once"
    )


@pytest.mark.parametrize(
    "row, message",
    [
        (
            '{"timestamp": 1, "input_length": 10, "input_length": 20, "output_length": 3}',
            "field 'input_length' given 2 times in the object, expected each field once",
        ),
        (  # the last value invalid: still the duplicate that is named
            '{"timestamp": 1, "input_length": 10, "output_length": 3, "output_length": null}',
            "field 'output_length' given 2 times in the object, expected each field once",
        ),
        (
            '{"timestamp": 1, "input_length": 10, "input_tokens": 20, "output_length": 3}',
            "field 'input_length' given twice, as 'input_length' and its alias 'input_tokens': expected one of them",
        ),
        (
            '{"created_time": 1, "timestamp": 1, "input_length": 10, "output_length": 3}',
            "field 'timestamp' given twice, as 'timestamp' and its alias 'created_time': expected one of them",
        ),
        (
            '{"timestamp": 1, "input_tokens": 10, "output_tokens": 3, "output_length": 3, "hash_ids": [4]}',
            "field 'output_length' given twice, as 'output_length' and its alias 'output_tokens': expected one of them",
        ),
        (  # an alias given twice, in a row that has another string key
            '{"created_time": 1, "input_tokens": 10, "output_length": 3, "input_tokens": 9, "note": "x"}',
            "field 'input_tokens' given 2 times in the object, expected each field once",
        ),
        (  # malformed otherwise (a string length): the duplicate is named first
            '{"timestamp": 1, "input_length": "ten", "output_length": 3, "timestamp": 2}',
            "field 'timestamp' given 2 times in the object, expected each field once",
        ),
    ],
)
def test_jsonl_field_twice_or_with_its_alias_is_refused_on_its_line(tmp_path, row, message):
    text = "\n".join([ROW % 0, "", row, ROW % 2]) + "\n"
    assert _refusal(tmp_path, "t.jsonl", text) == f"t.jsonl:3: {message}"


def test_jsonl_field_names_inside_values_and_nested_objects_are_not_duplicates(tmp_path):
    rows = [
        '{"timestamp": 0, "input_length": 10, "output_length": 3, "note": "input_length"}',
        '{"timestamp": 1, "input_length": 11, "output_length": 4, "meta": {"input_length": 1, "input_length": 2}}',
        '{"timestamp": 2, "input_length": 12, "output_length": 5, "hash_ids": null}',
        '{"created_time": 3, "input_tokens": 13, "output_tokens": 6, "hash_ids": [7]}',
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(rows) + "\n")
    got = [(r.arrival_ms, r.input_length, r.output_length, r.hash_ids) for r in load_trace(path)]
    assert got == [(0, 10, 3, None), (1, 11, 4, None), (2, 12, 5, None), (3, 13, 6, (7,))]


def test_simulate_refuses_a_field_with_its_alias_in_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "input_tokens": 20, "output_length": 3}\n')
    rc = cli_main(["simulate", "--trace", str(path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == (
        f"dynoplan simulate: error: {path}:1: field 'input_length' given twice, as 'input_length' and its alias "
        "'input_tokens': expected one of them\n"
    )

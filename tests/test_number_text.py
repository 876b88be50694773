"""One number grammar for settings text and typed flags (dynoplan.fields INT_TEXT / FLOAT_TEXT).

A flag used to go through Python's int()/float(), which take ``1_000``, surrounding whitespace, ``inf``
and non-ASCII digits; a settings file took none of them. The cases are hand-listed; the properties
check that every int and every finite float Python writes is read back exactly, and that a flag and a
settings value read the same text the same way.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynoplan.fields import float_text, int_text
from dynoplan.settings_text import scalar
from mocker.arguments import nonneg_float, nonneg_int, positive_float, positive_int, positive_seconds


@pytest.mark.parametrize(
    ("text", "value"), [("0", 0), ("12", 12), ("+7", 7), ("-3", -3), ("007", 7), ("9223372036854775807", 2**63 - 1)]
)
def test_integers_read(text: str, value: int) -> None:
    assert int_text(text) == value
    assert scalar(text) == value and type(scalar(text)) is int


@pytest.mark.parametrize("text", ["1_000", "12\u00a0", "١٢", "１２", "0x10", "1e3", "1.0", "", "+", "12a"])
def test_not_integers(text: str) -> None:
    with pytest.raises(ValueError, match="is not an integer"):
        int_text(text)
    assert type(scalar(text)) is not int


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e3", 1000.0),
        (".5", 0.5),
        ("-2.", -2.0),
        ("3", 3.0),
        ("1.5E-2", 0.015),
        (".inf", math.inf),
        ("-.Inf", -math.inf),
    ],
)
def test_numbers_read(text: str, value: float) -> None:
    assert float_text(text) == value
    assert scalar(text) == value


@pytest.mark.parametrize("text", ["1_000.5", "inf", "nan", "Infinity", "1.5\u00a0", "١٫٥", "1e", "e3", ".", "0x1p3"])
def test_not_numbers(text: str) -> None:
    with pytest.raises(ValueError, match="is not a number"):
        float_text(text)
    assert not isinstance(scalar(text), float)


def test_nan_text_reads_as_nan() -> None:
    assert math.isnan(float_text(".nan")) and math.isnan(scalar(".nan"))


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_every_int_python_writes_is_read_back(i: int) -> None:
    assert int_text(str(i)) == i
    assert float_text(str(i)) == float(i)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_float_python_writes_is_read_back(f: float) -> None:
    assert float_text(repr(f)) == f


@pytest.mark.parametrize("flag_type", [positive_int, nonneg_int])
@pytest.mark.parametrize("text", ["1_000", "١٢", "\u200312", "1e3"])
def test_integer_flags_take_the_settings_grammar_only(flag_type: object, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        flag_type(text)  # type: ignore[operator]


@pytest.mark.parametrize("flag_type", [positive_float, nonneg_float, positive_seconds])
@pytest.mark.parametrize("text", ["1_000", "١٢", "inf", "nan"])
def test_number_flags_take_the_settings_grammar_only(flag_type: object, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        flag_type(text)  # type: ignore[operator]


def test_number_flags_still_take_what_settings_take() -> None:
    assert positive_int(" 12\t") == 12 == scalar(" 12\t")
    assert positive_int("12") == 12 and nonneg_int("0") == 0
    assert positive_float("1e3") == 1000.0 and nonneg_float("0") == 0.0 and positive_seconds(".5") == 0.5


def test_replay_refuses_an_underscored_worker_count_in_one_line() -> None:
    p = subprocess.run(
        [str(Path(sys.executable).with_name("dynoplan")), "replay", "--trace", "x.csv", "--workers", "1_000"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers" in lines[0] and "'1_000'" in lines[0], p.stderr

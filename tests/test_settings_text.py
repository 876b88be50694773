"""dynoplan/settings_text.py: the settings loader (YAML 1.2 core scalars, duplicate keys refused), the
command-line scalar and ``KEY=VALUE`` readers, and the YAML/JSON spelling of problem lines."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dynoplan.errors import ConfigError
from dynoplan.settings import spell
from dynoplan.settings_text import assignments, field_kinds, load_file, load_text, scalar, text_value


@pytest.mark.parametrize(
    "text, value",
    [
        # YAML 1.2 core: booleans, null, decimal integers, floats with or without a dot or exponent sign
        ("true", True),
        ("False", False),
        ("TRUE", True),
        ("null", None),
        ("~", None),
        ("", None),
        ("42", 42),
        ("-7", -7),
        ("007", 7),
        ("1e3", 1000.0),
        ("1.0e+3", 1000.0),
        ("-2.5E-1", -0.25),
        (".5", 0.5),
        ("3.", 3.0),
        (".inf", math.inf),
        ("-.inf", -math.inf),
        # text, where PyYAML's YAML 1.1 reads something else
        ("yes", "yes"),
        ("off", "off"),
        ("0x10", "0x10"),
        ("0o17", "0o17"),
        ("1_000", "1_000"),
        ("12:30", "12:30"),
        ("2023-01-01", "2023-01-01"),
        ("2023-01-01T10:00:00Z", "2023-01-01T10:00:00Z"),
        # a quoted scalar is text
        ('"8090"', "8090"),
        ("'true'", "true"),
        # not one scalar: kept as typed, for the validation to name
        ("[1, 2]", "[1, 2]"),
        ("a: b", "a: b"),
        ("[1", "[1"),
    ],
)
def test_scalar_reads_yaml_1_2_core_scalars(text, value):
    assert scalar(text) == value and type(scalar(text)) is type(value)


def test_nan_is_a_float():
    assert math.isnan(scalar(".nan"))


def test_text_value_keeps_text_for_text_settings_and_splits_lists():
    assert text_value("off", "Mode") == "off"
    assert text_value("123", "str") == "123"
    assert text_value("constant, kalman", "tuple") == ["constant", "kalman"]
    assert text_value(" 1e3 ", "int") == 1000.0  # refused later by the integer setting, as in a file
    assert text_value("1", "bool") == 1


def test_an_empty_list_item_is_kept_for_the_validation_to_refuse():
    # dropped before: auto_candidates=constant,,kalman or a trailing comma passed as a shorter list
    assert text_value("constant,,kalman", "tuple") == ["constant", "", "kalman"]
    assert text_value("constant,", "tuple") == ["constant", ""]
    assert text_value("", "tuple") == [] and text_value(" ", "tuple") == []


def test_duplicate_keys_name_the_dotted_key_and_both_lines():
    text = "service:\n  host: x\n  port: 0\n  port: 1\n"
    with pytest.raises(ConfigError) as e:
        load_text(text, "f.yaml")
    assert str(e.value) == "f.yaml: line 4: duplicate key 'service.port' (first at line 3), expected each setting once"
    # inside a list of mappings: the item index is part of the path
    with pytest.raises(ConfigError) as e:
        load_text("pools:\n- name: a\n  name: b\n", "f.yaml")
    assert str(e.value) == "f.yaml: line 3: duplicate key 'pools.0.name' (first at line 2), expected each setting once"
    # JSON is YAML: the same rule
    with pytest.raises(ConfigError) as e:
        load_text('{"ttft_ms": 1,\n "ttft_ms": 2}', "f.json")
    assert str(e.value) == "f.json: line 2: duplicate key 'ttft_ms' (first at line 1), expected each setting once"


def test_json_indented_with_tabs_is_read_with_the_same_rules():
    text = '{\n\t"ttft_ms": 1e3,\n\t"agg": {\n\t\t"max_replicas": 2,\n\t\t"max_replicas": 3\n\t}\n}'
    with pytest.raises(ConfigError) as e:
        load_text(text, "f.json")
    assert str(e.value) == (
        "f.json: line 5: duplicate key 'agg.max_replicas' (first at line 4), expected each setting once"
    )
    assert load_text(text.replace(',\n\t\t"max_replicas": 3', ""), "f.json") == {
        "ttft_ms": 1000.0,
        "agg": {"max_replicas": 2},
    }
    # YAML indented with a tab is still a parse error
    with pytest.raises(ConfigError, match=r"^f.yaml: cannot parse settings file at line 2, column 1: found character"):
        load_text("agg:\n\tmax_replicas: 2\n", "f.yaml")


def test_no_timestamps_and_no_merge_keys():
    assert load_text("d: 2023-01-01\nt: 2023-01-01 10:00:00\n", "f") == {"d": "2023-01-01", "t": "2023-01-01 10:00:00"}
    assert load_text("b:\n  <<: {k: 1}\n", "f") == {"b": {"<<": {"k": 1}}}  # a key like any other


def test_aliases_are_refused_so_a_few_bytes_cannot_expand_into_gigabytes():
    laughs = 'a: &a ["lol", "lol", "lol"]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n'
    with pytest.raises(ConfigError) as e:
        load_text(laughs, "f.yaml")
    assert str(e.value) == (
        "f.yaml: cannot parse settings file at line 2, column 8: found the alias *a: aliases are not accepted in "
        "settings files, write the value out; expected a YAML or JSON mapping of setting: value"
    )
    assert load_text("a: &a 1\n", "f") == {"a": 1}  # an anchor alone changes nothing


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("ttft_ms: !!binary AAAA\n", "line 1: ttft_ms: the tag !!binary is not accepted"),
        ("agg:\n  max_replicas: !!timestamp 2023-01-01\n", "line 2: agg.max_replicas: the tag !!timestamp is not"),
        ("s: !!set {a, b}\n", "line 1: s: the tag !!set is not accepted"),
        ("!!omap [a: 1]\n", "line 1: the document: the tag !!omap is not accepted"),
    ],
)
def test_tags_outside_the_core_schema_are_refused_naming_the_key(text, line):
    with pytest.raises(ConfigError) as e:
        load_text(text, "f.yaml")
    assert str(e.value).startswith(f"f.yaml: {line}")
    assert str(e.value).endswith("in settings files, expected a plain value, list or mapping")
    assert load_text("a: !!str 3\nb: !!int 3\n", "f") == {"a": "3", "b": 3}  # core tags stay


def test_a_key_spelled_with_dashes_after_underscores_is_the_same_key_again():
    with pytest.raises(ConfigError) as e:
        load_text("ttft_ms: 300\nttft-ms: 400\n", "f.yaml")
    assert str(e.value) == (
        "f.yaml: line 2: duplicate key 'ttft-ms' (first at line 1 as 'ttft_ms'), expected each setting once"
    )


def test_a_control_character_is_a_parse_error_not_a_traceback():
    with pytest.raises(ConfigError) as e:
        load_text("a: \x7f\n", "f.yaml")
    assert str(e.value) == (
        "f.yaml: cannot parse settings file: unacceptable character #x007f: special characters are not allowed; "
        "expected a YAML or JSON mapping of setting: value"
    )


def test_file_errors_are_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"ttft_ms: caf\xe9\n")
    with pytest.raises(ConfigError) as e:
        load_file(bad, "--config bad.yaml", "config file")
    assert str(e.value) == "--config bad.yaml: cannot read config file: byte 0xe9 at offset 12: expected UTF-8 text"
    bad.write_text("ttft_ms: [1, 2\n")
    with pytest.raises(ConfigError) as e:
        load_file(bad, "s.yaml", "stack file", "YAML (see examples/stack.yaml)")
    assert str(e.value) == (
        "s.yaml: cannot parse stack file at line 2, column 1: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence started at line 1, column 10); expected YAML (see examples/stack.yaml)"
    )
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError) as e:
        load_file(bad, "f.yaml")
    assert str(e.value) == "f.yaml: expected a mapping of setting: value at the top level, got a list"
    # a file that is not YAML (a CSV given as a config) is one scalar: its first 60 characters shown, not the file
    # (was: the whole trace on one line, 699,982 characters for the bundled Azure CSV)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.6805900,374,44\n" * 100)
    with pytest.raises(ConfigError) as e:
        load_file(bad, "--config t.csv")
    text = "TIMESTAMP,ContextTokens,GeneratedTokens " + "2023-11-16 18:15:46.6805900,374,44 " * 100  # lines folded
    assert str(e.value) == (
        "--config t.csv: expected a mapping of setting: value at the top level, got the scalar "
        f"{repr(text.strip())[:60]}... ({len(text.strip())} characters)"
    )
    bad.write_text("")
    assert load_file(bad) == {}


def test_assignments():
    assert assignments(["a=1", " b-c = x=y "], "--set") == {"a": "1", "b_c": "x=y"}
    for items, line in [
        (["a=1", "a=2"], "--set a=2: a given twice (first a=1), expected each setting once"),
        (["=1"], "--set '=1': expected KEY=VALUE"),
        (["a"], "--set 'a': expected KEY=VALUE"),
        (["a=\udce9t\udce9"], "--set a: byte 0xe9 at offset 0: expected UTF-8 text"),
        (["\udcff=1"], "--set: byte 0xff at offset 0: expected UTF-8 text"),
    ]:
        with pytest.raises(ConfigError) as e:
            assignments(items, "--set")
        assert str(e.value) == line


def test_assignments_find_a_key_given_twice_in_any_spelling_of_name():
    from planner.core.config import setting_name

    assert assignments(["agg.max_replicas=2"], "--set", name=setting_name) == {"agg_max_replicas": "2"}
    with pytest.raises(ConfigError) as e:
        assignments(["agg_gpus_per_engine=2", "agg.gpus-per-engine=4"], "--set", name=setting_name)
    assert str(e.value) == (
        "--set agg.gpus-per-engine=4: agg.gpus-per-engine given twice (first agg_gpus_per_engine=2), "
        "expected each setting once"
    )


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"),
        (False, "false"),
        (None, "null"),
        ("1e3", '"1e3"'),
        (1000.0, "1000.0"),
        (3, "3"),
        (math.inf, ".inf"),
        (-math.inf, "-.inf"),
        (math.nan, ".nan"),
        (["foo"], '["foo"]'),
        (("a", 1), '["a", 1]'),
        ({"k": None}, '{"k": null}'),
        ("é", '"é"'),
        (list(range(40)), "[" + ", ".join(str(i) for i in range(40))[:76] + "..."),
        ("m" * 5_000_000, '"' + "m" * 996 + '..."'),  # a pasted 5 MB value is not echoed whole
    ],
)
def test_spell_writes_values_as_yaml_and_json_do(value, text):
    assert spell(value) == text


KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


def docs(*, infinity: bool = True) -> st.SearchStrategy[dict]:
    """Settings-like documents: identifier keys, nested lists and mappings of YAML/JSON scalars."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**63)
        | st.floats(allow_nan=False, allow_infinity=infinity)
        | st.text(max_size=20)
    )
    return st.dictionaries(
        KEYS,
        st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4)),
        max_size=6,
    )


def _expected(v):
    """What the settings loader reads back for ``v`` as ``yaml.safe_dump`` writes it: the same value, except a
    string that YAML 1.1 leaves as text and so is written without quotes but is a number by the YAML 1.2
    rules (``1e3``: PyYAML's float needs a dot and a signed exponent) -- read as that number, the one
    documented difference."""
    if isinstance(v, dict):
        return {k: _expected(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_expected(x) for x in v]
    if isinstance(v, str):
        written = yaml.safe_dump(v)
        plain = not written.startswith(("'", '"', "|", ">"))
        return scalar(v) if plain and isinstance(scalar(v), float) else v
    return v


@given(docs())
def test_any_mapping_dumped_by_safe_dump_loads_back(doc):
    assert load_text(yaml.safe_dump(doc), "doc") == _expected(doc)


@given(docs(infinity=False))  # JSON has no infinity
def test_any_mapping_dumped_as_json_loads_back_equal(doc):
    # json.dumps escapes every non-ASCII character (non-BMP ones as a UTF-16 surrogate pair)
    assert load_text(json.dumps(doc), "doc") == doc
    assert load_text(json.dumps(doc, indent="\t"), "doc") == doc
    raw = json.dumps(doc, ensure_ascii=False, indent=1)
    if yaml.reader.Reader.NON_PRINTABLE.search(raw):  # json.dumps leaves DEL and C1 controls unescaped
        # a control character unescaped: YAML refuses the stream, in one line
        with pytest.raises(ConfigError, match=r"^doc: cannot parse settings file: unacceptable character"):
            load_text(raw, "doc")
    elif any(c in raw for c in "\x85\u2028\u2029"):
        # YAML line breaks (NEL, LS, PS) unescaped inside a JSON string are folded by the YAML reader; JSON
        # writers escape them when asked (ensure_ascii, the default, checked above)
        assert load_text(raw, "doc").keys() == doc.keys()
    else:
        assert load_text(raw, "doc") == doc


def test_field_kinds_are_the_base_types_of_the_annotations():
    from planner.core import PlannerConfig

    kinds = field_kinds(PlannerConfig)
    assert (kinds["ttft_ms"], kinds["early_sizing_s"], kinds["auto_candidates"], kinds["mode"]) == (
        "float",
        "float",
        "tuple",
        "Mode",
    )
    assert (kinds["load_enabled"], kinds["predictor_min_points"]) == ("bool", "int")


def test_an_operator_variable_that_is_not_utf8_is_named(monkeypatch):
    from dynoplan.errors import SettingsError
    from planner.operator.settings import settings_from_env

    # the environment keeps a byte that is not UTF-8 as a lone surrogate (os.fsdecode)
    with pytest.raises(SettingsError) as e:
        settings_from_env({"DYNOPLAN_OPERATOR_PEERING_NAME": "p\udce9"})
    assert str(e.value) == (
        "operator settings: DYNOPLAN_OPERATOR_PEERING_NAME: byte 0xe9 at offset 1: expected UTF-8 text"
    )


def test_a_path_with_no_end_is_refused_after_the_bound_not_read_forever(tmp_path):
    # was: `dynoplan up --config /dev/zero` (and profile / mocker serve --engine-config) read until the memory ran out
    from dynoplan.settings_text import MAX_SETTINGS_BYTES

    for path in ("/dev/zero", "/dev/urandom"):
        with pytest.raises(ConfigError) as e:
            load_file(path, f"--config {path}", "config file")
        assert str(e.value) == (
            f"--config {path}: cannot read config file: more than 16 MiB; expected YAML or JSON text of a few KiB"
        )
    # the bound itself is read (a long comment, then a setting); one byte more is refused
    f = tmp_path / "big.yaml"
    tail = b"\nttft_ms: 5\n"
    f.write_bytes(b"#" + b"x" * (MAX_SETTINGS_BYTES - 1 - len(tail)) + tail)
    assert load_file(f) == {"ttft_ms": 5}
    f.write_bytes(b"#" + b"x" * (MAX_SETTINGS_BYTES - len(tail)) + tail)
    with pytest.raises(ConfigError, match="more than 16 MiB"):
        load_file(f)

"""One wording for a refused HTTP(S) URL (stack file, operator settings and flag, planner's Prometheus source:
dynoplan.fields.HttpUrl), and ``dynoplan operator`` flags typed as the other commands' flags, a refused value
named by the flag as typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynoplan.errors import ConfigError, SettingsError
from planner.cli import main as cli_main
from planner.live.config import stack_config_from_mapping
from planner.operator.settings import settings_from_mapping
from planner.sources.prometheus import PrometheusSourceSettings


@pytest.fixture(autouse=True)
def _no_operator_env(monkeypatch):
    import os

    for k in [k for k in os.environ if k.startswith("DYNOPLAN_OPERATOR_")]:
        monkeypatch.delenv(k)


def test_stack_file_prometheus_url_wording():
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping({"prometheus": {"url": "ftp://x"}}, Path("."))
    assert 'prometheus.url="ftp://x": expected an http:// or https:// URL' in e.value.problems


def test_operator_settings_prometheus_url_wording():
    with pytest.raises(SettingsError) as e:
        settings_from_mapping({"prometheus_url": "ftp://x"})
    assert e.value.problems == ['prometheus_url="ftp://x": expected an http:// or https:// URL']


def test_planner_prometheus_source_url_wording():
    with pytest.raises(ConfigError) as e:
        PrometheusSourceSettings(url="ftp://x")
    assert e.value.problems == ['prometheus.url="ftp://x": expected an http:// or https:// URL']


def test_http_url_field_keeps_its_schema_pattern():
    from dynoplan.settings import json_schema
    from planner.operator.settings import OperatorSettings

    assert json_schema(OperatorSettings)["properties"]["prometheus_url"]["pattern"] == "^https?://"


def _operator_error(capsys, *argv: str) -> tuple[int, str]:
    try:
        rc = cli_main(["operator", *argv])
    except SystemExit as e:  # an argparse type error exits from the parser
        rc = int(e.code or 0)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return rc, err.strip()


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ("--health-port", "abc"),
            "argument --health-port: 'abc': expected an integer >= 0 (see dynoplan operator --help)",
        ),
        (
            ("--shared-gpu-budget", "-2"),
            "argument --shared-gpu-budget: '-2': expected an integer >= 0 (see dynoplan operator --help)",
        ),
        (
            ("--dgd-resync-s", "-1"),
            "argument --dgd-resync-s: '-1': expected seconds > 0 (see dynoplan operator --help)",
        ),
        (
            ("--dgd-resync-s", "nan"),
            "argument --dgd-resync-s: 'nan': expected seconds > 0 (see dynoplan operator --help)",
        ),
        (("--health-port", "70000"), "--health-port=70000: expected <= 65535"),
        (("--prometheus-url", "ftp://x"), "--prometheus-url=ftp://x: expected an http:// or https:// URL"),
    ],
)
def test_operator_flag_refusals_name_the_flag_and_the_value_as_typed(capsys, argv, line):
    rc, err = _operator_error(capsys, *argv)
    assert rc == 2
    assert err == f"dynoplan operator: error: {line}"


def test_operator_environment_refusal_keeps_the_setting_name(capsys, monkeypatch):
    monkeypatch.setenv("DYNOPLAN_OPERATOR_DGD_RESYNC_S", "-1")
    rc, err = _operator_error(capsys, "--metrics-port", "70000")
    assert rc == 2
    assert err == (
        "dynoplan operator: error: operator settings: dgd_resync_s=-1: expected > 0.0; "
        "--metrics-port=70000: expected <= 65535"
    )

import argparse
import json

import pytest

from dynoplan.errors import ConfigError, DynoplanError
from planner.core.config import (
    PlannerConfig,
    PoolLimits,
    add_config_arguments,
    config_from_args,
    config_from_mapping,
    load_config,
)


def test_defaults_match_design():
    c = PlannerConfig()
    assert (c.adjustment_interval_s, c.load_adjustment_interval_s) == (180.0, 5.0)
    assert (c.ttft_ms, c.itl_ms, c.max_gpu_budget) == (500.0, 50.0, 8)
    assert (c.kalman_q_level, c.kalman_q_trend, c.kalman_r, c.kalman_min_points, c.prophet_window) == (
        1.0,
        0.1,
        10.0,
        5,
        50,
    )
    assert c.prefill.min_replicas == c.decode.min_replicas == 1
    assert c.pending_timeout_s == 1800.0
    assert c.pools == ("prefill", "decode")
    assert PlannerConfig(mode="agg").pools == ("agg",)


def test_all_problems_collected_at_once():
    with pytest.raises(ConfigError) as ei:
        config_from_mapping(
            {
                "adjustment_interval_s": -1,
                "load_adjustment_interval_s": 500,
                "predictor": "lstm",
                "prefill": {"min_replicas": -3, "max_replicas": 2},
                "bogus": 1,
            }
        )
    e = ei.value
    assert isinstance(e, DynoplanError)
    assert set(e.problems) == {
        "bogus: unknown setting",
        "adjustment_interval_s=-1: expected > 0.0",
        "predictor=\"lstm\": expected one of 'constant', 'arima', 'kalman', 'prophet' or 'auto'",
        "prefill.min_replicas=-3: expected >= 0",
    }
    # the cross-field checks run once every field is valid, and report every line at once too
    with pytest.raises(ConfigError) as ei:
        config_from_mapping(
            {
                "load_adjustment_interval_s": 500,
                "prefill": {"min_replicas": 3, "max_replicas": 2},
                "min_gpu_budget": 9,
                "throughput_enabled": False,
            }
        )
    assert ei.value.problems == [
        "load_adjustment_interval_s=500.0: expected less than adjustment_interval_s=180.0",
        "throughput_enabled=false and load_enabled=false: expected at least one loop enabled",
        "min_gpu_budget=9: expected <= max_gpu_budget=8",
        "prefill.min_replicas=3: expected <= prefill.max_replicas=2",
    ]


def test_direct_construction_is_validated():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="load_adjustment_interval_s=180.0: expected less than"):
        PlannerConfig(load_adjustment_interval_s=180.0)
    with pytest.raises(ValidationError, match="ttft_ms"):
        PlannerConfig(ttft_ms=-1.0)
    with pytest.raises(ValidationError, match="max_gpu_budget=3: expected >= 4 GPUs"):
        PlannerConfig(max_gpu_budget=3, prefill=PoolLimits(1, None, 2), decode=PoolLimits(1, None, 2))


def test_budget_smaller_than_pool_minimums():
    with pytest.raises(ConfigError, match=r"max_gpu_budget=3: expected >= 4 GPUs"):
        config_from_mapping({"max_gpu_budget": 3, "prefill": {"gpus_per_engine": 2}, "decode": {"gpus_per_engine": 2}})
    with pytest.raises(ConfigError, match="min_gpu_budget=9: expected <= max_gpu_budget=8"):
        config_from_mapping({"min_gpu_budget": 9})


def test_bad_types_named():
    with pytest.raises(ConfigError) as ei:
        config_from_mapping({"ttft_ms": "fast", "decode": {"gpus_per_engine": 1.5}, "load_enabled": "maybe"})
    assert set(ei.value.problems) == {
        'ttft_ms="fast": expected a number',
        "decode.gpus_per_engine=1.5: expected an integer",
        'load_enabled="maybe": expected a boolean (true/false)',
    }


def test_strict_types_a_bool_is_not_an_int_and_text_is_not_a_number():
    with pytest.raises(ConfigError) as ei:
        config_from_mapping(
            {"max_gpu_budget": True, "ttft_ms": "300", "agg": {"max_replicas": False}, "simulated_sizing": 1}
        )
    assert set(ei.value.problems) == {
        "max_gpu_budget=true: expected an integer",
        'ttft_ms="300": expected a number',
        "agg.max_replicas=false: expected an integer or null",
        "simulated_sizing=1: expected a boolean (true/false)",
    }
    # an integer is a number: 300 is 300.0 (a YAML or JSON file writes 300)
    assert config_from_mapping({"ttft_ms": 300}).ttft_ms == 300.0


def test_bounds_named_with_the_bound():
    with pytest.raises(ConfigError) as ei:
        config_from_mapping(
            {
                "ttft_ms": 4_000_000,
                "itl_ms": 0,
                "load_sensitivity": 1.5,
                "sla_attainment_target": 1,
                "regression_min_samples": 1,
                "auto_candidates": [],
                "early_sizing_s": 0,
            }
        )
    assert set(ei.value.problems) == {
        "ttft_ms=4000000: expected <= 3600000.0",
        "itl_ms=0: expected > 0.0",
        "load_sensitivity=1.5: expected <= 1.0",
        "sla_attainment_target=1: expected <= 0.9999 (the sizing judges each candidate fleet on at least 2 z^2 / "
        "(1 - target) simulated requests: 54,119 at 0.9999, ten times more for each further nine)",
        "regression_min_samples=1: expected >= 2",
        "auto_candidates=[]: expected at least 1 items",
        "early_sizing_s=0: expected > 0.0",
    }
    with pytest.raises(ConfigError, match=r"auto_candidates.0=\"auto\": expected one of 'constant', 'arima'"):
        config_from_mapping({"auto_candidates": ["auto"]})


def test_cli_text_is_read_as_yaml_1_2_scalars_then_validated_as_a_file_value():
    c = config_from_mapping(
        {
            "ttft_ms": "300",
            "load_enabled": "true",
            "early_sizing_s": "null",
            "agg-max-replicas": "3",
            "auto_candidates": "constant, kalman",
            "itl_ms": "1e2",
            "predictor_log1p": "false",
            "sla_attainment_target": "~",
            "mode": "agg",
        },
        cli=True,
    )
    assert (
        c.ttft_ms,
        c.load_enabled,
        c.early_sizing_s,
        c.agg.max_replicas,
        c.auto_candidates,
        c.itl_ms,
        c.predictor_log1p,
        c.sla_attainment_target,
    ) == (300.0, True, None, 3, ("constant", "kalman"), 100.0, False, None)
    with pytest.raises(ConfigError) as ei:
        config_from_mapping(
            {
                "max_gpu_budget": "true",
                "ttft_ms": "fast",
                "ttft": "1",
                "load_enabled": "1",
                "throughput_enabled": "yes",
                "predictor_min_points": "1e3",
                "prophet_window": "0x10",
                "early_sizing_s": "none",
            },
            cli=True,
        )
    # what a file refuses is refused on the command line too: a YAML 1.1 boolean, 1/0, a float for an
    # integer, a hexadecimal number, Python's None
    assert set(ei.value.problems) == {
        "max_gpu_budget=true: expected an integer",
        'ttft_ms="fast": expected a number',
        "ttft: unknown setting (did you mean ttft_ms?)",
        "load_enabled=1: expected a boolean (true/false)",
        'throughput_enabled="yes": expected a boolean (true/false)',
        "predictor_min_points=1000.0: expected an integer",
        'prophet_window="0x10": expected an integer',
        'early_sizing_s="none": expected a number or null',
    }


def test_yaml_json_and_cli_overrides(tmp_path):
    y = tmp_path / "p.yaml"
    y.write_text("mode: agg\nttft_ms: 300\nagg:\n  max_replicas: 4\n  gpus_per_engine: 2\npredictor: kalman\n")
    c = load_config(y)
    assert (c.mode, c.ttft_ms, c.agg.max_replicas, c.agg.gpus_per_engine, c.predictor) == ("agg", 300.0, 4, 2, "kalman")
    j = tmp_path / "p.json"
    j.write_text(json.dumps(c.to_dict()))
    assert load_config(j) == c
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    args = parser.parse_args(
        ["--config", str(y), "--ttft-ms", "250", "--agg-max-replicas", "3", "--auto-candidates", "constant,kalman"]
    )
    c2 = config_from_args(args)
    assert (c2.ttft_ms, c2.agg.max_replicas, c2.agg.gpus_per_engine, c2.auto_candidates) == (
        250.0,
        3,
        2,
        ("constant", "kalman"),
    )


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ttft_ms: [1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: cannot parse config file"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"missing.yaml: cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    neg = tmp_path / "neg.yaml"
    neg.write_text("adjustment_interval_s: -5\n")
    with pytest.raises(ConfigError, match=r"neg.yaml: adjustment_interval_s=-5: expected > 0.0"):
        load_config(neg)


def test_unknown_setting_names_what_was_meant():
    with pytest.raises(ConfigError) as ei:
        config_from_mapping({"min_replicas": 5, "max_replicas": 2, "predicter": "kalman", "zzz": 1})
    assert set(ei.value.problems) == {
        "min_replicas: unknown setting (pool limits are per pool: prefill_min_replicas, decode_min_replicas, "
        "agg_min_replicas, or min_replicas under a prefill:/decode:/agg: section)",
        "max_replicas: unknown setting (pool limits are per pool: prefill_max_replicas, decode_max_replicas, "
        "agg_max_replicas, or max_replicas under a prefill:/decode:/agg: section)",
        "predicter: unknown setting (did you mean predictor or predictor_log1p?)",
        "zzz: unknown setting",
    }
    with pytest.raises(ConfigError, match=r"agg.min_replicas=5: expected <= agg.max_replicas=2"):
        config_from_mapping({"mode": "agg", "agg_min_replicas": 5, "agg_max_replicas": 2})


def test_config_file_not_utf8_names_file_and_byte(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"ttft_ms: 300\n# caf\xe9\n")
    with pytest.raises(ConfigError) as ei:  # was a UnicodeDecodeError traceback from dynoplan simulate --config
        load_config(bad)
    assert str(ei.value) == f"{bad}: cannot read config file: byte 0xe9 at offset 18: expected UTF-8 text"


def test_a_removed_rules_setting_says_what_replaced_it():
    from dynoplan.errors import ConfigError
    from planner.core.config import config_from_mapping

    with pytest.raises(
        ConfigError,
        match=r"scale_down_hysteresis: unknown setting \(removed: the sizing by simulation "
        r"replaced that rule, see docs/planner-core.md",
    ):
        config_from_mapping({"scale_down_hysteresis": 0.1})


def test_a_text_setting_keeps_command_line_text():
    # a predictor named "off" by mistake is named as the text given, not as a boolean
    with pytest.raises(ConfigError, match=r"predictor=\"off\": expected one of"):
        config_from_mapping({"predictor": "off"}, cli=True)


def test_command_line_pool_keys_may_be_dotted_as_the_error_lines_name_them():
    # `--planner-set agg.max_replicas=2` (the name `--config` errors use) is the flat agg_max_replicas
    cfg = config_from_mapping({"agg.max_replicas": "2", "decode.gpus_per_engine": "4"}, cli=True)
    assert cfg.limits("agg").max_replicas == 2 and cfg.limits("decode").gpus_per_engine == 4
    with pytest.raises(ConfigError) as ei:
        config_from_mapping({"agg.max_replica": "2"}, cli=True)
    assert ei.value.problems == ["agg.max_replica: unknown setting (did you mean agg.max_replicas?)"]

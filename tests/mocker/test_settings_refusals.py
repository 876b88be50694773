"""Every mocker settings class refuses what a YAML file or a flag can get wrong, each problem on one line
``field=value: expected ...``, all of them at once (:mod:`dynoplan.settings`)."""

from __future__ import annotations

import pytest

from dynoplan.errors import ConfigError
from dynoplan.settings import build, json_schema
from mocker.config import EngineConfig, SGLangConfig
from mocker.fleet import FleetConfig
from mocker.kv.tiers import TierConfig
from mocker.live.frontend import FrontendSettings
from mocker.live.loadgen import LoadgenSettings
from mocker.live.worker import WorkerSettings
from mocker.transfer import KvTransferConfig

# (class, the smallest valid mapping, an int field, a number field, a misspelt key, the key it is close to)
CASES = [
    (EngineConfig, {}, "num_gpu_blocks", "speedup_ratio", "max_num_seq", "max_num_seqs"),
    (SGLangConfig, {}, "chunked_prefill_size", "init_new_token_ratio", "schedule_polcy", "schedule_policy"),
    (TierConfig, {"bytes_per_block": 1}, "num_g2_blocks", "bw_g1_g2_gbps", "offload_batch", "offload_batch_size"),
    (KvTransferConfig, {"kv_bytes_per_token": 1}, "kv_bytes_per_token", "bandwidth_gbps", "handof", "handoff"),
    (FleetConfig, {}, "num_workers", "arrival_speedup", "num_worker", "num_workers"),
    (WorkerSettings, {}, "port", "heartbeat_s", "heartbeat", "heartbeat_s"),
    (FrontendSettings, {"workers": ["http://a"]}, "max_retries", "poll_s", "pol_s", "poll_s"),
    (LoadgenSettings, {"url": "http://a"}, "max_concurrency", "time_compression", "modle", "model"),
]


@pytest.mark.parametrize("cls, base, int_field, number_field, typo, close", CASES, ids=[c[0].__name__ for c in CASES])
def test_refuses_bool_for_int_string_for_number_and_unknown_key_all_at_once(
    cls, base, int_field, number_field, typo, close
):
    assert isinstance(build(cls, base), cls)  # the base itself is valid
    with pytest.raises(ConfigError) as e:
        build(cls, {**base, int_field: True, number_field: "5", typo: 1}, source="s.yaml")
    assert sorted(e.value.problems) == sorted(
        [
            # a field that also takes null (kv_bytes_per_token: derived from the model when null) says so
            f"{int_field}=true: expected an integer" + (" or null" if cls is KvTransferConfig else ""),
            f'{number_field}="5": expected a number',
            f"{typo}: unknown setting (did you mean {close}?)",
        ]
    )
    assert str(e.value).startswith("s.yaml: ")


@pytest.mark.parametrize("cls, base, int_field, number_field, typo, close", CASES, ids=[c[0].__name__ for c in CASES])
def test_accepts_an_int_for_a_number_as_yaml_writes_it(cls, base, int_field, number_field, typo, close):
    cfg = build(cls, {**base, number_field: 2})
    assert getattr(cfg, number_field) == 2.0 and isinstance(getattr(cfg, number_field), float)


def test_nested_problems_are_dotted():
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_mapping({"sglang": {"chunked_prefill_size": 0, "chunked_prefil_size": 1}, "dp_size": 0})
    assert sorted(e.value.problems) == [
        "dp_size=0: expected > 0",
        "sglang.chunked_prefil_size: unknown setting (did you mean sglang.chunked_prefill_size?)",
        "sglang.chunked_prefill_size=0: expected > 0",
    ]
    with pytest.raises(ConfigError) as e:
        build(WorkerSettings, {"engine": {"sglang": {"chunked_prefill_size": 0}}, "port": 70000})
    assert e.value.problems == ["engine.sglang.chunked_prefill_size=0: expected > 0", "port=70000: expected <= 65535"]
    with pytest.raises(ConfigError) as e:
        build(FleetConfig, {"transfer": {"bandwidth_gbps": -1}, "seed": 1.5})
    assert e.value.problems == ["seed=1.5: expected an integer", "transfer.bandwidth_gbps=-1: expected >= 0.0"]


def test_engine_config_yaml_pitfalls_and_cross_field_checks():
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_mapping(
            {"num_gpu_blocks": True, "enable_prefix_caching": "false", "speedup_ratio": float("inf"), "engine": "tpu"}
        )
    assert e.value.problems == [
        "engine=\"tpu\": expected one of 'vllm', 'trtllm' or 'sglang'",
        "num_gpu_blocks=true: expected an integer",
        'enable_prefix_caching="false": expected a boolean (true/false)',
        "speedup_ratio=.inf: expected a finite number",
    ]
    # cross-field checks run once every field is valid, and report every line they find
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_mapping({"max_num_batched_tokens": 32, "gpu_memory_fraction": 0.5, "num_g3_blocks": 4})
    assert e.value.problems == [
        "max_num_batched_tokens=32: smaller than one block (block_size=64); expected >= block_size",
        "gpu_memory_fraction=0.5: sizes the KV cache from an AIConfigurator model; expected timing='aic:...'",
        "num_g2_blocks=0: G3/G4 hits stage through G2; expected num_g2_blocks > 0",
        'g1_backend="native": lower KV tiers configured (num_g3_blocks=4); '
        'expected g1_backend="kvbm" (KVBM owns G2/G3/G4)',
    ]
    # SGLang pages are one token: no block-size floor on the token budget
    assert EngineConfig.from_mapping({"engine": "sglang", "max_num_batched_tokens": 32}).max_num_batched_tokens == 32


def test_replace_validates_and_ignores_none():
    cfg = EngineConfig()
    assert cfg.replace(num_gpu_blocks=None, max_num_seqs=4) == EngineConfig(max_num_seqs=4)
    with pytest.raises(ConfigError) as e:
        cfg.replace(num_gpu_blocks=0, timing="nope")
    assert e.value.problems == ["num_gpu_blocks=0: expected > 0"]
    with pytest.raises(ConfigError) as e:
        cfg.replace(timing="nope")
    assert e.value.problems == [
        ("timing='nope': expected 'polynomial', a path to a .npz profile or 'aic:model=...,system=...'")
    ]


def test_schema_states_bound_default_and_description_once():
    prop = json_schema(EngineConfig)["properties"]["num_gpu_blocks"]
    assert prop["default"] == 16384 and prop["exclusiveMinimum"] == 0 and "blocks" in prop["description"]
    frac = json_schema(EngineConfig)["properties"]["gpu_memory_fraction"]
    assert {"exclusiveMinimum": 0.0, "maximum": 1.0, "type": "number"} in frac["anyOf"]

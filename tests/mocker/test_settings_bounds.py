"""Integer engine and planner settings are bounded by int64 (dynoplan.fields.MAX_INT64), the largest value
numpy arrays, deque maxlen and range take; the bound itself is accepted."""

from __future__ import annotations

import pytest

from dynoplan.errors import ConfigError
from dynoplan.fields import MAX_INT64
from mocker.config import EngineConfig
from planner.core.config import config_from_mapping


def test_max_int64_is_two_to_the_63_minus_one():
    assert MAX_INT64 == 9223372036854775807 == 2**63 - 1


@pytest.mark.parametrize("field", ["num_gpu_blocks", "max_num_seqs", "num_g2_blocks"])
def test_engine_integer_past_int64_is_refused(field):
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_mapping({field: MAX_INT64 + 1})
    assert str(e.value) == f"{field}=9223372036854775808: expected <= 9223372036854775807"


def test_engine_integer_at_int64_is_accepted():
    assert EngineConfig.from_mapping({"num_gpu_blocks": MAX_INT64, "block_size": 1}).total_kv_tokens == MAX_INT64


@pytest.mark.parametrize("field", ["predictor_min_points", "prophet_window", "max_gpu_budget"])
def test_planner_integer_past_int64_is_refused(field):
    with pytest.raises(ConfigError) as e:
        config_from_mapping({field: MAX_INT64 + 1})
    assert f"{field}=9223372036854775808: expected <= 9223372036854775807" in str(e.value).splitlines()

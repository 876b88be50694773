import math
import subprocess
import sys

import numpy as np
import pytest

import planner.core
from dynoplan.errors import TraceError
from planner.arguments import warm_start_windows
from planner.core.traces import bucket_intervals


def test_azure_csv_bucketed(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,110\n"
        "2023-11-16 18:16:47.0000000,100,10\n"
        "2023-11-16 18:18:47.0000000,200,20\n"
    )
    w = warm_start_windows(f, 60.0)
    # arrivals 0, 4.314, 60.319, 180.319 s after the first row
    assert [x.num_requests for x in w] == [2.0, 1.0, 0.0, 1.0]
    assert w[0].mean_isl_tokens == pytest.approx(385.0) and w[0].mean_osl_tokens == pytest.approx(77.0)
    assert math.isnan(w[2].mean_isl_tokens)


def test_mooncake_jsonl_bucketed_relative_to_the_first_arrival(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"timestamp": 1000, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
        '{"timestamp": 180999, "input_length": 300, "output_length": 30}\n'
        '{"timestamp": 181000, "input_length": 50, "output_length": 5}\n'
    )
    w = warm_start_windows(f, 180.0)
    assert [(x.num_requests, x.mean_isl_tokens, x.mean_osl_tokens) for x in w] == [(2.0, 200.0, 20.0), (1.0, 50.0, 5.0)]


def test_warm_start_reads_the_trace_aliases_of_the_trace_reader(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"created_time": 0, "input_tokens": 40, "output_tokens": 4}\n'
        '{"created_time": 61000, "input_tokens": 80, "output_tokens": 8}\n'
    )
    w = warm_start_windows(f, 60.0)
    assert [(x.num_requests, x.mean_isl_tokens, x.mean_osl_tokens) for x in w] == [(1.0, 40.0, 4.0), (1.0, 80.0, 8.0)]


def test_bundled_traces_read():
    w = warm_start_windows("examples/traces/azure_llm_conv_2023.csv", 180.0)
    assert sum(x.num_requests for x in w) == 19366
    w = warm_start_windows("examples/traces/mooncake_conversation.jsonl", 180.0)
    assert sum(x.num_requests for x in w) == 12031


def test_trace_errors_name_file_line_field(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": "x", "input_length": 1}\n')
    with pytest.raises(
        TraceError, match=r"bad.jsonl:2: field 'timestamp' 'x': expected a finite number of milliseconds"
    ):
        warm_start_windows(f, 60.0)
    c = tmp_path / "bad.csv"
    c.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n")
    with pytest.raises(TraceError, match=r"bad.csv:1: field 'GeneratedTokens' missing column"):
        warm_start_windows(c, 60.0)
    c.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: field 'TIMESTAMP' 'yesterday': unparsable timestamp"):
        warm_start_windows(c, 60.0)
    c.write_bytes("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,1 caf\xe9\n".encode("latin-1"))
    with pytest.raises(TraceError, match=r"bad.csv:2: byte 0xe9 at column 28: expected UTF-8 text"):
        warm_start_windows(c, 60.0)
    assert bucket_intervals(np.array([]), np.array([]), np.array([]), 60.0) == []


def test_public_api_pinned():
    assert sorted(planner.core.__all__) == sorted(
        [
            "Decision",
            "DecodeProfile",
            "Diagnostics",
            "Observations",
            "PassObservation",
            "PerformanceProfile",
            "Planner",
            "PlannerConfig",
            "PoolLimits",
            "PoolState",
            "PrefillProfile",
            "Reason",
            "TickResult",
            "TrafficWindow",
            "add_config_arguments",
            "bucket_intervals",
            "config_from_args",
            "config_from_mapping",
            "load_config",
            "load_profile",
            "profile_from_arrays",
            "save_profile",
        ]
    )
    for name in planner.core.__all__:
        assert getattr(planner.core, name) is not None


def test_core_import_pulls_no_mocker_kopf_kubernetes():
    code = (
        "import sys, planner.core, planner.core.metrics; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mocker', 'kopf', 'kubernetes')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"

import math
import subprocess
import sys

import numpy as np
import pytest

import planner.core
from planner.core.traces import bucket_intervals, read_trace_intervals, read_trace_requests
from planner.errors import TraceError


def test_azure_csv_bucketed(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,110\n"
                 "2023-11-16 18:16:47.0000000,100,10\n"
                 "2023-11-16 18:18:47.0000000,200,20\n")
    w = read_trace_intervals(f, 60.0)
    assert [x.num_requests for x in w] == [2.0, 1.0, 0.0, 1.0]
    assert w[0].mean_isl_tokens == pytest.approx(385.0) and w[0].mean_osl_tokens == pytest.approx(77.0)
    assert math.isnan(w[2].mean_isl_tokens)


def test_mooncake_jsonl_bucketed(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
                 '{"timestamp": 179999, "input_length": 300, "output_length": 30}\n'
                 '{"timestamp": 180000, "input_length": 50, "output_length": 5}\n')
    w = read_trace_intervals(f, 180.0)
    assert [(x.num_requests, x.mean_isl_tokens, x.mean_osl_tokens) for x in w] == [(2.0, 200.0, 20.0), (1.0, 50.0, 5.0)]


def test_bundled_traces_read():
    t, isl, osl = read_trace_requests("examples/traces/azure_llm_conv_2023.csv")
    assert len(t) == 19366 and t[0] == 0.0 and np.all(np.diff(t) >= 0)
    w = read_trace_intervals("examples/traces/mooncake_conversation.jsonl", 180.0)
    assert sum(x.num_requests for x in w) == 12031


def test_trace_errors_name_file_line_field(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": "x", "input_length": 1}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2: field 'timestamp' expected a number >= 0, got 'x'"):
        read_trace_requests(f)
    c = tmp_path / "bad.csv"
    c.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n")
    with pytest.raises(TraceError, match=r"bad.csv:1: field 'GeneratedTokens' missing column"):
        read_trace_requests(c)
    c.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: field 'TIMESTAMP' cannot parse 'yesterday'"):
        read_trace_requests(c)
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace_requests(tmp_path / "x.txt")
    assert bucket_intervals(np.array([]), np.array([]), np.array([]), 60.0) == []


def test_public_api_pinned():
    assert sorted(planner.core.__all__) == sorted([
        "Decision", "DecodeProfile", "Diagnostics", "ForwardPassMetrics", "Observations",
        "PerformanceProfile", "Planner", "PlannerConfig", "PoolLimits", "PoolState", "PrefillProfile",
        "QueuedRequests", "Reason", "ScheduledRequests", "TickResult", "TrafficWindow", "add_config_arguments",
        "config_from_args", "config_from_mapping", "load_config", "load_profile", "profile_from_arrays",
        "read_trace_intervals", "save_profile"])
    for name in planner.core.__all__:
        assert getattr(planner.core, name) is not None


def test_core_import_pulls_no_mocker_kopf_kubernetes():
    code = ("import sys, planner.core, planner.core.metrics; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mocker', 'kopf', 'kubernetes')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"

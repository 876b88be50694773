"""AIConfigurator timing source: spec parsing, the missing-package error, and (when an AIConfigurator
interpreter is available) a real offline sample turned into an NpzTiming profile and a KV capacity."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from dynoplan.errors import AicSpecError, ConfigError
from mocker.timing import NpzTiming
from mocker.timing_aic import aic_num_gpu_blocks, ensure_profile, profile_path
from mocker.timing_spec import parse_aic_spec as parse_spec

SPEC = "aic:model=Qwen/Qwen3-8B,system=h200_sxm,backend=vllm,tp=1"
AIC_PY = os.environ.get("DYNOPLAN_AIC_PYTHON") or os.path.join(
    os.environ.get("DYNOPLAN_CACHE") or os.path.expanduser("~/.cache/dynoplan"), "aicvenv-0.12.0", "bin", "python"
)
"""The AIConfigurator interpreter: DYNOPLAN_AIC_PYTHON, else the venv ``make test`` builds (tools/build-aic-venv.sh)."""


def test_parse_spec_defaults_and_errors():
    s = parse_spec("aic:model=Qwen/Qwen3-8B,system=h200_sxm")
    assert s == {
        "model": "Qwen/Qwen3-8B",
        "system": "h200_sxm",
        "backend": "vllm",
        "tp": 1,
        "quant": "bf16",
        "version": None,
    }
    with pytest.raises(AicSpecError) as e:
        parse_spec("aic:model=x,tp=0,backend=tgi,colour=red")
    msg = str(e.value)
    assert "tp='0': expected a positive integer" in msg and "backend='tgi'" in msg
    assert "'colour=red': expected key=value" in msg and "system: missing" in msg


def test_missing_package_is_a_config_error_naming_it(monkeypatch, tmp_path):
    pytest.importorskip("numpy")
    try:
        import aiconfigurator_core  # noqa: F401  a probe: importing it (not find_spec) is what the product does

        pytest.skip("aiconfigurator-core importable in this interpreter")
    except ImportError:
        pass
    monkeypatch.delenv("DYNOPLAN_AIC_PYTHON", raising=False)
    monkeypatch.setenv("DYNOPLAN_AIC_CACHE", str(tmp_path))
    with pytest.raises(
        ConfigError,
        match=r"timing='aic:.*needs the optional package aiconfigurator-core.*"
        r"No module named 'aiconfigurator_core'",
    ):
        ensure_profile(SPEC)
    with pytest.raises(ConfigError, match=r"tp='x': expected a positive integer"):
        ensure_profile("aic:model=m,system=s,tp=x")


@pytest.mark.skipif(
    not Path(AIC_PY).is_file(),
    reason="no AIConfigurator interpreter (DYNOPLAN_AIC_PYTHON, or run tools/build-aic-venv.sh)",
)
def test_real_aiconfigurator_profile_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNOPLAN_AIC_PYTHON", AIC_PY)
    monkeypatch.setenv("DYNOPLAN_AIC_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = ensure_profile(SPEC, grid="small")
    assert path == profile_path(SPEC, grid="small") and path.is_file()
    d = np.load(path)
    # Qwen3-8B: 36 layers * 2 (K,V) * 8 KV heads * 128 head dim * 2 bytes (bf16) = 147456 bytes/token
    assert float(d["kv_bytes_per_token"]) == pytest.approx(147456, rel=0.01)
    assert np.all(np.diff(d["prefill_ttft_ms"]) > 0)  # more new tokens, longer prefill
    assert d["decode_itl"].shape == (len(d["decode_active_kv_tokens"]), len(d["decode_context_length"]))
    t = NpzTiming(ensure_profile(SPEC, grid="small"))
    assert isinstance(t, NpzTiming)
    assert t.prefill_ms(1, 1024, 0) == pytest.approx(float(d["prefill_ttft_ms"][1]))
    blocks = aic_num_gpu_blocks(SPEC, 64, 0.9, grid="small")
    expect = math.floor(
        (float(d["gpu_mem_bytes"]) * 0.9 - float(d["non_kv_bytes"])) / (float(d["kv_bytes_per_token"]) * 64)
    )
    assert blocks == expect and blocks > 1000
    with pytest.raises(ConfigError, match=r"gpu_memory_fraction=0.05: the model .* leaves no room"):
        aic_num_gpu_blocks(SPEC, 64, 0.05, grid="small")


def test_cli_aic_without_package_is_one_line_error(monkeypatch, tmp_path, capsys):
    try:
        import aiconfigurator_core  # noqa: F401  a probe: importing it (not find_spec) is what the product does

        pytest.skip("aiconfigurator-core importable in this interpreter")
    except ImportError:
        pass
    from planner.cli import main

    monkeypatch.delenv("DYNOPLAN_AIC_PYTHON", raising=False)
    monkeypatch.setenv("DYNOPLAN_AIC_CACHE", str(tmp_path))
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 2}\n')
    assert main(["replay", "--trace", str(trace), "--quiet", "--timing", SPEC]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs the optional package aiconfigurator-core" in err and len(err.splitlines()) == 1

"""Stack file: fleet.worker_args of pools the mode lacks, and disaggregated TensorRT-LLM workers, are refused
(as fleet.initial of such pools is, and as replay/simulate refuse trtllm in disaggregated mode)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from dynoplan.errors import ConfigError
from planner.live.config import stack_config_from_mapping
from tests.liveplanner.stack import write_profile


def _base(tmp_path, mode: str) -> dict:
    return {"planner": {"mode": mode}, "profile": str(write_profile(tmp_path / "p.npz"))}


def test_worker_args_of_a_pool_the_mode_lacks_is_an_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping(
            {**_base(tmp_path, "disagg"), "fleet": {"worker_args": {"agg": ["--speedup-ratio", "10"]}}}, tmp_path
        )
    assert "fleet.worker_args.agg: pool not planned in mode 'disagg' (expected prefill, decode)" in str(e.value)
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping({**_base(tmp_path, "agg"), "fleet": {"worker_args": {"decode": []}}}, tmp_path)
    assert "fleet.worker_args.decode: pool not planned in mode 'agg'" in str(e.value)


@pytest.mark.parametrize("flags", [["--engine", "trtllm"], ["--engine=trtllm", "--speedup-ratio", "5"], "config"])
def test_disaggregated_trtllm_workers_rejected(tmp_path, flags):
    if flags == "config":
        (tmp_path / "e.yaml").write_text("engine: trtllm\n")
        flags = ["--engine-config", str(tmp_path / "e.yaml")]
    with pytest.raises(ConfigError) as e:
        stack_config_from_mapping(
            {**_base(tmp_path, "disagg"), "fleet": {"worker_args": {"prefill": flags, "decode": []}}}, tmp_path
        )
    msg = str(e.value)
    assert "fleet.worker_args.prefill: engine trtllm: disaggregated serving is not supported" in msg
    assert "worker_args.decode" not in msg  # the default engine (vllm) is fine


def test_trtllm_accepted_in_agg_and_vllm_in_disagg(tmp_path):
    ok = stack_config_from_mapping(
        {**_base(tmp_path, "agg"), "fleet": {"worker_args": {"agg": ["--engine", "trtllm"]}}}, tmp_path
    )
    assert ok.worker_args == {"agg": ("--engine", "trtllm")}
    ok = stack_config_from_mapping(
        {**_base(tmp_path, "disagg"), "fleet": {"worker_args": {"prefill": ["--engine", "vllm"], "decode": []}}},
        tmp_path,
    )
    assert set(ok.worker_args) == {"prefill", "decode"}


def test_up_refuses_disaggregated_trtllm_with_one_line(tmp_path):
    f = tmp_path / "stack.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                **_base(tmp_path, "disagg"),
                "state_dir": str(tmp_path / "st"),
                "fleet": {"worker_args": {"decode": ["--engine", "trtllm"]}},
            }
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "planner.cli", "up", "--config", str(f)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "fleet.worker_args.decode: engine trtllm" in r.stderr
    assert not (tmp_path / "st").exists()  # nothing started


def test_shipped_example_stack_file_is_valid_with_the_profile_its_comment_makes(tmp_path):
    import shlex
    import shutil
    from pathlib import Path

    from planner.cli import main as cli_main
    from planner.live.config import load_stack_config

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "examples" / "stack.yaml").read_text()
    (tmp_path / "examples").mkdir()
    shutil.copy(repo / "examples" / "stack.yaml", tmp_path / "examples" / "stack.yaml")
    # the profile command of the file's comment, run as written (plus a small sweep grid, for speed)
    cmd = " ".join(line.lstrip("# ").rstrip("\\ ") for line in text.splitlines() if line.startswith("#   ")).split(
        "dynoplan ", 1
    )[1]
    argv = shlex.split(cmd)
    assert argv[:3] == ["profile", "--out", "out/stack-profile.npz"]
    (tmp_path / "out").mkdir()
    argv[2] = str(tmp_path / argv[2])
    assert cli_main([*argv, "--isl", "128,512", "--kv-usage", "0.01,0.1", "--context", "256,1024"]) == 0
    cfg = load_stack_config(tmp_path / "examples" / "stack.yaml")
    assert list(cfg.worker_args["agg"]) == argv[3:]  # the profiled engine is the workers' engine
    assert cfg.state_dir == (tmp_path / "out" / "stack-state").resolve()

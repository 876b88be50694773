"""The engine model each live driver hands the planner (planner.whatif): from the stack's worker flags
(``dynoplan up`` / ``dynoplan planner``) and from a DynoPlanner's ``spec.engine`` (the operator)."""

from __future__ import annotations

import pytest

from dynoplan.errors import ConfigError
from mocker.config import EngineConfig
from mocker.transfer import KvTransferConfig
from planner.core import PlannerConfig
from planner.live.config import load_stack_config, worker_engines
from planner.whatif import EngineFleetEvaluator, evaluator_from_spec
from tests.liveplanner.stack import FAST_WORKER, stack_file


def test_worker_engines_are_what_mocker_serve_builds(tmp_path):
    engines, transfer, problems = worker_engines(load_stack_config(stack_file(tmp_path)))
    assert problems == [] and transfer is None
    assert engines == {
        "agg": EngineConfig(
            num_gpu_blocks=2048, block_size=16, speedup_ratio=20.0, trace_block_size=16, worker_type="aggregated"
        )
    }
    assert FAST_WORKER == [
        "--speedup-ratio",
        "20",
        "--num-gpu-blocks",
        "2048",
        "--block-size",
        "16",
        "--trace-block-size",
        "16",
    ]


def test_worker_engines_disagg_roles_dp_and_kv_transfer(tmp_path):
    p = stack_file(
        tmp_path,
        planner={"mode": "disagg"},
        fleet={
            "worker_args": {
                "prefill": ["--engine", "sglang", "--dp-size", "2"],
                "decode": [
                    "--kv-transfer-bandwidth-gbps",
                    "16",
                    "--kv-bytes-per-token",
                    "131072",
                    "--max-num-seqs",
                    "64",
                ],
            }
        },
    )
    engines, transfer, problems = worker_engines(load_stack_config(p))
    assert problems == []
    assert engines["prefill"] == EngineConfig(engine="sglang", dp_size=2, worker_type="prefill")
    assert engines["decode"] == EngineConfig(max_num_seqs=64, worker_type="decode")
    assert transfer == KvTransferConfig(bandwidth_gbps=16.0, kv_bytes_per_token=131072, handoff="direct")
    # 1000 prompt tokens x 131072 B at 16 GB/s = 8.192 ms
    assert transfer.transfer_ms(1000) == pytest.approx(8.192)


def test_worker_engines_without_flags_is_the_default_engine_and_bad_flags_are_named(tmp_path):
    engines, _, problems = worker_engines(load_stack_config(stack_file(tmp_path, fleet={"worker_args": {}})))
    assert engines == {"agg": EngineConfig(worker_type="aggregated")} and problems == []
    bad = stack_file(tmp_path, fleet={"worker_args": {"agg": ["--num-gpu-blocks", "x"]}})
    engines, _, problems = worker_engines(load_stack_config(bad))
    assert engines == {} and problems == [
        'fleet.worker_args.agg=["--num-gpu-blocks", "x"]: flags mocker serve rejects '
        "(argument --num-gpu-blocks: 'x': expected a positive integer)"
    ]


def test_up_builds_the_evaluator_with_the_frontend_router_and_sla(tmp_path):
    from planner.cli_up import _build_planner

    p = stack_file(
        tmp_path, planner={"simulated_sizing": True, "ttft_ms": 300, "itl_ms": 25}, frontend={"port": 0, "router": "kv"}
    )
    planner = _build_planner(load_stack_config(p))
    ev = planner.evaluator
    assert isinstance(ev, EngineFleetEvaluator) and planner.simulating
    assert (ev.router, ev.ttft_ms, ev.itl_ms) == ("kv", 300.0, 25.0)
    assert ev.engines["agg"].speedup_ratio == 20.0
    off = _build_planner(load_stack_config(stack_file(tmp_path)))  # simulated_sizing: false
    assert off.evaluator is not None and not off.simulating


def test_operator_spec_engine_camel_or_snake_case_per_pool():
    cfg = PlannerConfig(mode="disagg", ttft_ms=200.0, itl_ms=10.0)
    ev = evaluator_from_spec({"numGpuBlocks": 4096, "max_num_seqs": 128, "engine": "sglang"}, cfg)
    assert ev.engines == {
        "prefill": EngineConfig(engine="sglang", num_gpu_blocks=4096, max_num_seqs=128, worker_type="prefill"),
        "decode": EngineConfig(engine="sglang", num_gpu_blocks=4096, max_num_seqs=128, worker_type="decode"),
    }
    assert (ev.router, ev.ttft_ms, ev.itl_ms) == ("round_robin", 200.0, 10.0)
    assert evaluator_from_spec(None, PlannerConfig(mode="agg")).engines == {"agg": EngineConfig()}


@pytest.mark.parametrize(
    "engine, problem",
    [
        ({"numGpuBlocks": 0}, "spec.engine.num_gpu_blocks=0: expected > 0"),
        ({"engine": "tgi"}, "spec.engine.engine=\"tgi\": expected one of 'vllm', 'trtllm' or 'sglang'"),
        ({"bogus": 1}, "spec.engine.bogus: unknown setting"),
        ({"maxNumSeq": 1}, "spec.engine.max_num_seq: unknown setting (did you mean max_num_seqs?)"),
        ([1], "spec.engine=[1]: expected a mapping of engine settings (EngineConfig fields)"),
        ({"workerType": "decode"}, "spec.engine.workerType='decode': set per pool by the planner's mode"),
    ],
)
def test_operator_spec_engine_errors_name_the_field(engine, problem):
    with pytest.raises(ConfigError) as e:
        evaluator_from_spec(engine, PlannerConfig(mode="agg"))
    assert problem in str(e.value)


def test_operator_planning_one_half_of_a_disaggregated_deployment_sizes_in_closed_form():
    # mode prefill / decode plans one pool: a what-if fleet needs both halves, so no engine model (closed form);
    # simulated_sizing off likewise. The engine settings are still checked
    for mode in ("prefill", "decode"):
        assert evaluator_from_spec({"numGpuBlocks": 4096}, PlannerConfig(mode=mode)) is None
        with pytest.raises(ConfigError, match="spec.engine.num_gpu_blocks=0"):
            evaluator_from_spec({"numGpuBlocks": 0}, PlannerConfig(mode=mode))
    assert evaluator_from_spec(None, PlannerConfig(mode="agg", simulated_sizing=False)) is None

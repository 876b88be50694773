"""Disaggregated prefill/decode fleet: KV transfer times, the reference's per-request timeline, handoff holds
and reservations released exactly once, model-config KV sizing, refusals."""

from __future__ import annotations

import json

import pytest

from dynoplan.errors import ConfigError
from dynoplan.settings import build
from mocker.config import EngineConfig
from mocker.fleet import Fleet, FleetConfig, run_replay
from mocker.modelcfg import kv_bytes_per_token_from_file, kv_bytes_per_token_from_mapping
from mocker.records import TraceRequest
from mocker.transfer import KvTransferConfig

REF_TRANSFER = KvTransferConfig(bandwidth_gbps=64, kv_bytes_per_token=131072)


def disagg(**kw) -> Fleet:  # type: ignore[no-untyped-def]
    fl = Fleet({"prefill": EngineConfig(worker_type="prefill"), "decode": EngineConfig(worker_type="decode")}, **kw)
    fl.add_worker("prefill", 0.0)
    fl.add_worker("decode", 0.0)
    return fl


# ------------------------------------------------------------------------------------------ transfer model
def test_transfer_time_hand_computed():
    # 1000 tokens x 131072 B / (64 x 1e9 B/s) = 2.048 ms; 374 tokens -> 0.765952 ms (reference's gap)
    assert REF_TRANSFER.transfer_ms(1000) == pytest.approx(2.048, abs=1e-9)
    assert REF_TRANSFER.transfer_ms(374) == pytest.approx(0.765952, abs=1e-9)
    assert REF_TRANSFER.transfer_ms(0) == 0.0
    assert KvTransferConfig(bandwidth_gbps=0.0, kv_bytes_per_token=131072).transfer_ms(1000) == 0.0
    assert KvTransferConfig(bandwidth_gbps=1.0, kv_bytes_per_token=1_000_000).transfer_ms(1) == pytest.approx(1.0)


def test_charged_tokens_modes():
    full = KvTransferConfig(64, 131072, timing="full_prompt")
    miss = KvTransferConfig(64, 131072, timing="destination_missing")
    assert full.charged_tokens(1000, 960) == 1000
    assert miss.charged_tokens(1000, 960) == 40
    assert miss.charged_tokens(1024, 1024) == 0


def test_transfer_config_errors_name_the_field():
    with pytest.raises(ConfigError) as e:
        build(KvTransferConfig, {"bandwidth_gbps": -1, "kv_bytes_per_token": 0, "handoff": "x", "timing": "x"})
    assert e.value.problems == [
        "bandwidth_gbps=-1: expected >= 0.0",
        "kv_bytes_per_token=0: expected > 0",
        "timing=\"x\": expected one of 'full_prompt' or 'destination_missing'",
        "handoff=\"x\": expected one of 'direct' or 'coordinated'",
    ]
    with pytest.raises(ConfigError, match=r"kv_bytes_per_token=null: needed when bandwidth_gbps=10.0 > 0"):
        build(KvTransferConfig, {"bandwidth_gbps": 10})


# ------------------------------------------------------------------------------------------ reference timeline
@pytest.mark.parametrize("handoff", ["direct", "coordinated"])
def test_single_request_timeline_matches_reference(handoff):
    """Reference (Dynamo Mocker 1.6.1 --disagg, 64 GB/s, 131072 B/token), ISL 374 OSL 4 alone: prefill ends at
    22.238914, decode admitted at 23.004866 (+0.765952 transfer), tokens at 28.764127, 34.523439, 40.282803,
    46.042218 (decode passes at 374, 375, 376, 377 KV tokens); ISL 1000 OSL 3 at t=1000: prefill 32.105859,
    transfer 2.048, first token 1039.945344, last 1051.528467."""
    t = KvTransferConfig(64, 131072, handoff=handoff)
    res = run_replay(
        [TraceRequest(0, 0.0, 374, 4, (1,)), TraceRequest(1, 1000.0, 1000, 3, (2, 3))],
        EngineConfig(),
        FleetConfig(num_prefill_workers=1, num_decode_workers=1, transfer=t),
    )
    a, b = res.records
    assert a.token_times_ms == pytest.approx([28.764127, 34.523439, 40.282803, 46.042218], abs=1e-6)
    assert a.first_token_ms == pytest.approx(28.764127, abs=1e-6)
    assert a.admit_ms == 0.0 and a.prefill_worker_id == 0 and a.worker_id == 0 and a.status == "finished"
    assert b.first_token_ms == pytest.approx(1039.945344, abs=1e-6)
    assert b.finish_ms == pytest.approx(1051.528467, abs=1e-6)
    assert len(b.token_times_ms) == 3
    assert res.prefill_worker_seconds == pytest.approx(res.duration_ms / 1000.0)
    assert res.worker_seconds == pytest.approx(2 * res.duration_ms / 1000.0)


def test_coordinated_waits_for_busy_destination_pass_boundary():
    """Reference fact: the destination reserves at its next pass boundary; the transfer starts then. A decode
    worker busy with a long request delays a short request's admission to a pass start."""
    reqs = [TraceRequest(0, 0.0, 2000, 400, None), TraceRequest(1, 500.0, 91, 3, None)]
    co = run_replay(
        reqs,
        EngineConfig(),
        FleetConfig(
            num_prefill_workers=1, num_decode_workers=1, transfer=KvTransferConfig(64, 131072, handoff="coordinated")
        ),
    )
    di = run_replay(
        reqs,
        EngineConfig(),
        FleetConfig(
            num_prefill_workers=1, num_decode_workers=1, transfer=KvTransferConfig(64, 131072, handoff="direct")
        ),
    )
    # the second request's first token is at the end of a decode pass in both; coordinated can only be later
    assert co.records[1].first_token_ms >= di.records[1].first_token_ms
    assert co.records[0].token_times_ms == di.records[0].token_times_ms[:1] + co.records[0].token_times_ms[1:]


def test_destination_missing_charges_nothing_on_a_full_hit():
    # request 0 (1088 tokens = 17 blocks) leaves blocks of hash ids (1, 2) = 1024 tokens cached on the decode
    # worker; request 1 (1024 tokens, hash ids (1, 2)) then finds all of its prompt there: no transfer.
    r0 = TraceRequest(0, 0.0, 1088, 2, (1, 2, 3))
    r1 = TraceRequest(1, 5000.0, 1024, 2, (1, 2))
    out = {}
    for mode in ("full_prompt", "destination_missing"):
        res = run_replay(
            [r0, r1],
            EngineConfig(),
            FleetConfig(
                num_prefill_workers=1, num_decode_workers=1, transfer=KvTransferConfig(64, 131072, timing=mode)
            ),
        )
        out[mode] = res.records
    # request 0: nothing cached on the decode side yet, both modes charge 1088 tokens
    assert out["full_prompt"][0].token_times_ms == out["destination_missing"][0].token_times_ms
    # request 1: full_prompt pays 1024 x 131072 / 64e9 s = 2.097152 ms more
    d = out["full_prompt"][1].first_token_ms - out["destination_missing"][1].first_token_ms
    assert d == pytest.approx(2.097152, abs=1e-6)


def test_bandwidth_zero_disables_the_delay():
    reqs = [TraceRequest(0, 0.0, 1000, 3, None)]
    zero = run_replay(
        reqs,
        EngineConfig(),
        FleetConfig(num_prefill_workers=1, num_decode_workers=1, transfer=KvTransferConfig(0.0, 131072)),
    )
    ref = run_replay(
        reqs, EngineConfig(), FleetConfig(num_prefill_workers=1, num_decode_workers=1, transfer=REF_TRANSFER)
    )
    assert ref.records[0].first_token_ms - zero.records[0].first_token_ms == pytest.approx(2.048, abs=1e-6)


# ------------------------------------------------------------------------------------------ holds
SLOW = KvTransferConfig(bandwidth_gbps=0.001, kv_bytes_per_token=131072, handoff="coordinated")  # 1000 tok: 131 s


def _private(fl: Fleet, pool: str) -> int:
    return sum(c.kv.private_in_use for c in fl.cores(pool))


def test_holds_released_once_on_activation():
    fl = disagg(transfer=SLOW)
    rec = fl.submit(TraceRequest(7, 0.0, 1000, 3, None), 0.0)
    fl.advance_until(100.0)  # prefill done at 32.1 ms; transfer runs until 131 s
    assert fl.holds_taken == 2 and fl.holds_released == 0
    assert _private(fl, "prefill") == 16  # ceil(1000 / 64) held on the source
    assert _private(fl, "decode") == 16  # ceil(1001 / 64) reserved on the destination
    for c in fl.cores("prefill") + fl.cores("decode"):
        c.check_invariants()
    fl.finish()
    assert rec.status == "finished" and len(rec.token_times_ms) == 3
    assert rec.first_token_ms > 131072.0
    assert fl.holds_released == 2
    assert _private(fl, "prefill") == 0 and _private(fl, "decode") == 0


@pytest.mark.parametrize("cancel_at", [10.0, 100.0, 140_000.0])
def test_cancel_releases_every_hold_exactly_once(cancel_at):
    """Cancel during prefill (10 ms), during the transfer (100 ms: hold + reservation live) or during decode."""
    fl = disagg(transfer=SLOW)
    rec = fl.submit(TraceRequest(7, 0.0, 1000, 5000, None), 0.0)
    fl.advance_until(cancel_at)
    taken = fl.holds_taken
    assert fl.cancel(rec, cancel_at) is True
    assert fl.cancel(rec, cancel_at) is False  # second cancel: nothing left to release
    assert rec.status == "cancelled" and rec.finish_ms == cancel_at
    assert fl.holds_released == taken
    fl.finish()
    assert fl.holds_released == taken  # the pending activation did not release again
    assert rec.status == "cancelled"
    assert _private(fl, "prefill") == 0 and _private(fl, "decode") == 0
    for c in fl.cores("prefill") + fl.cores("decode"):
        c.check_invariants()
        assert not c.has_work()


def test_requests_wait_for_a_decode_worker():
    fl = Fleet({"prefill": EngineConfig(), "decode": EngineConfig()}, transfer=REF_TRANSFER)
    fl.add_worker("prefill", 0.0)
    wid = fl.add_worker("decode", 0.0, startup_delay_ms=5000.0)
    rec = fl.submit(TraceRequest(0, 0.0, 1000, 3, None), 0.0)
    fl.advance_until(1000.0)
    assert fl.pool_counts("decode").queued_at_fleet == 1 and rec.first_token_ms is None
    fl.finish()
    # decode worker ready at 5000: reserve then, 2.048 ms transfer, one decode pass
    assert rec.worker_id == wid and rec.first_token_ms > 5002.048


# ------------------------------------------------------------------------------------------ refusals
def test_trtllm_and_mixed_kv_layout_disaggregation_are_config_errors():
    with pytest.raises(ConfigError, match="TensorRT-LLM"):
        Fleet({"prefill": EngineConfig(engine="trtllm"), "decode": EngineConfig(engine="trtllm")})
    with pytest.raises(ConfigError, match="prefill='vllm', decode='sglang'.*same KV layout"):
        Fleet({"prefill": EngineConfig(), "decode": EngineConfig(engine="sglang")})
    with pytest.raises(ConfigError, match="num_decode_workers=0"):
        build(FleetConfig, {"num_prefill_workers": 2})
    with pytest.raises(ConfigError, match="expected pools"):
        Fleet({"prefill": EngineConfig()})


# ------------------------------------------------------------------------------------------ model config
LLAMA3_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


def test_kv_bytes_per_token_from_hf_config(tmp_path):
    # 32 layers x 2 x 8 KV heads x 128 head dim x 2 bytes = 131072 B (the reference benchmark's value)
    assert kv_bytes_per_token_from_mapping(LLAMA3_8B) == 131072
    assert kv_bytes_per_token_from_mapping(LLAMA3_8B, "fp8") == 65536
    assert kv_bytes_per_token_from_mapping({**LLAMA3_8B, "torch_dtype": "float32"}) == 262144
    assert kv_bytes_per_token_from_mapping({**LLAMA3_8B, "head_dim": 64}) == 65536
    mha = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"}
    assert kv_bytes_per_token_from_mapping(mha) == 32 * 2 * 32 * 128 * 2
    mla = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert kv_bytes_per_token_from_mapping(mla) == 61 * 576 * 2
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA3_8B))
    assert kv_bytes_per_token_from_file(p) == 131072


def test_model_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="num_hidden_layers: missing"):
        kv_bytes_per_token_from_mapping({"num_attention_heads": 8, "hidden_size": 512, "torch_dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="torch_dtype: missing"):
        kv_bytes_per_token_from_mapping({k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"})
    assert (
        kv_bytes_per_token_from_mapping({k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"}, "bfloat16")
        == 131072
    )
    with pytest.raises(ConfigError, match="kv_cache_dtype='int3'"):
        kv_bytes_per_token_from_mapping(LLAMA3_8B, "int3")
    with pytest.raises(ConfigError, match="not found"):
        kv_bytes_per_token_from_file(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        kv_bytes_per_token_from_file(bad)


# ------------------------------------------------------------------------------------------ CLI
def test_cli_disaggregated_replay_and_errors(tmp_path, capsys):
    from planner.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 374, "output_length": 4, "hash_ids": [1]}\n')
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA3_8B))
    out = tmp_path / "r.json"
    rc = main(
        [
            "replay",
            "--trace",
            str(trace),
            "--prefill-workers",
            "1",
            "--decode-workers",
            "1",
            "--kv-transfer-bandwidth",
            "64",
            "--model-config",
            str(cfg),
            "--quiet",
            "--report-json",
            str(out),
        ]
    )
    assert rc in (0, None)
    rep = json.loads(out.read_text())
    assert rep["mean_ttft_ms"] == pytest.approx(28.764127, abs=1e-6)
    assert rep["prefill_worker_seconds"] == pytest.approx(rep["decode_worker_seconds"])
    assert rep["prefill_worker_seconds"] == pytest.approx(0.046042218, abs=1e-9)
    for argv, msg in [
        (["--prefill-workers", "1"], "give both"),
        (
            ["--prefill-workers", "1", "--decode-workers", "1", "--kv-transfer-bandwidth", "64"],
            "needs --kv-bytes-per-token",
        ),
        (["--kv-bytes-per-token", "5"], "only for a disaggregated fleet"),
    ]:
        try:
            code = main(["replay", "--trace", str(trace), "--quiet", *argv])
        except SystemExit as e:  # argparse-level errors
            code = e.code  # type: ignore[assignment]
        assert code == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("handoff", ["direct", "coordinated"])
def test_decode_side_failure_releases_holds_and_fails_the_request(handoff):
    """A prompt that fits the prefill worker but can never fit the decode worker: the request fails on the
    decode side; the reservation (capped at what the destination has) and the hold are released once."""
    fl = Fleet(
        {"prefill": EngineConfig(), "decode": EngineConfig(num_gpu_blocks=8)},
        transfer=KvTransferConfig(64, 131072, handoff=handoff),
    )
    fl.add_worker("prefill", 0.0)
    fl.add_worker("decode", 0.0)
    bad = fl.submit(TraceRequest(0, 0.0, 2000, 5, None), 0.0)  # 32 blocks > 8 on the decode worker
    ok = fl.submit(TraceRequest(1, 1.0, 100, 5, None), 1.0)
    fl.finish()
    assert bad.status == "failed" and bad.first_token_ms is None and bad.prefill_worker_id == 0
    assert ok.status == "finished" and len(ok.token_times_ms) == 5
    assert fl.holds_taken == fl.holds_released == (4 if handoff == "coordinated" else 0)
    for c in fl.cores("prefill") + fl.cores("decode"):
        c.check_invariants()
        assert c.kv.private_in_use == 0


def test_source_hold_pins_its_own_cached_prompt_blocks():
    """1000-token prompt with hash ids: 15 full blocks are cached on the prefill worker when its prefill ends;
    the coordinated hold pins those 15 (no other block evicted) and holds 1 private block for the tail."""
    fl = disagg(transfer=SLOW)
    fl.submit(TraceRequest(0, 0.0, 1000, 3, (1, 2)), 0.0)
    fl.advance_until(100.0)
    (src,) = fl.cores("prefill")
    assert len(src.kv.active) == 15 and src.kv.private_in_use == 1
    assert src.kv.num_active_blocks() == 16
    fl.finish()
    assert len(src.kv.active) == 0 and src.kv.private_in_use == 0 and len(src.kv.inactive) == 15
    assert fl.holds_taken == fl.holds_released == 2


def test_cli_model_config_binary_file_is_one_line(tmp_path, capsys):
    from planner.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 374, "output_length": 4, "hash_ids": [1]}\n')
    blob = tmp_path / "model.safetensors"
    blob.write_bytes(bytes(range(256)) * 4)  # 0x80.. are invalid UTF-8 start bytes
    rc = main(
        [
            "replay",
            "--trace",
            str(trace),
            "--prefill-workers",
            "1",
            "--decode-workers",
            "1",
            "--kv-transfer-bandwidth",
            "64",
            "--model-config",
            str(blob),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(blob) in err and "not a text file" in err
    with pytest.raises(ConfigError, match="not a text file"):
        kv_bytes_per_token_from_file(blob)

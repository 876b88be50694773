"""Performance interpolation and throughput-loop formulas against hand-computed values."""

import math

import numpy as np
import pytest

from dynoplan.errors import ProfileError
from planner.core.interpolation import (
    DecodeProfile,
    PerformanceProfile,
    PrefillProfile,
    load_profile,
    profile_from_arrays,
    save_profile,
)
from planner.core.throughput import (
    Demand,
    ceil_replicas,
    clamp_correction,
    decode_correction,
    prefill_correction,
    size_decode,
    size_prefill,
)


def prefill_profile():
    # ISL 1000 -> 100 ms, 10000 tok/s/GPU; ISL 3000 -> 300 ms, 6000 tok/s/GPU (linear in between)
    return PrefillProfile([1000.0, 3000.0], [100.0, 300.0], [10000.0, 6000.0])


def decode_profile(resolution=201):
    # ITL = 10 + 40 x kv_usage ms (any context); thpt/GPU at context 1000: 4000 x kv, at 3000: 2000 x kv
    return DecodeProfile(
        [0.0, 1.0],
        [1000.0, 3000.0],
        [[10.0, 10.0], [50.0, 50.0]],
        [[0.0, 0.0], [4000.0, 2000.0]],
        max_kv_tokens=200000.0,
        resolution=resolution,
    )


def test_prefill_interpolation_linear_and_clamped():
    p = prefill_profile()
    assert p.ttft_ms_at(2000) == pytest.approx(200.0)
    assert p.thpt_per_gpu_at(2000) == pytest.approx(8000.0)
    assert p.thpt_per_gpu_at(10) == 10000.0 and p.thpt_per_gpu_at(1e6) == 6000.0  # clamped, not extrapolated


def test_decode_interpolation_bilinear_and_best_point():
    d = decode_profile()
    assert d.itl_ms_at(0.25, 2000) == pytest.approx(20.0)
    assert d.thpt_per_gpu_at(0.5, 2000) == pytest.approx(1500.0)  # midway between 2000 and 1000
    best = d.best_thpt_per_gpu(30.0, 2000)
    assert best.meets_itl and best.kv_usage == pytest.approx(0.5) and best.thpt_per_gpu == pytest.approx(1500.0)
    worst = d.best_thpt_per_gpu(5.0, 2000)  # even an empty engine has ITL 10 ms
    assert not worst.meets_itl and worst.kv_usage == 0.0


def test_prefill_replicas_formula():
    p = prefill_profile()
    # 3600 req x 2000 tok / 180 s = 40000 tok/s; x min(1, 0.5) = 20000; / 8000 tok/s/GPU = 2.5 GPUs
    s = size_prefill(Demand(3600, 2000, 100), 180.0, 0.5, p, 1)
    assert s.replicas_exact == pytest.approx(2.5) and s.replicas == 3
    # p_corr > 1 is capped at 1 (reference formula): 40000 / 8000 = 5.0 -> exactly 5 replicas
    s = size_prefill(Demand(3600, 2000, 100), 180.0, 2.0, p, 1)
    assert s.replicas_exact == pytest.approx(5.0) and s.replicas == 5
    # 2 GPUs per engine: 5 GPUs -> 2.5 engines -> 3
    assert size_prefill(Demand(3600, 2000, 100), 180.0, 2.0, p, 2).replicas == 3
    assert size_prefill(Demand(0, math.nan, math.nan), 180.0, 1.0, p, 1).replicas == 0


def test_decode_replicas_formula():
    d = decode_profile()
    # 3600 req x 150 tok / 180 s = 3000 tok/s; ITL 30 ms at context 1500+75 -> clamp... use isl 1925: ctx 2000
    s = size_decode(Demand(3600, 1925, 150), 180.0, 1.0, 30.0, d, 1)
    assert s.thpt_per_gpu == pytest.approx(1500.0) and s.replicas_exact == pytest.approx(2.0) and s.replicas == 2
    # d_corr 1.5: corrected ITL 20 ms -> kv 0.25 -> 750 tok/s/GPU -> 4 replicas
    s = size_decode(Demand(3600, 1925, 150), 180.0, 1.5, 30.0, d, 1)
    assert s.thpt_per_gpu == pytest.approx(750.0) and s.replicas == 4


def test_correction_factors():
    p, d = prefill_profile(), decode_profile()
    assert prefill_correction(300.0, 2000.0, p) == pytest.approx(1.5)  # 300 / 200
    # concurrency = 3600/4 x 10 s / 180 s = 50; kv = 50 x (1500 + 500) / 200000 = 0.5 -> expected 30 ms
    assert decode_correction(45.0, 3600, 1500, 1000, 10.0, 4, 180.0, d) == pytest.approx(1.5)
    assert math.isnan(prefill_correction(math.nan, 2000.0, p))
    assert clamp_correction(math.nan, 1.2) == 1.2 and clamp_correction(50.0, 1.0) == 10.0
    assert clamp_correction(0.01, 1.0) == 0.1


def test_ceil_tolerates_float_noise():
    assert ceil_replicas(2.0000000000001) == 2 and ceil_replicas(2.01) == 3
    assert ceil_replicas(math.nan) == 0 and ceil_replicas(-1.0) == 0


def test_npz_round_trip(tmp_path):
    prof = PerformanceProfile(prefill_profile(), decode_profile())
    path = tmp_path / "profile.npz"
    save_profile(prof, path)
    with np.load(path) as z:
        assert sorted(z.files) == [
            "decode_context_length",
            "decode_itl_ms",
            "decode_kv_usage",
            "decode_max_kv_tokens",
            "decode_thpt_per_gpu",
            "prefill_isl",
            "prefill_thpt_per_gpu",
            "prefill_ttft_ms",
        ]
    back = load_profile(path)
    assert back.prefill.thpt_per_gpu_at(2000) == pytest.approx(8000.0)
    assert back.decode.itl_ms_at(0.25, 2000) == pytest.approx(20.0) and back.decode.max_kv_tokens == 200000.0


def test_profiler_results_dir(tmp_path):
    (tmp_path / "selected_prefill_interpolation").mkdir()
    (tmp_path / "selected_decode_interpolation").mkdir()
    np.savez(
        tmp_path / "selected_prefill_interpolation" / "raw_data.npz",
        prefill_isl=np.array([3000.0, 1000.0]),
        prefill_ttft=np.array([300.0, 100.0]),
        prefill_thpt_per_gpu=np.array([6000.0, 10000.0]),
    )
    x, y = np.meshgrid([0.0, 0.5, 1.0], [1000.0, 2000.0, 3000.0], indexing="ij")
    np.savez(
        tmp_path / "selected_decode_interpolation" / "raw_data.npz",
        x_kv_usage=x.ravel(),
        y_context_length=y.ravel(),
        z_itl=(10 + 40 * x).ravel(),
        z_thpt_per_gpu=(x * (5000 - y)).ravel(),
        max_kv_tokens=np.array([123456]),
    )
    prof = load_profile(tmp_path)
    assert prof.prefill.ttft_ms_at(2000) == pytest.approx(200.0)  # unsorted input sorted
    assert prof.decode.max_kv_tokens == 123456.0
    assert prof.decode.itl_ms_at(0.25, 2500) == pytest.approx(20.0)
    assert prof.decode.thpt_per_gpu_at(0.5, 2000) == pytest.approx(1500.0)


def test_profile_errors_name_file_and_array(tmp_path):
    path = tmp_path / "p.npz"
    np.savez(path, prefill_isl=np.array([1.0, 2.0]), prefill_ttft_ms=np.array([1.0, 2.0]))
    with pytest.raises(ProfileError, match=r"p.npz: missing array 'prefill_thpt_per_gpu'"):
        load_profile(path)
    with pytest.raises(ProfileError, match="prefill_isl.*strictly increasing"):
        profile_from_arrays({"prefill_isl": [2.0, 1.0], "prefill_ttft_ms": [1, 2], "prefill_thpt_per_gpu": [1, 2]})
    with pytest.raises(ProfileError, match=r"array 'decode_itl_ms' has shape \(3,\): expected 2-D"):
        DecodeProfile([0.0, 1.0], [1.0], [1.0, 2.0, 3.0], [[1.0], [2.0]], 10.0)
    with pytest.raises(
        ProfileError, match=r"decode_itl_ms \(1, 3\) / decode_thpt_per_gpu \(2, 1\): expected shape \(2, 1\)"
    ):
        DecodeProfile([0.0, 1.0], [1.0], [[1.0, 2.0, 3.0]], [[1.0], [2.0]], 10.0)
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(tmp_path / "nope.npz")
    with pytest.raises(ProfileError, match="not a profiler results directory"):
        load_profile(tmp_path)


GOOD_PREFILL = {"prefill_isl": [100.0, 200.0], "prefill_ttft_ms": [10.0, 20.0], "prefill_thpt_per_gpu": [1e4, 1e4]}
GOOD_DECODE = {
    "decode_kv_usage": [0.0, 1.0],
    "decode_context_length": [100.0, 200.0],
    "decode_itl_ms": [[5.0, 6.0], [7.0, 8.0]],
    "decode_thpt_per_gpu": [[10.0, 20.0], [30.0, 40.0]],
    "decode_max_kv_tokens": [1000],
}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("prefill_isl", np.array(["a", "b"]), "array 'prefill_isl' has dtype <U1: expected real numbers"),
        ("prefill_isl", np.array([1 + 1j, 2.0]), "array 'prefill_isl' has dtype complex128: expected real numbers"),
        ("prefill_isl", [0.0, 200.0], "array 'prefill_isl'[0] = 0: expected finite values > 0"),
        ("prefill_ttft_ms", [10.0, -2.0], "array 'prefill_ttft_ms'[1] = -2: expected finite values > 0"),
        ("prefill_thpt_per_gpu", [1e4, 0.0], "array 'prefill_thpt_per_gpu'[1] = 0: expected finite values > 0"),
        ("decode_kv_usage", [-0.5, 1.0], "array 'decode_kv_usage'[0] = -0.5: expected finite values >= 0"),
        ("decode_itl_ms", [[5.0, 6.0], [0.0, 8.0]], "array 'decode_itl_ms'[1, 0] = 0: expected finite values > 0"),
        (
            "decode_thpt_per_gpu",
            [[1.0, -1.0], [1.0, 1.0]],
            "array 'decode_thpt_per_gpu'[0, 1] = -1: expected finite values >= 0",
        ),
        ("decode_max_kv_tokens", np.array(["x"]), "array 'decode_max_kv_tokens' has dtype <U1: expected real"),
        ("decode_max_kv_tokens", [0], "array 'decode_max_kv_tokens'[0] = 0: expected finite values > 0"),
        ("decode_max_kv_tokens", np.zeros(0), "array 'decode_max_kv_tokens': expected finite values, non-empty"),
        # a NaN or infinity by its index too (was: "array 'prefill_ttft_ms': expected finite values, non-empty")
        ("prefill_ttft_ms", [10.0, np.nan], "array 'prefill_ttft_ms'[1] = nan: expected finite values > 0"),
        ("decode_kv_usage", [0.0, np.inf], "array 'decode_kv_usage'[1] = inf: expected finite values >= 0"),
        (
            "decode_itl_ms",
            [[5.0, 6.0], [-np.inf, np.nan]],
            "array 'decode_itl_ms'[1, 0] = -inf: expected finite values > 0",
        ),
        (
            "decode_thpt_per_gpu",
            [[1.0, 2.0], [3.0, np.nan]],
            "array 'decode_thpt_per_gpu'[1, 1] = nan: expected finite values >= 0",
        ),
    ],
)
def test_profile_values_out_of_range_name_the_array_index_and_value(name, value, message):
    arrays = {**GOOD_PREFILL, **GOOD_DECODE, name: value}
    with pytest.raises(ProfileError) as exc:
        profile_from_arrays(arrays, source="p.npz")
    assert str(exc.value).startswith(f"p.npz: {message}")
    good = profile_from_arrays({**GOOD_PREFILL, **GOOD_DECODE})  # the unmodified arrays load
    assert good.decode is not None and good.decode.max_kv_tokens == 1000.0  # an integer array is real too


def test_profiler_results_dir_values_are_checked_too(tmp_path):
    d = tmp_path / "selected_prefill_interpolation"
    d.mkdir()
    np.savez(d / "raw_data.npz", prefill_isl=[100.0, 200.0], prefill_ttft=[10.0, np.nan], prefill_thpt_per_gpu=[1, 2])
    with pytest.raises(ProfileError) as exc:
        load_profile(tmp_path)
    assert str(exc.value) == f"{d / 'raw_data.npz'}: array 'prefill_ttft'[1] = nan: expected finite values > 0"

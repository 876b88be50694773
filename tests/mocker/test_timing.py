"""Timing sources: the polynomial baseline by hand, NPZ interpolation and extrapolation, ns rounding."""

from __future__ import annotations

import numpy as np
import pytest

from dynoplan.errors import ConfigError
from mocker.config import EngineConfig
from mocker.timing import (
    NpzTiming,
    PolynomialTiming,
    decode_pass_ms,
    decode_pass_ms_array,
    load_timing,
    round_ns,
    round_ns_array,
)


def test_polynomial_prefill_by_hand():
    t = PolynomialTiming(16384 * 64)
    # T = 374: 4.209989e-07 * 374^2 + 1.518344e-02 * 374 + 16.50142
    assert t.prefill_ms(1, 374, 0) == pytest.approx(0.0588870 + 5.6786066 + 16.50142, abs=1e-6)
    # T = batch * (mean ISL - mean prefix) = 2 * (1000 - 600) = 800
    assert t.prefill_ms(2, 1000, 600) == pytest.approx(4.209989e-07 * 640000 + 1.518344e-02 * 800 + 16.50142)
    assert t.prefill_ms(3, 500, 500) == 0.0
    assert t.prefill_ms(0, 0, 0) == 0.0


def test_polynomial_decode_by_hand():
    total = 16384 * 64
    t = PolynomialTiming(total)
    # p = 375 / 1048576 -> 5.74 + 54.01 p - 25.74 p^2 = 5.759312 (the reference's second-token gap)
    assert round_ns(float(t.decode_ms_array(np.array([375.0]), np.array([375.0]))[0])) == pytest.approx(
        5.759312, abs=1e-9
    )
    # full cache: p = 1 -> -25.74 + 54.01 + 5.74 = 34.01
    assert float(t.decode_ms_array(np.array([float(total)]), np.array([1.0]))[0]) == pytest.approx(34.01)
    # floor at 1 ms never binds for p >= 0 with these coefficients, but is applied
    assert float(PolynomialTiming(1).decode_ms_array(np.array([-1.0]), np.array([1.0]))[0]) == 1.0


def test_reference_prefill_374_rounds_to_the_ns():
    t = PolynomialTiming(16384 * 64)
    assert round_ns(t.prefill_ms(1, 374, 0)) == pytest.approx(22.238914, abs=1e-12)


def test_round_ns_scalar_and_vector_agree_bitwise():
    rng = np.random.default_rng(1)
    xs = np.concatenate([rng.uniform(0, 50, 2000), rng.uniform(900, 3000, 200)])
    assert [round_ns(float(x)) for x in xs] == round_ns_array(xs).tolist()


@pytest.mark.parametrize("speedup", [1.0, 2.5])
def test_decode_scalar_and_vector_twins_agree_bitwise(speedup):
    t = PolynomialTiming(16384 * 64)
    s = np.arange(1, 400_000, 997, dtype=np.int64)
    vec = decode_pass_ms_array(t, s, 7, speedup).tolist()
    assert vec == [decode_pass_ms(t, int(x), 7, speedup) for x in s]


def test_decode_table_is_the_scalar_twin_bitwise_and_grows_on_demand():
    total = 16384 * 64
    t = PolynomialTiming(total)
    small = t.decode_table(10)
    assert small.size == 4096  # the minimum chunk
    assert t.decode_table(4095) is small  # covered: no regrowth
    grown = t.decode_table(5000)
    assert grown.size == 8192 and np.array_equal(grown[:4096], small)  # at least twofold, prefix unchanged
    s = list(range(0, 2 * total + 1, 173)) + [total, 2 * total]  # up to the engines' cap (twice the capacity)
    table = t.decode_table(2 * total)
    assert table.size == 2 * total + 1
    assert [float(table[x]) for x in s] == [decode_pass_ms(t, x, 5, 1.0) for x in s]
    assert float(table[375]) == pytest.approx(5.759312, abs=1e-9)  # the reference's second-token gap (above)


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "profile.npz"
    np.savez(
        path,
        prefill_isl=np.array([100.0, 200.0, 400.0]),
        prefill_ttft_ms=np.array([10.0, 30.0, 50.0]),
        decode_active_kv_tokens=np.array([0.0, 1000.0]),
        decode_context_length=np.array([100.0, 200.0]),
        decode_itl=np.array([[5.0, 7.0], [9.0, 11.0]]),
    )
    return path


def test_npz_prefill_linear_and_extrapolated(npz):
    t = NpzTiming(npz)
    assert t.prefill_ms(1, 150, 0) == pytest.approx(20.0)  # halfway 10 -> 30
    assert t.prefill_ms(2, 150, 50) == pytest.approx(30.0)  # 2 * 100 = 200 new tokens
    assert t.prefill_ms(1, 300, 0) == pytest.approx(40.0)  # halfway 30 -> 50
    assert t.prefill_ms(1, 600, 0) == pytest.approx(70.0)  # beyond: slope 0.1 ms/token
    assert t.prefill_ms(1, 50, 0) == pytest.approx(0.0)  # below: 10 - 0.2 * 50 = 0
    assert t.prefill_ms(1, 20, 0) == 0.0  # clamped at 0


def test_npz_decode_bilinear_and_extrapolated(npz):
    t = NpzTiming(npz)
    got = t.decode_ms_array(
        np.array([500.0, 0.0, 1000.0, 2000.0, 500.0]), np.array([150.0, 100.0, 200.0, 100.0, 300.0])
    )
    # centre: mean of corners 8; corners exact; (2000, 100): 5 + 2 * (9 - 5) = 13;
    # (500, 300): at x=500 the value is 7 at y=100 and 9 at y=200, so 11 at y=300
    assert got.tolist() == pytest.approx([8.0, 5.0, 11.0, 13.0, 11.0])


def test_npz_errors_name_the_file_and_arrays(tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, prefill_isl=np.array([1.0]), prefill_ttft_ms=np.array([1.0]))
    with pytest.raises(ConfigError, match="bad.npz.*decode_active_kv_tokens"):
        NpzTiming(bad)
    shape = tmp_path / "shape.npz"
    np.savez(
        shape,
        prefill_isl=np.array([1.0, 2.0]),
        prefill_ttft_ms=np.array([1.0, 2.0]),
        decode_active_kv_tokens=np.array([0.0, 1.0]),
        decode_context_length=np.array([1.0, 2.0, 3.0]),
        decode_itl=np.ones((2, 2)),
    )
    with pytest.raises(ConfigError, match=r"decode_itl: expected shape .*\(2, 3\)"):
        NpzTiming(shape)


def test_load_timing_from_engine_config(npz):
    assert isinstance(load_timing(EngineConfig()), PolynomialTiming)
    assert isinstance(load_timing(EngineConfig(timing=str(npz))), NpzTiming)


def test_npz_drives_an_engine(npz):
    from mocker.engine import VllmCore
    from mocker.records import TraceRequest

    core = VllmCore(EngineConfig(timing=str(npz)))
    rec = core.add_request(TraceRequest(0, 0.0, 150, 3, None), 0.0)
    core.advance_until(float("inf"))
    core.finalize()
    assert rec.first_token_ms == pytest.approx(20.0)
    # second token: active KV = 151 tokens, context 151 -> bilinear on the grid
    expect = 5 + (9 - 5) * 0.151 + (7 - 5) * 0.51 + (11 - 9 - 7 + 5) * 0.151 * 0.51
    assert rec.token_times_ms[1] - rec.token_times_ms[0] == pytest.approx(expect, abs=1e-6)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("prefill_isl", np.array(["a", "b", "c"]), "prefill_isl has dtype <U1: expected real numbers"),
        (
            "prefill_isl",
            np.array([100.0, None, 400.0], dtype=object),
            "prefill_isl has dtype object: expected real numbers",
        ),
        ("decode_itl", np.array([[5.0, 7.0], [9.0, 11j]]), "decode_itl has dtype complex128: expected real numbers"),
        ("prefill_ttft_ms", np.array([10.0, -30.0, 50.0]), "prefill_ttft_ms[1] = -30: expected ms > 0, finite"),
        ("prefill_ttft_ms", np.array([10.0, 30.0, np.nan]), "prefill_ttft_ms[2] = nan: expected ms > 0, finite"),
        ("decode_itl", np.array([[5.0, 7.0], [0.0, 11.0]]), "decode_itl[1, 0] = 0: expected ms > 0, finite"),
        (
            "decode_active_kv_tokens",
            np.array([-1.0, 1000.0]),
            "decode_active_kv_tokens[0] = -1: expected tokens >= 0, finite",
        ),
        ("prefill_isl", np.array([100.0, 400.0, 100.0]), "prefill_isl: 100 appears twice; expected distinct values"),
    ],
)
def test_npz_values_name_the_array_index_and_value(tmp_path, npz, name, value, message):
    arrays = dict(np.load(npz))
    arrays[name] = value
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ConfigError) as exc:
        NpzTiming(bad)
    assert str(exc.value) == f"timing={str(bad)!r}: {message}"


def test_npz_unsorted_axes_are_sorted_not_refused(tmp_path, npz):
    # the reference's grid need not be sorted: NpzTiming sorts each axis with its values
    arrays = dict(np.load(npz))
    arrays["prefill_isl"], arrays["prefill_ttft_ms"] = arrays["prefill_isl"][::-1], arrays["prefill_ttft_ms"][::-1]
    path = tmp_path / "unsorted.npz"
    np.savez(path, **arrays)
    assert NpzTiming(path).prefill_ms(1, 150, 0) == pytest.approx(20.0)  # as test_npz_prefill_linear_and_extrapolated

import math
import warnings

import numpy as np
import pytest

from dynoplan.errors import ConfigError
from planner.core.config import PlannerConfig
from planner.core.predictors import (
    ArimaPredictor,
    AutoPredictor,
    ConstantPredictor,
    KalmanPredictor,
    ProphetPredictor,
    make_predictor,
)


def test_constant_skips_nan_and_leading_idle():
    p = ConstantPredictor()
    assert math.isnan(p.predict_next())  # nothing observed: unknown
    p.add(0.0)
    p.add(0.0)
    assert p.predict_next() == 0.0 and p.values == []  # leading idle skipped, but known to be idle
    p.add(12.0)
    p.add(float("nan"))
    p.add(float("inf"))
    assert p.predict_next() == 12.0 and p.skipped_nonfinite == 2
    p.add(0.0)  # a zero after traffic is real: demand dropped
    assert p.predict_next() == 0.0
    p.add(-3.0)
    assert p.predict_next() == 0.0


def _numpy_llt(series, q_level, q_trend, r):
    """Independent local-linear-trend Kalman filter (textbook equations) for cross-checking."""
    F = np.array([[1.0, 1.0], [0.0, 1.0]])
    H = np.array([[1.0, 0.0]])
    Q = np.diag([q_level, q_trend])
    x = np.array([series[0], 0.0])
    P = np.eye(2) * 1e4
    for z in series[1:]:
        x = F @ x
        P = F @ P @ F.T + Q
        S = H @ P @ H.T + r
        K = P @ H.T / S
        x = x + (K * (z - H @ x)).ravel()
        P = (np.eye(2) - K @ H) @ P
    return float((F @ x)[0])


def test_kalman_matches_filterpy_and_textbook():
    from filterpy.kalman import KalmanFilter

    rng = np.random.default_rng(7)
    series = 100 + 3.0 * np.arange(40) + rng.normal(0, 2.0, 40)
    p = KalmanPredictor()
    kf = KalmanFilter(dim_x=2, dim_z=1)
    kf.F = np.array([[1.0, 1.0], [0.0, 1.0]])
    kf.H = np.array([[1.0, 0.0]])
    kf.Q = np.diag([1.0, 0.1])
    kf.R = np.array([[10.0]])
    kf.x = np.array([[series[0]], [0.0]])
    kf.P = np.eye(2) * 1e4
    for i, v in enumerate(series):
        p.add(v)
        if i > 0:
            kf.predict()
            kf.update(v)
        if i + 1 >= 5:
            assert p.predict_next() == pytest.approx(float((kf.F @ kf.x)[0, 0]), rel=1e-12)
            assert p.predict_next() == pytest.approx(_numpy_llt(series[: i + 1], 1.0, 0.1, 10.0), rel=1e-9)
    # the trend is learnt: next value of 100 + 3 t at t = 40 is 220
    assert p.predict_next() == pytest.approx(220.0, abs=4.0)


def test_kalman_warmup_is_constant():
    p = KalmanPredictor(min_points=5)
    for v in (10.0, 20.0, 30.0, 40.0):
        p.add(v)
        assert p.predict_next() == v and p.used_fallback
    p.add(50.0)
    assert p.predict_next() > 50.0 and not p.used_fallback


def test_arima_matches_pmdarima_with_incremental_updates():
    import pmdarima

    rng = np.random.default_rng(3)
    y = np.empty(60)
    y[0] = 50.0
    for t in range(1, 60):
        y[t] = 50.0 + 0.7 * (y[t - 1] - 50.0) + rng.normal(0, 3.0)
    p = ArimaPredictor(min_points=30, refit_every=1000)
    for v in y:
        p.add(v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = pmdarima.auto_arima(y[:30], seasonal=False, stepwise=True, suppress_warnings=True, error_action="ignore")
        for v in y[30:]:
            ref.update([v])  # incremental, one interval at a time like the planner
        expected = float(np.asarray(ref.predict(n_periods=1))[0])
    assert p.fits == 1
    assert p.predict_next() == pytest.approx(expected, rel=1e-9)


def test_arima_log1p_predicts_in_original_units():
    import pmdarima

    y = np.exp(np.linspace(2.0, 5.0, 25)) + np.tile([0.0, 3.0, -2.0, 1.0, 0.0], 5)
    p = ArimaPredictor(min_points=25, log1p=True)
    for v in y:
        p.add(v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = pmdarima.auto_arima(
            np.log1p(y), seasonal=False, stepwise=True, suppress_warnings=True, error_action="ignore"
        )
    assert p.predict_next() == pytest.approx(float(np.expm1(np.asarray(ref.predict(n_periods=1))[0])), rel=1e-9)


def test_arima_degenerate_fit_is_refit_later():
    p = ArimaPredictor(min_points=5, refit_every=3)
    for _ in range(5):
        p.add(10.0)  # a flat series: auto_arima picks no AR/MA terms
    assert p.fits == 1 and p.degenerate
    assert p.predict_next() == pytest.approx(10.0)
    p.add(10.0)
    p.add(10.0)
    assert p.fits == 1
    p.add(11.0)
    assert p.fits == 2


def test_model_error_falls_back_to_constant():
    p = ArimaPredictor(min_points=3)
    for v in (5.0, 7.0, 6.0):
        p.add(v)

    class Broken:
        order = (1, 0, 0)

        def predict(self, n_periods):
            raise RuntimeError("boom")

    p.model, p.degenerate = Broken(), False
    p._cache = None
    assert p.predict_next() == 6.0
    assert p.last_error == "RuntimeError: boom" and p.used_fallback


@pytest.mark.slow
def test_prophet_matches_library_on_its_window():
    import pandas as pd
    from prophet import Prophet

    y = 200 + 20 * np.sin(np.arange(70) / 4.0) + np.arange(70)
    p = ProphetPredictor(window=50, interval_s=180.0)
    for v in y:
        p.add(v)
    got = p.predict_next()
    ds = pd.to_datetime((np.arange(50) + 20) * 180.0, unit="s")
    m = Prophet()
    m.fit(pd.DataFrame({"ds": ds, "y": y[-50:]}))
    want = float(m.predict(pd.DataFrame({"ds": pd.to_datetime([70 * 180.0], unit="s")}))["yhat"].iloc[0])
    assert got == pytest.approx(want, rel=1e-6)


def test_auto_picks_lowest_rolling_error():
    p = AutoPredictor([ConstantPredictor(), KalmanPredictor()], error_window=5)
    for t in range(30):
        p.add(10.0 + 4.0 * t)
    errs = p.mean_errors()
    assert errs["constant"] == pytest.approx(4.0)  # the last value lags a +4 trend by exactly 4
    assert errs["kalman"] < 1.0
    nxt = p.predict_next()
    assert p.chosen == "kalman" and nxt == pytest.approx(10.0 + 4.0 * 30, abs=1.0)


def test_auto_before_any_score_uses_first_candidate():
    p = AutoPredictor([ConstantPredictor(), KalmanPredictor()])
    p.add(5.0)
    assert p.predict_next() == 5.0 and p.chosen == "constant"


def test_factory_uses_config_and_rejects_unknown():
    c = PlannerConfig(predictor="kalman", kalman_r=3.0, kalman_min_points=2)
    k = make_predictor("kalman", c)
    assert isinstance(k, KalmanPredictor) and k.r == 3.0 and k.min_points == 2
    a = make_predictor("auto", PlannerConfig(auto_candidates=("constant", "kalman")))
    assert [x.name for x in a.candidates] == ["constant", "kalman"]
    with pytest.raises(ConfigError, match="predictor='lstm'"):
        make_predictor("lstm", c)


def test_warm_start_feeds_history():
    p = KalmanPredictor()
    p.warm_start([0.0, 0.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    assert p.values == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert p.predict_next() > 50.0


@pytest.mark.slow
def test_prophet_refit_every_k_predicts_from_last_fit():
    y = list(200 + 20 * np.sin(np.arange(12) / 4.0) + np.arange(12))
    p = ProphetPredictor(window=50, interval_s=180.0, refit_every=3, phase=0)
    preds = []
    for v in y:
        p.add(v)
        preds.append(p.predict_next())
    # fitted first at the 5th point (model missing), then when (n + 0) % 3 == 0: n = 6, 9, 12
    assert p.fits == 4
    q = ProphetPredictor(window=50, interval_s=180.0)  # reference: refit every point
    for v in y:
        q.add(v)
    assert preds[-1] == pytest.approx(q.predict_next(), rel=1e-6)  # n = 12 was a refit point


def test_arima_phase_staggers_the_first_fit():
    p = ArimaPredictor(min_points=5, phase=2)
    for v in [3.0, 5.0, 4.0, 6.0, 5.0, 7.0]:
        p.add(v)
        assert p.fits == 0 and p.predict_next() == v  # constant fallback while waiting
    p.add(6.0)
    assert p.fits == 1

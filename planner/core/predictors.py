"""Demand predictors: next interval's request count, mean ISL and mean OSL from their history.

Every predictor shares one input contract (:class:`BasePredictor`):

- NaN / inf observations are skipped (an unknown interval is not a zero-demand interval);
- leading idle values (zeros before the first non-zero value) are skipped, so a quiet start does not
  drag the model to zero (Dynamo's predictors do the same);
- while warming up (fewer points than the model needs) or when the model fails or returns a
  non-finite value, the prediction falls back to the last observed value ("constant");
- predictions are never negative. :meth:`predict_next` returns NaN only when nothing was observed.

Models (registry :data:`PREDICTOR_TYPES`, names as in the config):

- ``constant``: the last value.
- ``arima``: ``pmdarima.auto_arima`` (non-seasonal, stepwise) fitted once ``min_points`` are known,
  then ``model.update([y])`` per new point; optional log1p transform (predict expm1); a degenerate fit
  (order (0, d, 0): no AR/MA terms; on a flat series it predicts 0) is not used (constant fallback) and is
  refitted after ``refit_every`` further points.
- ``kalman``: local linear trend via ``filterpy.kalman.KalmanFilter`` — state (level, trend),
  F = [[1, 1], [0, 1]], H = [1, 0], Q = diag(q_level, q_trend), R = r; defaults 1.0 / 0.1 / 10.0 and 5
  min points from the Dynamo planner design. Initial state (first value, 0), P0 = 1e4 I.
  Prediction: level + trend after the latest update.
- ``prophet``: ``prophet.Prophet(uncertainty_samples=0)`` fitted on the last ``window`` points (default
  50) at timestamps spaced ``interval_s`` apart, predicting the next timestamp (``yhat``). Refitted every
  interval by default (reference); ``refit_every`` k > 1 refits every k-th point (``phase`` staggers the
  planner's three series so one tick carries at most one fit) and predicts from the last fit meanwhile.
- ``auto``: runs several candidates, keeps each one's absolute one-step errors over a rolling window
  and predicts with the candidate of lowest mean error so far (ties: the earlier candidate; none
  scored yet: the first candidate).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from dynoplan.errors import ConfigError

FloatArray = npt.NDArray[np.float64]


class Predictor(Protocol):
    """One series' predictor. ``add`` one observation per interval, ``predict_next`` the next value."""

    name: str

    def add(self, value: float) -> None: ...

    def predict_next(self) -> float: ...

    def warm_start(self, values: Sequence[float]) -> None: ...


def single_thread_blas() -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A factory of contexts limiting BLAS/OpenMP to one thread (``threadpoolctl``).

    Model fits are tiny matrix problems: multi-threaded OpenBLAS only spins, and on a shared 2-core machine
    it made ``auto_arima`` ~8x slower (measured 2.3 s vs 0.28 s for a 15-point fit). The controller is
    built once per predictor (library introspection ~3 ms); each limit then costs ~0.03 ms. The process default
    is one thread already (``dynoplan/__init__.py``); this keeps the fits at one where the environment asks for more
    (``OPENBLAS_NUM_THREADS``, OpenMP).
    """
    try:
        from threadpoolctl import ThreadpoolController

        ctl = ThreadpoolController()
        return lambda: ctl.limit(limits=1)
    except Exception:  # noqa: BLE001 - threadpoolctl missing or introspection failed: run unlimited
        return contextlib.nullcontext


class BasePredictor:
    """Shared input handling (see module docstring). Subclasses implement ``_on_value`` / ``_model_predict``."""

    name = "base"
    min_points = 1

    def __init__(self) -> None:
        self.values: list[float] = []
        """Accepted observations (after NaN and leading-idle skipping), oldest first."""
        self.seen_idle = False
        self.skipped_nonfinite = 0
        self.last_error: str | None = None
        """Message of the last model failure (the prediction fell back to constant), else None."""
        self.used_fallback = False
        self._cache: float | None = None

    def add(self, value: float) -> None:
        v = float(value)
        if not math.isfinite(v):
            self.skipped_nonfinite += 1
            return
        v = max(0.0, v)
        if not self.values and v == 0.0:
            self.seen_idle = True
            return
        self.values.append(v)
        self._cache = None
        try:
            self._on_value(v)
        except Exception as e:  # noqa: BLE001 - any model failure degrades to constant
            self.last_error = f"{type(e).__name__}: {e}"
            self._reset_model()

    def warm_start(self, values: Sequence[float]) -> None:
        """Feed historical interval values (e.g. from a trace), oldest first."""
        for v in values:
            self.add(v)

    def predict_next(self) -> float:
        if self._cache is not None:
            return self._cache
        if not self.values:
            return 0.0 if self.seen_idle else math.nan
        out = math.nan
        self.used_fallback = True
        if len(self.values) >= self.min_points:
            try:
                out = float(self._model_predict())
                self.used_fallback = not math.isfinite(out)
            except Exception as e:  # noqa: BLE001
                self.last_error = f"{type(e).__name__}: {e}"
                self._reset_model()
                out = math.nan
        if not math.isfinite(out):
            out = self.values[-1]
        self._cache = max(0.0, out)
        return self._cache

    # hooks
    def _on_value(self, v: float) -> None:  # pragma: no cover - trivial
        pass

    def _model_predict(self) -> float:
        return self.values[-1]

    def _reset_model(self) -> None:
        pass


class ConstantPredictor(BasePredictor):
    """Predicts the last observed value."""

    name = "constant"


class ArimaPredictor(BasePredictor):
    """pmdarima auto_arima with incremental updates (see module docstring)."""

    name = "arima"

    def __init__(self, *, min_points: int = 5, log1p: bool = False, refit_every: int = 10, phase: int = 0) -> None:
        super().__init__()
        self.min_points = min_points
        self.phase = phase
        """The first fit waits ``phase`` extra points (constant fallback meanwhile), so the planner's three
        series do not all run auto_arima in the same tick."""
        self.log1p = log1p
        self.refit_every = refit_every
        import pmdarima  # noqa: F401 - import cost paid at construction, not inside a tick

        self._limit = single_thread_blas()
        self.model: Any = None
        self.degenerate = False
        self.fits = 0
        self._since_fit = 0

    def _tf(self, v: FloatArray) -> FloatArray:
        out: FloatArray = np.log1p(v) if self.log1p else v
        return out

    def _tf_one(self, v: float) -> float:
        return float(np.log1p(v)) if self.log1p else v

    def _fit(self) -> None:
        import pmdarima

        y = self._tf(np.asarray(self.values, dtype=float))
        with warnings.catch_warnings(), self._limit():
            warnings.simplefilter("ignore")
            self.model = pmdarima.auto_arima(
                y, seasonal=False, stepwise=True, suppress_warnings=True, error_action="ignore"
            )
        order = tuple(self.model.order)
        self.degenerate = order[0] == 0 and order[2] == 0
        self.fits += 1
        self._since_fit = 0

    def _on_value(self, v: float) -> None:
        if len(self.values) < self.min_points + (self.phase if self.fits == 0 else 0):
            return
        if self.model is None or (self.degenerate and self._since_fit + 1 >= self.refit_every):
            self._fit()
            return
        with warnings.catch_warnings(), self._limit():
            warnings.simplefilter("ignore")
            self.model.update([self._tf_one(v)])
        self._since_fit += 1

    def _model_predict(self) -> float:
        if self.model is None or self.degenerate:  # a (0, d, 0) fit has nothing to add: constant
            return math.nan
        with warnings.catch_warnings(), self._limit():
            warnings.simplefilter("ignore")
            y = float(np.asarray(self.model.predict(n_periods=1))[0])
        return float(np.expm1(y)) if self.log1p else y

    def _reset_model(self) -> None:
        self.model = None


class KalmanPredictor(BasePredictor):
    """Local linear trend Kalman filter (filterpy)."""

    name = "kalman"

    def __init__(self, *, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0, min_points: int = 5) -> None:
        super().__init__()
        self.q_level, self.q_trend, self.r = q_level, q_trend, r
        self.min_points = min_points
        import filterpy.kalman  # noqa: F401 - import cost paid at construction, not inside a tick

        self.kf: Any = None

    def _new_filter(self, v0: float) -> Any:
        from filterpy.kalman import KalmanFilter

        kf = KalmanFilter(dim_x=2, dim_z=1)
        kf.F = np.array([[1.0, 1.0], [0.0, 1.0]])
        kf.H = np.array([[1.0, 0.0]])
        kf.Q = np.diag([self.q_level, self.q_trend])
        kf.R = np.array([[self.r]])
        kf.x = np.array([[v0], [0.0]])
        kf.P = np.eye(2) * 1e4
        return kf

    def _on_value(self, v: float) -> None:
        if self.kf is None:
            self.kf = self._new_filter(v)
            return
        self.kf.predict()
        self.kf.update(np.array([[v]]))

    def _model_predict(self) -> float:
        x = self.kf.F @ self.kf.x
        return float(x[0, 0])

    def _reset_model(self) -> None:
        self.kf = None


class ProphetPredictor(BasePredictor):
    """Prophet on a rolling window of the last ``window`` points, spaced ``interval_s`` apart."""

    name = "prophet"

    def __init__(
        self, *, window: int = 50, interval_s: float = 180.0, min_points: int = 5, refit_every: int = 1, phase: int = 0
    ) -> None:
        super().__init__()
        self.window = window
        self.refit_every = refit_every
        self.phase = phase
        self.fits = 0
        self._model: Any = None
        self.interval_s = interval_s
        self.min_points = max(2, min_points)
        import pandas  # noqa: F401 - import cost paid at construction, not inside a tick
        import prophet  # noqa: F401

        try:  # cmdstanpy installs its own INFO handler on first use: create it now, then quieten it
            from cmdstanpy.utils import get_logger

            get_logger()
        except Exception:  # noqa: BLE001
            pass
        for name in ("cmdstanpy", "prophet"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self._limit = single_thread_blas()

    def _model_predict(self) -> float:
        import pandas as pd
        from prophet import Prophet

        n = len(self.values)
        with warnings.catch_warnings(), self._limit():
            warnings.simplefilter("ignore")
            if self._model is None or (n + self.phase) % self.refit_every == 0:
                y = self.values[-self.window :]
                ds = pd.to_datetime((np.arange(len(y)) + n - len(y)) * self.interval_s, unit="s")
                m = Prophet(uncertainty_samples=0)  # yhat only: skips the interval sampling (large speed-up)
                m.fit(pd.DataFrame({"ds": ds, "y": y}))
                self._model = m
                self.fits += 1
            nxt = pd.DataFrame({"ds": pd.to_datetime([n * self.interval_s], unit="s")})
            return float(self._model.predict(nxt)["yhat"].iloc[0])

    def _reset_model(self) -> None:
        self._model = None


class AutoPredictor(BasePredictor):
    """Chooses among candidates by rolling mean absolute one-step error."""

    name = "auto"

    def __init__(self, candidates: Sequence[BasePredictor], *, error_window: int = 10) -> None:
        super().__init__()
        if not candidates:
            raise ConfigError("auto_candidates=[]: expected at least one predictor")
        self.candidates = list(candidates)
        self.errors: dict[str, deque[float]] = {c.name: deque(maxlen=error_window) for c in self.candidates}
        self.chosen: str = self.candidates[0].name

    def add(self, value: float) -> None:
        v = float(value)
        if math.isfinite(v) and (self.values or v > 0):
            for c in self.candidates:
                p = c.predict_next()
                if math.isfinite(p):
                    self.errors[c.name].append(abs(p - max(0.0, v)))
        for c in self.candidates:
            c.add(v)
        super().add(v)

    def mean_errors(self) -> dict[str, float]:
        """Candidate -> mean absolute one-step error over the window (inf when not scored yet)."""
        return {n: (sum(e) / len(e) if e else math.inf) for n, e in self.errors.items()}

    def predict_next(self) -> float:
        if self._cache is not None:
            return self._cache
        errs = self.mean_errors()
        best = (
            min(self.candidates, key=lambda c: errs[c.name])
            if any(math.isfinite(x) for x in errs.values())
            else self.candidates[0]
        )
        self.chosen = best.name
        self._cache = best.predict_next()
        return self._cache


PREDICTOR_TYPES: dict[str, type[BasePredictor]] = {
    "constant": ConstantPredictor,
    "arima": ArimaPredictor,
    "kalman": KalmanPredictor,
    "prophet": ProphetPredictor,
    "auto": AutoPredictor,
}


def make_predictor(name: str, config: Any, interval_s: float | None = None, phase: int = 0) -> BasePredictor:
    """Build predictor ``name`` with the settings of a :class:`~planner.core.config.PlannerConfig`.

    ``interval_s`` (default ``config.adjustment_interval_s``) spaces Prophet's timestamps; ``phase``
    staggers Prophet refits across series. Raises ConfigError for an unknown name.
    """
    interval = float(interval_s if interval_s is not None else config.adjustment_interval_s)
    builders: dict[str, Callable[[], BasePredictor]] = {
        "constant": ConstantPredictor,
        "arima": lambda: ArimaPredictor(
            min_points=config.predictor_min_points,
            log1p=config.predictor_log1p,
            refit_every=config.arima_refit_every,
            phase=phase,
        ),
        "kalman": lambda: KalmanPredictor(
            q_level=config.kalman_q_level,
            q_trend=config.kalman_q_trend,
            r=config.kalman_r,
            min_points=config.kalman_min_points,
        ),
        "prophet": lambda: ProphetPredictor(
            window=config.prophet_window,
            interval_s=interval,
            min_points=config.predictor_min_points,
            refit_every=config.prophet_refit_every,
            phase=phase,
        ),
        "auto": lambda: AutoPredictor(
            [make_predictor(c, config, interval, phase) for c in config.auto_candidates],
            error_window=config.auto_error_window,
        ),
    }
    if name not in builders:
        raise ConfigError(f"predictor={name!r}: expected one of {', '.join(builders)}")
    return builders[name]()

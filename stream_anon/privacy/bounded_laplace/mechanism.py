"""The bounded Laplace mechanism on a public grid (exact eps), and what it shares with the unsafe float sampler.

:class:`BoundedLaplace` samples the integer table of :mod:`.grid` (KR 10-2456177: bounded Laplace on [-1, 1],
b = 2/eps; the table makes its eps exact).  A value between two grid points is first rounded to one of them at
random, unbiasedly (a mixture of two rows: with all values neighbours, any mixture keeps the table's eps; for a
smaller ``sensitivity`` the relation is widened by one step).  ``calibration="exact"`` (default) bisects the
scale until the table's exact eps meets the target; ``"patent"`` uses b = sensitivity / eps (= 2/eps on
[-1, 1]: the seed patent) and states the exact eps that scale gives.

:class:`BoundedLaplaceBase` holds what both samplers share (validated parameters, inputs, closed forms through
the model, the mean estimators); :class:`~stream_anon.privacy.bounded_laplace.unsafe_float.
UnsafeFloatBoundedLaplace` is the other subclass.
"""

from __future__ import annotations

import math
import warnings
from abc import abstractmethod
from typing import Any, Literal, Protocol

import numpy as np

from stream_anon.core.validation import require_choice, require_float, require_int
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, crypto_rng, parameter_error
from stream_anon.privacy.bounded_laplace.grid import GridModel, calibrate_grid_scale, grid_for_domain
from stream_anon.privacy.exact import IntegerTable
from stream_anon.privacy.mechanism import IntervalDomain, LocalMechanism

__all__ = [
    "CALIBRATIONS",
    "OUT_OF_BOUNDS",
    "BoundedLaplace",
    "BoundedLaplaceBase",
    "Calibration",
    "OutOfBounds",
]

OutOfBounds = Literal["error", "clip"]
Calibration = Literal["exact", "patent"]
OUT_OF_BOUNDS: tuple[str, ...] = ("error", "clip")
CALIBRATIONS: tuple[str, ...] = ("exact", "patent")


class OutputModel(Protocol):
    """What the mechanisms ask of their output model (grid table or continuous density), in data units."""

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...
    def expected_output(self, x: np.ndarray) -> np.ndarray: ...
    def variance(self, x: np.ndarray) -> np.ndarray: ...
    def inverse_expected_output(self, y: np.ndarray) -> np.ndarray: ...
    def slope(self, x: float) -> float: ...
    def cdf(self, y: np.ndarray, x: float) -> np.ndarray: ...


class BoundedLaplaceBase(LocalMechanism):
    """Bounded Laplace on a public domain [lower, upper]: parameters, inputs, closed forms and mean estimators.

    Parameters (keyword-only, shared): ``epsilon`` (target) or ``scale`` (b in data units), ``lower < upper``
    (public bounds, never derived from data), ``sensitivity`` (inputs within it are neighbours; default the
    width: any two values are, the patent's dQ = 2 on [-1, 1]), ``calibration`` ``"exact"`` | ``"patent"``,
    ``delta``, ``out_of_bounds`` ``"error"`` (default) | ``"clip"``, ``snap_bits``, ``rng`` (injected
    generator; default ChaCha20 from OS entropy, :func:`~stream_anon.privacy.base.crypto_rng`).
    """

    integer: bool = False

    def __init__(self, *, epsilon: float | None, lower: float, upper: float, sensitivity: float | None,
                 calibration: Calibration, scale: float | None, delta: float, out_of_bounds: OutOfBounds,
                 snap_bits: int | None, rng: np.random.Generator | int | None) -> None:
        if (epsilon is None) == (scale is None):
            raise PrivacyParameterError(f"give exactly one of epsilon or scale, got epsilon={epsilon!r}, "
                                        f"scale={scale!r}")
        self.target_epsilon = None if epsilon is None else check_epsilon(epsilon)
        self.lower = require_float("lower", lower, error=parameter_error)
        self.upper = require_float("upper", upper, low=self.lower, low_open=True,
                                   allowed=f"a finite number greater than lower={self.lower}", error=parameter_error)
        self.width = self.upper - self.lower
        self.sensitivity = self.width if sensitivity is None else require_float(
            "sensitivity", sensitivity, low=0.0, low_open=True, high=self.width,
            allowed=f"a number in (0, upper - lower = {self.width}]", error=parameter_error)
        self.calibration: Calibration = require_choice("calibration", calibration, CALIBRATIONS,
                                                       error=parameter_error)
        self.delta = require_float("delta", delta, low=0.0, high=1.0, high_open=True, error=parameter_error)
        self.out_of_bounds: OutOfBounds = require_choice("out_of_bounds", out_of_bounds, OUT_OF_BOUNDS,
                                                         error=parameter_error)
        self.snap_bits = None if snap_bits is None else require_int("snap_bits", snap_bits, low=1, high=52,
                                                                    error=parameter_error)
        self.rng = crypto_rng(rng)
        self.epsilon: float = math.nan
        self.scale: float = math.nan
        self.normalized_scale: float = math.nan

    # ---------------------------------------------------------------- the protocol
    @property
    def domain(self) -> IntervalDomain:
        return IntervalDomain(self.lower, self.upper, self.integer)

    @abstractmethod
    def _model(self) -> OutputModel:
        """The output model this mechanism samples from."""

    def _integer_inputs(self) -> bool:
        return False

    # ---------------------------------------------------------------- inputs
    def _checked(self, x: Any, name: str = "value") -> np.ndarray:
        arr = np.asarray(x, dtype=np.float64)
        if np.isnan(arr).any():
            raise PrivacyParameterError(f"{name}: NaN is not a value in [{self.lower}, {self.upper}]")
        bad = (arr < self.lower) | (arr > self.upper)
        if bad.any():
            if self.out_of_bounds == "error":
                v = float(arr[bad].flat[0])
                raise PrivacyParameterError(
                    f"{name}: must be in the public domain [{self.lower}, {self.upper}], got {v!r} "
                    f"({int(bad.sum())} value(s) outside; pass out_of_bounds='clip' to clip)")
            arr = np.clip(arr, self.lower, self.upper)
        if self._integer_inputs():
            frac = arr != np.floor(arr)
            if frac.any():
                raise PrivacyParameterError(
                    f"{name}: expected an integer in [{self.lower:g}, {self.upper:g}], got {float(arr[frac].flat[0])!r}")
        return arr

    # ---------------------------------------------------------------- randomisation
    def randomise_many(self, values: Any) -> np.ndarray:
        """Perturb an array of values (vectorized); float64 outputs in [lower, upper]."""
        return self._model().sample(self._checked(values), self.rng)

    def randomise(self, value: Any) -> float:
        """Perturb one value."""
        return float(self.randomise_many(np.asarray([value], dtype=np.float64))[0])

    # ---------------------------------------------------------------- closed forms (data units)
    def expected_output(self, x: Any) -> np.ndarray | float:
        """g(x) = E[M(x)] (grid: exact from the table, piecewise linear between grid points); strictly increasing."""
        return _scalar_or_array(self._model().expected_output(self._checked(x)), x)

    def bias(self, x: Any) -> np.ndarray | float:
        """E[M(x)] - x."""
        arr = self._checked(x)
        return _scalar_or_array(self._model().expected_output(arr) - arr, x)

    def variance(self, x: Any) -> np.ndarray | float:
        """Var[M(x)] (grid: exact from the table)."""
        return _scalar_or_array(self._model().variance(self._checked(x)), x)

    def cdf(self, y: Any, x: float) -> np.ndarray:
        """P(M(x) <= y)."""
        return self._model().cdf(np.asarray(y, dtype=np.float64), float(self._checked(np.asarray([x]))[0]))

    def inverse_expected_output(self, y: Any) -> np.ndarray | float:
        """g^{-1}(y), clipped to g's range (narrower than the domain)."""
        return _scalar_or_array(self._model().inverse_expected_output(np.asarray(y, dtype=np.float64)), y)

    # ---------------------------------------------------------------- estimation
    @abstractmethod
    def unbiased_transform(self, perturbed: Any, *, boundary_width: float = 0.1) -> np.ndarray:
        """h(y) with E[h(M(x))] = x exactly for every x at least ``boundary_width`` (normalized) from both bounds."""

    @abstractmethod
    def max_transform_bias(self, *, boundary_width: float = 0.1) -> float:
        """Largest |E[h(M(x))] - x| of ``unbiased_transform`` over the domain, in data units."""

    def _boundary_width(self, boundary_width: float) -> float:
        return require_float("boundary_width", boundary_width, low=0.0, high=0.5,
                             allowed="a number in [0, 0.5] (normalized units)", error=parameter_error)

    def estimate_mean(self, perturbed: Any, *,
                      method: Literal["boundary-corrected", "unbiased", "aggregate", "per-value"] = "boundary-corrected",
                      boundary_width: float = 0.1) -> tuple[float, float]:
        """Estimate the mean of the true values from perturbed outputs; returns (mean, standard error).

        ``"boundary-corrected"`` (default): mean of ``unbiased_transform(y, boundary_width)``: exactly unbiased
        when no true value lies within ``boundary_width`` (normalized; w * (upper - lower) / 2 in data units) of
        a bound, else biased by at most ``max_transform_bias`` times the share of such values.
        ``"unbiased"``: the same with boundary_width = 0 (grid only): exactly unbiased for any data.
        SE = sd(h) / sqrt(n) (conservative for heterogeneous data).
        ``"aggregate"``: g^{-1}(ybar), SE by the delta method; consistent only when all inputs are equal.
        ``"per-value"``: mean of g^{-1}(y_i); biased (for comparison).
        """
        y = np.asarray(perturbed, dtype=np.float64).ravel()
        n = y.size
        if n < 2:
            raise PrivacyParameterError(f"perturbed: need at least 2 values to estimate a mean and its SE, got {n}")
        if np.isnan(y).any():
            raise PrivacyParameterError("perturbed: contains NaN")
        if method in ("boundary-corrected", "unbiased"):
            w = 0.0 if method == "unbiased" else boundary_width
            hv = self.unbiased_transform(y, boundary_width=w)
            return float(hv.mean()), float(hv.std(ddof=1)) / math.sqrt(n)
        if method == "aggregate":
            ybar = float(y.mean())
            est = float(self.inverse_expected_output(ybar))
            se_y = float(y.std(ddof=1)) / math.sqrt(n)
            return est, se_y / self._model().slope(est)
        if method == "per-value":
            xs = np.asarray(self.inverse_expected_output(y))
            return float(xs.mean()), float(xs.std(ddof=1)) / math.sqrt(n)
        raise PrivacyParameterError(
            f"method: must be 'boundary-corrected', 'unbiased', 'aggregate' or 'per-value', got {method!r}")

    def aggregate_target(self, true_values: Any) -> float:
        """g^{-1}(mean_i g(x_i)): the limit of the aggregate mean estimator for these inputs (diagnostic)."""
        return float(self.inverse_expected_output(float(np.mean(self.expected_output(true_values)))))


def _scalar_or_array(result: np.ndarray, like: Any) -> np.ndarray | float:
    return float(np.asarray(result).reshape(-1)[0]) if np.ndim(like) == 0 else np.asarray(result)


class BoundedLaplace(BoundedLaplaceBase):
    """Bounded Laplace on a public domain [lower, upper], on a public grid, with an exact eps (module docstring).

    Parameters (keyword-only):

    * ``epsilon``: the target; ``.epsilon`` is what the mechanism really spends (computed from its integer
      table, <= the target with ``calibration="exact"``).  Give ``scale`` instead to fix b and get its eps.
    * ``lower < upper``: public bounds (never derived from data).
    * ``sensitivity``: inputs within it are neighbours (default the width: any two values are neighbours,
      the patent's dQ = 2 on [-1, 1]).
    * ``integer``: integer attribute: integer grid (see :func:`.grid.grid_for_domain`) and integer inputs only.
    * ``grid_step``: explicit grid step (must divide the width); default from the domain.
    * ``calibration``: ``"exact"`` (default: bisection until the exact eps meets ``epsilon``) or ``"patent"``
      (b = sensitivity / epsilon, e.g. 2/eps on [-1, 1]; eps stated is what that scale gives on the grid).
    * ``scale``: b in data units (instead of ``epsilon``).
    * ``delta``: must be 0 (the grid mechanism is pure eps-DP; ``UnsafeFloatBoundedLaplace`` takes delta > 0).
    * ``out_of_bounds``: ``"error"`` (default) or ``"clip"`` inputs into the domain.
    * ``snap_bits``: superseded by the grid (outputs always lie on it): accepted with a DeprecationWarning, ignored.
    * ``rng``: injected generator (default ChaCha20 from OS entropy).

    Attributes: ``epsilon`` (exact, spent per value; also ``exact_epsilon``), ``target_epsilon``, ``scale``
    (b, data units), ``normalized_scale`` (b on [-1, 1]), ``grid`` (output values), ``grid_step``,
    ``neighbour_steps`` (the relation on grid indices), ``transition_matrix`` (P[i, j] = W[i, j] / 2^62),
    ``table``.
    """

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        lower: float,
        upper: float,
        sensitivity: float | None = None,
        integer: bool = False,
        grid_step: float | None = None,
        calibration: Calibration = "exact",
        scale: float | None = None,
        delta: float = 0.0,
        out_of_bounds: OutOfBounds = "error",
        snap_bits: int | None = None,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__(epsilon=epsilon, lower=lower, upper=upper, sensitivity=sensitivity,
                         calibration=calibration, scale=scale, delta=delta, out_of_bounds=out_of_bounds,
                         snap_bits=snap_bits, rng=rng)
        self.integer = bool(integer)
        if self.delta != 0.0:
            raise PrivacyParameterError(f"delta: the grid mechanism is pure eps-DP (delta = 0), got {delta!r}; "
                                        f"delta > 0 exists only for UnsafeFloatBoundedLaplace")
        if self.snap_bits is not None:
            warnings.warn("BoundedLaplace(snap_bits=...) is superseded: outputs always lie on the exact grid; "
                          "snap_bits is ignored", DeprecationWarning, stacklevel=2)
        n_int, step = grid_for_domain(self.lower, self.upper, integer=self.integer, grid_step=grid_step)
        n_points = n_int + 1
        integer_inputs = self.integer and step == 1.0
        if self.sensitivity >= self.width:
            radius = n_points - 1
        elif integer_inputs:
            radius = max(1, math.floor(self.sensitivity + 1e-9))
        else:  # stochastic rounding of real inputs moves each by < 1 step
            radius = min(n_points - 1, math.ceil(self.sensitivity / step - 1e-9) + 1)
        self.grid_step = step
        self.neighbour_steps = radius
        if scale is not None:
            t = require_float("scale", scale, low=0.0, low_open=True, error=parameter_error) / step
        elif self.calibration == "patent":
            assert self.target_epsilon is not None
            t = self.sensitivity / self.target_epsilon / step
        else:
            assert self.target_epsilon is not None
            t = calibrate_grid_scale(n_points, radius, self.target_epsilon)
        self._grid = GridModel(self.lower, self.upper, n_int, t, integer_inputs)
        self.table: IntegerTable = self._grid.table
        self.scale = t * step
        self.normalized_scale = 2.0 * self.scale / self.width
        self.epsilon = self.table.epsilon(radius)
        self.naive_scale = self.sensitivity / self.target_epsilon if self.target_epsilon else math.nan

    def __repr__(self) -> str:
        return (f"BoundedLaplace(epsilon={self.epsilon!r}, lower={self.lower}, upper={self.upper}, "
                f"sensitivity={self.sensitivity}, grid_step={self.grid_step:g}, scale={self.scale:.6g})")

    @property
    def exact_epsilon(self) -> float:
        """The integer table's eps for the neighbouring relation on grid indices (the same value as ``epsilon``)."""
        return self.epsilon

    def _model(self) -> GridModel:
        return self._grid

    def _integer_inputs(self) -> bool:
        return self._grid.integer_inputs

    # ---------------------------------------------------------------- grid views
    @property
    def grid(self) -> np.ndarray:
        """The public output values."""
        return self._grid.values.copy()

    @property
    def transition_matrix(self) -> np.ndarray:
        """P[i, j] = P(output grid[j] | input grid[i]) = W[i, j] / 2^62 (float64 view of the exact table)."""
        return self._grid.P.copy()

    def pmf(self, x: float) -> np.ndarray:
        """P(M(x) = grid[j]) for every j (a mixture of two rows for an input between grid points)."""
        return self._grid.pmf(float(self._checked(np.asarray([x]))[0]))

    # ---------------------------------------------------------------- estimation
    def unbiased_transform(self, perturbed: Any, *, boundary_width: float = 0.1) -> np.ndarray:
        """h(y) with E[h(M(x))] = x exactly for every x at least ``boundary_width`` (normalized) from both bounds.

        The minimum-variance such h over the grid outputs (``GridModel.transform``), bias near the bounds at
        most ``max_transform_bias``; ``boundary_width=0``: h = P^-1 x, exactly unbiased for EVERY input (larger
        variance; numbers in docs/privacy-numeric.md).  Outputs must be this mechanism's grid values.
        """
        w = self._boundary_width(boundary_width)
        estimates: np.ndarray = self._grid.transform(w)[self._grid.output_index(perturbed)]
        return estimates

    def max_transform_bias(self, *, boundary_width: float = 0.1) -> float:
        """Largest |E[h(M(x))] - x| of ``unbiased_transform`` over the domain, in data units (0 for width 0)."""
        w = self._boundary_width(boundary_width)
        return float(np.abs(self._grid.transform_bias(w)).max()) if w > 0 else 0.0

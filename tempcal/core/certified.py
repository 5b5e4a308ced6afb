"""The NLL fit in a few reads: high-order steps in ``beta = 1/T`` and a certified error bound.

The NLL is convex in ``beta`` and every pass returns its first four derivatives ``d1..d4``
(:mod:`tempcal.core.kernels`), so:

* **Start.** The sign change of ``d1`` on the validating scan's grid (:mod:`tempcal.core.first_scan`), refined by
  two-point Hermite interpolation in ``log beta``.
* **Steps.** From an evaluated point, a third-order Householder step in ``s = log beta`` (the
  root of a [1/2] Pade model of ``d1``; with ``G_k = d^k d1 / ds^k``: ``G1 = beta d2``,
  ``G2 = beta d2 + beta^2 d3``, ``G3 = beta d2 + 3 beta^2 d3 + beta^3 d4``); once passes lie
  on either side of the optimum, the root of their degree-7 Hermite interpolant in
  ``log beta``. A bracket kept from the signs of ``d1`` (full passes only) bounds every step.
* **Certificate.** After every pass the candidate ``beta + t``, with ``t`` the root of the
  cubic Taylor model ``P3(t) = d1 + d2 t + d3 t^2/2 + d4 t^3/6``, gets an error bound from
  the derivatives themselves. Taylor's theorem gives the residual

      |NLL'(beta + t)| <= min(|P2(t)| + S4 |t|^3 / 6,  |P3(t)| + S5 t^4 / 24)

  and ``NLL'' >= H(r) = d2 - |d3| r - S4 r^2 / 2`` within ``r`` of ``beta``, so the optimum
  lies within ``E = residual / H(|t| + E)`` of ``beta + t`` (checked as a fixed point).
  ``S4``, ``S5`` bound ``|NLL''''|``, ``|NLL'''''|`` along the step, per row: moving beta by
  ``r`` tilts ``p`` by at most ``Lambda = exp(r R)`` (``R``: the largest row range over
  finite logits, capped at ``(2 ln C + 100) / beta_low`` since entries further below the
  top carry no weight), the mean moves by at most ``r Lambda mu2``, and Minkowski,
  Cauchy-Schwarz and ``|u| <= R`` give, with ``F = Lambda^2 (1 + r Lambda R)^5``,

      |k4| <= mu4 + 2 mu2^2              ->  S4 = F (mean mu4 + 2 mean mu2^2)
      |k5| <= E|u|^5 + 10 |mu3| mu2      ->  S5 = F (R mean mu4 + 10 mean sqrt(mu2^3 mu4))

  ``mean mu4 = d4 + 3 q`` with ``q = mean mu2^2``; both bound terms come with every pass.
  The fit stops when ``E <= tol * (beta + t)``, or when two passes bracket the optimum that
  tightly; otherwise it takes another pass. The bound covers the truncation of the model,
  not float rounding in a pass (float32 chunks with float64 sums).

A :class:`Prior` adds ``w (ln beta - ln beta_0)^2`` to the mean NLL (a per-group fit drawn toward the
global T: ``ln T - ln T_0 = -(ln beta - ln beta_0)``); its derivatives are exact and its own 4th and 5th
derivatives are bounded along the step like the NLL's, so the same search and certificate apply.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .kernels import NllDerivatives

T_MIN = 1e-6
T_MAX = 1e6
BETA_MIN, BETA_MAX = 1.0 / T_MAX, 1.0 / T_MIN
#: Relative tolerance on beta (so on T) that the error bound must certify.
TOL = 1e-7
#: Reads (the validating scan included) the certified steps may take before the L-BFGS fallback.
MAX_PASSES = 12
#: Longest step a single-point model may take, as a factor on beta.
MAX_FACTOR = 16.0

Evaluator = Callable[[float], NllDerivatives]


@dataclass(frozen=True)
class Prior:
    """The penalty ``weight * u^2`` with ``u = ln beta - ln centre``, added to the mean NLL.

    With ``lam`` the penalty on a sum over ``n`` rows, ``weight = lam / n``. Its derivatives in beta:
    ``2w u / b``, ``2w (1 - u) / b^2``, ``2w (2u - 3) / b^3``, ``2w (11 - 6u) / b^4``, ``2w (24u - 50) / b^5``.
    """

    weight: float
    centre: float  # the prior's beta (1 / T_0)

    def add(self, s: NllDerivatives) -> NllDerivatives:
        """The penalised objective's point at ``s.beta`` (the NLL's bound terms ``q``, ``q5`` kept as they are)."""
        b, w = s.beta, self.weight
        u = math.log(b / self.centre)
        return NllDerivatives(b, s.nll + w * u * u, s.d1 + 2 * w * u / b, s.d2 + 2 * w * (1 - u) / b ** 2,
                              s.d3 + 2 * w * (2 * u - 3) / b ** 3, s.d4 + 2 * w * (11 - 6 * u) / b ** 4, s.q, s.q5)

    def bounds(self, beta: float, r: float) -> tuple[float, float]:
        """Bounds on the penalty's ``|4th|`` and ``|5th|`` derivatives within ``r`` of ``beta`` (``r < beta``)."""
        low = beta - r
        if not low > 0:
            return math.inf, math.inf
        u = abs(math.log(beta / self.centre)) + math.log(beta / low)
        return (2 * self.weight * (11 + 6 * u) / low ** 4, 2 * self.weight * (50 + 24 * u) / low ** 5)


@dataclass(frozen=True)
class FitStart:
    """What the validating scan hands to the fit (all-reduced over ranks)."""

    count: int
    num_classes: int
    span: float = math.inf  # largest max - min over a row's finite logits (inf: unknown)
    grid: tuple[NllDerivatives, ...] = ()  # estimates on a row sample at fixed betas, ascending
    exact_grid: bool = False  # the sample is every row: grid points are exact passes
    reference_beta: float = 1.0  # a scale-aware start when there is no grid
    #: Every fitting row (a :class:`~tempcal.core.first_scan.ChunkRows`), when the validating scan held them all in
    #: one chunk: fits on subsets of them need no read.
    rows: Any = field(default=None, compare=False, repr=False)


@dataclass
class CertifiedFit:
    """The fitted inverse temperature, the reads it took and how sure the fit is of it."""

    beta: float
    passes: int  # reads of the data, the validating scan included
    converged: bool
    error_bound: float  # certified bound on |beta - beta*| / beta (inf when not certified)
    nll: float
    bound: str | None = None  # "lower" / "upper" at T_MIN / T_MAX
    warnings: list[str] = field(default_factory=list)


def certified_fit(start: FitStart, evaluate: Evaluator, *, tol: float = TOL, max_passes: int = MAX_PASSES,
                  passes: int = 1, prior: Prior | None = None) -> CertifiedFit:
    """Minimise the mean NLL over beta from the scan's ``start``, one pass per call of ``evaluate``.

    ``passes`` reads are already spent (the validating scan); the fit stops at ``max_passes``.
    Degenerate data (every true class on top, or a slope >= 0 at beta = 0) must be handled first.
    """
    search = Search(start, tol, passes, prior)
    if search.points:  # exact points from the scan may settle it without a pass
        done = search.result(max_passes)
        if done is not None and done.converged:
            return done
    beta, done = search.start(), None
    while done is None:
        search.add(evaluate(beta))
        done = search.result(max_passes)
        if done is None:
            beta = search.next_beta()
            done = search.result(max_passes) if search.stuck else None  # stuck: an answer, certified or not
    return done


class Search:
    """Full-data points (passes, and the grid when it covers every row), their bracket, the best certificate.

    With a ``prior`` the points kept are the penalised objective's; :meth:`add` takes the NLL's.
    """

    def __init__(self, start: FitStart, tol: float, passes: int, prior: Prior | None = None):
        self.info, self.tol, self.prior = start, tol, prior
        self.points: list[NllDerivatives] = []
        self.passes = passes
        self.lo, self.hi = 0.0, math.inf  # the optimum lies in [lo, hi]: d1(0) < 0
        self.best: tuple[float, float, NllDerivatives] | None = None  # (estimate, relative bound, point)
        self.stuck = False  # the next beta would repeat an evaluated one: no progress is possible
        if start.exact_grid:
            for g in start.grid:
                self._add_point(g)

    def start(self) -> float:
        """The first beta to evaluate: the grid's Hermite root, or a step off its end."""
        grid = self.info.grid
        for a, b in itertools.pairwise(grid):
            if a.d1 < 0 <= b.d1:
                root = hermite_root_log(a, b)
                return self._clamp(root if root is not None else math.sqrt(a.beta * b.beta))
        if grid:
            end = grid[-1] if grid[-1].d1 < 0 else grid[0]
            return self._clamp(_factor_limited(end.beta, pade_log_step(end)))
        return self._clamp(self.info.reference_beta)

    def add(self, s: NllDerivatives) -> None:
        """Record one pass."""
        self.passes += 1
        self._add_point(s)

    def _add_point(self, nll: NllDerivatives) -> None:
        s = nll if self.prior is None else self.prior.add(nll)
        self.points.append(s)
        if s.d1 < 0:
            self.lo = max(self.lo, s.beta)
        elif s.d1 > 0:
            self.hi = min(self.hi, s.beta)
        else:
            self.lo = self.hi = s.beta
        info = self.info
        estimate, error = (certify(nll, info.span, info.num_classes) if self.prior is None
                           else certify(nll, info.span, info.num_classes, self.prior))
        relative = error / estimate if estimate > 0 else math.inf
        if self.best is None or relative < self.best[1]:
            self.best = (estimate, relative, s)

    def estimate(self) -> float:
        """The best estimate of the optimum so far (inside the bracket)."""
        assert self.best is not None
        return min(max(self.best[0], self.lo), self.hi)

    def result(self, max_passes: int) -> CertifiedFit | None:
        """The answer when certified, at a T bound, or out of passes; else None."""
        assert self.best is not None
        estimate, relative, s = self.best
        if self.lo >= BETA_MAX:
            return self._bound(BETA_MAX, "lower")
        if self.hi <= BETA_MIN:
            return self._bound(BETA_MIN, "upper")
        if self.lo == self.hi:  # d1 == 0 exactly at an evaluated beta
            s = next(p for p in self.points if p.beta == self.lo)
            return self._final(self.lo, 0.0, s)
        inside = min(max(estimate, self.lo), self.hi)  # rounding may put the estimate just outside: the bracket wins
        width = (self.hi - self.lo) / self.lo if self.lo > 0 else math.inf
        if width <= self.tol:  # the bracket alone certifies (convexity)
            return self._final(inside, min(width, relative), s)
        if relative <= self.tol:
            return self._final(inside, relative, s)
        if self.passes >= max_passes or self.stuck:
            result = self._final(inside, relative, s)
            result.converged = False
            result.warnings.append(f"not certified after {self.passes} passes: bound {relative:.1e} > {self.tol:.1e}")
            return result
        return None

    def next_beta(self) -> float:
        """The next pass: Hermite on the tightest bracketing pair, else a Pade step from the nearest point."""
        below = [p for p in self.points if p.d1 < 0]
        above = [p for p in self.points if p.d1 > 0]
        candidate = None
        if below and above:
            candidate = hermite_root_log(max(below, key=lambda p: p.beta), min(above, key=lambda p: p.beta))
        if candidate is None:
            near = min(self.points, key=lambda p: abs(p.d1 / (p.beta * p.d2)) if p.d2 > 0 else math.inf)
            candidate = _factor_limited(near.beta, pade_log_step(near))
        return self._clamp(candidate)

    def _clamp(self, beta: float) -> float:
        """``beta`` inside the bracket and the T bounds; the bracket's log-midpoint when it falls outside."""
        if not (math.isfinite(beta) and beta > 0):
            beta = self.lo * MAX_FACTOR if self.lo > 0 else 1.0
        beta = min(max(beta, BETA_MIN), BETA_MAX)
        evaluated = {p.beta for p in self.points}
        if self.lo < beta < self.hi and beta not in evaluated:
            return beta
        if beta >= self.hi:
            beta = math.sqrt(max(self.lo, self.hi / MAX_FACTOR ** 2) * self.hi)
        else:
            beta = math.sqrt(self.lo * min(self.hi, self.lo * MAX_FACTOR ** 2))
        beta = min(max(beta, BETA_MIN), BETA_MAX)
        self.stuck = beta in evaluated
        return beta

    def _final(self, beta: float, relative: float, s: NllDerivatives) -> CertifiedFit:
        if beta > BETA_MAX:
            return self._bound(BETA_MAX, "lower")
        if beta < BETA_MIN:
            return self._bound(BETA_MIN, "upper")
        return CertifiedFit(beta, self.passes, True, relative, taylor_nll(s, beta - s.beta))

    def _bound(self, beta: float, bound: str) -> CertifiedFit:
        near = min(self.points, key=lambda p: abs(math.log(p.beta / beta)))
        where = f"below T = {T_MIN:g}" if bound == "lower" else f"above T = {T_MAX:g}"
        return CertifiedFit(beta, self.passes, True, 0.0, taylor_nll(near, beta - near.beta), bound,
                            [f"the optimum lies {where}; T is set to that bound"])


# -- models of d1 ----------------------------------------------------------------------
def taylor_nll(s: NllDerivatives, t: float) -> float:
    """The NLL at ``beta + t`` from the quartic Taylor model at ``s`` (``t`` is tiny once certified)."""
    return s.nll + t * (s.d1 + t * (s.d2 / 2 + t * (s.d3 / 6 + t * s.d4 / 24)))


def cubic_step(s: NllDerivatives) -> float:
    """The root of ``P3(t) = d1 + d2 t + d3 t^2/2 + d4 t^3/6`` nearest the Newton step on its side; else Newton."""
    d1, d2, d3, d4 = s.derivatives
    newton = -d1 / d2 if d2 > 0 else math.inf
    if not math.isfinite(newton) or newton == 0:
        return newton
    if abs(d3 * newton) <= 0.1 * d2 and abs(d4 * newton * newton) <= 0.1 * d2:
        # P3' >= 0.6 d2 on |t| <= 2 |newton|: one root there, within 0.11 |newton| of it, the nearest; Newton finds it.
        t = newton
        for _ in range(30):
            step = (d1 + t * (d2 + t * (d3 / 2 + t * d4 / 6))) / (d2 + t * (d3 + t * d4 / 2))
            t -= step
            if abs(step) <= 1e-15 * abs(t):
                break
        return t
    coefficients = [d4 / 6, d3 / 2, d2, d1]
    while coefficients and coefficients[0] == 0:
        coefficients.pop(0)
    roots = list(np.roots(coefficients)) if len(coefficients) > 1 else []
    real = [float(r.real) for r in roots if abs(r.imag) <= 1e-9 * (1 + abs(r.real)) and r.real * newton >= 0]
    return min(real, key=lambda t: abs(t - newton)) if real else newton


def log_derivatives(s: NllDerivatives) -> tuple[float, float, float, float]:
    """``d^k d1 / ds^k`` for ``s = log beta``, k = 0..3."""
    b = s.beta
    d1, d2, d3, d4 = s.derivatives
    return d1, b * d2, b * d2 + b * b * d3, b * d2 + 3 * b * b * d3 + b ** 3 * d4


def pade_log_step(s: NllDerivatives) -> float:
    """Third-order Householder step on ``d1`` in ``log beta`` (Newton in ``log beta`` if it misbehaves).

    When Newton's step in ``log beta`` already exceeds a factor MAX_FACTOR, that factor is taken.
    """
    g0, g1, g2, g3 = log_derivatives(s)
    newton = -g0 / g1 if g1 > 0 else math.copysign(math.inf, -g0)
    if abs(newton) >= math.log(MAX_FACTOR):
        # Far from the root (or where d1 saturates) no local model is trusted: the longest step allowed.
        return s.beta * MAX_FACTOR ** math.copysign(1.0, newton)
    numerator = 3 * (2 * g1 * g1 - g0 * g2) * g0
    denominator = -6 * g1 ** 3 + 6 * g0 * g1 * g2 - g0 * g0 * g3
    step = numerator / denominator if denominator != 0 else newton
    if not math.isfinite(step) or step * newton < 0:
        step = newton
    return s.beta * math.exp(max(min(step, 50.0), -50.0))


def hermite_root_log(a: NllDerivatives, b: NllDerivatives) -> float | None:
    """The root in ``(a.beta, b.beta)`` of the degree-7 Hermite interpolant of d1 in ``log beta``."""
    x0, x1 = math.log(a.beta), math.log(b.beta)
    h = x1 - x0
    if not h > 0:
        return None
    ga, gb = log_derivatives(a), log_derivatives(b)
    system = np.zeros((8, 8))
    rhs = np.zeros(8)
    for k in range(4):  # k-th derivative of sum_j c_j t^j at t = 0 and t = 1, in units of h^k
        system[k, k] = math.factorial(k)
        for j in range(k, 8):
            system[4 + k, j] = math.factorial(j) / math.factorial(j - k)
        rhs[k], rhs[4 + k] = ga[k] * h ** k, gb[k] * h ** k
    try:
        coefficients = np.linalg.solve(system, rhs)
    except np.linalg.LinAlgError:
        return None
    roots = np.roots(coefficients[::-1])
    inside = [float(r.real) for r in roots if abs(r.imag) < 1e-9 and 0 < r.real < 1]
    if not inside:
        return None
    secant = ga[0] / (ga[0] - gb[0])
    t = min(inside, key=lambda r: abs(r - secant))
    return math.exp(x0 + t * h)


def _factor_limited(beta: float, candidate: float) -> float:
    """``candidate`` within a factor MAX_FACTOR of ``beta``."""
    return min(max(candidate, beta / MAX_FACTOR), beta * MAX_FACTOR)


# -- the certificate -------------------------------------------------------------------
def certify(s: NllDerivatives, span: float, num_classes: int, prior: Prior | None = None) -> tuple[float, float]:
    """``(beta + t, E)``: the cubic model's root and a bound on its distance to the optimum (inf if none).

    ``s`` is the NLL's point; with a ``prior`` the penalised objective's optimum is certified.
    """
    total = s if prior is None else prior.add(s)
    t = cubic_step(total)
    beta = s.beta
    if not math.isfinite(t) or beta + t <= 0:
        return beta, math.inf

    def bounds(r: float) -> tuple[float, float]:
        s4, s5 = _derivative_bounds(s, r, span, num_classes)
        if prior is None:
            return s4, s5
        p4, p5 = prior.bounds(beta, r)
        return s4 + p4, s5 + p5

    residual = _residual(total, t, bounds)
    curvature = _lower_curvature(total, abs(t), bounds)
    if not (curvature > 0 and math.isfinite(residual)):
        return beta + t, math.inf
    guess = 2 * residual / curvature + 1e-300
    curvature = _lower_curvature(total, abs(t) + guess, bounds)
    error = residual / curvature if curvature > 0 else math.inf
    return beta + t, error if error <= guess else math.inf


Bounds = Callable[[float], tuple[float, float]]


def _residual(s: NllDerivatives, t: float, bounds: Bounds) -> float:
    """A bound on ``|d1(beta + t)|`` from the Taylor models of order 2 and 3 with bounded remainders."""
    d1, d2, d3, d4 = s.derivatives
    p2 = d1 + d2 * t + d3 * t * t / 2
    p3 = p2 + d4 * t ** 3 / 6
    s4, s5 = bounds(abs(t))
    return min(abs(p2) + s4 * abs(t) ** 3 / 6, abs(p3) + s5 * t ** 4 / 24)


def _lower_curvature(s: NllDerivatives, r: float, bounds: Bounds) -> float:
    """A lower bound on ``d2`` within ``r`` of ``s.beta`` (<= 0 means none)."""
    s4, _ = bounds(r)
    return s.d2 - abs(s.d3) * r - s4 * r * r / 2


def _derivative_bounds(s: NllDerivatives, r: float, span: float, num_classes: int) -> tuple[float, float]:
    """Bounds on ``|d4|`` and ``|d5|`` of the NLL within ``r`` of ``s.beta`` (see the module docstring)."""
    low = s.beta - r
    if low <= s.beta / 2:
        return math.inf, math.inf
    reach = min(span, (2 * math.log(max(num_classes, 2)) + 100) / low)
    x = r * reach
    if x > 50:
        return math.inf, math.inf
    tilt = math.exp(x)
    factor = tilt * tilt * (1 + x * tilt) ** 5
    mu4 = max(s.d4 + 3 * s.q, s.q)  # mean mu4 >= mean mu2^2
    return factor * (mu4 + 2 * s.q), factor * (reach * mu4 + 10 * s.q5)


__all__ = ["BETA_MAX", "BETA_MIN", "MAX_PASSES", "TOL", "T_MAX", "T_MIN", "CertifiedFit", "Evaluator", "FitStart",
           "Prior", "Search", "certified_fit", "certify", "cubic_step", "hermite_root_log", "pade_log_step"]

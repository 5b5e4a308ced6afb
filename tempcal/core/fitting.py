"""The fit of one temperature: :func:`fit_temperature` on tensors or a :class:`~tempcal.core.scan.Scan` (groups and
folds go to the subset fit :mod:`tempcal.subsets` registers), and the fit on one validated scan (:func:`fit_scan`)."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import DataError, TempcalError, probabilities_refused
from . import certified
from .certified import T_MAX, T_MIN, Evaluator, FitStart, certified_fit
from .data import as_logits_data
from .ece_fit import PassCallback, minimise_ece
from .kernels import DEFAULT_BINS
from .scan import ALL_ROWS, Scan

# -- the fit on one validated scan -------------------------------------------------------------------------------------
# Fit one temperature T > 0 on a validated :class:`~tempcal.core.scan.Scan` by minimising the mean NLL of
# ``softmax(logits / T)`` (or, with ``objective="ece"``, the binned ECE around that optimum).
#
# Every read of the data is the cost, so the fit takes about three on typical data: the validating scan prepares
# the start (:mod:`tempcal.core.first_scan`), and certified steps (:mod:`tempcal.core.certified`) stop as soon as T is
# certain. Should they not certify T within ``certified.MAX_PASSES`` reads (never on the test corpora), L-BFGS over
# ``theta = log T`` takes over from their best estimate, its bracket closed on the slope alone (regula falsi) until T
# is known to within ``xtol``. ``FitResult.method`` says which method answered, ``passes`` counts every read.

#: Tolerance on log T of the L-BFGS fallback: float32 arithmetic resolves beta = 1/T to about 6e-8.
XTOL = {torch.float32: 1e-7, torch.float64: 1e-10}
MAX_PASSES = 60
#: A secant estimate decides convergence only between points this close in log T.
TRUST_WIDTH = 1e-2


@dataclass
class FitResult:
    """The fitted temperature and how it was reached."""

    temperature: float
    objective: str
    n_fit: int
    passes: int  # full reads of the data, the validating scan included
    converged: bool
    nll: float  # mean NLL on the fitting samples at ``temperature``
    bound: str | None = None  # "lower" / "upper" when T sits at T_MIN / T_MAX
    warnings: list[str] = field(default_factory=list)
    error_bound: float | None = None  # certified bound on |T - T*| / T* (None: not certified by the bound)
    method: str = "certified"  # "certified" (high-order steps), "l-bfgs" (the fallback), "bound" (degenerate data)
    #: ``groups=``: each group's T (drawn toward ``temperature`` by ``group_prior``), keyed by its group value.
    group_temperatures: dict[Any, float] | None = None
    #: ``folds=K``: T on the rows outside each fold, and each row's fold.
    fold_temperatures: list[float] | None = None
    folds: Any = field(default=None, repr=False)


def fit_scan(scan: Scan, *, objective: str = "nll", bins: int = DEFAULT_BINS, xtol: float | None = None,
             max_passes: int = MAX_PASSES, evaluate: Evaluator | None = None, ece_terms: Any = None,
             on_pass: PassCallback | None = None) -> FitResult:
    """T on every row of ``scan`` (already validated) for ``objective``, as :func:`fit_temperature` describes its
    arguments; ``passes`` counts the validating scan. ``evaluate`` and ``ece_terms`` replace the scan's pass for fits
    that ride on another's reads."""
    start_passes = scan.passes
    if scan.num_samples < 2:
        raise DataError(f"the fitting part holds {scan.num_samples} sample(s); at least 2 are needed")
    if objective == "nll":
        result = _fit_nll(scan, xtol=xtol, max_passes=max_passes, evaluate=evaluate)
    elif objective == "ece":
        result = _fit_ece(scan, bins=bins, xtol=xtol, max_passes=max_passes, ece_terms=ece_terms, on_pass=on_pass)
    else:
        raise ValueError(f"objective must be 'nll' or 'ece', got {objective!r}")
    if scan.distinct_labels() == 1:
        result.warnings.append(f"all {scan.num_samples} fitting samples have label {scan.only_label()}: "
                               "T is fitted on one class only")
    result.passes = scan.passes - start_passes + 1  # the validating scan, done here or by the caller
    return result


def _fit_nll(scan: Scan, *, xtol: float | None, max_passes: int, evaluate: Evaluator | None = None) -> FitResult:
    """The NLL fit; ``evaluate`` (default: ``scan.objective``) is the pass at one beta, which other fits may ride."""
    n = scan.num_samples
    evaluate = evaluate or scan.objective
    if scan.all_top():
        return _no_class_above_the_true_one(scan)
    if scan.slope_at_infinity() >= 0:
        message = ("on the fitting samples the logits predict no better than uniform probabilities, so the NLL "
                   f"keeps falling as T -> inf; T is set to the upper bound {T_MAX:g}")
        nll = scan.objective(1.0 / T_MAX).nll
        return FitResult(T_MAX, "nll", n, 0, True, nll, "upper", [message], method="bound")
    start = scan.fit_start
    if start is None:  # a scan made without fit_rows: no grid, the scale-aware start (more reads)
        start = FitStart(n, scan.num_classes, reference_beta=scan.initial_beta())
    fit = certified_fit(start, evaluate, tol=certified.TOL if xtol is None else xtol,
                        max_passes=min(max_passes, certified.MAX_PASSES))
    if fit.converged:
        return FitResult(1.0 / fit.beta, "nll", n, 0, True, fit.nll, fit.bound, fit.warnings,
                         error_bound=fit.error_bound if fit.bound is None else None,
                         method="certified")
    # Not certified within its budget: L-BFGS takes over from the best estimate, with the reads left.
    result = _fit_lbfgs(scan, beta0=fit.beta, xtol=XTOL[scan.compute_dtype] if xtol is None else xtol,
                        max_passes=max_passes, evaluate=evaluate)
    result.warnings[:0] = [w for w in fit.warnings if w not in result.warnings]
    return result


def _fit_lbfgs(scan: Scan, *, beta0: float, xtol: float, max_passes: int, evaluate: Evaluator) -> FitResult:
    """The first method: L-BFGS over log T from ``beta0``, closed by regula falsi on the slope."""
    search = _SlopeSearch(scan, xtol, evaluate)
    theta0 = min(max(-math.log(beta0), math.log(T_MIN)), math.log(T_MAX))
    sums0, beta0 = search.evaluate(theta0)
    hessian = beta0 * beta0 * sums0.d2 + beta0 * sums0.d1  # d2 NLL / d theta2
    scale = math.sqrt(hessian) if hessian > 0 else math.sqrt(max(beta0 * beta0 * sums0.d2, 1e-12))
    search.hessian = scale * scale

    u = torch.zeros(1, dtype=torch.float64)
    with _no_dynamo_import():
        optimizer = torch.optim.LBFGS([u], lr=1.0, max_iter=max_passes, max_eval=max_passes,
                                      tolerance_grad=0.0, tolerance_change=0.0,
                                      history_size=10, line_search_fn="strong_wolfe")

    def closure():
        point, fresh = search.point_at(theta0 + float(u) / scale)
        if fresh and (search.estimate()[1] or scan.passes >= max_passes):
            raise _Done
        u.grad = torch.tensor([point[2] / scale], dtype=torch.float64)
        return point[1]

    with contextlib.suppress(_Done):
        optimizer.step(closure)
    theta, converged = search.finish(max_passes)
    result = FitResult(math.exp(theta), "nll", scan.num_samples, 0, converged, min(p[1] for p in search.points),
                       method="l-bfgs")
    return _clamp(result)


@contextlib.contextmanager
def _no_dynamo_import():
    """Build an optimizer without importing ``torch._dynamo`` (1.5 s, more than the whole fit of 200 MB), which
    ``Optimizer.add_param_group`` imports only to exclude itself from ``torch.compile``; torch is left as it was."""
    plain = getattr(torch.optim.Optimizer.add_param_group, "__wrapped__", None)
    if plain is None or "torch._dynamo" in sys.modules or hasattr(plain, _DYNAMO_MARKER):
        yield
        return
    setattr(plain, _DYNAMO_MARKER, plain)
    try:
        yield
    finally:
        delattr(plain, _DYNAMO_MARKER)


_DYNAMO_MARKER = "__dynamo_disable"


class _Done(Exception):
    """Raised from the L-BFGS closure once the optimum is bracketed to within ``xtol``."""


class _SlopeSearch:
    """The evaluated points (theta, NLL, dNLL/dtheta) and the optimum their slopes bracket (the NLL is convex in
    1/T); an estimate that rounds to an evaluated beta in the compute dtype ends the search."""

    def __init__(self, scan: Scan, xtol: float, evaluate: Evaluator):
        self.scan, self.xtol, self.objective = scan, xtol, evaluate
        self.points: list[tuple[float, float, float]] = []
        self.seen: dict[float, tuple[float, float, float]] = {}
        self._last_side = 0
        self._halve = 0
        self._stalled = False
        self.hessian = 1.0  # curvature estimate at the start, for a Newton step from a single point

    def effective_theta(self, theta: float) -> tuple[float, float]:
        """The (theta, beta) the pass really uses, beta in the compute dtype and kept a little beyond the T bounds
        (extreme logits can make L-BFGS try a T whose 1/T overflows)."""
        theta = min(max(theta, math.log(T_MIN) - 5), math.log(T_MAX) + 5)
        beta = float(torch.tensor(math.exp(-theta), dtype=self.scan.compute_dtype))
        return -math.log(beta), beta

    def point_at(self, theta: float) -> tuple[tuple[float, float, float], bool]:
        """The point at ``theta``, evaluated unless its beta was already; and whether it is new."""
        effective, _ = self.effective_theta(theta)
        if effective in self.seen:
            self._stalled = True
            return self.seen[effective], False
        self.evaluate(theta)
        return self.points[-1], True

    def evaluate(self, theta: float):
        effective, beta = self.effective_theta(theta)
        self._stalled = effective in self.seen
        sums = self.objective(beta)
        point = (effective, sums.nll, -beta * sums.d1)
        side = -1 if point[2] < 0 else 1
        # Illinois rule for the regula falsi below: when one end moves twice, halve the other's slope.
        self._halve = -side if side == self._last_side else 0
        self._last_side = side
        self.points.append(point)
        self.seen[effective] = point
        return sums, beta

    def estimate(self) -> tuple[float, bool]:
        """The best estimate of the optimal theta, and whether it is within ``xtol``."""
        points = self.points
        for theta, _, slope in points:
            if slope == 0:
                return theta, True
        below = [p for p in points if p[2] < 0]
        above = [p for p in points if p[2] > 0]
        if below and above:
            lo = max(below, key=lambda p: p[0])
            hi = min(above, key=lambda p: p[0])
            g_lo = lo[2] / 2 if self._halve == -1 else lo[2]
            g_hi = hi[2] / 2 if self._halve == 1 else hi[2]
            width = hi[0] - lo[0]
            root = lo[0] - g_lo * width / (g_hi - g_lo)
            if width > TRUST_WIDTH:
                # The secant is trusted only on a narrow bracket; on a wide one keep clear of its ends.
                root = min(max(root, lo[0] + 0.01 * width), hi[0] - 0.01 * width)
                return root, False
            if min(root - lo[0], hi[0] - root) <= self.xtol or self._stalled:
                return root, True
            secant = lo[0] - lo[2] * width / (hi[2] - lo[2])
            error = self._secant_error(lo, hi, secant)
            if error is not None and error <= self.xtol / 10:
                return secant, True
            return root, False
        if len(points) == 1:
            step = -points[0][2] / self.hessian
            return points[0][0] + step, abs(step) <= self.xtol
        a, b = sorted(points, key=lambda p: abs(p[2]))[:2]
        if a[2] == b[2]:
            return a[0], self._stalled
        root = a[0] - a[2] * (a[0] - b[0]) / (a[2] - b[2])
        return root, (abs(root - a[0]) <= self.xtol and abs(a[0] - b[0]) <= TRUST_WIDTH) or self._stalled

    def _secant_error(self, lo, hi, root: float) -> float | None:
        """About how far the secant root through ``lo``, ``hi`` lies from the optimum: ``g(root) ~ g''/2 (root - lo)
        (root - hi)``, g'' from a third evaluated point (None without one)."""
        others = [p for p in self.points if p[0] not in (lo[0], hi[0])]
        if not others:
            return None
        third = min(others, key=lambda p: min(abs(p[0] - lo[0]), abs(p[0] - hi[0])))
        if min(abs(third[0] - lo[0]), abs(third[0] - hi[0])) < 100 * self.xtol:
            return None  # too close: rounding would swamp the second difference
        slope = (hi[2] - lo[2]) / (hi[0] - lo[0])
        a, middle, b = sorted((lo, hi, third))
        second = ((b[2] - middle[2]) / (b[0] - middle[0]) - (middle[2] - a[2]) / (middle[0] - a[0])) / (b[0] - a[0])
        if slope <= 0 or not math.isfinite(second):
            return None
        return abs(second / slope) * (root - lo[0]) * (hi[0] - root)

    def finish(self, max_passes: int) -> tuple[float, bool]:
        """Evaluate at the estimate until it is converged or the pass budget is spent."""
        while True:
            theta, converged = self.estimate()
            if converged or self.scan.passes >= max_passes:
                return theta, converged
            if not self.point_at(theta)[1]:
                return theta, True  # the estimate rounds to an evaluated beta: precision reached


def _no_class_above_the_true_one(scan: Scan) -> FitResult:
    """T at the lower bound when no row has a class above its true class (one more read, which also counts
    ties); refused when the NLL does not depend on T at all (every row's finite logits equal: neither a bound
    nor T = 1 is an answer)."""
    n = scan.num_samples
    tied, flat, nll = scan.top_ties(1.0 / T_MIN)
    if flat == n:
        constant = f"ln {scan.num_classes} = {math.log(scan.num_classes):.4f}" if scan.sum(
            scan.stats.has_neginf) == 0 else "the log of the count of possible classes"
        raise DataError(f"logits carry no information: every one of the {n} fitting rows has all its logits equal, "
                        f"so the NLL is {constant} at every T; no temperature can be fitted")
    if not tied:
        why = "every fitting sample's true class holds the largest logit"
    else:
        equal = f", {flat} of them with all logits equal" if flat else ""
        why = (f"no fitting sample has a class with a larger logit than its true class ({tied} of the {n} share "
               f"the largest logit with another class{equal})")
    message = f"{why}, so the NLL keeps falling as T -> 0; T is set to the lower bound {T_MIN:g}"
    return FitResult(T_MIN, "nll", n, 0, True, nll, "lower", [message], method="bound")


def _clamp(result: FitResult) -> FitResult:
    if result.temperature < T_MIN:
        result.temperature, result.bound = T_MIN, "lower"
        result.warnings.append(f"the optimum lies below T = {T_MIN:g}; T is set to that bound")
    elif result.temperature > T_MAX:
        result.temperature, result.bound = T_MAX, "upper"
        result.warnings.append(f"the optimum lies above T = {T_MAX:g}; T is set to that bound")
    return result


def _fit_ece(scan: Scan, *, bins: int, xtol: float | None, max_passes: int, ece_terms: Any = None,
             on_pass: PassCallback | None = None) -> FitResult:
    """The T minimising binned ECE on the fitting samples (see :mod:`tempcal.core.ece_fit`), around the NLL optimum.

    ``ece_terms`` replaces the search's pass (for searches that ride on this one's reads)."""
    anchor = _fit_nll(scan, xtol=xtol, max_passes=max_passes)
    temperature, _, searched = minimise_ece(scan, anchor.temperature, bins=bins, terms=ece_terms, on_pass=on_pass)
    nll = scan.objective(1.0 / temperature).nll
    warnings = list(anchor.warnings)
    if not searched:
        warnings.append("the ECE search stopped before certifying its tolerance; T may not be the global minimum")
    return _clamp(FitResult(temperature, "ece", scan.num_samples, 0, searched, nll, None, warnings,
                            method="ece-search"))


# -- the public fit ----------------------------------------------------------------------------------------------------

#: The fit of ``groups=`` and ``folds=``, ``(scan, groups, kept rows, group_prior=, folds=, seed=, objective=, bins=)
#: -> FitResult``: registered when :mod:`tempcal.subsets.fits` loads (``tempcal.fit_temperature`` loads it).
SUBSET_FIT: list[Callable[..., FitResult]] = []


def fit_temperature(logits, labels=None, *, objective: str = "nll", bins: int = DEFAULT_BINS,
                    device: str | torch.device = "auto", chunk_rows: int | None = None,
                    probs: bool | None = None, xtol: float | None = None, max_passes: int = MAX_PASSES,
                    groups: Any = None, group_prior: float | None = None, folds: int | None = None, seed: int = 0,
                    on_pass: PassCallback | None = None) -> FitResult:
    """Fit T on ``logits`` ``[N, C]`` (or ``[N]`` binary) and integer ``labels`` ``[N]``.

    ``probs=True``: ``logits`` holds probabilities and T is fitted on log(p); ``probs=False``: logits, whatever they
    look like; ``probs=None``: logits, refusing values that all look like probability vectors
    (:class:`~tempcal.errors.ProbabilitiesError`). Logits whose rows are flat are refused too.

    ``logits`` may also be a :class:`~tempcal.core.scan.Scan` (``labels`` None), so that callers validate once and
    fit on a split without reading the data again. ``xtol`` is the relative tolerance on T (default 1e-7);
    ``max_passes`` caps the reads, the validating scan included.

    ``groups`` (one value per row) also fits each group's T, drawn toward the global T by ``group_prior``
    (``lam * (ln T - ln T_global)^2`` added to the group's NLL sum): ``group_temperatures``. ``folds`` (K, seeded by
    ``seed``) also fits T outside each of K class-stratified folds: ``fold_temperatures``. Both share the global
    fit's reads."""
    kept, owned = None, not isinstance(logits, Scan)  # owned: the scan made here, whose buffers it may give back
    if not owned:
        scan = logits
    else:
        data = as_logits_data(logits, labels, probs=probs)
        kept = data.index
        scan = Scan(data, device=device, chunk_rows=chunk_rows, fit_rows=ALL_ROWS)
    try:
        if owned and probs is None and scan.looks_like_probabilities:
            raise probabilities_refused("the logits")
        if groups is not None or folds is not None:
            if not SUBSET_FIT:
                raise TempcalError("groups= and folds= are fitted by tempcal.subsets: call tempcal.fit_temperature, "
                                   "or import tempcal.subsets.fits first")
            return SUBSET_FIT[0](scan, groups, kept, group_prior=group_prior, folds=folds, seed=seed,
                                 objective=objective, bins=bins)
        return fit_scan(scan, objective=objective, bins=bins, xtol=xtol, max_passes=max_passes, on_pass=on_pass)
    finally:
        if owned:
            scan.release_buffers()  # the fit returns numbers: its buffers serve the next fit of the process


__all__ = ["MAX_PASSES", "SUBSET_FIT", "T_MAX", "T_MIN", "XTOL", "FitResult", "fit_scan", "fit_temperature"]

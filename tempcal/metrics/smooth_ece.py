"""Smooth ECE (Blasiok & Nakkiran 2023) of (confidence, correct), as ``relplot.smECE`` computes it (relplot 1.0.3).

The residuals ``r_i = conf_i - correct_i`` and the rows themselves are spread onto a uniform grid over [0, 1]
by linear interpolation, smoothed by a Gaussian kernel of width sigma reflected at 0 and 1, and
``smECE(sigma) = sum_t |R(t) / D(t)| D(t) / sum_t D(t)`` over an evaluation mesh, with R and D the smoothed
residuals and density (D plus 1e-4). The bandwidth is relplot's fixed point: the sigma found by bisection on
(0, 1] (10 halvings) where ``smECE(sigma) = sigma`` (sigma below 1e-3 accepted). It needs only the arrays the
risk-coverage figures keep: ``sum_i w_i r_i = sum_i w_i (conf_i - 1) + sum_wrong w_i``. relplot is not a dependency
(it imports pandas and seaborn); the tests check against it to 1e-4.
"""

from __future__ import annotations

import math

import numpy as np

#: relplot's ``config.smECE_mesh_pts``: the evaluation mesh has at least this many points.
MESH_POINTS = 200
#: relplot's ``smECE(eps=0.001)``: a bandwidth below it is accepted outright.
MIN_BANDWIDTH = 1e-3
#: relplot's ``search_param(refine=10)``.
HALVINGS = 10
#: Rows spread onto the grid at a time (about 50 bytes of temporaries per row of a chunk).
CHUNK = 1 << 14


def _spread(values: np.ndarray, points: int, offset: float | None) -> np.ndarray:
    """``values`` spread onto ``points`` grid points by linear interpolation, each weighing ``value + offset`` (1
    without an offset)."""
    position = values * (points - 1)
    index = position.astype(np.int64).clip(0, points - 2)
    frac = position - index
    low = 1 - frac
    if offset is not None:
        weight = values + offset
        low *= weight
        frac *= weight
    return np.bincount(index, low, minlength=points) + np.bincount(index + 1, frac, minlength=points)


def _grid_sums(confidence: np.ndarray, subset: np.ndarray, points: int, right: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(residual, count)`` spread onto ``points`` grid points, :data:`CHUNK` rows at a time (the temporaries
    stay a few megabytes, whatever the rows). ``subset`` holds the misclassified rows' confidences (residual
    ``conf - 1 + [wrong]``), or with ``right`` the correctly classified rows' (``conf - [right]``)."""
    residual = np.zeros(points)
    count = np.zeros(points)
    for start in range(0, confidence.size, CHUNK):
        part = confidence[start:start + CHUNK]
        residual += _spread(part, points, 0.0 if right else -1.0)
        count += _spread(part, points, None)
    for start in range(0, subset.size, CHUNK):
        spread = _spread(subset[start:start + CHUNK], points, None)
        residual += -spread if right else spread
    return residual, count


def _smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    """relplot's ``ReflectedGaussianKernel.convolve``: reflect at both ends, convolve, keep the middle."""
    points = values.size
    t = np.linspace(0, 1, points)
    kernel = np.exp(-(t - 0.5) ** 2 / (2 * sigma * sigma)) / (math.sqrt(2 * math.pi) * sigma)
    extended = np.concatenate([values[::-1][:-1], values, values[::-1][1:]])
    return np.convolve(extended, kernel, "valid")[points // 2: points // 2 + points]


def _interpolate(t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Linear interpolation of ``i / (len - 1) -> values[i]`` at ``t`` (relplot's ``interpolate``)."""
    count = values.size
    index = (t * (count - 1)).astype(np.int64).clip(0, count - 2)
    residual = (t - index / (count - 1)) * (count - 1)
    return values[index] * (1 - residual) + values[index + 1] * residual


def smooth_ece_at(confidence: np.ndarray, wrong_confidence: np.ndarray, sigma: float,
                  cache: dict[int, tuple[np.ndarray, np.ndarray]] | None = None, *, right: bool = False) -> float:
    """smECE at a fixed bandwidth ``sigma`` (relplot's ``smooth_ece``); ``right`` as for :func:`smooth_ece`."""
    mesh = np.linspace(0, 1, max(round(10 / sigma), MESH_POINTS))
    points = max(2000, round(20 / sigma)) // 2 + 1
    if cache is not None and points in cache:
        residual, count = cache[points]
    else:
        residual, count = _grid_sums(confidence, wrong_confidence, points, right)
        if cache is not None:
            cache[points] = (residual, count)
    smoothed = _interpolate(mesh, _smooth(residual, sigma))
    density = _interpolate(mesh, _smooth(count, sigma)) + 1e-4
    return float(np.sum(np.abs(smoothed / density) * density) / np.sum(density))


def smooth_ece(confidence: np.ndarray, wrong_confidence: np.ndarray, *, right: bool = False) -> float:
    """smECE at relplot's default bandwidth (the fixed point ``smECE(sigma) = sigma``); NaN without rows. With
    ``right`` the second array holds the correctly classified rows' confidences instead of the misclassified rows'."""
    confidence = np.asarray(confidence, dtype=np.float64)
    wrong_confidence = np.asarray(wrong_confidence, dtype=np.float64)
    if confidence.size == 0:
        return math.nan
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def accepted(sigma: float) -> bool:
        return sigma < MIN_BANDWIDTH or sigma < smooth_ece_at(confidence, wrong_confidence, sigma, cache, right=right)

    sigma = 1.0
    if not accepted(sigma):
        high, low = 1.0, 0.0
        for _ in range(HALVINGS):
            middle = (high + low) / 2
            if accepted(middle):
                low = middle
            else:
                high = middle
        sigma = high
    return smooth_ece_at(confidence, wrong_confidence, sigma, cache, right=right)

"""Temperature scaling for Python users: a scikit-learn-style estimator and a ``torch.nn.Module`` for deployment.

:class:`TemperatureScaler` fits T with :func:`tempcal.core.fitting.fit_temperature` (the CLI's exact
L-BFGS fit) and follows scikit-learn's conventions (``fit`` returns ``self``, fitted attributes
end in ``_``, ``get_params``/``set_params``/``clone`` work, ``NotFittedError`` before ``fit``).
:class:`TemperatureScaling` divides logits by a fitted T inside a model.
"""

import math
import os
import warnings
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator  # type: ignore[import-untyped]
from sklearn.utils.validation import check_is_fitted  # type: ignore[import-untyped]

from .core.fitting import FitResult, fit_temperature
from .errors import TempcalError
from .metrics.calibration import DEFAULT_BINS

#: Rows per chunk of ``predict_proba`` are cut to about this many probabilities (float64 work space).
CHUNK_ELEMENTS = 1 << 18


class TemperatureScaler(BaseEstimator):
    """Post-hoc temperature scaling: fit T on held-out logits, then divide logits by T.

    Inputs are logits ``[N, C]`` (or ``[N]`` / ``[N, 1]``: one binary logit, sigmoid) as numpy
    arrays, lists or torch tensors, and integer labels ``[N]``. Outputs follow the input: a
    torch tensor in gives a torch tensor out (same device), anything else gives numpy.

    Example (overconfident logits: three times the scale the labels were drawn at):

    >>> import numpy as np
    >>> from tempcal.scaler import TemperatureScaler
    >>> rng = np.random.default_rng(0)
    >>> base = 2 * rng.normal(size=(2000, 5))
    >>> p = np.exp(base) / np.exp(base).sum(axis=1, keepdims=True)
    >>> labels = (rng.random((2000, 1)) > p.cumsum(axis=1)).sum(axis=1)
    >>> logits = 3 * base
    >>> scaler = TemperatureScaler().fit(logits, labels)
    >>> round(scaler.temperature_, 1), scaler.converged_
    (3.0, True)
    >>> np.allclose(scaler.transform(logits), logits / scaler.temperature_)
    True
    >>> scaler.predict_proba(logits[:2]).sum(axis=1)
    array([1., 1.])
    >>> round(-scaler.score(logits, labels), 3)  # mean NLL at the fitted T; 1.419 at T = 1
    0.897
    >>> from sklearn.base import clone
    >>> clone(scaler).get_params()
    {'bins': 15, 'device': 'cpu', 'objective': 'nll'}

    Parameters
    ----------
    objective : ``"nll"`` (default) minimises the mean NLL; ``"ece"`` the binned ECE.
    bins : equal-width bins of the ECE objective.
    device : ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``: where the fit's reductions run.

    Attributes
    ----------
    temperature_ : the fitted T (> 0).
    n_passes_ : passes over the data the fit took (the validating scan included).
    converged_ : whether the fit met its tolerance.
    n_features_in_ : logit columns seen in ``fit`` (1 for a single binary logit).
    classes_ : ``arange(C)`` (``[0, 1]`` for a single binary logit).
    fit_result_ : the full :class:`~tempcal.core.fitting.FitResult` (objective value, bound, warnings).
    """

    def __init__(self, *, objective: str = "nll", bins: int = DEFAULT_BINS, device: str = "cpu"):
        self.objective = objective
        self.bins = bins
        self.device = device

    def fit(self, logits: Any, labels: Any) -> "TemperatureScaler":
        """Fit T on ``logits`` and ``labels``; warnings of the fit (e.g. T at a bound) are issued as ``UserWarning``."""
        if self.objective not in ("nll", "ece"):
            raise TempcalError(f"objective must be 'nll' or 'ece', got {self.objective!r}")
        if isinstance(self.bins, bool) or not isinstance(self.bins, (int, np.integer)) or self.bins < 1:
            raise TempcalError(f"bins must be an integer >= 1, got {self.bins!r}")
        z = _as_tensor(logits)
        result: FitResult = fit_temperature(z, _as_tensor(labels), objective=self.objective, bins=int(self.bins),
                                            device=self.device)
        for message in result.warnings:
            warnings.warn(message, UserWarning, stacklevel=2)
        self.temperature_ = float(result.temperature)
        self.n_passes_ = int(result.passes)
        self.converged_ = bool(result.converged)
        self.n_features_in_ = 1 if z.dim() == 1 else int(z.shape[1])
        self.classes_ = np.arange(max(self.n_features_in_, 2))
        self.fit_result_ = result
        return self

    def transform(self, logits: Any) -> Any:
        """``logits / T`` in the input's float dtype (float16/bfloat16 divided in float32; integers become float64)."""
        z, is_torch = self._check(logits)
        if z.is_floating_point():
            scaled = (z.to(torch.promote_types(z.dtype, torch.float32)) / self.temperature_).to(z.dtype)
        else:
            scaled = z.to(torch.float64) / self.temperature_
        return _out(scaled, is_torch)

    def predict_proba(self, logits: Any) -> Any:
        """``softmax(logits / T)`` ``[N, C]`` (``[N, 2]`` = ``[1 - sigmoid, sigmoid]`` for one binary logit).

        Computed in float64 chunk by chunk; returned as float64 numpy, or as a tensor in the
        input's dtype promoted to at least float32.
        """
        z, is_torch = self._check(logits)
        binary = self.n_features_in_ == 1
        z = z.reshape(-1) if binary else z
        rows = int(z.shape[0])
        out_dtype = torch.promote_types(z.dtype, torch.float32) if is_torch else torch.float64
        out = torch.empty(rows, 2 if binary else int(z.shape[1]), dtype=out_dtype, device=z.device)
        step = max(1, CHUNK_ELEMENTS // out.shape[1])
        for start in range(0, rows, step):
            chunk = z[start : start + step].to(torch.float64) / self.temperature_
            if binary:
                p = torch.stack([torch.sigmoid(-chunk), torch.sigmoid(chunk)], dim=1)
            else:
                p = torch.softmax(chunk, dim=1)
            out[start : start + step] = p.to(out_dtype)
        return _out(out, is_torch)

    def predict(self, logits: Any) -> Any:
        """The predicted class: arg-max (the first on ties); for one binary logit, 1 when ``logit >= 0``.

        T > 0 does not change it; it is here for scikit-learn pipelines.
        """
        z, is_torch = self._check(logits)
        binary = self.n_features_in_ == 1
        predicted = (z.reshape(-1) >= 0).to(torch.int64) if binary else torch.argmax(z, dim=1)
        return _out(predicted, is_torch)

    def score(self, logits: Any, labels: Any) -> float:
        """Minus the mean NLL of ``softmax(logits / T)`` (higher is better, as scikit-learn expects)."""
        from .core.data import as_logits_data
        from .core.scan import Scan

        z, _ = self._check(logits)
        scan = Scan(as_logits_data(z, _as_tensor(labels)), device=self.device)
        return -scan.objective(1.0 / self.temperature_).nll

    def to_module(self) -> "TemperatureScaling":
        """A :class:`TemperatureScaling` module holding the fitted T, for deployment code."""
        check_is_fitted(self, "temperature_")
        return TemperatureScaling(self.temperature_)

    def _check(self, logits: Any) -> tuple[torch.Tensor, bool]:
        """The logits as a tensor, after checking the scaler is fitted and the columns match ``fit``."""
        check_is_fitted(self, "temperature_")
        z = _as_tensor(logits)
        columns = 1 if z.dim() == 1 else (int(z.shape[1]) if z.dim() == 2 else -1)
        if columns != self.n_features_in_ or (z.dim() == 1 and self.n_features_in_ != 1):
            expected = "[N] or [N, 1] (one binary logit)" if self.n_features_in_ == 1 else f"[N, {self.n_features_in_}]"
            raise TempcalError(f"logits have shape {list(z.shape)}; this scaler was fitted on {expected}")
        return z, isinstance(logits, torch.Tensor)


def _as_tensor(x: Any) -> torch.Tensor:
    """A tensor view of a tensor, numpy array or nested list (numpy arrays in native byte order)."""
    if isinstance(x, torch.Tensor):
        return x
    array = np.asarray(x)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if array.dtype.kind not in "biuf":
        raise TempcalError(f"expected a numeric array, got dtype {array.dtype}")
    return torch.from_numpy(np.ascontiguousarray(array))


def _out(result: torch.Tensor, is_torch: bool) -> Any:
    """Torch in, torch out; anything else gets numpy."""
    if is_torch:
        return result
    return result.cpu().numpy()


class TemperatureScaling(torch.nn.Module):
    """``forward(logits) = logits / T`` with a fitted T held as a buffer (saved in ``state_dict``).

    Append it to a model to make its outputs calibrated logits; it works under
    ``torch.jit.script`` and ``torch.export``. float16/bfloat16 logits are divided in float32
    and returned in their own dtype.

    >>> import torch
    >>> from tempcal.scaler import TemperatureScaling
    >>> net = torch.nn.Linear(4, 3)
    >>> calibrated = torch.nn.Sequential(net, TemperatureScaling(2.5))
    >>> x = torch.randn(8, 4)
    >>> torch.allclose(calibrated(x), net(x) / 2.5)
    True
    >>> calibrated[1]
    TemperatureScaling(temperature=2.5)
    """

    temperature: torch.Tensor

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        value = float(temperature)
        if not (math.isfinite(value) and value > 0):
            raise TempcalError(f"temperature must be a positive number, got {temperature!r}")
        # float32: every accelerator has it (MPS has no float64), and it resolves T to 6e-8.
        self.register_buffer("temperature", torch.tensor(value, dtype=torch.float32))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(logits.dtype, torch.float32)
        scaled = logits.to(compute) / self.temperature.to(compute)
        return scaled.to(logits.dtype) if logits.is_floating_point() else scaled

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TemperatureScaling":
        """The T that ``tempcal fit`` stored for ``path`` (safetensors metadata, or the sidecar of other formats)."""
        from .sources.registry import read_stored_temperature

        temperature, notes = read_stored_temperature(path)
        if temperature is None:
            why = notes[0] if notes else "run tempcal fit on it first"
            raise TempcalError(f"{path}: no stored temperature ({why})")
        return cls(temperature)

    def extra_repr(self) -> str:
        return f"temperature={float(self.temperature):.6g}"


__all__ = ["TemperatureScaler", "TemperatureScaling"]

"""Temperature scaling for Python users: a scikit-learn estimator and a ``torch.nn.Module`` for deployment.

:class:`TemperatureScaler` fits T with :func:`tempcal.fit_temperature` (the CLI's fit) and passes scikit-learn's
estimator checks except those that cannot apply to a scaler of logits (listed in the tests).
:class:`TemperatureScaling` divides logits by a fitted T inside a model.
"""

import contextlib
import os
import warnings
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, TransformerMixin  # type: ignore[import-untyped]
from sklearn.utils.multiclass import check_classification_targets  # type: ignore[import-untyped]
from sklearn.utils.validation import check_is_fitted  # type: ignore[import-untyped]

from .core.data import as_logits_data, probabilities_to_logits
from .core.fitting import FitResult
from .core.scan import Scan
from .errors import DataError, TempcalError, as_temperature
from .metrics.calibration import DEFAULT_BINS
from .subsets.fits import fit_temperature  # core's fit, with groups= registered

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _sklearn_validate_data  # type: ignore[import-untyped]
except ImportError:  # scikit-learn 1.3 to 1.5: the estimator's own _validate_data
    _sklearn_validate_data = None

#: Rows per chunk of ``predict_proba`` are cut to about this many probabilities (float64 work space).
CHUNK_ELEMENTS = 1 << 18
#: Rows per chunk of the NaN / +inf check of ``transform`` and ``predict`` (one bool per logit).
CHECK_ELEMENTS = 1 << 24
#: Float dtypes that numpy input keeps (float16 is divided in float32 and returned as float16); others become float64.
FLOAT_DTYPES = (np.float64, np.float32, np.float16)
#: scikit-learn's sentinel for "no y to validate".
NO_Y = "no_validation"


# auto_wrap_output_keys=None: transform's output is never rewrapped by set_output (a tensor in gives a tensor out).
class TemperatureScaler(ClassifierMixin, TransformerMixin, BaseEstimator,
                        auto_wrap_output_keys=None):  # type: ignore[call-arg]
    """Post-hoc temperature scaling: fit T on held-out logits, then divide logits by T.

    A scikit-learn classifier and transformer whose input ``X`` holds logits: ``[N, C]``, or
    ``[N]`` / ``[N, 1]`` for one binary logit per sample (sigmoid; the logit of ``classes_[1]``),
    as numpy arrays, lists, pandas frames or torch tensors; ``y`` holds the labels ``[N]``.
    Outputs follow the input: a torch tensor in gives a torch tensor out (same device; ``predict``
    gives numpy when the labels are strings), anything else gives numpy. ``-inf`` logits mark
    impossible classes and are allowed; NaN and ``+inf`` are refused (``ValueError``).

    Labels and ``classes_``: logit column ``j`` belongs to class ``classes_[j]``, and ``classes_``
    has one entry per column (two for one binary logit). ``fit`` decides them from ``y`` by one rule:

    * numeric labels that are all whole numbers in ``0..C-1`` (C columns; 0..1 for one binary
      logit) are column indices, and ``classes_ = arange(C)`` in ``y``'s dtype (widened if it
      cannot hold ``C - 1``), whether or not every class occurs in ``y``: a validation set may
      lack a class;
    * any other labels (strings, booleans, negative numbers, numbers past ``C - 1`` such as
      ``{10, 20, 30}``; one such label in ``y`` is enough) are sorted, ``classes_ = unique(y)``,
      and column ``j`` is the ``j``-th smallest label; there must then be exactly C distinct
      labels, since with fewer it is unknown which column belongs to which label (code such
      labels as ``0..C-1`` when a class may be absent).

    So labels ``{1, 2, 3}`` over 3 columns are sorted labels (column 0 is class 1), while labels
    ``{1, 2}`` over 3 columns are column indices (column 0 is a class absent from ``y``).
    ``predict`` returns labels from ``classes_``, ``predict_proba``'s columns follow ``classes_``,
    and ``score`` accepts only labels in ``classes_``.

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
    {'bins': 15, 'device': 'cpu', 'group_prior': None, 'objective': 'nll', 'probs': None}

    Groups (tasks, domains, subjects): ``fit(X, y, groups=g)`` also fits a T per group, drawn toward the
    global T by ``group_prior``; ``transform``, ``predict_proba`` and ``score`` given ``groups`` divide each
    row by its group's T (a group not seen in ``fit``: the global T, with a warning):

    >>> g = np.where(np.arange(2000) % 2 == 0, "even", "odd")
    >>> per_group = TemperatureScaler().fit(logits, labels, groups=g)
    >>> sorted(per_group.group_temperatures_), per_group.temperature_ == scaler.temperature_
    (['even', 'odd'], True)
    >>> t_odd = per_group.group_temperatures_["odd"]
    >>> np.allclose(per_group.transform(logits[1:2], groups=g[1:2]), logits[1:2] / t_odd)
    True

    Probabilities (a classifier's ``predict_proba``; here the ones the labels were drawn from, so T is about 1)
    are refused unless ``probs`` says what they are;
    with ``probs=True`` every method works on ``log(p)``:

    >>> TemperatureScaler().fit(p, labels)
    Traceback (most recent call last):
    ...
    tempcal.errors.ProbabilitiesError: every row of the logits looks like a probability vector
    (values in [0, 1], each row summing to 1); pass probs=True, or probs=False to treat the values as logits
    >>> on_p = TemperatureScaler(probs=True).fit(p, labels)
    >>> round(on_p.temperature_, 1), np.allclose(on_p.transform(p), np.log(p) / on_p.temperature_)
    (1.0, True)

    Labels that are not column indices are kept in ``classes_`` and returned by ``predict``:

    >>> names = np.array(["ant", "bee", "cat", "dog", "eel"])
    >>> named = TemperatureScaler().fit(logits, names[labels])
    >>> named.classes_.tolist(), named.temperature_ == scaler.temperature_
    (['ant', 'bee', 'cat', 'dog', 'eel'], True)
    >>> named.predict(np.array([[0.0, 0.0, 5.0, 0.0, 0.0]])).tolist()
    ['cat']

    Parameters
    ----------
    objective : ``"nll"`` (default) minimises the mean NLL; ``"ece"`` the binned ECE.
    bins : equal-width bins of the ECE objective.
    device : ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``: where the fit's reductions run.
    group_prior : how strongly each group's T is drawn toward the global T when ``fit`` is given ``groups``:
        ``group_prior * (ln T - ln T_global)^2`` is added to the group's NLL sum (0: independent fits; None:
        the command line's default, :data:`tempcal.subsets.options.DEFAULT_GROUP_PRIOR`).
    probs : ``True``: ``X`` holds probabilities (rows summing to 1; one binary column: the probability of
        ``classes_[1]``), and T scales ``log(p)`` (log-odds for one column) in every method; ``False``:
        ``X`` holds logits, whatever they look like; ``None`` (default): logits, and ``fit`` refuses ``X``
        whose rows all look like probability vectors (:class:`~tempcal.errors.ProbabilitiesError`).

    Attributes
    ----------
    temperature_ : the fitted T (> 0).
    n_passes_ : passes over the data the fit took (the validating scan included).
    converged_ : whether the fit met its tolerance.
    n_features_in_ : logit columns seen in ``fit`` (1 for a single binary logit).
    feature_names_in_ : column names, when ``fit`` was given a pandas frame with string column names.
    classes_ : the label of each logit column (see above).
    fit_result_ : the full :class:`~tempcal.core.fitting.FitResult` (objective value, bound, warnings).
    group_temperatures_ : each group's T, by group value, when ``fit`` was given ``groups`` (else None).
    """

    def __init__(self, *, objective: str = "nll", bins: int = DEFAULT_BINS, device: str = "cpu",
                 probs: bool | None = None, group_prior: float | None = None):
        self.objective = objective
        self.bins = bins
        self.device = device
        self.probs = probs
        self.group_prior = group_prior

    def fit(self, X: Any, y: Any, groups: Any = None) -> "TemperatureScaler":
        """Fit T on logits ``X`` and labels ``y`` (with ``groups``, one value per row, also ``group_temperatures_``);
        the fit's warnings (e.g. T at a bound) are issued as ``UserWarning``."""
        if self.objective not in ("nll", "ece"):
            raise TempcalError(f"objective must be 'nll' or 'ece', got {self.objective!r}")
        if isinstance(self.bins, bool) or not isinstance(self.bins, (int, np.integer)) or self.bins < 1:
            raise TempcalError(f"bins must be an integer >= 1, got {self.bins!r}")
        if self.probs not in (None, True, False):
            raise TempcalError(f"probs must be True, False or None, got {self.probs!r}")
        z, _, labels = self._validate(X, y, reset=True, min_samples=2)
        check_classification_targets(labels)
        classes, codes = _column_of_each_label(labels, self.n_features_in_)
        result: FitResult = fit_temperature(z, _as_tensor(codes), objective=self.objective,
                                            bins=int(self.bins), device=self.device, probs=self.probs,
                                            groups=None if groups is None else _group_values(groups, z.shape[0]),
                                            group_prior=self.group_prior)
        for message in result.warnings:
            warnings.warn(message, UserWarning, stacklevel=2)
        self.temperature_ = float(result.temperature)
        self.n_passes_ = int(result.passes)
        self.converged_ = bool(result.converged)
        self.classes_ = classes
        self.fit_result_ = result
        self.group_temperatures_ = result.group_temperatures
        return self

    def fit_transform(self, X: Any, y: Any = None, groups: Any = None, **fit_params: Any) -> Any:
        """``fit(X, y, groups)`` then ``transform(X, groups)``: each row at its group's T when groups are given."""
        return self.fit(X, y, groups, **fit_params).transform(X, groups)

    def _temperatures(self, rows: int, groups: Any, device: torch.device) -> torch.Tensor | float:
        """Each of ``rows`` rows' T as a column (its group's; the global T for an unseen group), or the global T."""
        if groups is None or not self.group_temperatures_:
            return self.temperature_
        values = _group_values(groups, rows)
        table = self.group_temperatures_
        unseen = sorted({v for v in values.tolist() if v not in table}, key=str)
        if unseen:
            warnings.warn(f"{len(unseen)} group(s) not seen in fit (first: {unseen[0]!r}) take the global T",
                          UserWarning, stacklevel=3)
        temps = [table.get(v, self.temperature_) for v in values.tolist()]
        return torch.tensor(temps, dtype=torch.float64, device=device)[:, None]

    def transform(self, X: Any, groups: Any = None) -> Any:
        """``X / T`` in the input's float dtype and shape (float16/bfloat16 divided in float32; integers: float64);
        ``log(X) / T`` with ``probs=True``. With ``groups``: each row divided by its group's T."""
        z, is_torch, shape, dtype = self._logits(X)
        compute = torch.promote_types(z.dtype, torch.float32)
        temperature = self._temperatures(z.shape[0], groups, z.device)
        divisor = temperature.to(compute) if isinstance(temperature, torch.Tensor) else temperature
        scaled = (z.to(compute) / divisor).to(dtype)
        return _out(scaled.reshape(shape), is_torch)

    def predict_proba(self, X: Any, groups: Any = None) -> Any:
        """``softmax(X / T)`` ``[N, C]`` in the order of ``classes_`` (one binary logit: ``[1 - sigmoid, sigmoid]``),
        computed in float64; float64 numpy, or a tensor in the input's dtype promoted to at least float32."""
        z, is_torch, _, dtype = self._logits(X)
        binary = self.n_features_in_ == 1
        rows = int(z.shape[0])
        out_dtype = torch.promote_types(dtype, torch.float32) if is_torch else torch.float64
        out = torch.empty(rows, 2 if binary else int(z.shape[1]), dtype=out_dtype, device=z.device)
        step = max(1, CHUNK_ELEMENTS // out.shape[1])
        temperature = self._temperatures(rows, groups, z.device)
        for start in range(0, rows, step):
            t = temperature[start : start + step] if isinstance(temperature, torch.Tensor) else temperature
            chunk = z[start : start + step].to(torch.float64) / t  # one binary logit: a column
            p = torch.cat([torch.sigmoid(-chunk), torch.sigmoid(chunk)], dim=1) if binary else torch.softmax(chunk, 1)
            out[start : start + step] = p.to(out_dtype)
        return _out(out, is_torch)

    def predict(self, X: Any) -> Any:
        """The label of the arg-max column (the first on ties; one binary logit: ``classes_[1]`` when ``logit >= 0``),
        which T > 0 does not change: here for scikit-learn pipelines."""
        z, is_torch, _, _ = self._logits(X)
        column = (z[:, 0] >= 0).to(torch.int64) if self.n_features_in_ == 1 else torch.argmax(z, dim=1)
        if is_torch and self.classes_.dtype.kind in "biuf":
            with contextlib.suppress(TypeError):  # a dtype torch lacks: numpy labels
                return torch.from_numpy(self.classes_).to(column.device)[column]
        return self.classes_[column.cpu().numpy()]

    def score(self, X: Any, y: Any, groups: Any = None) -> float:
        """Minus the mean NLL of ``softmax(X / T)`` on labels ``y`` (higher is better, as scikit-learn expects); with
        ``groups``, each row at its group's T."""
        z, _, labels = self._validate(X, y, reset=False)
        scan = Scan(as_logits_data(z, _as_tensor(self._columns(labels)), probs=bool(self.probs), logits_name="X"),
                    device=self.device)
        temperature = self._temperatures(z.shape[0], groups, torch.device("cpu"))
        if not isinstance(temperature, torch.Tensor):
            return -scan.objective(1.0 / temperature).nll
        from .subsets.cells import cell_objective

        cells = torch.arange(z.shape[0], device=scan.device)
        sums = cell_objective(scan, (1.0 / temperature).reshape(1, -1), cells)[0]
        return -float(sums[:, 1].sum() / sums[:, 0].sum())

    def to_module(self) -> "TemperatureScaling":
        """A :class:`TemperatureScaling` module holding the fitted T, for deployment code."""
        check_is_fitted(self, "temperature_")
        return TemperatureScaling(self.temperature_)

    def __sklearn_tags__(self):  # scikit-learn >= 1.6
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32", "float16"]
        return tags

    def _more_tags(self) -> dict[str, Any]:  # scikit-learn < 1.6
        return {"preserves_dtype": [np.float64, np.float32, np.float16]}

    # -- input checks ---------------------------------------------------------------------------------

    def _validate(self, X: Any, y: Any = NO_Y, *, reset: bool, min_samples: int = 1
                  ) -> tuple[torch.Tensor, bool, Any]:
        """X as a float tensor ``[N, F]`` (the input's memory where it can be), whether X was 1-D, and y as numpy,
        checked by scikit-learn (a tensor through a stand-in of its shape holding no memory); values are not checked."""
        if not reset:
            check_is_fitted(self, "temperature_")
        if isinstance(y, torch.Tensor):
            y = y.detach().cpu().numpy()
        is_torch = isinstance(X, torch.Tensor)
        if not hasattr(X, "shape"):  # a list or another array-like: as an array, its shape tells 1-D from 2-D
            X = np.asarray(X)
        one_d = len(X.shape) == 1 and (reset or self.n_features_in_ == 1)
        if one_d:  # one binary logit per sample
            X = X.reshape(-1, 1) if is_torch else np.reshape(np.asarray(X), (-1, 1))
        if is_torch:
            _check_tensor_form(X)
            stand_in = np.lib.stride_tricks.as_strided(np.zeros(1), shape=tuple(X.shape), strides=(0, 0))
            checked = _validate_data(self, stand_in, y, reset=reset, ensure_min_samples=min_samples, dtype=None)
            z = X if X.is_floating_point() else X.to(torch.float64)
        else:
            checked = _validate_data(self, X, y, reset=reset, ensure_min_samples=min_samples, dtype=FLOAT_DTYPES)
            z = _as_tensor(checked if y is NO_Y else checked[0])
        return z, one_d, (None if y is NO_Y else checked[1])

    def _logits(self, X: Any) -> tuple[torch.Tensor, bool, tuple[int, ...], torch.dtype]:
        """X checked against the fit (fitted, same columns, no NaN or +inf) as logits ``[N, F]`` (``log(X)`` with
        ``probs=True``), whether it was a tensor, the shape to give a result of X's own shape, and X's dtype."""
        z, one_d, _ = self._validate(X, reset=False)
        dtype = z.dtype
        if self.probs:  # one column: its log-odds
            z = probabilities_to_logits(z[:, 0], "X")[:, None] if z.shape[1] == 1 else probabilities_to_logits(z, "X")
        else:
            _refuse_nan_and_posinf(z)
        return z, isinstance(X, torch.Tensor), (z.shape[0],) if one_d else tuple(z.shape), dtype

    def _columns(self, labels: np.ndarray) -> np.ndarray:
        """The column of each label (int64), for labels of ``classes_``."""
        classes = self.classes_
        try:
            columns = np.minimum(np.searchsorted(classes, labels), len(classes) - 1)
            unknown = classes[columns] != labels
        except TypeError as error:  # e.g. string labels for numeric classes_
            raise TempcalError(f"y's labels ({labels.dtype}) cannot be compared with classes_ ({classes.dtype})"
                               ) from error
        if bool(np.any(unknown)):
            first = int(np.flatnonzero(unknown)[0])
            label = labels[first : first + 1].tolist()[0]
            raise TempcalError(f"y holds {int(np.sum(unknown))} label(s) not in classes_; first: {label!r} "
                               f"at index {first}")
        return columns.astype(np.int64, copy=False)


def _group_values(groups: Any, rows: int) -> np.ndarray:
    """One group value per row, as a flat numpy array (its length checked)."""
    values = np.asarray(groups.detach().cpu() if isinstance(groups, torch.Tensor) else groups).reshape(-1)
    if values.shape[0] != rows:
        raise TempcalError(f"groups holds {values.shape[0]} values for X's {rows} rows; give one per row")
    return values


def _validate_data(estimator: BaseEstimator, X: Any, y: Any, **check_params: Any) -> Any:
    """scikit-learn's ``validate_data`` (>= 1.6) or the method it replaced, without the finiteness check."""
    if _sklearn_validate_data is not None:
        return _sklearn_validate_data(estimator, X, y, ensure_all_finite=False, **check_params)
    return estimator._validate_data(X, y, force_all_finite=False, **check_params)


def _check_tensor_form(x: torch.Tensor) -> None:
    """What the stand-in of a tensor cannot show scikit-learn: its layout, complex values, a shape other than 2-D."""
    if x.layout != torch.strided:
        raise TypeError(f"Sparse data was passed for X ({x.layout}), but dense data is required; "
                        "use .to_dense() to convert it")
    if x.is_complex():
        raise ValueError("Complex data not supported")
    if x.dim() != 2:
        raise ValueError(f"Expected a 2D tensor [n_samples, n_features], got shape {list(x.shape)}. Reshape your "
                         "data either using X.reshape(-1, 1) if your data has a single feature or X.reshape(1, -1) "
                         "if it contains a single sample.")


def _column_of_each_label(y: np.ndarray, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """``classes_`` and the column of each label (int64), by the rule in :class:`TemperatureScaler`'s docstring."""
    n_classes = max(n_features, 2)
    # check_classification_targets has refused non-integral floats: numeric labels here are whole numbers
    if y.dtype.kind in "iuf" and y.min() >= 0 and y.max() < n_classes:
        dtype = np.result_type(y.dtype, np.min_scalar_type(n_classes - 1))  # y's dtype, widened to hold C - 1
        return np.arange(n_classes).astype(dtype), y.astype(np.int64, copy=False)
    classes, columns = np.unique(y, return_inverse=True)
    columns = columns.reshape(-1).astype(np.int64, copy=False)
    logits = "one binary logit" if n_features == 1 else "logit columns"
    if len(classes) > n_classes:
        raise TempcalError(f"y has {len(classes)} classes, but X has {n_features} feature(s) ({logits}) for "
                           f"{n_classes} classes")
    if len(classes) < n_classes:
        raise TempcalError(f"y has {len(classes)} distinct labels for X's {n_features} feature(s) ({logits}, "
                           f"{n_classes} classes) and they are not all column indices 0..{n_classes - 1}, so which "
                           "column belongs to which class is unknown; code the labels as 0..C-1 when a class is "
                           "absent")
    return classes, columns


def _refuse_nan_and_posinf(z: torch.Tensor) -> None:
    """Refuse NaN and +inf logits (``ValueError``, as scikit-learn expects); ``-inf`` marks an impossible class."""
    step = max(1, CHECK_ELEMENTS // max(1, int(z.shape[1])))
    for start in range(0, int(z.shape[0]), step):
        chunk = z[start : start + step]
        for name, bad in (("NaN", torch.isnan(chunk)), ("+inf", torch.isposinf(chunk))):
            rows = bad.any(1)
            if bool(rows.any()):
                first = start + int(rows.nonzero()[0, 0])
                raise DataError(f"Input X contains {name} (first in row {first}); only -inf logits are allowed")


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor on the memory of a checked array (copied only to make it C-contiguous in native byte order)."""
    array = np.ascontiguousarray(array)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    with warnings.catch_warnings():
        # A read-only array (a memory-mapped file, joblib's workers) is only ever read here.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        return torch.from_numpy(array)


def _out(result: torch.Tensor, is_torch: bool) -> Any:
    """Torch in, torch out; anything else gets numpy."""
    return result if is_torch else result.cpu().numpy()


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
        value = as_temperature(temperature)
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

"""Independent reference implementations the tests compare tempcal against (float64 numpy/scipy, scikit-learn)."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp, softmax
from sklearn.metrics import average_precision_score, roc_auc_score


def two_class(z: np.ndarray) -> np.ndarray:
    """A single binary logit ([N] or [N, 1]) as the two-class logits [0, z]."""
    if z.ndim == 2 and z.shape[1] == 1:
        z = z[:, 0]
    return np.stack([np.zeros_like(z), z], axis=1) if z.ndim == 1 else z


def nll_at(z: np.ndarray, y: np.ndarray, temperature: float) -> float:
    z = two_class(np.asarray(z, dtype=np.float64))
    scaled = z / temperature
    with np.errstate(invalid="ignore"):
        true = scaled[np.arange(len(y)), y]
    return float(np.mean(logsumexp(scaled, axis=1) - true))


def optimal_temperature(logits, labels) -> float:
    """T* by scipy's bounded scalar optimiser over log T, in float64."""
    z = torch.as_tensor(logits).double().numpy()
    y = torch.as_tensor(labels).long().numpy()

    def objective(log_t: float) -> float:
        return nll_at(z, y, math.exp(log_t))

    result = minimize_scalar(objective, bounds=(-12.0, 16.0), method="bounded",
                             options={"xatol": 1e-12, "maxiter": 2000})
    return math.exp(result.x)


def probabilities(logits, temperature: float = 1.0) -> np.ndarray:
    z = two_class(torch.as_tensor(logits).double().numpy()) / temperature
    return np.exp(z - logsumexp(z, axis=1, keepdims=True))


def predictions(logits) -> np.ndarray:
    """Arg-max (first on ties); a single binary logit predicts 1 when sigmoid >= 0.5."""
    z = torch.as_tensor(logits).double().numpy()
    if z.ndim == 2 and z.shape[1] == 1:
        z = z[:, 0]
    return (z >= 0).astype(np.int64) if z.ndim == 1 else np.argmax(z, axis=1)


def ece_loop(logits, labels, temperature: float = 1.0, bins: int = 15) -> tuple[float, float]:
    """ECE and MCE by a plain loop over the contract's bins (i/B, (i+1)/B], the first also holding 0."""
    p = probabilities(logits, temperature)
    confidence = p.max(axis=1)
    correct = predictions(logits) == np.asarray(labels)
    n = len(confidence)
    ece, mce = 0.0, 0.0
    for i in range(bins):
        lower, upper = i / bins, (i + 1) / bins
        members = [k for k in range(n) if (lower < confidence[k] <= upper) or (i == 0 and confidence[k] == 0)]
        if not members:
            continue
        gap = abs(np.mean(correct[members]) - np.mean(confidence[members]))
        ece += len(members) / n * gap
        mce = max(mce, gap)
    return ece, mce


def brier(logits, labels, temperature: float = 1.0) -> float:
    p = probabilities(logits, temperature)
    onehot = np.eye(p.shape[1])[np.asarray(labels)]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def entropy(logits, temperature: float = 1.0) -> float:
    p = probabilities(logits, temperature)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return float(np.mean(terms.sum(axis=1)))


def reference_per_sample(logits: torch.Tensor, labels: torch.Tensor, tau: float):
    """Per-sample confidence, correctness and NLL at ``tau``."""
    z = logits.double().numpy() / tau
    y = labels.numpy()
    p = softmax(z, axis=1)
    return p.max(1), p.argmax(1) == y, logsumexp(z, axis=1) - z[np.arange(len(y)), y]


# -- out-of-distribution scores and detection figures, written from the contract's words ----------------


def ref_msp(logits, tau: float) -> np.ndarray:
    z = two_class(np.asarray(logits, dtype=np.float64)) / tau
    return np.exp(z.max(axis=1) - logsumexp(z, axis=1))


def ref_energy(logits, tau: float) -> np.ndarray:
    z = two_class(np.asarray(logits, dtype=np.float64))
    return tau * logsumexp(z / tau, axis=1)


def ref_fpr95(id_scores, ood_scores) -> float:
    """The threshold keeps 95% of ID: the largest s with mean(id >= s) >= 0.95; FPR95 = mean(ood >= s), ties in."""
    id_scores, ood_scores = list(map(float, id_scores)), list(map(float, ood_scores))
    threshold = None
    for s in sorted(set(id_scores), reverse=True):
        kept = sum(1 for v in id_scores if v >= s)
        if 100 * kept >= 95 * len(id_scores):  # integers: no rounding at exactly 95%
            threshold = s
            break
    return sum(1 for v in ood_scores if v >= threshold) / len(ood_scores)


def ref_auroc(id_scores, ood_scores) -> float:
    """Mann-Whitney: the chance an ID score beats an OOD score, ties counted half."""
    a = np.asarray(id_scores, dtype=np.float64)[:, None]
    b = np.asarray(ood_scores, dtype=np.float64)[None, :]
    return float(np.mean((a > b) + 0.5 * (a == b)))


def sk_figures(id_scores, ood_scores) -> dict[str, float]:
    """AUROC, AUPR-In and AUPR-Out by scikit-learn, ID positive."""
    y = np.r_[np.ones(len(id_scores)), np.zeros(len(ood_scores))]
    s = np.r_[id_scores, ood_scores]
    return {"auroc": roc_auc_score(y, s), "aupr_in": average_precision_score(y, s),
            "aupr_out": average_precision_score(1 - y, -s)}


def ref_scores(logits, tau: float, gamma: float = 0.1, top: int = 100) -> dict[str, np.ndarray]:
    """All five OOD scores of ``logits`` ([N, C], or one binary logit = classes [0, z]) at ``tau``, float64, from
    the contract's definitions row-wise over all classes: ``p = softmax(z / tau)`` through a log-sum-exp, ``1 - p_max``
    as the sum of the other probabilities (in logs), ``p^g (1 - p)^g`` as ``exp(g (log p + log(1 - p)))``, the top M
    by a stable argsort."""
    z = two_class(np.asarray(logits, dtype=np.float64))
    n, classes = z.shape
    rows = np.arange(n)
    best = np.argmax(z, axis=1)
    z_max = z[rows, best]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        x = (z - z_max[:, None]) / tau  # <= 0, exactly 0 at the arg-max
        others = x.copy()
        others[rows, best] = -np.inf
        o_max = others.max(axis=1)
        shift = np.where(np.isfinite(o_max), o_max, 0.0)
        log_r = shift + np.log(np.exp(others - shift[:, None]).sum(axis=1))  # log sum_{c != max} e^{x_c}
        log_s0 = np.log1p(np.exp(log_r))  # log sum_c e^{x_c}
        log_p = x - log_s0[:, None]
        p = np.exp(log_p)
        entropy = np.where(p > 0, p * log_p, 0.0).sum(axis=1)
        log_1mp = np.log1p(-p)
        log_1mp[rows, best] = log_r - log_s0  # 1 - p_max = the sum of the others
        terms = np.exp(gamma * (log_p + log_1mp))
        maxlogit = z_max / tau
    order = np.argsort(-z, axis=1, kind="stable")[:, : min(top, classes)]
    return {"msp": p[rows, best], "energy": z_max + tau * log_s0, "maxlogit": maxlogit, "entropy": entropy,
            "gen": -np.take_along_axis(terms, order, axis=1).sum(axis=1)}


# -- decisions: risk-coverage figures and conformal sets ---------------------------------------------------------


def ref_risk_coverage(confidence, correct) -> dict[str, float]:
    """AURC, E-AURC and AUGRC by a plain loop over k = 1..N: rows ranked most confident first, errors(k) the
    misclassified rows among the first k, a tie block of m rows holding e errors counting j * e / m after j rows."""
    conf = np.asarray(confidence, dtype=np.float64)
    wrong = ~np.asarray(correct, dtype=bool)
    n = conf.size
    order = sorted(range(n), key=lambda i: -conf[i])
    aurc = augrc = best = 0.0
    errors_before = 0.0
    i = 0
    while i < n:
        j = i
        while j < n and conf[order[j]] == conf[order[i]]:
            j += 1
        block_errors = sum(1 for r in order[i:j] if wrong[r])
        for step in range(1, j - i + 1):
            errors = errors_before + step * block_errors / (j - i)
            aurc += errors / (i + step) / n
            augrc += errors / n / n
        errors_before += block_errors
        i = j
    n_correct = n - int(wrong.sum())
    for k in range(1, n + 1):
        best += max(0, k - n_correct) / k / n
    return {"aurc": aurc, "eaurc": aurc - best, "augrc": augrc}


def ref_conformal_scores(p: np.ndarray, labels: np.ndarray) -> dict[str, list[float]]:
    """LAC ``1 - p_y`` and APS (the probabilities above p_y, plus p_y) of each row, one row at a time."""
    lac, aps = [], []
    for row, y in zip(p, labels, strict=True):
        lac.append(1 - row[y])
        aps.append(sum(v for v in row if v > row[y]) + row[y])
    return {"lac": lac, "aps": aps}


def ref_threshold(scores: list[float], alpha: float) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest score (+inf past n)."""
    n = len(scores)
    rank = math.ceil(round((n + 1) * (1 - alpha), 9))
    return math.inf if rank > n else sorted(scores)[rank - 1]


def ref_conformal_sets(p: np.ndarray, q: float, score: str) -> list[set[int]]:
    """Each row's set, one class at a time: LAC ``{c : 1 - p_c <= q}``; APS the classes in decreasing p (lower index
    first on ties) up to and including the first whose running sum reaches q."""
    sets = []
    for row in p:
        if score == "lac":
            sets.append({c for c in range(row.size) if 1 - row[c] <= q})
            continue
        chosen, running = set(), 0.0
        for c in sorted(range(row.size), key=lambda c: (-row[c], c)):
            chosen.add(c)
            running += row[c]
            if running >= q:
                break
        sets.append(chosen)
    return sets


def ref_conformal(p_fit, y_fit, p_eval, y_eval, alpha: float) -> dict[str, tuple[float, float, float]]:
    """Per score: (threshold from the fitting rows, coverage and mean set size on the evaluation rows)."""
    out = {}
    for score, values in ref_conformal_scores(p_fit, y_fit).items():
        q = ref_threshold(values, alpha)
        sets = ref_conformal_sets(p_eval, q, score)
        out[score] = (q, float(np.mean([y in s for y, s in zip(y_eval, sets, strict=True)])),
                      float(np.mean([len(s) for s in sets])))
    return out

"""A seeded corpus of logits and labels for the fit, and float64 references for its temperature.

164 cases: N from 30 to 100,000, C from 2 to 30,000, logit scales 0.05 to 50 (and 1e-3, 1e3, 1e5),
weak and strong labels, single binary logits, ``-inf`` entries, mask values -1e4 and -1e30, row
offsets of +-1000, language-model-like rows, optima from T = 6e-4 to beyond T_MAX, float64 input,
float32 reductions, and the shipped digits example. References: scipy's bounded optimiser on the
float64 NLL, and the root of the exact float64 dNLL/dbeta polished by Newton from it (finer than
any optimiser on NLL values); cached in ``fit_corpus_references.json`` by a hash of each case's
data, recomputed when the data or REFERENCE_VERSION change.

Run ``python tests/core/fit_corpus.py [--only TEXT] [--verbose]`` for the reads and errors per case.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

Case = Callable[[], tuple[torch.Tensor, torch.Tensor]]
DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits_logits.safetensors"
REFERENCE_CACHE = Path(__file__).with_name("fit_corpus_references.json")
#: Part of every cache key: bump it when the reference computation changes.
REFERENCE_VERSION = "2"
#: Cases with more logits than this are marked slow in the tests (the default run skips them).
HEAVY_LOGITS = 500_000


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def gaussian(n: int, c: int, scale: float, signal: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels drawn from softmax(signal * z0); logits scale * z0, so T* is near scale / signal."""
    g = _gen(seed)
    z = torch.randn(n, c, dtype=torch.float64, generator=g) * 2
    y = torch.multinomial(torch.softmax(z * signal, 1), 1, generator=g)[:, 0]
    return (z * scale).float(), y


def margin(n: int, c: int, m: float, noise: float, seed: int, scale: float = 1.7) -> tuple[torch.Tensor, torch.Tensor]:
    """A network-like classifier: the true class is boosted by ``m``; a ``noise`` share of labels is random."""
    g = _gen(seed)
    y = torch.randint(0, c, (n,), generator=g)
    z = torch.randn(n, c, dtype=torch.float64, generator=g)
    z[torch.arange(n), y] += m
    flip = torch.rand(n, generator=g) < noise
    y = torch.where(flip, torch.randint(0, c, (n,), generator=g), y)
    return (z * scale).float(), y


def binary(n: int, scale: float, signal: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One logit per row ([N]): labels from sigmoid(signal * z0), logits scale * z0."""
    g = _gen(seed)
    z = torch.randn(n, dtype=torch.float64, generator=g) * 2
    y = torch.bernoulli(torch.sigmoid(z * signal), generator=g).long()
    return (z * scale).float(), y


def masked(n: int, c: int, share: float, seed: int, fill: float = -math.inf) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian logits with a share of impossible classes (``-inf``, or a large negative mask value)."""
    z, y = gaussian(n, c, 2.0, 1.0, seed)
    mask = torch.rand(z.shape, generator=_gen(seed + 1)) < share
    mask[torch.arange(n), y] = False
    mask[torch.arange(n), (y + 1) % c] = False
    return z.masked_fill(mask, fill), y


def lm_like(n: int, c: int, scale: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A language-model-like row: a few large logits over a broad bulk; labels from a sharper softmax."""
    g = _gen(seed)
    z = torch.randn(n, c, dtype=torch.float64, generator=g) * 1.5
    top = torch.randint(0, c, (n, 5), generator=g)
    z.scatter_add_(1, top, 6 + 2 * torch.rand(n, 5, dtype=torch.float64, generator=g))
    y = torch.multinomial(torch.softmax(z * 1.3, 1), 1, generator=g)[:, 0]
    return (z * scale).float(), y


def almost_separable(n: int, c: int, errors: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row right by a wide margin except ``errors`` rows: the optimum sits at a tiny T."""
    g = _gen(seed)
    y = torch.randint(0, c, (n,), generator=g)
    z = torch.randn(n, c, dtype=torch.float64, generator=g)
    z[torch.arange(n), y] += 8
    wrong = torch.arange(errors)
    z[wrong, y[wrong]] -= 8.5
    return z.float(), y


def uninformative(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels nearly independent of the logits: the optimum sits at a huge T."""
    z, y = margin(n, c, 0.05, 0.97, seed)
    return z, y


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from safetensors.torch import load_file

    data = load_file(str(DIGITS))
    return data["logits"], data["labels"]


def corpus() -> dict[str, Case]:
    """Name -> factory, every case seeded (seeds count up in order: add new cases at the end)."""
    cases: dict[str, Case] = {}
    seed = 100
    for n in (30, 200, 2000, 10000):
        for c in (2, 10, 100, 1000):
            if n * c > 2_000_000:
                continue
            for scale in (0.05, 1.0, 50.0):
                for signal in (0.3, 3.0):
                    seed += 1
                    cases[f"gauss-n{n}-c{c}-s{scale}-sig{signal}"] = (
                        lambda n=n, c=c, scale=scale, signal=signal, seed=seed: gaussian(n, c, scale, signal, seed))
    for n in (50, 1000, 5000):
        for c in (5, 100):
            for m, noise in ((0.5, 0.0), (2.0, 0.5), (5.0, 0.0), (5.0, 0.9), (0.5, 0.9)):
                seed += 1
                cases[f"margin-n{n}-c{c}-m{m}-noise{noise}"] = (
                    lambda n=n, c=c, m=m, noise=noise, seed=seed: margin(n, c, m, noise, seed))
    for n in (30, 500, 10000):
        for scale in (0.05, 1.0, 50.0):
            for signal in (0.2, 5.0):
                seed += 1
                cases[f"binary-n{n}-s{scale}-sig{signal}"] = (
                    lambda n=n, scale=scale, signal=signal, seed=seed: binary(n, scale, signal, seed))
    for share in (0.1, 0.5, 0.9):
        seed += 1
        cases[f"neginf-{share}"] = lambda share=share, seed=seed: masked(2000, 20, share, seed)
    seed += 1
    cases["mask-1e4"] = lambda seed=seed: masked(2000, 20, 0.5, seed, fill=-1e4)
    seed += 1
    cases["mask-1e30"] = lambda seed=seed: masked(2000, 20, 0.5, seed, fill=-1e30)
    seed += 1
    cases["lm-c1000"] = lambda seed=seed: lm_like(2000, 1000, 1.0, seed)
    seed += 1
    cases["lm-c30000"] = lambda seed=seed: lm_like(300, 30000, 1.0, seed)
    for n, errors in ((1000, 1), (5000, 3)):
        seed += 1
        cases[f"tiny-T-n{n}-e{errors}"] = lambda n=n, errors=errors, seed=seed: almost_separable(n, 10, errors, seed)
    for n in (500, 20000):
        seed += 1
        cases[f"huge-T-n{n}"] = lambda n=n, seed=seed: uninformative(n, 10, seed)
    seed += 1
    cases["tiny-T-scaled"] = lambda seed=seed: (lambda z, y: (z * 1e-3, y))(*almost_separable(2000, 10, 2, seed))
    seed += 1
    cases["huge-T-scaled"] = lambda seed=seed: (lambda z, y: (z * 1e3, y))(*uninformative(3000, 10, seed))
    seed += 1
    cases["beyond-T-max"] = lambda seed=seed: (lambda z, y: (z * 1e5, y))(*uninformative(3000, 10, seed))
    seed += 1
    cases["float64-input"] = lambda seed=seed: (lambda z, y: (z.double(), y))(*gaussian(3000, 10, 2.5, 1.0, seed))
    seed += 1
    cases["float32-big"] = lambda seed=seed: gaussian(40000, 50, 2.5, 1.0, seed)
    seed += 1
    cases["float32-big-weak"] = lambda seed=seed: margin(30000, 30, 2.0, 0.8, seed)
    for signal in (0.3, 1.0, 3.0):
        seed += 1
        cases[f"large-n100000-sig{signal}"] = lambda signal=signal, seed=seed: gaussian(100000, 20, 2.0, signal, seed)
    for m, noise in ((2.0, 0.3), (5.0, 0.02), (0.5, 0.8)):
        seed += 1
        cases[f"large-margin-m{m}-noise{noise}"] = lambda m=m, noise=noise, seed=seed: margin(60000, 30, m, noise, seed)
    seed += 1
    cases["large-lm-c2000"] = lambda seed=seed: lm_like(4000, 2000, 1.0, seed)
    seed += 1
    cases["row-offsets-1e3"] = lambda seed=seed: (lambda z, y: (
        z + 1000 * torch.randn(len(y), 1, generator=_gen(seed + 1)), y))(*gaussian(3000, 300, 2.0, 1.0, seed))
    cases["digits"] = digits
    return cases


# -- references ------------------------------------------------------------------------------
def _rows(z: torch.Tensor) -> np.ndarray:
    z = z.double()
    if z.dim() == 1:
        z = torch.stack([torch.zeros_like(z), z], 1)
    return z.numpy()


def nll(z: np.ndarray, y: np.ndarray, temperature: float) -> float:
    """Mean NLL of softmax(z / T) in float64, each row shifted by its maximum first (the NLL does not
    change, its rounding does: large common offsets would otherwise blur the optimiser's view)."""
    x = (z - np.max(z, axis=1, keepdims=True)) / temperature
    with np.errstate(invalid="ignore"):
        true = x[np.arange(len(y)), y]
    return float(np.mean(logsumexp(x, axis=1) - true))


def scipy_temperature(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """T* by scipy's bounded scalar optimiser over log T in float64 (the reference the brief names)."""
    z, y = _rows(logits), labels.numpy()
    result = minimize_scalar(lambda log_t: nll(z, y, math.exp(log_t)), bounds=(math.log(1e-6), math.log(1e6)),
                             method="bounded", options={"xatol": 1e-12, "maxiter": 5000})
    return math.exp(result.x)


def slope(z: np.ndarray, y: np.ndarray, beta: float) -> tuple[float, float]:
    """dNLL/dbeta and d2NLL/dbeta2 in float64, written independently of the kernels under test."""
    x = beta * z
    top = np.max(x, axis=1, keepdims=True)
    e = np.exp(x - top)
    p = e / e.sum(1, keepdims=True)
    zz = np.where(np.isfinite(z), z, 0.0)
    mean = (p * zz).sum(1)
    var = (p * (zz - mean[:, None]) ** 2).sum(1)
    return float(np.mean(mean - zz[np.arange(len(y)), y])), float(np.mean(var))


def polished_temperature(logits: torch.Tensor, labels: torch.Tensor, start: float) -> float:
    """The root of dNLL/dbeta by Newton from ``start`` in float64: finer than any optimiser on NLL values."""
    z, y = _rows(logits), labels.numpy()
    beta = 1.0 / start
    for _ in range(8):
        d1, d2 = slope(z, y, beta)
        if d2 <= 0:
            break
        beta -= d1 / d2
    return 1.0 / beta


def checksum(logits: torch.Tensor, labels: torch.Tensor) -> str:
    """A content hash, so a cached reference is used only for the very same data."""
    digest = hashlib.sha256(REFERENCE_VERSION.encode())
    digest.update(logits.contiguous().numpy().tobytes())
    digest.update(labels.contiguous().numpy().tobytes())
    return digest.hexdigest()[:12]


def references(names: list[str] | None = None) -> dict[str, dict]:
    """``{name: {"scipy": T, "polished": T, "degenerate": bool}}`` for every case (or ``names``)."""
    cases = corpus()
    return {name: reference(name, *cases[name]()) for name in names or list(cases)}


def reference(name: str, logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """The references of case ``name`` holding ``logits`` and ``labels``, cached by content hash.

    The cache holds ``name: [checksum, scipy, polished, logits]`` (null where there is none; ``logits``: how
    many the case holds, so that :func:`heavy` needs no data). A missing or stale entry is computed and saved.
    """
    cache = _load_cache()
    key = checksum(logits, labels)
    entry = cache.get(name)
    if entry is None or entry[0] != key or len(entry) < 4:
        ref = _reference(logits, labels) if entry is None or entry[0] != key else dict(scipy=entry[1],
                                                                                      polished=entry[2])
        cache[name] = [key, ref["scipy"], ref["polished"], logits.numel()]
        lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(cache.items())]
        REFERENCE_CACHE.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    _, scipy_t, polished, _ = cache[name]
    return {"scipy": scipy_t, "polished": polished, "degenerate": polished is None}


def _load_cache() -> dict[str, list]:
    return json.loads(REFERENCE_CACHE.read_text()) if REFERENCE_CACHE.exists() else {}


def heavy(name: str) -> bool:
    """Whether the case holds more than HEAVY_LOGITS logits, from the cache alone (False when not cached)."""
    entry = _load_cache().get(name, [])
    return len(entry) >= 4 and entry[3] > HEAVY_LOGITS


def _reference(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    z, y = _rows(logits), labels.numpy()
    top = np.max(z, axis=1)
    true = z[np.arange(len(y)), y]
    slope0 = float(np.mean(np.where(np.isfinite(z), z, 0).sum(1) / np.isfinite(z).sum(1) - true))
    if bool(np.all(true == top)) or slope0 >= 0:
        return {"scipy": None, "polished": None}
    t = scipy_temperature(logits, labels)
    if not 1.001e-6 < t < 0.999e6:  # the optimum lies at (or beyond) a documented bound on T
        return {"scipy": t, "polished": None}
    return {"scipy": t, "polished": polished_temperature(logits, labels, t)}


def report(argv: list[str] | None = None) -> None:
    """Fit every case (or those whose name contains ``--only``) and print the reads and errors."""
    import tempcal

    parser = argparse.ArgumentParser(description="the fit on the corpus: reads and errors per case")
    parser.add_argument("--only", default="")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    cases = {k: v for k, v in corpus().items() if args.only in k}
    refs = references(list(cases))
    reads: collections.Counter[int] = collections.Counter()
    worst_scipy = worst_root = (0.0, "")
    start = time.perf_counter()
    for name, make in cases.items():
        logits, labels = make()
        result = tempcal.fit_temperature(logits, labels, device="cpu")
        ref = refs[name]
        reads[result.passes] += 1
        if ref["degenerate"]:
            line = f"{name:34s} bound={result.bound} reads={result.passes}"
        else:
            e_scipy, e_root = abs(result.temperature / ref["scipy"] - 1), abs(result.temperature / ref["polished"] - 1)
            worst_scipy, worst_root = max(worst_scipy, (e_scipy, name)), max(worst_root, (e_root, name))
            line = (f"{name:34s} T={result.temperature:<12.6g} vs scipy {e_scipy:8.1e} vs root {e_root:8.1e} "
                    f"reads={result.passes} method={result.method} converged={result.converged}")
        if args.verbose or result.passes > 3 or not result.converged:
            print(line)
    seconds = time.perf_counter() - start
    print(f"{len(cases)} cases in {seconds:.1f} s; reads (scan included): {dict(sorted(reads.items()))}")
    print(f"max relative error vs scipy: {worst_scipy[0]:.2e} ({worst_scipy[1]}); "
          f"vs the float64 root: {worst_root[0]:.2e} ({worst_root[1]})")


if __name__ == "__main__":
    report(sys.argv[1:])

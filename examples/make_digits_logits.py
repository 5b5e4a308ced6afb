"""Make an overconfident example: validation logits of a small MLP trained on scikit-learn's digits.

Adds seeded noise to the bundled digits pixels (no network), splits them 25/75 (stratified, seed 0), trains a 64-128-10
ReLU MLP (full batch, cross-entropy, Adam) until it overfits, and saves the validation logits (float32 [N, 10],
key ``logits``) and labels (int64 [N], key ``labels``) to a safetensors file, the same bytes on every rerun.

Run: ``python examples/make_digits_logits.py [OUTPUT]`` (default: digits_logits.safetensors next to this script).
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save
from scipy.optimize import minimize_scalar
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

EPOCHS = 300
LR = 1e-2
TRAIN_FRACTION = 0.25
NOISE = 0.6  # std of Gaussian noise added to the standardised pixels, so the task is not nearly solved
METADATA = {"source": "scikit-learn digits (noisy pixels), MLP 64-128-10", "split": "validation"}


def make_mlp() -> torch.nn.Module:
    """The 64 -> 128 -> 10 ReLU MLP."""
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def digits_split(seed: int = 0):
    """Standardised digits with noisy pixels, split 25/75 (stratified): ``(X_train, y_train, X_val, y_val)``."""
    X, y = load_digits(return_X_y=True)
    X = X + NOISE * X.std() * np.random.default_rng(seed).standard_normal(X.shape)
    X_tr, X_val, y_tr, y_val = train_test_split(X, y, train_size=TRAIN_FRACTION, stratify=y, random_state=seed)
    scaler = StandardScaler().fit(X_tr)
    X_tr, X_val = (torch.tensor(scaler.transform(a), dtype=torch.float32) for a in (X_tr, X_val))
    return X_tr, torch.tensor(y_tr, dtype=torch.int64), X_val, torch.tensor(y_val, dtype=torch.int64)


def train_digits_mlp(seed: int = 0):
    """Train the MLP on the train part until it overfits; return ``(model, X_val, y_val)``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    X_tr, y_tr, X_val, y_val = digits_split(seed)
    model = make_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for _ in range(EPOCHS):  # full batch, no shuffling: only the initialisation depends on the seed
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X_tr), y_tr).backward()
        opt.step()
    return model.eval(), X_val, y_val


def optimal_temperature(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """NLL-optimal temperature (bounded search over log T, float64); returns ``(T, NLL at T)``."""
    z = logits.double()

    def nll(log_t: float) -> float:
        return torch.nn.functional.cross_entropy(z / math.exp(log_t), labels).item()

    res = minimize_scalar(nll, bounds=(math.log(0.05), math.log(20.0)), method="bounded")
    return math.exp(res.x), float(res.fun)


def save_reproducible(tensors: dict, path: str, metadata: dict) -> None:
    """Like ``save_file``, but sorts the ``__metadata__`` keys, which safetensors writes in random order (#584)."""
    blob = save(tensors, metadata=metadata)
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    header["__metadata__"] = dict(sorted(metadata.items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n, "re-serialised header grew"
    Path(path).write_bytes(blob[:8] + text.ljust(n) + blob[8 + n :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default=str(Path(__file__).with_name("digits_logits.safetensors")))
    args = parser.parse_args()
    model, X_val, y_val = train_digits_mlp()
    with torch.no_grad():
        X_tr, y_tr, _, _ = digits_split()
        train_acc = (model(X_tr).argmax(1) == y_tr).double().mean().item()
        logits = model(X_val).float().contiguous()
    val_acc = (logits.argmax(1) == y_val).double().mean().item()
    nll1 = torch.nn.functional.cross_entropy(logits.double(), y_val).item()
    t_opt, nll_opt = optimal_temperature(logits, y_val)
    save_reproducible({"logits": logits, "labels": y_val.contiguous()}, args.output, METADATA)
    print(f"train acc {train_acc:.4f}  val acc {val_acc:.4f}  (N_val={len(y_val)})")
    print(f"val NLL at T=1: {nll1:.4f}  NLL-optimal T*={t_opt:.3f} (NLL {nll_opt:.4f})")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

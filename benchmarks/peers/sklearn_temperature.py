"""scikit-learn's temperature calibration core (what ``CalibratedClassifierCV(method="temperature")`` fits).

``sklearn.calibration._TemperatureScaling`` on the precomputed float32 logits as a NumPy array:
``minimize_scalar`` (bounded Brent) over log(1/T) of the multinomial loss. Passes are the
loss evaluations (``nfev``), read off a pass-through wrapper around ``minimize_scalar``.
"""

from __future__ import annotations

from _common import Contender, run


def load(args) -> Contender:
    if args.device != "cpu":
        raise RuntimeError("scikit-learn runs on NumPy arrays on the CPU only")
    import sklearn
    import sklearn.calibration as calibration

    if not hasattr(calibration, "_TemperatureScaling"):
        raise ImportError(f"scikit-learn {sklearn.__version__} has no temperature calibration (needs >= 1.8)")
    evaluations = []
    minimize_scalar = calibration.minimize_scalar

    def counting_minimize_scalar(*a, **k):
        result = minimize_scalar(*a, **k)
        evaluations.append(int(result.nfev))
        return result

    calibration.minimize_scalar = counting_minimize_scalar

    def prepare(logits, labels, device):
        return logits.numpy(), labels.numpy()

    def fit(inputs):
        evaluations.clear()
        scaler = calibration._TemperatureScaling().fit(*inputs)
        return 1.0 / float(scaler.beta_), sum(evaluations)

    return Contender("scikit-learn temperature", sklearn.__version__, fit, prepare)


if __name__ == "__main__":
    run(load)

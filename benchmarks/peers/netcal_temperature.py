"""netcal's ``TemperatureScaling`` (method "mle"), given softmax probabilities as netcal expects.

The probabilities of the float32 logits are computed untimed, in float32 or float64
(``--dtype``). netcal takes their log and minimises the cross-entropy with
``scipy.optimize.minimize`` (L-BFGS-B, finite-difference gradient). Passes are the loss
evaluations (``nfev``), read off a pass-through wrapper around netcal's ``minimize``. netcal's
``temperature`` attribute is the factor that multiplies the log-probabilities, so T is its inverse.
"""

from __future__ import annotations

import sys

from _common import Contender, run


def load(args) -> Contender:
    import netcal
    import netcal.scaling  # loads the module patched below
    import numpy as np
    import torch

    module = sys.modules["netcal.scaling.AbstractLogisticRegression"]
    evaluations = []
    minimize = module.minimize

    def counting_minimize(*a, **k):
        result = minimize(*a, **k)
        evaluations.append(int(result.nfev))
        return result

    module.minimize = counting_minimize
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    use_cuda = args.device if args.device.startswith("cuda") else False

    def prepare(logits, labels, device):
        return torch.softmax(logits.to(dtype), 1).numpy(), labels.numpy()

    def fit(inputs):
        evaluations.clear()
        scaler = netcal.scaling.TemperatureScaling(use_cuda=use_cuda).fit(*inputs)
        # netcal's ``temperature`` is the weight that multiplies the log-probabilities, i.e. 1/T
        return 1.0 / float(np.asarray(scaler.temperature).reshape(-1)[0]), sum(evaluations)

    return Contender(f"netcal TemperatureScaling ({args.dtype} probs)", netcal.__version__, fit, prepare)


if __name__ == "__main__":
    run(load, lambda parser: parser.add_argument("--dtype", choices=["float32", "float64"], default="float32"))

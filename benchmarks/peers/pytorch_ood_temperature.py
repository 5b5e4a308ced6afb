"""pytorch-ood's ``TemperatureScaling`` detector, ``fit_logits`` (LBFGS lr=0.01, max_iter=50 on T from 1).

Passes are the calls of ``nll_loss`` in its module (the closure's, plus the NLL it logs before
and after), read off a counting pass-through wrapper.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import version

from _common import Contender, import_without_package_init, run


def load(args) -> Contender:
    import torch

    notes = []
    try:
        import pytorch_ood.detector.tscaling as tscaling
    except Exception as error:  # its package __init__ imports torchvision, whose PyPI wheel needs CUDA torch
        if importlib.util.find_spec("pytorch_ood") is None:
            raise
        notes.append(f"imported without pytorch_ood's package __init__, which fails here "
                     f"({type(error).__name__}: {str(error).splitlines()[0][:120]})")
        tscaling = import_without_package_init("pytorch_ood.detector.tscaling", ["pytorch_ood", "pytorch_ood.detector"])
    calls = [0]
    nll_loss = tscaling.nll_loss

    def counting_nll_loss(*a, **k):
        calls[0] += 1
        return nll_loss(*a, **k)

    tscaling.nll_loss = counting_nll_loss

    def fit(inputs):
        calls[0] = 0
        detector = tscaling.TemperatureScaling(None)
        detector.t = torch.nn.Parameter(detector.t.detach().to(args.device))
        detector.fit_logits(*inputs)
        return float(detector.t.detach()), calls[0]

    return Contender("pytorch-ood TemperatureScaling", version("pytorch-ood"), fit, notes=notes)


if __name__ == "__main__":
    run(load)

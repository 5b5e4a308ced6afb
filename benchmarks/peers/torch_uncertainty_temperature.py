"""torch-uncertainty's ``TemperatureScaler`` with its defaults (LBFGS lr=0.1, max_iter=100 on 1/T from 1).

The logits go in as a one-batch loader (``model=None`` fits on the loader's data directly).
Passes are the criterion calls, counted by a forward pre-hook on the scaler's criterion.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.metadata import version

from _common import Contender, import_without_package_init, run


def load(args) -> Contender:
    notes = []
    try:
        from torch_uncertainty.post_processing import TemperatureScaler
    except Exception as error:  # its package __init__ imports lightning and torchvision (CUDA-linked wheel)
        if importlib.util.find_spec("torch_uncertainty") is None:
            raise
        notes.append(f"imported without torch_uncertainty's package __init__, which fails here "
                     f"({type(error).__name__}: {str(error).splitlines()[0][:120]})")
        abstract = import_without_package_init("torch_uncertainty.post_processing.abstract",
                                               ["torch_uncertainty", "torch_uncertainty.post_processing",
                                                "torch_uncertainty.post_processing.calibration"])
        sys.modules["torch_uncertainty.post_processing"].PostProcessing = abstract.PostProcessing
        TemperatureScaler = import_without_package_init(
            "torch_uncertainty.post_processing.calibration.temperature_scaler", []).TemperatureScaler

    calls = [0]
    # the criterion is a class attribute shared by every scaler: count its calls with a forward pre-hook
    TemperatureScaler.criterion.register_forward_pre_hook(lambda module, inputs: calls.__setitem__(0, calls[0] + 1))

    def fit(inputs):
        calls[0] = 0
        scaler = TemperatureScaler(device=args.device)
        scaler.fit([inputs], progress=False)
        return 1.0 / float(scaler.inv_temp.detach()), calls[0]

    return Contender("torch-uncertainty TemperatureScaler", version("torch_uncertainty"), fit, notes=notes)


if __name__ == "__main__":
    run(load)

"""Maximum logit, ``max_c z_c / tau`` (Hendrycks et al., ICML 2022): the same ranking at every temperature."""

from __future__ import annotations

import torch

from .shared import Intermediates, Score


class MaxLogit(Score):
    """``max(z) / tau``."""

    name = "maxlogit"
    label = "MaxLogit"

    def compute(self, x: Intermediates) -> torch.Tensor:
        return x.z1 / x.tau


SCORES = {"maxlogit": MaxLogit()}

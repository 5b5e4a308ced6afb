"""The recipe of Guo et al.'s public temperature-scaling code, re-written: LBFGS(lr=0.01, max_iter=50) on T from 1.5.

One ``step`` of ``torch.optim.LBFGS`` over a scalar parameter T, minimising
``CrossEntropyLoss(logits / T, labels)`` by autograd, exactly the settings of the public
implementation (initial T = 1.5, lr = 0.01, max_iter = 50, no line search). Passes are the
closure calls, each a forward and backward over all the logits.
"""

from __future__ import annotations

from _common import Contender, run


def load(args) -> Contender:
    import torch

    def fit(inputs):
        logits, labels = inputs
        temperature = torch.nn.Parameter(torch.full((1,), 1.5, device=logits.device))
        optimizer = torch.optim.LBFGS([temperature], lr=0.01, max_iter=50)
        criterion = torch.nn.CrossEntropyLoss()
        calls = 0

        def closure():
            nonlocal calls
            calls += 1
            optimizer.zero_grad()
            loss = criterion(logits / temperature, labels)
            loss.backward()
            return loss

        optimizer.step(closure)
        return float(temperature.detach()), calls

    return Contender("Guo et al. recipe (LBFGS lr=0.01, 50 it)", f"torch {torch.__version__}", fit)


if __name__ == "__main__":
    run(load)

"""The floor: one bare chunked ``torch.logsumexp`` pass over the logits, the least any exact fit must read.

Chunks hold about as many logits as tempcal's CPU (or CUDA) chunks, so the floor is the same
kind of pass tempcal makes, without any of its bookkeeping.
"""

from __future__ import annotations

from _common import Contender, run


def load(args) -> Contender:
    import torch

    from tempcal.core.data import CPU_CHUNK_ELEMENTS, CUDA_CHUNK_ELEMENTS

    per_chunk = CUDA_CHUNK_ELEMENTS if args.device.startswith("cuda") else CPU_CHUNK_ELEMENTS

    def fit(inputs):
        logits, _ = inputs
        rows = max(1, per_chunk // logits.shape[1])
        for start in range(0, logits.shape[0], rows):
            torch.logsumexp(logits[start : start + rows], 1)
        return float("nan"), 1

    return Contender("floor: 1 logsumexp pass", f"torch {torch.__version__}", fit)


if __name__ == "__main__":
    run(load)

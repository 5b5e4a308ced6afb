"""Make the out-of-distribution example: the digits MLP's logits on noise images, for ``tempcal ood``.

Trains the same 64-128-10 MLP as ``make_digits_logits.py`` (same seed, same weights) and runs it over as many
noise images as there are validation rows, every standardised pixel drawn from N(0, 1) (seeded): float32 logits
[N, 10] under the key ``logits``, no labels, the same bytes on every rerun.

Run: ``python examples/make_digits_noise.py [OUTPUT]`` (default: digits_noise_logits.safetensors next to this script).
"""

import argparse
import importlib.util
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
METADATA = {"source": "Gaussian noise images N(0, 1) in the standardised pixel space through the digits MLP",
            "split": "out of distribution"}
SEED = 0


def _script(name: str):
    """A sibling script as a module (they live beside this one, not in a package)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default=str(HERE / "digits_noise_logits.safetensors"))
    args = parser.parse_args()
    logits_script = _script("make_digits_logits")
    model, X_val, _ = logits_script.train_digits_mlp()
    noise = torch.randn(len(X_val), X_val.shape[1], generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        logits = model(noise).float().contiguous()
    logits_script.save_reproducible({"logits": logits}, args.output, METADATA)
    print(f"wrote {args.output}: the digits MLP's logits on {len(noise)} noise images")


if __name__ == "__main__":
    main()

"""Make the data of the release-folder example: the files its ``tempcal.toml`` names, beside it.

* ``val.safetensors``: the digits MLP's validation logits and labels (a copy of ``../digits_logits.safetensors``);
* ``noise.safetensors``: the same MLP (``../digits_model.ts``) run over as many noise images, every standardised
  pixel drawn from N(0, 1) (``make_digits_model.noise_inputs``, seeded): out-of-distribution logits, no labels.

Both are the same bytes on every run. ``tempcal fit``, ``tempcal report`` and ``tempcal ood --tau 2`` then run
in this folder with no paths on the command line (see the README, "Project configuration").

Run: ``python examples/release/make_release_data.py [FOLDER]`` (default: this script's folder).
"""

import argparse
import importlib.util
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent


def noise_logits(rows: int) -> torch.Tensor:
    """The digits MLP's logits on ``rows`` noise images (the OOD inputs of ``make_digits_model.py --ood``)."""
    spec = importlib.util.spec_from_file_location("make_digits_model", EXAMPLES / "make_digits_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = torch.jit.load(str(EXAMPLES / "digits_model.ts")).eval()
    with torch.inference_mode():
        return model(module.noise_inputs(rows)).float().contiguous()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(HERE))
    folder = Path(parser.parse_args().folder)
    source = EXAMPLES / "digits_logits.safetensors"
    shutil.copyfile(source, folder / "val.safetensors")
    rows = len(load_file(str(source))["labels"])
    save_file({"logits": noise_logits(rows)}, str(folder / "noise.safetensors"))
    print(f"wrote {folder / 'val.safetensors'} ({rows} validation rows) and {folder / 'noise.safetensors'} "
          f"({rows} noise images' logits)")


if __name__ == "__main__":
    main()

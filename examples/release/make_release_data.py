"""Make the data of the release-folder example: the files its ``tempcal.toml`` names, beside it.

* ``val.safetensors``: the digits MLP's validation logits and labels (a copy of ``../digits_logits.safetensors``);
* ``noise.safetensors``: the same MLP's logits on as many noise images, out of distribution, no labels (a copy of
  ``../digits_noise_logits.safetensors``, which ``../make_digits_noise.py`` rebuilds).

``tempcal fit``, ``tempcal report`` and ``tempcal ood --tau 2`` then run in this folder with no paths on the
command line (see docs/configuration.md).

Run: ``python examples/release/make_release_data.py [FOLDER]`` (default: this script's folder).
"""

import argparse
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(HERE))
    folder = Path(parser.parse_args().folder)
    shutil.copyfile(EXAMPLES / "digits_logits.safetensors", folder / "val.safetensors")
    shutil.copyfile(EXAMPLES / "digits_noise_logits.safetensors", folder / "noise.safetensors")
    print(f"wrote {folder / 'val.safetensors'} (validation logits) and {folder / 'noise.safetensors'} "
          "(noise images' logits)")


if __name__ == "__main__":
    main()

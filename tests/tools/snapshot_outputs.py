"""Record what ``fit``, ``report`` and ``ood`` print and write on the shipped examples, to compare two versions.

    python tests/tools/snapshot_outputs.py OUT_DIR

runs a fixed list of commands in a scratch folder (always the same path, so file names in the
output match between runs) and stores each command's standard output, standard error, exit
status and written files in OUT_DIR. ``diff -r BEFORE AFTER`` then shows every change in
behaviour. Not a test: a tool for refactors that must not change what users see.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRATCH = Path("/tmp/tempcal-snapshot-run")

COMMANDS = [
    "fit digits_logits.safetensors --no-write",
    "fit digits_logits.safetensors --no-write --json -",
    "fit digits_logits.safetensors --no-write --estimators all --bootstrap 50 --json -",
    "fit digits_logits.safetensors --no-write --estimators all --bootstrap 50",
    "fit digits_logits.safetensors --no-write --objective ece --json -",
    "fit digits_logits.safetensors --no-write --val-fraction 1.0 --bins 10 --json -",
    "fit digits_logits.safetensors --eval digits_logits.safetensors --no-write",
    "fit digits_logits.safetensors --output cal.safetensors --markdown card.md",
    "fit digits.npz --no-write --json -",
    "fit 'shard-*.safetensors' --no-write --json -",
    "report cal.safetensors",
    "report cal.safetensors --json -",
    "report cal.safetensors --sweep 0.5:10:5",
    "report cal.safetensors --sweep 0.5:10:5 --json -",
    "report cal.safetensors --tau 1 --tau fitted --estimators all --bootstrap 30 --json -",
    "report cal.safetensors --tau 1 --tau fitted --estimators all --bootstrap 30",
    "report cal.safetensors --markdown report.md",
    "ood cal.safetensors --ood noise.safetensors --score both",
    "ood cal.safetensors --ood noise.safetensors --score both --json -",
    "ood cal.safetensors --ood noise.safetensors --tau 1 --tau fitted --json -",
    "fit digits_model.ts --inputs digits_inputs.safetensors --save-model cal.ts --json -",
    "report cal.ts --inputs digits_inputs.safetensors",
    "report cal.ts --inputs digits_inputs.safetensors --tau 1 --tau 2 --json -",
    "ood digits_model.ts --inputs digits_inputs.safetensors --ood-inputs noise_inputs.safetensors --json -",
    "ood digits_model.ts --inputs digits_inputs.safetensors --ood-inputs noise_inputs.safetensors",
    "ood digits_model.ts --inputs digits_inputs.safetensors --ood-inputs noise_inputs.safetensors "
    "--odin-eps 0.01 --tau 1 --tau 2 --json -",
    # bad input: the message and the status
    "fit missing.safetensors",
    "fit digits_logits.safetensors --logits-key nope",
    "fit digits_logits.safetensors --output x.safetensors --no-write",
    "report cal.safetensors --tau -1",
    "report digits_logits.safetensors --tau fitted",
    "ood cal.safetensors",
    "ood cal.safetensors --ood noise.safetensors --score nope",
    "fit digits_logits.safetensors --no-write --estimators nope",
    "report cal.safetensors --sweep 1:2",
    "fit digits_logits.safetensors --no-write --max-ece 0.0001 --json -",
    "fit noise.safetensors --no-write",
]


def prepare() -> None:
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    shutil.rmtree(SCRATCH, ignore_errors=True)
    SCRATCH.mkdir(parents=True)
    for name in ("digits_logits.safetensors", "digits_inputs.safetensors", "digits_model.ts"):
        shutil.copy(REPO / "examples" / name, SCRATCH / name)
    data = load_file(str(SCRATCH / "digits_logits.safetensors"))
    np.savez(SCRATCH / "digits.npz", logits=data["logits"].numpy(), labels=data["labels"].numpy())
    half = data["logits"].shape[0] // 3
    for k, (a, b) in enumerate(((0, half), (half, data["logits"].shape[0]))):
        save_file({"logits": data["logits"][a:b].contiguous(), "labels": data["labels"][a:b].contiguous()},
                  str(SCRATCH / f"shard-{k}.safetensors"))
    g = torch.Generator().manual_seed(0)
    save_file({"logits": torch.randn(500, 10, generator=g) * 2, "labels": torch.randint(0, 10, (500,), generator=g)},
              str(SCRATCH / "noise.safetensors"))
    save_file({"inputs": torch.randn(400, 64, generator=g) * 1.5}, str(SCRATCH / "noise_inputs.safetensors"))


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    prepare()
    tempcal = Path(sys.executable).with_name("tempcal")
    env = dict(os.environ, COLUMNS="100", TERM="dumb")
    for k, command in enumerate(COMMANDS):
        done = subprocess.run(f"{tempcal} {command}", shell=True, cwd=SCRATCH, capture_output=True, text=True,
                              env=env)
        (out / f"{k:02d}.txt").write_text(f"$ tempcal {command}\nexit {done.returncode}\n--- stdout\n{done.stdout}"
                                          f"--- stderr\n{done.stderr}")
    for path in sorted(SCRATCH.iterdir()):
        if path.suffix in (".md", ".json"):
            shutil.copy(path, out / path.name)
        elif path.is_file():
            (out / (path.name + ".sha256")).write_text(hashlib.sha256(path.read_bytes()).hexdigest() + "\n")


if __name__ == "__main__":
    main()

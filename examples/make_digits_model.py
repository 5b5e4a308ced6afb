"""Ship the digits example as a model: the scripted MLP and the validation inputs behind digits_logits.safetensors.

Trains the same 64-128-10 MLP as ``make_digits_logits.py`` (same seed, same weights), scripts it with
``torch.jit.script`` and saves it as ``digits_model.ts`` without TorchScript's debug records (they hold this
machine's file paths) and under a fixed string hash seed (the script re-runs itself with ``PYTHONHASHSEED=0``:
TorchScript writes module constants in set order), so the file is the same bytes wherever it is rebuilt with
the same torch. The validation rows go to ``digits_inputs.safetensors`` (``inputs`` float32 [N, 64],
standardised noisy pixels; ``labels`` int64 [N]), and the script checks that the saved model maps them to the
logits in ``digits_logits.safetensors``.

``--ood PATH`` also writes an out-of-distribution inputs file for ``tempcal ood``: noise images, as many as
the validation rows, each pixel drawn from N(0, 1) in the standardised pixel space (seeded), no labels.

Run: ``python examples/make_digits_model.py [--ood PATH]``.
"""

import argparse
import importlib.util
import io
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
MODEL = HERE / "digits_model.ts"
INPUTS = HERE / "digits_inputs.safetensors"
LOGITS = HERE / "digits_logits.safetensors"
METADATA = {"source": "scikit-learn digits (noisy pixels), standardised; validation rows of digits_logits.safetensors",
            "split": "validation"}
OOD_METADATA = {"source": "Gaussian noise images N(0, 1) in the standardised pixel space (out of distribution)"}
OOD_SEED = 0


def _logits_script():
    """``make_digits_logits.py`` as a module (it lives beside this script, not in a package)."""
    spec = importlib.util.spec_from_file_location("make_digits_logits", HERE / "make_digits_logits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scripted_bytes(model: torch.nn.Module) -> bytes:
    """The TorchScript archive of ``model``, debug records stripped so the bytes do not depend on paths."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(model.eval()), buffer)
    return strip_debug_info(buffer.getvalue())


def strip_debug_info(blob: bytes) -> bytes:
    """A saved TorchScript archive without its ``.debug_pkl`` records (source file paths): reproducible bytes
    for the shipped example model; the model runs the same."""
    reader = torch._C.PyTorchFileReader(io.BytesIO(blob))
    out = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(out)
    for record in reader.get_all_records():
        if record.endswith(".debug_pkl") or record == ".data/serialization_id":
            continue  # the writer adds its own serialization id
        data = reader.get_record(record)
        writer.write_record(record, data, len(data))
    writer.write_end_of_file()
    return out.getvalue()


def noise_inputs(rows: int, seed: int = OOD_SEED) -> torch.Tensor:
    """OOD inputs: ``rows`` noise images, every standardised pixel drawn from N(0, 1)."""
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def main() -> None:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # TorchScript writes a module's constants in set order, which follows the string hash seed.
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], {**os.environ, "PYTHONHASHSEED": "0"})
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ood", metavar="PATH", help="also write noise images as OOD inputs to PATH")
    args = parser.parse_args()
    logits_script = _logits_script()
    model, X_val, y_val = logits_script.train_digits_mlp()
    blob = scripted_bytes(model)
    shipped = load_file(str(LOGITS))
    with torch.inference_mode():  # check before writing anything: the saved bytes reproduce the shipped logits
        logits = torch.jit.load(io.BytesIO(blob)).eval()(X_val)
    gap = (logits.double() - shipped["logits"].double()).abs().max().item()
    scale = shipped["logits"].abs().max().item()
    if not torch.equal(shipped["labels"], y_val) or gap > 1e-6 * scale:
        raise SystemExit(f"the model does not reproduce {LOGITS.name} (largest logit gap {gap:.3g}); nothing written")
    MODEL.write_bytes(blob)
    logits_script.save_reproducible({"inputs": X_val.contiguous(), "labels": y_val.contiguous()}, str(INPUTS),
                                    METADATA)
    print(f"wrote {MODEL.name} ({len(blob)} bytes) and {INPUTS.name} ({INPUTS.stat().st_size} bytes); "
          f"model(inputs) matches {LOGITS.name} within {gap:.3g} (largest |logit| {scale:.3g})")
    if args.ood:
        ood = noise_inputs(len(X_val))
        logits_script.save_reproducible({"inputs": ood}, args.ood, OOD_METADATA)
        print(f"wrote {args.ood}: {len(ood)} noise images (OOD inputs)")


if __name__ == "__main__":
    main()

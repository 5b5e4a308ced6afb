""".pt2 files as users write them (torch.export.export then torch.export.save, every usual call form) fitted through
``tempcal fit m.pt2 --inputs inputs.safetensors --save-model out.pt2`` (in a process for the report's case, in-process
for the others): T against scipy's fit on the model's own logits, the calibrated program against logits / T."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import ROOT, write_inputs
from reference import optimal_temperature
from safetensors.torch import load_file
from torch.export import Dim

from tempcal.models import export
from tempcal.models.export import FittedBatches

ROWS, FEATURES, CLASSES = 611, 6, 4  # 611 = 87 * 7 + 2: a static batch of 7 leaves a short last batch
STATIC_BATCH = 7


class WithBuffer(torch.nn.Module):
    """A linear layer, then a fixed shift held in a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, CLASSES)
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(x)) * 3.0 + self.shift


class WithConstant(torch.nn.Module):
    """A linear layer scaled by a plain tensor attribute (a lifted constant of the program)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(FEATURES, CLASSES)
        self.scale = torch.tensor([2.5, 3.0, 3.5, 4.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


def _forms() -> dict[str, tuple[type[torch.nn.Module], object]]:
    """Each call form: (module class, the dynamic_shapes argument as the user writes it; None: a static export)."""
    return {
        "Dim.DYNAMIC": (WithBuffer, ({0: Dim.DYNAMIC},)),
        "Dim.AUTO": (WithBuffer, ({0: Dim.AUTO},)),
        "named Dim": (WithBuffer, ({0: Dim("batch")},)),
        "bounded Dim": (WithConstant, ({0: Dim("batch", min=16, max=100)},)),
        "static": (WithBuffer, None),
        "constants, Dim.DYNAMIC": (WithConstant, ({0: Dim.DYNAMIC},)),
        "constants, static": (WithConstant, None),
    }


def _write(folder: Path, form: str) -> tuple[Path, Path, torch.nn.Module, torch.Tensor]:
    """The user's files: m.pt2 (torch.export.save) and inputs.safetensors with labels the logits make likely."""
    module_type, shapes = _forms()[form]
    torch.manual_seed(0)
    module = module_type().eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, FEATURES, generator=g)
    example = x[:STATIC_BATCH] if shapes is None else x[:32]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(module, (example,), dynamic_shapes=shapes)
    path = folder / "m.pt2"
    torch.export.save(program, path)
    with torch.no_grad():
        logits = module(x)
    labels = torch.multinomial(torch.softmax(logits / 2.0, 1), 1, generator=g).squeeze(1)  # T* near 2
    return path, write_inputs(folder / "inputs.safetensors", x, labels), module, logits


def _check_fit(folder: Path, form: str, inputs: Path, module: torch.nn.Module, logits: torch.Tensor,
               fitted: float) -> None:
    """T is scipy's on the model's own logits; out.pt2 gives the original as a SOURCE and logits / T in torch."""
    expected = optimal_temperature(logits, load_file(str(inputs))["labels"])
    assert 1.2 < expected < 3.5 and abs(fitted - expected) / expected < 1e-6, (fitted, expected)
    calibrated = export.load(folder / "out.pt2", "cpu")
    assert calibrated.temperature == fitted
    x = load_file(str(inputs))["inputs"][:23]  # not a multiple of the static batch
    with torch.no_grad():
        assert torch.allclose(calibrated.net(x), module(x), rtol=1e-5, atol=1e-6)  # the SOURCE view: the original
        stock = torch.export.load(folder / "out.pt2").module()  # torch's own loader runs the calibrated one
        rows = {"static": STATIC_BATCH, "constants, static": STATIC_BATCH, "bounded Dim": 16}.get(form, 23)
        want = (module(x[:rows]).double() / fitted).float()
        assert torch.allclose(stock(x[:rows]), want, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # a fresh interpreter importing torch: seconds on its own, much more on a loaded machine
def test_the_issue_command_in_a_process(tmp_path):
    """The report's exact case: Dim.DYNAMIC, then ``python -m tempcal fit m.pt2 --inputs inputs.safetensors``."""
    _, inputs, module, logits = _write(tmp_path, "Dim.DYNAMIC")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tempcal", "fit", "m.pt2", "--inputs", "inputs.safetensors",
                           "--val-fraction", "1.0", "--save-model", "out.pt2", "--json", "-"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _check_fit(tmp_path, "Dim.DYNAMIC", inputs, module, logits, json.loads(done.stdout)["temperature"])


@pytest.mark.parametrize("form", list(_forms()))
def test_usual_pt2_fits_like_its_logits_and_saves_calibrated(tmp_path, form, monkeypatch, cli):
    _, inputs, module, logits = _write(tmp_path, form)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["fit", "m.pt2", "--inputs", "inputs.safetensors", "--val-fraction", "1.0",
                          "--save-model", "out.pt2", "--json", "-"])
    assert code == 0, err
    _check_fit(tmp_path, form, inputs, module, logits, json.loads(out)["temperature"])


def test_static_program_runs_in_its_own_batch_size(tmp_path):
    """A static export takes exactly its batch: tempcal runs batches of that size, padding the last one."""
    path, _, module, _ = _write(tmp_path, "static")
    loaded = export.load(path, "cpu")
    assert isinstance(loaded.net, FittedBatches) and loaded.net.batch_limits == (STATIC_BATCH, STATIC_BATCH)
    calls = []
    loaded.net.program.register_forward_pre_hook(lambda _, args: calls.append(args[0].shape[0]))
    x = torch.randn(2 * STATIC_BATCH + 3, FEATURES)
    with torch.no_grad():
        assert torch.allclose(loaded.net(x), module(x), rtol=1e-5, atol=1e-6)
    assert calls == [STATIC_BATCH] * 3  # the last 3 rows padded to a full batch, their padding dropped
    with torch.no_grad(), pytest.raises(Exception, match="equal to 7"):
        loaded.net.program(x)  # the program itself refuses any other batch size


def test_dynamic_programs_are_not_wrapped(tmp_path):
    """Dim.DYNAMIC takes any batch size (torch lets 0 and 1 through its lower bound of 2): run as it is."""
    path, _, module, _ = _write(tmp_path, "Dim.DYNAMIC")
    loaded = export.load(path, "cpu")
    assert isinstance(loaded.net, torch.fx.GraphModule)
    with torch.no_grad():
        assert torch.allclose(loaded.net(torch.ones(1, FEATURES)), module(torch.ones(1, FEATURES)), atol=1e-6)

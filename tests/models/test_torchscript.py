"""Loading TorchScript models (tempcal.models.torchscript): pickles refused unrun, a stored T checked, the example."""

from __future__ import annotations

import io
import pickle
import zipfile

import pytest
import torch
from conftest import EXAMPLES, Evil, read_model_temperature, run_model_source, script_model
from safetensors import safe_open
from safetensors.torch import load_file

from tempcal.errors import TempcalError
from tempcal.models.detect import is_model_path
from tempcal.models.save import save_calibrated_model
from tempcal.models.torchscript import load as load_model
from tempcal.sources.registry import open_source

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def test_pickles_are_never_unpickled(digits, tmp_path):
    marker = tmp_path / "UNPICKLED"
    evil = pickle.dumps(Evil(marker), protocol=2)
    plain = tmp_path / "evil.pt"
    plain.write_bytes(evil)
    saved = tmp_path / "evil_save.pth"
    torch.save({"logits": Evil(marker)}, saved)
    # A TorchScript-shaped archive whose pickles are the hostile one: torch.jit.load's own unpickler refuses it.
    disguised = tmp_path / "evil.ts"
    with zipfile.ZipFile(digits["model"]) as src, zipfile.ZipFile(disguised, "w") as out:
        for name in src.namelist():
            out.writestr(name, evil if name.endswith(".pkl") else src.read(name))
    assert not marker.exists()
    for path, why in ((plain, "a pickle file, which tempcal never unpickles"),
                      (saved, "a torch.save archive"), (disguised, "not a loadable TorchScript model")):
        assert is_model_path(path) == (path is disguised)
        with pytest.raises(TempcalError) as info:
            load_model(path, "cpu")
        message = str(info.value)
        assert str(path) in message and why in message and "\n" not in message
        if path is disguised:  # a model: its T is read by loading it, which refuses
            with pytest.raises(TempcalError):
                read_model_temperature(path)
        else:  # a .pt/.pth logits file keeps T in a sidecar: the file itself is not even opened
            assert read_model_temperature(path) is None
        with pytest.raises(TempcalError):
            open_source(path)
        assert not marker.exists()


def test_shipped_example_model_reproduces_the_shipped_logits():
    model, inputs, logits = (EXAMPLES / n for n in ("digits_model.ts", "digits_inputs.safetensors",
                                                    "digits_logits.safetensors"))
    assert model.stat().st_size + inputs.stat().st_size < 1_000_000
    assert is_model_path(model)
    with safe_open(str(inputs), framework="pt") as f:
        assert sorted(f.keys()) == ["inputs", "labels"]
        assert f.get_tensor("inputs").dtype == torch.float32 and f.get_tensor("inputs").shape[1] == 64
        assert f.get_tensor("labels").dtype == torch.int64
    shipped = load_file(str(logits))
    data, stored = run_model_source(model, inputs, device="cpu", progress=False)
    assert stored is None
    assert torch.equal(data.labels, shipped["labels"])
    assert torch.allclose(data.logits.double(), shipped["logits"].double(), rtol=0, atol=1e-5)
    with zipfile.ZipFile(model) as archive:  # no debug records: no build machine paths in the shipped file
        assert not any(name.endswith(".debug_pkl") for name in archive.namelist())


def test_altered_temperature_is_refused(tmp_path):
    plain = script_model(torch.nn.Linear(5, 4), tmp_path / "plain.pt")
    calibrated = tmp_path / "calibrated.pt"
    save_calibrated_model(plain, 2.0, calibrated)
    module = torch.jit.load(str(calibrated))
    buffer = io.BytesIO()
    torch.jit.save(module, buffer, _extra_files={"tempcal.temperature": "3.0"})
    altered = tmp_path / "altered.pt"
    altered.write_bytes(buffer.getvalue())
    with pytest.raises(TempcalError, match=r"altered\.pt: extra file 'tempcal\.temperature' says T = 3\.0 but "
                                           r"the model divides by 2\.0"):
        load_model(altered, "cpu")


def test_a_pickle_in_the_temperature_extra_file_is_read_as_text(tmp_path):
    """The extra file holding T is text: a pickle there is a bad number (exit 2), never unpickled."""
    marker = tmp_path / "UNPICKLED"
    path = tmp_path / "model.ts"
    torch.jit.save(torch.jit.script(torch.nn.Linear(5, 4).eval()), str(path),
                   _extra_files={"tempcal.temperature": pickle.dumps(Evil(marker), protocol=2)})
    for attempt in (lambda: load_model(path, "cpu"), lambda: read_model_temperature(path)):
        with pytest.raises(TempcalError, match=r"extra file 'tempcal\.temperature' is .*not a positive number"):
            attempt()
    assert not marker.exists()


def test_an_exported_program_under_a_pt_name_gets_the_same_checks(tmp_path, small):
    """A .pt file is a model by its zip directory: an exported program there is checked member by member too."""
    from model_builders import save_program, with_opaque_payload

    marker = tmp_path / "UNPICKLED"
    program = save_program(torch.nn.Linear(5, 4), torch.randn(4, 5), tmp_path / "plain.pt2")
    hostile = with_opaque_payload(program, tmp_path / "hostile.pt", marker)
    for attempt in (lambda: open_source(hostile, inputs=str(small[2]), device="cpu"),
                    lambda: read_model_temperature(hostile)):
        with pytest.raises(TempcalError, match=r"hostile\.pt: member 'data/constants/opaque_obj_0'.*refused"):
            attempt()
    with pytest.raises(TempcalError, match=r"hostile\.pt: an exported program SOURCE needs its inputs"):
        open_source(hostile)  # a model, not a logits file: never handed to torch.load
    assert not marker.exists()

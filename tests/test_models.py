"""TorchScript models as a SOURCE: run, save logits, calibrated model, bad input, ODIN (tempcal.models.torchscript).

Every figure is checked against an independent computation: the model called directly in Python, scipy's
optimiser, numpy softmax, scikit-learn's AUROC and a few-line autograd ODIN written from the paper.
"""

from __future__ import annotations

import importlib.util
import io
import math
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, softmax
from sklearn.metrics import roc_auc_score

import tempcal
from tempcal.errors import TempcalError
from tempcal.models.detect import is_model_path
from tempcal.models.odin import odin_scores
from tempcal.models.save import save_calibrated_model, save_logits
from tempcal.models.torchscript import load as load_model
from tempcal.sources.registry import open_source, read_stored_temperature
from tempcal.workflows.ood import ood_file


def run_model(model, inputs, *, device="cpu", labels_optional=False, **options):
    """A model SOURCE run over its inputs through the public API: (logits data, the T a calibrated model holds)."""
    options.setdefault("progress", False)
    opened = open_source(model, inputs=str(inputs), device=device, labels_optional=labels_optional, **options)
    return opened.data, opened.stored_temperature


def read_model_temperature(path):
    return read_stored_temperature(path)[0]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


# -- independent references ---------------------------------------------------------------------
def ref_optimal_temperature(logits, labels) -> float:
    """T* by scipy's bounded scalar optimiser over log T, NLL in float64 numpy."""
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)

    def nll(log_t: float) -> float:
        return float(-np.mean(log_softmax(z / math.exp(log_t), axis=1)[np.arange(len(y)), y]))

    return math.exp(minimize_scalar(nll, bounds=(-12.0, 16.0), method="bounded",
                                    options={"xatol": 1e-12, "maxiter": 2000}).x)


def ref_nll(logits, labels, tau: float = 1.0) -> float:
    z = np.asarray(logits, dtype=np.float64) / tau
    return float(-np.mean(log_softmax(z, axis=1)[np.arange(len(labels)), np.asarray(labels)]))


def ref_odin(module: torch.nn.Module, x: torch.Tensor, tau: float, eps: float) -> np.ndarray:
    """ODIN as Liang et al. (2018) write it, with plain autograd on the Python module."""
    x = x.clone().requires_grad_(True)
    log_s = torch.log_softmax(module(x).double() / tau, dim=1).max(dim=1).values
    log_s.sum().backward()
    x_tilde = x.detach() - eps * torch.sign(-x.grad)
    with torch.no_grad():
        z = module(x_tilde).double().numpy()
    return softmax(z / tau, axis=1).max(axis=1)


# -- fixtures -------------------------------------------------------------------------------------
def _digits_script():
    spec = importlib.util.spec_from_file_location("make_digits_logits", EXAMPLES / "make_digits_logits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """The digits MLP trained here (seconds), scripted and saved, with its validation inputs file."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        mlp, x_val, y_val = _digits_script().train_digits_mlp()
    finally:  # the training script sets these process-wide
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    folder = tmp_path_factory.mktemp("digits")
    model_path = folder / "mlp.pt"
    torch.jit.script(mlp).save(str(model_path))
    inputs_path = folder / "inputs.safetensors"
    save_file({"inputs": x_val, "labels": y_val}, str(inputs_path))
    return {"mlp": mlp, "x": x_val, "y": y_val, "model": model_path, "inputs": inputs_path, "folder": folder}


def _save_inputs(path: Path, x: torch.Tensor, y: torch.Tensor | None = None, **more) -> Path:
    tensors = {"inputs": x, **more}
    if y is not None:
        tensors["labels"] = y
    save_file(tensors, str(path))
    return path


class TupleNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(5, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.relu(self.body(x))
        return features, self.head(features)


class TripleNet(TupleNet):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = torch.relu(self.body(x))
        return features, self.head(features), x


class DictNet(TupleNet):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = torch.relu(self.body(x))
        return {"features": features, "logits": self.head(features)}


class RaisesOnFlag(torch.nn.Module):
    """Raises on a batch holding a row whose first input is above 1000 (a model failing mid-run)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x[:, 0] > 1000).any()):
            raise ValueError("flagged row in this batch")
        return self.head(x)


class WideOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x, x], dim=2)


class IntOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argsort(dim=1)


class BinaryNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def _script(module: torch.nn.Module, path: Path) -> Path:
    torch.manual_seed(0)
    torch.jit.script(module.eval()).save(str(path))
    return path


@pytest.fixture
def small(tmp_path):
    """Five-feature inputs (40 rows, integer labels 0..3)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 5, generator=g)
    y = torch.randint(0, 4, (40,), generator=g)
    return x, y, _save_inputs(tmp_path / "small.safetensors", x, y)


# -- recognising models ---------------------------------------------------------------------------
def test_is_model_path_needs_a_torchscript_archive(digits, tmp_path):
    blob = Path(digits["model"]).read_bytes()
    for suffix in (".pt", ".pth", ".ts", ".torchscript", ".PT"):
        (tmp_path / f"m{suffix}").write_bytes(blob)
        assert is_model_path(tmp_path / f"m{suffix}")
    (tmp_path / "m.safetensors").write_bytes(blob)
    assert not is_model_path(tmp_path / "m.safetensors")  # not a model suffix
    torch.save({"logits": torch.zeros(3, 2), "labels": torch.zeros(3, dtype=torch.int64)}, tmp_path / "dict.pt")
    assert not is_model_path(tmp_path / "dict.pt")  # a torch.save zip of tensors is a logits file
    assert not is_model_path(tmp_path / "missing.pt")
    (tmp_path / "folder.pt").mkdir()
    assert not is_model_path(tmp_path / "folder.pt")
    with pytest.raises(TempcalError, match=r"dict\.pt: not a TorchScript model \(a torch\.save archive"):
        load_model(tmp_path / "dict.pt", "cpu")
    with pytest.raises(TempcalError, match=r"missing\.pt: no such file"):
        load_model(tmp_path / "missing.pt", "cpu")


class _Evil:
    """Unpickling this creates the marker file: proof that a file was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickles_are_never_unpickled(digits, tmp_path):
    marker = tmp_path / "UNPICKLED"
    evil = pickle.dumps(_Evil(marker), protocol=2)
    plain = tmp_path / "evil.pt"
    plain.write_bytes(evil)
    saved = tmp_path / "evil_save.pth"
    torch.save({"logits": _Evil(marker)}, saved)
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


# -- the full path on the digits MLP ----------------------------------------------------------
def test_model_to_logits_to_fit_to_calibrated_model_to_report(digits, tmp_path):
    mlp, x, y = digits["mlp"], digits["x"], digits["y"]
    data, stored = run_model(digits["model"], digits["inputs"], device="cpu", batch_size=100, progress=False)
    assert stored is None
    with torch.no_grad():
        direct = mlp(x).double()
    assert data.logits.shape == (len(y), 10)
    assert torch.allclose(data.logits.double(), direct, rtol=0, atol=1e-6)
    assert torch.equal(data.labels, y)

    t = tempcal.fit_temperature(data.logits, data.labels).temperature
    assert t == pytest.approx(ref_optimal_temperature(direct.numpy(), y.numpy()), rel=1e-6)
    assert t > 1.5  # the example is overconfident

    calibrated = tmp_path / "calibrated.pt"
    assert save_calibrated_model(digits["model"], t, calibrated, check_inputs=digits["inputs"]) == calibrated
    reloaded = torch.jit.load(str(calibrated))
    with torch.no_grad():
        scaled = reloaded(x).double()
    assert torch.allclose(scaled, direct / t, rtol=1e-6, atol=1e-6)
    assert read_model_temperature(calibrated) == t
    assert float(reloaded.tempcal_temperature) == t and reloaded.tempcal_temperature.dtype == torch.float64
    assert read_model_temperature(digits["model"]) is None

    # The calibrated model as a SOURCE: the original's logits and T as the stored temperature.
    again, stored = run_model(calibrated, digits["inputs"], device="cpu", progress=False)
    assert stored == t
    assert torch.allclose(again.logits.double(), direct, atol=1e-6)
    # ... so that a report at the stored T is the calibrated model's outputs at T = 1 (numpy NLL).
    saved = save_logits(again, tmp_path / "logits.safetensors", temperature=stored)
    report = tempcal.report_file(str(saved), device="cpu")
    assert report.stored_temperature == t and [m.tau for m in report.results] == [t]
    assert report.results[0].nll == pytest.approx(ref_nll(scaled.numpy(), y.numpy()), rel=1e-6)
    assert report.results[0].nll < ref_nll(direct.numpy(), y.numpy())
    # Calibrating a calibrated model replaces T instead of dividing twice.
    twice = tmp_path / "twice.pt"
    save_calibrated_model(calibrated, 3.0, twice)
    with torch.no_grad():
        assert torch.allclose(torch.jit.load(str(twice))(x).double(), direct / 3.0, rtol=1e-6, atol=1e-6)
    assert read_model_temperature(twice) == 3.0


def test_open_model_source_feeds_the_fit_workflow(digits):
    opened = open_source(digits["model"], inputs=str(digits["inputs"]), device="cpu", progress=False)
    assert opened.name == f"{digits['model']} on {digits['inputs']}" and opened.stored_temperature is None
    assert opened.paths == []  # nothing to write T back into
    assert opened.data.num_samples == len(digits["y"]) and opened.data.num_classes == 10
    with pytest.raises(TempcalError, match=r"mlp\.pt: a TorchScript model SOURCE needs its inputs: inputs"):
        open_source(digits["model"])


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
    data, stored = run_model(model, inputs, device="cpu", progress=False)
    assert stored is None
    assert torch.equal(data.labels, shipped["labels"])
    assert torch.allclose(data.logits.double(), shipped["logits"].double(), rtol=0, atol=1e-5)
    with zipfile.ZipFile(model) as archive:  # no debug records: no build machine paths in the shipped file
        assert not any(name.endswith(".debug_pkl") for name in archive.namelist())


# -- batches, outputs, saving ------------------------------------------------------------------
def test_batch_size_does_not_change_the_logits(digits):
    runs = [run_model(digits["model"], digits["inputs"], device="cpu", batch_size=b, progress=False)[0].logits
            for b in (1348, 100, 512)]
    assert all(torch.allclose(runs[0], other, rtol=1e-6, atol=1e-5) for other in runs[1:])  # float32 sums
    with pytest.raises(TempcalError, match="batch_size must be a whole number >= 1, got 0"):
        run_model(digits["model"], digits["inputs"], batch_size=0)


@pytest.mark.parametrize(("net", "key", "column"), [(TupleNet, 1, 1), (TupleNet, "1", 1), (TupleNet, -1, 1),
                                                     (TripleNet, "1", 1), (DictNet, "logits", "logits")])
def test_tuple_and_dict_outputs(net, key, column, small, tmp_path):
    x, _, inputs = small
    module = net().eval()
    path = _script(module, tmp_path / "net.pt")
    module = torch.jit.load(str(path))  # the same weights as the file
    data, _ = run_model(path, inputs, output_key=key, device="cpu", progress=False)
    with torch.no_grad():
        expected = module(x)[column]
    assert torch.allclose(data.logits, expected, atol=1e-7) and data.num_classes == 4
    # The calibrated model keeps the output structure and divides only the logits.
    out = tmp_path / "calibrated.pt"
    save_calibrated_model(path, 2.5, out, output_key=key, check_inputs=x)
    with torch.no_grad():
        original, scaled = module(x), torch.jit.load(str(out))(x)
    assert type(scaled) is type(original)
    names = list(original) if isinstance(original, dict) else range(len(original))
    for name in names:
        want = original[name] / 2.5 if name == column else original[name]
        assert torch.allclose(scaled[name], want, rtol=1e-6, atol=1e-7)
    if isinstance(original, dict):
        assert list(scaled) == list(original)
    again, stored = run_model(out, inputs, output_key=key, device="cpu", progress=False)
    assert stored == 2.5 and torch.allclose(again.logits, expected, atol=1e-7)


def test_output_key_errors_list_what_is_there(small, tmp_path):
    _, _, inputs = small
    pair, mapping = _script(TupleNet(), tmp_path / "pair.pt"), _script(DictNet(), tmp_path / "dict.pt")
    plain = _script(torch.nn.Linear(5, 4), tmp_path / "plain.pt")
    cases = [(pair, None, r"pair\.pt returns a tuple of 2 outputs; choose the logits with output_key 0\.\.1"),
             (pair, "2", r"output_key 2: .*pair\.pt returns a tuple of 2 outputs; expected an index 0\.\.1"),
             (pair, "logits", r"output_key logits: .*expected an index 0\.\.1"),
             (mapping, None, r"dict\.pt returns a dict with keys 'features', 'logits'; choose the logits with "
                             r"output_key NAME"),
             (mapping, "scores", r"output_key scores: .*keys 'features', 'logits'; no key 'scores'"),
             (plain, "0", r"output_key 0: .*plain\.pt returns a single tensor; drop output_key")]
    for model, key, message in cases:
        with pytest.raises(TempcalError, match=message):
            run_model(model, inputs, output_key=key, device="cpu", progress=False)
    out = tmp_path / "out.pt"
    with pytest.raises(TempcalError, match=r"returns a dict; name the logits entry with output_key NAME"):
        save_calibrated_model(mapping, 2.0, out)
    with pytest.raises(TempcalError, match=r"no key 'scores'"):
        save_calibrated_model(mapping, 2.0, out, output_key="scores", check_inputs=inputs)
    with pytest.raises(TempcalError, match=r"tuple of 2 tensors; choose the logits with output_key 0\.\.1"):
        save_calibrated_model(pair, 2.0, out)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(TempcalError, match="positive"):
            save_calibrated_model(plain, bad, out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dict.pt", "pair.pt", "plain.pt", "small.safetensors"]


def test_single_binary_logit_and_missing_labels(small, tmp_path):
    x, y, _ = small
    path = _script(BinaryNet(), tmp_path / "binary.pt")
    labels01 = _save_inputs(tmp_path / "b.safetensors", x, (y % 2))
    data, _ = run_model(path, labels01, device="cpu", progress=False)
    assert data.binary and data.logits.shape == (40,)
    unlabelled = _save_inputs(tmp_path / "u.safetensors", x)
    with pytest.raises(TempcalError, match=r"u\.safetensors: no tensor 'labels' \(keys present: 'inputs'; "
                                           r"choose one with labels_key\)"):
        run_model(path, unlabelled, device="cpu", progress=False)
    data, _ = run_model(path, unlabelled, labels_optional=True, device="cpu", progress=False)
    assert torch.equal(data.labels, torch.zeros(40, dtype=torch.int64))
    four = _script(torch.nn.Linear(5, 4), tmp_path / "four.pt")
    data, _ = run_model(four, unlabelled, labels_optional=True, device="cpu", progress=False)
    assert torch.equal(data.labels, data.logits.argmax(1))  # placeholders: never a -inf "true" class


def test_save_logits_round_trip(digits, tmp_path):
    data, _ = run_model(digits["model"], digits["inputs"], device="cpu", progress=False)
    path = tmp_path / "logits.safetensors"
    save_logits(data, path, temperature=2.5, metadata={"tempcal.model": "mlp.pt"})
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"tempcal.model": "mlp.pt", "tempcal.temperature": "2.5"}
        assert torch.equal(f.get_tensor("logits"), data.logits)
        assert torch.equal(f.get_tensor("labels"), data.labels)
    loaded = tempcal.open_source(path)
    assert loaded.stored_temperature == 2.5
    save_logits(data, path, labels=False)  # replaces the file atomically
    with safe_open(str(path), framework="pt") as f:
        assert list(f.keys()) == ["logits"] and not f.metadata()
    assert [p.name for p in tmp_path.iterdir()] == ["logits.safetensors"]  # no temporary file left
    with pytest.raises(TempcalError, match="is a folder"):
        save_logits(data, tmp_path)


# -- bad input ------------------------------------------------------------------------------------
def test_inputs_the_model_rejects_name_both_shapes(digits, tmp_path):
    narrow = _save_inputs(tmp_path / "narrow.safetensors", digits["x"][:, :63].contiguous(), digits["y"])
    with pytest.raises(TempcalError) as info:
        run_model(digits["model"], narrow, device="cpu", progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert f"{digits['model']} rejects the inputs {narrow} 'inputs' [1348, 63] float32 on batch 0 " in message
    assert "(rows 0-511 of 1348, shape [512, 63])" in message
    assert message.endswith("mat1 and mat2 shapes cannot be multiplied (512x63 and 64x128)")


def test_a_model_raising_on_one_batch_names_it(small, tmp_path):
    x, y, _ = small
    x = x.clone()
    x[25, 0] = 5000.0
    inputs = _save_inputs(tmp_path / "flagged.safetensors", x, y)
    path = _script(RaisesOnFlag(), tmp_path / "raises.pt")
    with pytest.raises(TempcalError) as info:
        run_model(path, inputs, batch_size=8, device="cpu", progress=False)
    message = str(info.value)
    assert message.startswith(f"{path} raised on batch 3 (rows 24-31 of 40, shape [8, 5]) of {inputs}")
    assert message.endswith("ValueError: flagged row in this batch") and "\n" not in message


def test_outputs_that_are_not_logits(small, tmp_path):
    x, y, inputs = small
    wide, ints = _script(WideOutput(), tmp_path / "wide.pt"), _script(IntOutput(), tmp_path / "ints.pt")
    with pytest.raises(TempcalError, match=r"wide\.pt output has shape \[40, 5, 2\] on batch 0 of 40 rows; "
                                           r"expected logits \[40, C\] \(or \[40\] for one binary logit\)"):
        run_model(wide, inputs, batch_size=64, device="cpu", progress=False)
    with pytest.raises(TempcalError, match=r"ints\.pt output has dtype int64 on batch 0; expected floating-point"):
        run_model(ints, inputs, device="cpu", progress=False)
    identity = _script(torch.nn.Identity(), tmp_path / "identity.pt")
    nan_inputs = x.clone()
    nan_inputs[7, 2] = math.nan
    bad = _save_inputs(tmp_path / "nan.safetensors", nan_inputs, y)
    data, _ = run_model(identity, bad, device="cpu", progress=False)  # values are the scan's job ...
    with pytest.raises(tempcal.DataError, match=r"NaN.*first at index 7"):
        tempcal.Scan(data)  # ... which names the row


def test_missing_and_malformed_inputs(digits, small, tmp_path):
    x, y, _ = small
    renamed = tmp_path / "renamed.safetensors"
    save_file({"pixels": x, "labels": y}, str(renamed))
    with pytest.raises(TempcalError, match=r"renamed\.safetensors: no tensor 'inputs' \(keys present: 'labels', "
                                           r"'pixels'; choose one with inputs_key\)"):
        run_model(digits["model"], renamed, device="cpu")
    data, _ = run_model(_script(torch.nn.Linear(5, 3), tmp_path / "lin.pt"), renamed, inputs_key="pixels",
                        device="cpu", progress=False)
    assert data.num_samples == 40
    short = _save_inputs(tmp_path / "short.safetensors", x, y[:30])
    with pytest.raises(TempcalError, match=r"short\.safetensors: 'inputs' has 40 rows but 'labels' has 30"):
        run_model(digits["model"], short, device="cpu")
    floats = _save_inputs(tmp_path / "floats.safetensors", x, y.double())
    with pytest.raises(TempcalError, match=r"'labels' has dtype float64; expected an integer dtype"):
        run_model(digits["model"], floats, device="cpu")
    empty = _save_inputs(tmp_path / "empty.safetensors", torch.zeros(0, 5), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(TempcalError, match=r"empty\.safetensors: 'inputs' holds no samples"):
        run_model(digits["model"], empty, device="cpu")
    with pytest.raises(TempcalError, match=r"nothere\.safetensors: no such file"):
        run_model(digits["model"], tmp_path / "nothere.safetensors", device="cpu")


def test_altered_temperature_is_refused(tmp_path):
    plain = _script(torch.nn.Linear(5, 4), tmp_path / "plain.pt")
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


def test_progress_bar_goes_to_the_console_given_and_only_to_a_terminal(digits, capsys):
    terminal = io.StringIO()
    run_model(digits["model"], digits["inputs"], device="cpu", batch_size=200,
              progress=Console(file=terminal, force_terminal=True, width=100))
    assert "running mlp.pt" in terminal.getvalue()
    run_model(digits["model"], digits["inputs"], device="cpu")  # standard error is not a terminal under pytest
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


# -- ODIN -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("tau", "eps"), [(1.0, 0.0), (1.0, 0.05), (1000.0, 0.01), (2.0, 0.2)])
def test_odin_matches_a_hand_written_autograd_version(digits, tau, eps):
    x = digits["x"][:300]
    ours = odin_scores(digits["model"], x, tau=tau, eps=eps, batch_size=128, device="cpu").numpy()
    reference = ref_odin(digits["mlp"], x, tau, eps)
    assert ours.dtype == np.float64 and ours.shape == (300,)
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-9)
    if eps == 0:  # no perturbation: the plain max softmax at tau
        with torch.no_grad():
            z = digits["mlp"](x).double().numpy()
        np.testing.assert_allclose(ours, softmax(z / tau, axis=1).max(axis=1), rtol=1e-6)


def test_odin_perturbation_raises_the_in_distribution_max_softmax(digits):
    x = digits["x"]
    plain = odin_scores(digits["model"], x, tau=1.0, eps=0.0, device="cpu")
    up = odin_scores(digits["model"], x, tau=1.0, eps=0.05, device="cpu")
    assert float((up - plain).mean()) > 0
    assert float((up >= plain - 1e-12).double().mean()) > 0.95
    # The opposite step (the sign flipped by hand) lowers it: the sign is the paper's, not its negation.
    down = ref_odin(digits["mlp"], x, 1.0, -0.05)
    assert float(np.mean(down - plain.numpy())) < 0


def test_odin_on_a_calibrated_model_scores_the_original(digits, tmp_path):
    calibrated = tmp_path / "calibrated.pt"
    save_calibrated_model(digits["model"], 2.0, calibrated)
    x = digits["x"][:100]
    on_calibrated = odin_scores(calibrated, x, tau=2.0, eps=0.01, device="cpu")
    np.testing.assert_allclose(on_calibrated.numpy(), ref_odin(digits["mlp"], x, 2.0, 0.01), rtol=1e-5)
    with pytest.raises(TempcalError, match=r"ODIN perturbs the inputs, so they must be floating point"):
        odin_scores(digits["model"], torch.zeros(4, 64, dtype=torch.int64), tau=1.0, eps=0.01, device="cpu")
    with pytest.raises(TempcalError, match=r"odin_eps -0\.1: expected a number >= 0"):
        odin_scores(digits["model"], x, tau=1.0, eps=-0.1, device="cpu")


def test_odin_ood_report_matches_scikit_learn(digits, tmp_path):
    noise = torch.randn(200, 64, generator=torch.Generator().manual_seed(3))
    ood_path = _save_inputs(tmp_path / "noise.safetensors", noise)
    id_path = _save_inputs(tmp_path / "id.safetensors", digits["x"][:300], digits["y"][:300])
    report = ood_file(digits["model"], [ood_path], odin_eps=0.02, taus=[1.0, 1000.0], device="cpu",
                      inputs=str(id_path), progress=False)
    assert report.taus == [1.0, 1000.0] and report.num_classes == 10 and not report.binary
    assert report.n_id == 300 and report.n_ood == [200]
    for (path, row), tau in zip(report.results, [1.0, 1000.0], strict=True):
        a, b = ref_odin(digits["mlp"], digits["x"][:300], tau, 0.02), ref_odin(digits["mlp"], noise, tau, 0.02)
        truth = np.r_[np.ones(len(a)), np.zeros(len(b))]
        assert path == str(ood_path) and row.score == "msp" and row.tau == tau
        assert row.auroc == pytest.approx(roc_auc_score(truth, np.r_[a, b]), abs=1e-6)
    assert report.to_json()["results"][0]["auroc"] == report.results[0][1].auroc
    with pytest.raises(TempcalError, match=r"tau fitted: .*mlp\.pt on .*id\.safetensors has no stored temperature"):
        ood_file(digits["model"], [ood_path], odin_eps=0.02, taus=["fitted"], device="cpu", inputs=str(id_path))

"""Running a model over its inputs (tempcal.models.run): batches, output selection, errors naming a batch, progress."""

from __future__ import annotations

import io
import math

import pytest
import torch
from conftest import run_model_source, script_model, write_inputs
from rich.console import Console

import tempcal
from tempcal.errors import TempcalError
from tempcal.models.save import save_calibrated_model

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


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


def test_batch_size_does_not_change_the_logits(digits):
    runs = [run_model_source(digits["model"], digits["inputs"], device="cpu", batch_size=b, progress=False)[0].logits
            for b in (1348, 100, 512)]
    assert all(torch.allclose(runs[0], other, rtol=1e-6, atol=1e-5) for other in runs[1:])  # float32 sums
    with pytest.raises(TempcalError, match="batch_size must be a whole number >= 1, got 0"):
        run_model_source(digits["model"], digits["inputs"], batch_size=0)


@pytest.mark.parametrize(("net", "key", "column"), [(TupleNet, 1, 1), (TupleNet, "1", 1), (TupleNet, -1, 1),
                                                     (TripleNet, "1", 1), (DictNet, "logits", "logits")])
def test_tuple_and_dict_outputs(net, key, column, small, tmp_path):
    x, _, inputs = small
    module = net().eval()
    path = script_model(module, tmp_path / "net.pt")
    module = torch.jit.load(str(path))  # the same weights as the file
    data, _ = run_model_source(path, inputs, output_key=key, device="cpu", progress=False)
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
    again, stored = run_model_source(out, inputs, output_key=key, device="cpu", progress=False)
    assert stored == 2.5 and torch.allclose(again.logits, expected, atol=1e-7)


def test_output_key_errors_list_what_is_there(small, tmp_path):
    _, _, inputs = small
    pair, mapping = script_model(TupleNet(), tmp_path / "pair.pt"), script_model(DictNet(), tmp_path / "dict.pt")
    plain = script_model(torch.nn.Linear(5, 4), tmp_path / "plain.pt")
    cases = [(pair, None, r"pair\.pt returns a tuple of 2 outputs; choose the logits with output_key 0\.\.1"),
             (pair, "2", r"output_key 2: .*pair\.pt returns a tuple of 2 outputs; expected an index 0\.\.1"),
             (pair, "logits", r"output_key logits: .*expected an index 0\.\.1"),
             (mapping, None, r"dict\.pt returns a dict with keys 'features', 'logits'; choose the logits with "
                             r"output_key NAME"),
             (mapping, "scores", r"output_key scores: .*keys 'features', 'logits'; no key 'scores'"),
             (plain, "0", r"output_key 0: .*plain\.pt returns a single tensor; drop output_key")]
    for model, key, message in cases:
        with pytest.raises(TempcalError, match=message):
            run_model_source(model, inputs, output_key=key, device="cpu", progress=False)
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
    path = script_model(BinaryNet(), tmp_path / "binary.pt")
    labels01 = write_inputs(tmp_path / "b.safetensors", x, (y % 2))
    data, _ = run_model_source(path, labels01, device="cpu", progress=False)
    assert data.binary and data.logits.shape == (40,)
    unlabelled = write_inputs(tmp_path / "u.safetensors", x)
    with pytest.raises(TempcalError, match=r"u\.safetensors: no tensor 'labels' \(keys present: 'inputs'; "
                                           r"choose one with labels_key\)"):
        run_model_source(path, unlabelled, device="cpu", progress=False)
    data, _ = run_model_source(path, unlabelled, labels_optional=True, device="cpu", progress=False)
    assert torch.equal(data.labels, torch.zeros(40, dtype=torch.int64))
    four = script_model(torch.nn.Linear(5, 4), tmp_path / "four.pt")
    data, _ = run_model_source(four, unlabelled, labels_optional=True, device="cpu", progress=False)
    assert torch.equal(data.labels, data.logits.argmax(1))  # placeholders: never a -inf "true" class


# -- bad input --------------------------------------------------------------------------------------------------


def test_inputs_the_model_rejects_name_both_shapes(digits, tmp_path):
    narrow = write_inputs(tmp_path / "narrow.safetensors", digits["x"][:, :63].contiguous(), digits["y"])
    with pytest.raises(TempcalError) as info:
        run_model_source(digits["model"], narrow, device="cpu", progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert f"{digits['model']} rejects the inputs {narrow} 'inputs' [1348, 63] float32 on batch 0 " in message
    assert "(rows 0-511 of 1348, shape [512, 63])" in message
    assert message.endswith("mat1 and mat2 shapes cannot be multiplied (512x63 and 64x128)")


def test_a_model_raising_on_one_batch_names_it(small, tmp_path):
    x, y, _ = small
    x = x.clone()
    x[25, 0] = 5000.0
    inputs = write_inputs(tmp_path / "flagged.safetensors", x, y)
    path = script_model(RaisesOnFlag(), tmp_path / "raises.pt")
    with pytest.raises(TempcalError) as info:
        run_model_source(path, inputs, batch_size=8, device="cpu", progress=False)
    message = str(info.value)
    assert message.startswith(f"{path} raised on batch 3 (rows 24-31 of 40, shape [8, 5]) of {inputs}")
    assert message.endswith("ValueError: flagged row in this batch") and "\n" not in message


def test_outputs_that_are_not_logits(small, tmp_path):
    x, y, inputs = small
    wide, ints = script_model(WideOutput(), tmp_path / "wide.pt"), script_model(IntOutput(), tmp_path / "ints.pt")
    with pytest.raises(TempcalError, match=r"wide\.pt output has shape \[40, 5, 2\] on batch 0 of 40 rows; "
                                           r"expected logits \[40, C\] \(or \[40\] for one binary logit\)"):
        run_model_source(wide, inputs, batch_size=64, device="cpu", progress=False)
    with pytest.raises(TempcalError, match=r"ints\.pt output has dtype int64 on batch 0; expected floating-point"):
        run_model_source(ints, inputs, device="cpu", progress=False)
    identity = script_model(torch.nn.Identity(), tmp_path / "identity.pt")
    nan_inputs = x.clone()
    nan_inputs[7, 2] = math.nan
    bad = write_inputs(tmp_path / "nan.safetensors", nan_inputs, y)
    data, _ = run_model_source(identity, bad, device="cpu", progress=False)  # values are the scan's job ...
    with pytest.raises(tempcal.DataError, match=r"NaN.*first at index 7"):
        tempcal.Scan(data)  # ... which names the row


def test_progress_bar_goes_to_the_console_given_and_only_to_a_terminal(digits, capsys):
    terminal = io.StringIO()
    run_model_source(digits["model"], digits["inputs"], device="cpu", batch_size=200,
              progress=Console(file=terminal, force_terminal=True, width=100))
    assert "running mlp.pt" in terminal.getvalue()
    run_model_source(digits["model"], digits["inputs"], device="cpu")  # standard error is not a terminal under pytest
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_models_run_without_tf32_whatever_the_global_setting(small):
    """TF32 would change a model's logits (and T) by about 1e-3 relative on CUDA: every format runs with it off."""
    from tempcal.models.base import LoadedModel
    from tempcal.models.run import InputsFile, run_model

    flags = torch.backends.cuda.matmul, torch.backends.cudnn
    before = [flag.allow_tf32 for flag in flags]
    seen = []

    def net(x):
        seen.append(tuple(flag.allow_tf32 for flag in flags))
        return x[:, :3]

    try:
        for flag in flags:
            flag.allow_tf32 = True
        model = LoadedModel(small[2], "export", net, None, torch.device("cpu"))
        logits = run_model(model, InputsFile(small[2]), batch_size=16, progress=False)
        assert seen == [(False, False)] * 3 and torch.equal(logits, small[0][:, :3])
        assert all(flag.allow_tf32 for flag in flags)  # restored afterwards
    finally:
        for flag, value in zip(flags, before, strict=True):
            flag.allow_tf32 = value


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_programs_run_on_cuda_as_on_the_cpu(digits, tmp_path):
    from model_builders import save_program

    path = save_program(digits["mlp"], digits["x"][:4], tmp_path / "digits.pt2")
    on_cpu, _ = run_model_source(path, digits["inputs"], device="cpu")
    on_cuda, _ = run_model_source(path, digits["inputs"], device="cuda")
    torch.testing.assert_close(on_cuda.logits, on_cpu.logits, rtol=1e-5, atol=1e-5)  # TF32 would miss this

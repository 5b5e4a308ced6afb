"""Exported programs (tempcal.models.export, .pt2_archive): hostile archives refused before anything is unpickled,
damaged ones as one line, calibrated programs exact at any batch size, T stored twice, atomic writes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import read_model_temperature, run_model_source, script_model, write_inputs
from model_builders import (
    CNN,
    CONSTANTS_CONFIG,
    MLP,
    SAMPLE_INPUTS,
    WEIGHTS_CONFIG,
    Branchy,
    DictOut,
    TupleOut,
    divided,
    payload_pickle,
    payload_torch_save,
    read_member,
    rewrite_zip,
    save_program,
    with_opaque_payload,
)
from torch.utils._pytree import tree_leaves

from tempcal.errors import TempcalError
from tempcal.models import export
from tempcal.models.base import TEMPERATURE_BUFFER
from tempcal.models.save import save_calibrated_model

# torch 2.13 deprecates TorchScript; these tests convert TorchScript models on purpose (the migration path).
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")

T = 1.7320508075688772  # not exactly representable in float32: rounding choices show


@pytest.fixture(scope="module")
def mlp_pt2(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A plain exported MLP with a dynamic batch, saved by torch.export.save, and the module it came from."""
    torch.manual_seed(0)
    module = MLP().eval()
    return save_program(module, torch.randn(4, 8), tmp_path_factory.mktemp("pt2") / "mlp.pt2"), module


def one_line(exc: TempcalError) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def _config_with(path: Path, name: str, fqn: str, **changes: object) -> bytes:
    """A payload config of ``path`` with entry ``fqn`` changed (or added) by ``changes``."""
    config = json.loads(read_member(path, name))
    entry = config["config"].setdefault(fqn, {"is_param": False, "tensor_meta": None})
    entry.update(changes)
    return json.dumps(config).encode()


# -- what loads --------------------------------------------------------------------------------------------------------


def test_plain_program_loads_and_runs(mlp_pt2):
    path, module = mlp_pt2
    _, info = export.load_program(path)
    assert info.programs == ("model",) and info.temperature is None
    loaded = export.load(path, "cpu")
    assert loaded.format == "export" and loaded.temperature is None and loaded.device == torch.device("cpu")
    x = torch.randn(7, 8)
    with torch.no_grad():
        assert torch.equal(loaded.net(x), module(x))
    program, _ = export.load_program(path)
    assert program.example_inputs is None  # the sample inputs were never unpickled


def test_program_with_buffers_constants_and_extra_files_loads(tmp_path):
    class WithState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.register_buffer("shift", torch.arange(3.0))
            self.scale = torch.tensor([2.0])  # a tensor constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x) * self.scale + self.shift

    module = WithState().eval()
    path = save_program(module, torch.randn(3, 4), tmp_path / "state.pt2", **{"notes.txt": "hello"})
    loaded = export.load(path, "cpu")
    x = torch.randn(5, 4)
    with torch.no_grad():
        assert torch.equal(loaded.net(x), module(x))
    assert export.load_program(path)[1].extra_files == ("notes.txt",)


def test_training_mode_program_is_refused(tmp_path):
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    program = torch.export.export(module, (torch.randn(3, 4),))
    assert export.training_nodes(program)
    path = tmp_path / "train.pt2"
    torch.export.save(program, path)
    with pytest.raises(TempcalError, match="training mode") as caught:
        export.load(path, "cpu")
    one_line(caught.value)


# -- hostile archives: refused, the payload never runs -----------------------------------------------------------------


def _assert_refused(path: Path, marker: Path, match: str) -> None:
    for attempt in (export.load_program, lambda p: export.load(p, "cpu"), read_model_temperature):
        with pytest.raises(TempcalError, match=match) as caught:
            attempt(path)
        one_line(caught.value)
    assert not marker.exists()


def test_opaque_object_constant_is_refused(mlp_pt2, tmp_path):
    marker = tmp_path / "pwned"
    hostile = with_opaque_payload(mlp_pt2[0], tmp_path / "opaque.pt2", marker)
    _assert_refused(hostile, marker, r"data/constants/opaque_obj_0.*pickle\.loads.*refused")


def test_pickled_weight_is_refused(mlp_pt2, tmp_path):
    source, _ = mlp_pt2
    marker = tmp_path / "pwned"
    hostile = rewrite_zip(source, tmp_path / "weight.pt2", replace={
        WEIGHTS_CONFIG: _config_with(source, WEIGHTS_CONFIG, "a.weight", use_pickle=True),
        "data/weights/weight_0": payload_pickle(marker)})
    _assert_refused(hostile, marker, r"data/weights/weight_0.*weights_only=False")


def test_pickled_tensor_constant_is_refused(mlp_pt2, tmp_path):
    source, _ = mlp_pt2
    marker = tmp_path / "pwned"
    hostile = rewrite_zip(source, tmp_path / "constant.pt2", replace={
        CONSTANTS_CONFIG: _config_with(source, CONSTANTS_CONFIG, "c", path_name="tensor_9", use_pickle=True)},
        add={"data/constants/tensor_9": payload_torch_save(marker)})
    _assert_refused(hostile, marker, r"tensor_9.*pickled tensor")


def test_torchbind_object_is_refused(mlp_pt2, tmp_path):
    source, _ = mlp_pt2
    hostile = rewrite_zip(source, tmp_path / "custom.pt2", replace={
        CONSTANTS_CONFIG: _config_with(source, CONSTANTS_CONFIG, "obj", path_name="custom_obj_0", use_pickle=True)},
        add={"data/constants/custom_obj_0": b"\x80\x02N."})
    _assert_refused(hostile, tmp_path / "none", r"custom_obj_0.*_pickle_load_obj")


@pytest.mark.parametrize("protocol", [2, 4])
def test_hostile_sample_inputs_are_refused(mlp_pt2, tmp_path, protocol):
    """torch.export.load retries sample inputs with weights_only=False: a payload there would run."""
    marker = tmp_path / "pwned"
    for kind, blob in (("raw", payload_pickle(marker, protocol)), ("zip", payload_torch_save(marker))):
        hostile = rewrite_zip(mlp_pt2[0], tmp_path / f"sample-{kind}.pt2", replace={SAMPLE_INPUTS: blob})
        _assert_refused(hostile, marker, r"data/sample_inputs/model\.pt")


def test_legacy_members_and_format_are_refused(mlp_pt2, tmp_path):
    marker = tmp_path / "pwned"
    legacy_weights = rewrite_zip(mlp_pt2[0], tmp_path / "legacy-weights.pt2",
                                 add={"data/weights/model.pt": payload_pickle(marker)})
    _assert_refused(legacy_weights, marker, r"data/weights/model\.pt.*legacy")
    legacy = tmp_path / "legacy.pt2"
    with zipfile.ZipFile(legacy, "w") as archive:
        archive.writestr("version", "8.0")
        archive.writestr("serialized_exported_program.json", "{}")
        archive.writestr("serialized_state_dict.pt", payload_pickle(marker))
    _assert_refused(legacy, marker, "legacy torch.export archive")


def test_aoti_duplicates_and_other_archives_are_refused(mlp_pt2, tmp_path):
    source, _ = mlp_pt2
    aoti = rewrite_zip(source, tmp_path / "aoti.pt2", add={"data/aotinductor/model/model.so": b"\x7fELF"})
    _assert_refused(aoti, tmp_path / "none", "AOTInductor")
    duplicate = rewrite_zip(source, tmp_path / "dup.pt2")
    with zipfile.ZipFile(duplicate, "a") as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name
        archive.writestr(archive.namelist()[0], b"other")
    _assert_refused(duplicate, tmp_path / "none", "appears twice")
    saved = tmp_path / "state.pt2"
    torch.save({"w": torch.ones(2)}, saved)
    _assert_refused(saved, tmp_path / "none", "torch.save archive")


def test_lying_tensor_metadata_is_refused(mlp_pt2, tmp_path):
    """A record smaller than its declared shape (torch would read past it, or allocate zeros of any size)."""
    source, _ = mlp_pt2
    config = json.loads(read_member(source, WEIGHTS_CONFIG))
    config["config"]["a.weight"]["tensor_meta"]["sizes"] = [{"as_int": 10**6}, {"as_int": 8}]
    hostile = rewrite_zip(source, tmp_path / "big.pt2", replace={WEIGHTS_CONFIG: json.dumps(config).encode()})
    _assert_refused(hostile, tmp_path / "none", "needs")


def test_control_plain_torch_export_load_runs_the_payloads(mlp_pt2, tmp_path):
    """The attacks above are real: torch.export.load itself unpickles them (why tempcal never calls it)."""
    source, _ = mlp_pt2
    opaque_marker, sample_marker = tmp_path / "pwned-opaque", tmp_path / "pwned-sample"
    opaque = with_opaque_payload(source, tmp_path / "control-opaque.pt2", opaque_marker)
    sample = rewrite_zip(source, tmp_path / "control-sample.pt2",
                         replace={SAMPLE_INPUTS: payload_torch_save(sample_marker)})
    for hostile in (opaque, sample):
        with warnings.catch_warnings(), contextlib.suppress(Exception):
            warnings.simplefilter("ignore")
            torch.export.load(hostile)
    assert opaque_marker.exists() and sample_marker.exists()


def test_pickle_in_the_temperature_extra_file_is_text_not_a_pickle(mlp_pt2, tmp_path):
    """The extra file holding T is read as text: a pickle there is a bad number, never unpickled."""
    marker = tmp_path / "pwned"
    hostile = rewrite_zip(mlp_pt2[0], tmp_path / "extra.pt2", add={"extra/tempcal.temperature": payload_pickle(marker)})
    _assert_refused(hostile, marker, r"extra file 'tempcal\.temperature' is .*not a positive number")


# -- damaged files: one line, no traceback -----------------------------------------------------------------------------


def test_missing_and_non_files(tmp_path):
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"\x80\x02not a zip")
    for path, match in ((tmp_path / "absent.pt2", "no such file"), (tmp_path, "not a regular file"),
                        (junk, "not a zip")):
        with pytest.raises(TempcalError, match=match) as caught:
            export.load(path, "cpu")
        one_line(caught.value)


def test_missing_members(mlp_pt2, tmp_path):
    for member in (WEIGHTS_CONFIG, "data/weights/weight_1", SAMPLE_INPUTS, "models/model.json"):
        damaged = rewrite_zip(mlp_pt2[0], tmp_path / "missing.pt2", drop=(member,))
        with pytest.raises(TempcalError, match=r"missing|no program") as caught:
            export.load(damaged, "cpu")
        one_line(caught.value)


def test_truncated_files(mlp_pt2, tmp_path):
    data = mlp_pt2[0].read_bytes()
    for cut in (0, 1, 2, 30, 200, len(data) // 3, len(data) // 2, len(data) - 100, len(data) - 22, len(data) - 1):
        damaged = tmp_path / "cut.pt2"
        damaged.write_bytes(data[:cut])
        with pytest.raises(TempcalError) as caught:
            export.load(damaged, "cpu")
        one_line(caught.value)


def test_corrupted_bytes_give_one_line_or_the_same_program(mlp_pt2, tmp_path):
    """Flipped bits: refused as one line, or (in bytes no reader uses) the very same program loads."""
    path, module = mlp_pt2
    data = path.read_bytes()
    rng = random.Random(15)
    x = torch.randn(3, 8)
    with torch.no_grad():
        want = module(x)
    refused = 0
    for _ in range(40):
        blob = bytearray(data)
        blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        damaged = tmp_path / "flip.pt2"
        damaged.write_bytes(bytes(blob))
        try:
            loaded = export.load(damaged, "cpu")
        except TempcalError as exc:
            one_line(exc)
            refused += 1
            continue
        with torch.no_grad():
            assert torch.equal(loaded.net(x), want)
    assert refused > 20


def test_unsupported_zip_version_is_one_line(mlp_pt2, tmp_path):
    """zipfile raises NotImplementedError for an unknown 'version needed' (found by fuzzing): still one line."""
    blob = bytearray(mlp_pt2[0].read_bytes())
    end = blob.rindex(b"PK\x05\x06")  # the outer archive's end record (the sample inputs hold a zip too)
    central = int.from_bytes(blob[end + 16:end + 20], "little")
    blob[central + 6] = 0xFF  # version needed to extract
    damaged = tmp_path / "version.pt2"
    damaged.write_bytes(bytes(blob))
    with pytest.raises(TempcalError, match="damaged or truncated zip") as caught:
        export.load(damaged, "cpu")
    one_line(caught.value)


# -- writing a calibrated program --------------------------------------------------------------------------------------


def _assert_calibrated(got, want, index: int, temperature: float) -> None:
    """Output ``index`` equals want / T rounded once (bit for bit); every other output untouched; structure kept."""
    assert type(got) is type(want)
    got_leaves, want_leaves = tree_leaves(got), tree_leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for position, (a, b) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        assert torch.equal(a, divided(b, temperature) if position == index else b), position


def test_calibrated_program_is_exact_at_any_batch_size(mlp_pt2, tmp_path):
    path, module = mlp_pt2
    out = tmp_path / "calibrated.pt2"
    assert save_calibrated_model(path, T, out, check_inputs=torch.randn(4, 8)) == out
    program, info = export.load_program(out)
    assert info.temperature == T and export.program_temperature(program) == T
    assert read_member(out, "extra/tempcal.temperature").decode() == repr(T)
    buffer = program.state_dict[TEMPERATURE_BUFFER]
    assert buffer.dtype == torch.float64 and buffer.item() == T
    calibrated = program.module()  # the saved program as a deployment runs it
    for rows in (1, 3, 17, 600):  # none is the 16 check rows, nor the 4 example rows
        x = torch.randn(rows, 8)
        with torch.no_grad():
            want, got = module(x), calibrated(x)
        assert torch.equal(got, divided(want, T))
        torch.testing.assert_close(got.double(), want.double() / T, rtol=2**-24, atol=0)  # float32 rounding


def test_recalibrating_divides_the_original_once(mlp_pt2, tmp_path):
    path, module = mlp_pt2
    first, second = tmp_path / "first.pt2", tmp_path / "second.pt2"
    save_calibrated_model(path, T, first, check_inputs=torch.randn(4, 8))
    save_calibrated_model(first, 0.5, second, check_inputs=torch.randn(4, 8))
    program, info = export.load_program(second)
    assert info.temperature == 0.5
    x = torch.randn(6, 8)
    with torch.no_grad():
        assert torch.equal(program.module()(x), divided(module(x), 0.5))
    assert sum(n.target == torch.ops.aten.div.Tensor for n in program.graph.nodes) == 1
    assert set(program.state_dict) == {*dict(module.named_parameters()), TEMPERATURE_BUFFER}  # names not nested


def test_calibrated_program_as_a_source_gives_the_original_and_t(mlp_pt2, tmp_path):
    """Like a TorchScript SOURCE: the original's logits, with the stored T (so --tau 1 means uncalibrated)."""
    path, module = mlp_pt2
    out = tmp_path / "calibrated.pt2"
    save_calibrated_model(path, T, out, check_inputs=torch.randn(4, 8))
    loaded = export.load(out, "cpu")
    assert loaded.temperature == T and read_model_temperature(out) == T and read_model_temperature(path) is None
    x = torch.randn(6, 8)
    with torch.no_grad():
        assert torch.equal(loaded.net(x), module(x))
    program, _ = export.load_program(out)
    with torch.no_grad():
        assert torch.equal(export.graph_module(program, None, "c")(x), divided(module(x), T))


@pytest.mark.parametrize(("module", "shape", "key", "index"), [
    (MLP(), (8,), None, 0), (CNN(), (3, 8, 8), None, 0), (TupleOut(), (8,), "0", 0), (TupleOut(), (8,), "1", 1),
    (DictOut(), (8,), "logits", 0), (Branchy(), (8,), None, 0),
], ids=["mlp", "cnn", "tuple-0", "tuple-1", "dict", "branchy"])
def test_from_torchscript_the_migration_path(tmp_path, module, shape, key, index):
    torch.manual_seed(0)
    path = script_model(module, tmp_path / "model.ts")
    scripted = torch.jit.load(str(path))
    out = tmp_path / "migrated.pt2"
    save_calibrated_model(path, T, out, output_key=key, check_inputs=torch.randn(4, *shape))
    program, info = export.load_program(out)
    assert info.temperature == T
    for rows in (1, 9):
        x = torch.randn(rows, *shape)
        for sign in (1, -1):  # both branches of the data-dependent model
            with torch.no_grad():
                _assert_calibrated(program.module()(sign * x), scripted(sign * x), index, T)


def test_from_a_calibrated_torchscript_model(tmp_path):
    """A TorchScript model calibrated by tempcal is converted from its original: T2 replaces T1, never both."""
    torch.manual_seed(0)
    plain = script_model(MLP(), tmp_path / "plain.ts")
    first = tmp_path / "first.ts"
    save_calibrated_model(plain, 3.0, first)
    out = tmp_path / "migrated.pt2"
    save_calibrated_model(first, T, out, check_inputs=torch.randn(4, 8))
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert torch.equal(export.load_program(out)[0].module()(x), divided(torch.jit.load(str(plain))(x), T))


def test_float64_and_bfloat16_logits(tmp_path):
    for dtype in (torch.float64, torch.bfloat16):
        module = MLP().to(dtype).eval()
        path = save_program(module, torch.randn(4, 8, dtype=dtype), tmp_path / f"{dtype}.pt2")
        out = tmp_path / f"{dtype}-calibrated.pt2"
        save_calibrated_model(path, T, out, check_inputs=torch.randn(4, 8, dtype=dtype))
        x = torch.randn(6, 8, dtype=dtype)
        with torch.no_grad():
            want, got = module(x), export.load_program(out)[0].module()(x)
        assert got.dtype == dtype and torch.equal(got, divided(want, T))


def test_an_example_of_one_row_still_gives_a_dynamic_batch(mlp_pt2, tmp_path):
    path, module = mlp_pt2
    out = tmp_path / "one.pt2"
    save_calibrated_model(path, T, out, check_inputs=torch.randn(1, 8))
    x = torch.randn(11, 8)
    with torch.no_grad():
        assert torch.equal(export.load_program(out)[0].module()(x), divided(module(x), T))


def test_errors_are_one_line_and_nothing_is_written(mlp_pt2, tmp_path):
    torch.manual_seed(0)
    pair = script_model(TupleOut(), tmp_path / "pair.ts")
    mapping = script_model(DictOut(), tmp_path / "dict.ts")
    path, x = mlp_pt2[0], torch.randn(4, 8)
    out = tmp_path / "a.pt2"
    cases = [
        (pair, None, x, r"returns a tuple of 2 outputs; choose the logits with output_key 0\.\.1"),
        (pair, "5", x, r"output_key 5: .*expected an index 0\.\.1"),
        (mapping, "nope", x, r"keys 'logits', 'features'; no key 'nope'"),
        (path, "0", x, "returns a single tensor; drop output_key"),
        (path, None, None, r"written from example inputs; pass check_inputs"),
        (path, None, torch.randn(4, 3), r"fails on inputs of shape \[5, 3\]"),
    ]
    for model, key, inputs, match in cases:
        with pytest.raises(TempcalError, match=match) as caught:
            save_calibrated_model(model, T, out, output_key=key, check_inputs=inputs)
        assert one_line(caught.value).startswith(f"save_model {out}: ")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(TempcalError, match="positive"):
            save_calibrated_model(path, bad, out, check_inputs=x)
    with pytest.raises(TempcalError, match="does not exist"):
        save_calibrated_model(path, T, tmp_path / "missing" / "a.pt2", check_inputs=x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dict.ts", "pair.ts"]


class Interpolating(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(x, scale_factor=2.0).flatten(1)


class Looping(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = []
        for i in range(x.size(0)):
            rows.append(x[i] * 2)
        return torch.stack(rows)


@pytest.mark.parametrize(("module", "shape", "match"), [
    (Interpolating(), (4, 1, 2, 2), "fixes its batch size"),
    (Looping(), (4, 3), r"prim::Loop.*export the original nn\.Module with torch\.export"),
], ids=["interpolate", "loop"])
def test_unconvertible_torchscript_is_one_line(tmp_path, module, shape, match):
    path = script_model(module, tmp_path / "model.ts")
    with pytest.raises(TempcalError, match=match) as caught:
        save_calibrated_model(path, T, tmp_path / "x.pt2", check_inputs=torch.randn(*shape))
    one_line(caught.value)
    assert not (tmp_path / "x.pt2").exists()


def test_the_write_is_atomic(mlp_pt2, tmp_path, monkeypatch):
    path = mlp_pt2[0]
    out = tmp_path / "out.pt2"
    out.write_bytes(b"previous")
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def recording(src, dst):
        renames.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording)
    save_calibrated_model(path, T, out, check_inputs=torch.randn(4, 8))
    ((src, dst),) = renames
    assert Path(src).parent == tmp_path and Path(dst) == out  # a temporary file beside the destination
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pt2"]

    def failing(src, dst):
        raise OSError(28, "No space left on device")

    out.write_bytes(b"previous")
    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(TempcalError, match="No space left on device") as caught:
        save_calibrated_model(path, 2.0, out, check_inputs=torch.randn(4, 8))
    assert one_line(caught.value).startswith(f"save_model {out}: cannot write")  # one prefix
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pt2"]


def test_nothing_written_when_the_check_fails(mlp_pt2, tmp_path, monkeypatch):
    real = export._add_division

    def other_t(graph, index, temperature, dtype):
        real(graph, index, temperature * 1.001, dtype)  # the buffer disagrees with the extra file

    def scaled(graph, index, temperature, dtype):
        real(graph, index, temperature, dtype)
        output = next(n for n in graph.graph.nodes if n.op == "output")
        leaf = output.args[0][index]
        with graph.graph.inserting_before(output):
            off = graph.graph.call_function(torch.ops.aten.mul.Tensor, (leaf, 1.001))
        output.args = ((off,),)
        graph.recompile()

    out = tmp_path / "out.pt2"
    for patch, match in ((other_t, "says T = 1.7320508075688772 but the program divides by 1.733"),
                         (scaled, "does not reproduce its logits divided by T on a batch of 17 rows; nothing written")):
        monkeypatch.setattr(export, "_add_division", patch)
        with pytest.raises(TempcalError, match=match) as caught:
            save_calibrated_model(mlp_pt2[0], T, out, check_inputs=torch.randn(16, 8))
        one_line(caught.value)
        assert not list(tmp_path.iterdir())


def test_in_memory_archives_load_through_the_same_checks():
    buffer = io.BytesIO()
    torch.export.save(torch.export.export(MLP().eval(), (torch.randn(4, 8),),
                                          dynamic_shapes=({0: torch.export.Dim("batch")},)), buffer)
    program, info = export.load_program(buffer.getvalue(), label="in memory")
    assert info.path == "in memory" and program.module()(torch.randn(2, 8)).shape == (2, 5)


def test_program_source_runs_in_batches_like_any_model(mlp_pt2, tmp_path):
    path, module = mlp_pt2
    x, y = torch.randn(50, 8), torch.randint(0, 5, (50,))
    inputs = write_inputs(tmp_path / "inputs.safetensors", x, y)
    with torch.no_grad():
        want = module(x)
    for batch_size in (7, 50, 512):
        data, stored = run_model_source(path, inputs, batch_size=batch_size)
        assert stored is None and torch.equal(data.labels, y)
        torch.testing.assert_close(data.logits, want, rtol=1e-6, atol=1e-6)
    wrong = write_inputs(tmp_path / "wrong.safetensors", x.double(), y)
    with pytest.raises(TempcalError, match=r"rejects the inputs .*wrong\.safetensors.* on batch 0") as caught:
        run_model_source(path, wrong)
    one_line(caught.value)

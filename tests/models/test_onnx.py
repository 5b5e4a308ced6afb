"""ONNX models (tempcal.models.onnx, .onnx_graph): run with onnxruntime in batches, written calibrated with a Div by T,
external data kept inside the model's folder, and a clear error when the optional extra is missing."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, read_model_temperature, run_model_source, write_inputs

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from model_builders import (  # noqa: E402 (after the skips: the extra may be missing)
    external_onnx,
    metadata_props,
    onnx_mlp,
    onnx_model,
    run_onnx_file,
    ulps,
)
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tempcal.errors import TempcalError  # noqa: E402
from tempcal.models import onnx as onnx_runtime  # noqa: E402
from tempcal.models import onnx_graph  # noqa: E402
from tempcal.models.odin import odin_scores  # noqa: E402
from tempcal.models.save import save_calibrated_model  # noqa: E402

# torch 2.13 deprecates TorchScript; the digits fixture scripts its model on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")

T = 1.7320508075688772
RNG = np.random.default_rng(15)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)
X = RNG.standard_normal((11, 4)).astype(np.float32)
Y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1])


def one_line(exc: TempcalError) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


def gemm_model(path: Path) -> Path:
    """x [N, 4] -> Gemm -> logits [N, 3]: one output, dynamic batch."""
    model = onnx_model([helper.make_node("Gemm", ["x", "W", "b"], ["logits"], transB=1)],
                       [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
                       [numpy_helper.from_array(W.T.copy(), "W"), numpy_helper.from_array(B, "b")], features=4)
    onnx.save_model(model, path)
    return path


def two_output_model(path: Path) -> Path:
    """MatMul + Add -> logits, Softmax(logits) -> probs; outputs listed as (probs, logits)."""
    model = onnx_model([helper.make_node("MatMul", ["x", "W"], ["mm"]),
                        helper.make_node("Add", ["mm", "b"], ["logits"]),
                        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
                       [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3]),
                        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
                       [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b")], features=4)
    onnx.save_model(model, path)
    return path


def run(path: Path, x: np.ndarray = X, key: str | None = None) -> np.ndarray:
    """A model SOURCE's logits through tempcal (a calibrated model gives its original's)."""
    return run_model_source(path, write_inputs(path.parent / "x.safetensors", torch.from_numpy(x),
                                               torch.from_numpy(Y[: len(x)])),
                            batch_size=4, output_key=key)[0].logits.numpy()


# -- running -------------------------------------------------------------------------------------------------------


def test_runs_in_batches_and_as_a_callable(tmp_path):
    path = gemm_model(tmp_path / "m.onnx")
    got = run(path)
    np.testing.assert_allclose(got, X @ W + B, rtol=1e-5, atol=1e-5)
    assert np.array_equal(got, run_onnx_file(path, X))  # onnxruntime itself, batched or not
    loaded = onnx_runtime.load(path, "cpu")
    assert loaded.format == "onnx" and loaded.temperature is None
    out = loaded.net(torch.from_numpy(X[:5]))
    assert isinstance(out, torch.Tensor) and torch.equal(out, torch.from_numpy(got[:5]))


def test_output_selection_by_name(tmp_path):
    path = two_output_model(tmp_path / "m.onnx")
    with pytest.raises(TempcalError, match=r"returns a dict with keys 'probs', 'logits'; choose the logits with "
                                           r"output_key NAME") as caught:
        run(path)
    one_line(caught.value)
    np.testing.assert_allclose(run(path, key="logits"), X @ W + B, rtol=1e-5, atol=1e-5)
    with pytest.raises(TempcalError, match=r"output_key scores: .*no key 'scores'") as caught:
        run(path, key="scores")
    one_line(caught.value)


def test_wrong_input_dtype_and_shape_name_the_batch(tmp_path):
    path = gemm_model(tmp_path / "m.onnx")
    for bad, match in ((X.astype(np.float64), r"input 'x' takes float32, not float64"),
                       (X[:, :3].copy(), r"input 'x' has shape \['\?', 4\], not \[4, 3\]"),
                       (X[:, :, None].copy(), r"input 'x' has shape")):
        with pytest.raises(TempcalError, match=match) as caught:
            run(path, bad)
        assert "rejects the inputs" in one_line(caught.value) and "on batch 0" in str(caught.value)


def test_models_with_several_inputs_are_refused(tmp_path):
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "two",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3]) for n in ("x", "y")],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])])
    path = tmp_path / "two.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(TempcalError, match=r"takes 2 inputs \('x', 'y'\); tempcal feeds one tensor") as caught:
        onnx_runtime.load(path, "cpu")
    one_line(caught.value)


# -- calibrating -----------------------------------------------------------------------------------------------------


def test_calibrated_outputs_are_exact_and_t_is_stored(tmp_path):
    path = gemm_model(tmp_path / "m.onnx")
    out = tmp_path / "calibrated.onnx"
    assert save_calibrated_model(path, T, out, check_inputs=torch.from_numpy(X)) == out
    original = run_onnx_file(path, X)
    got = run_onnx_file(out, X)  # the saved model as onnxruntime runs it
    assert np.array_equal(got, original / np.float32(T))  # one Div in float32
    assert ulps(got, (original.astype(np.float64) / T).astype(np.float32)) <= 1  # float32 rounding of z / T
    assert metadata_props(out)["tempcal.temperature"] == repr(T)
    info = onnx_graph.inspect_onnx(out)
    assert info.temperature == T and read_model_temperature(out) == T
    assert [o.name for o in info.model.graph.output] == ["logits"]
    (divisor,) = [t for t in info.model.graph.initializer if t.name == "tempcal_temperature"]
    assert numpy_helper.to_array(divisor) == np.float32(T) and divisor.dims == []
    assert np.array_equal(run(out), original)  # as a SOURCE: the original's logits, with T stored


def test_two_outputs_keep_names_order_and_values(tmp_path):
    path = two_output_model(tmp_path / "m.onnx")
    out = tmp_path / "calibrated.onnx"
    save_calibrated_model(path, T, out, output_key="logits", check_inputs=torch.from_numpy(X))
    assert [o.name for o in onnx_graph.inspect_onnx(out).model.graph.output] == ["probs", "logits"]
    assert np.array_equal(run_onnx_file(out, X, "probs"), run_onnx_file(path, X, "probs"))  # softmax of the original
    assert np.array_equal(run_onnx_file(out, X, "logits"), run_onnx_file(path, X, "logits") / np.float32(T))
    with pytest.raises(TempcalError, match="choose the logits with output_key NAME") as caught:
        save_calibrated_model(path, T, tmp_path / "other.onnx")
    one_line(caught.value)
    assert not (tmp_path / "other.onnx").exists()


def test_recalibrating_divides_the_original_once(tmp_path):
    path = two_output_model(tmp_path / "m.onnx")
    first, second, third = tmp_path / "first.onnx", tmp_path / "second.onnx", tmp_path / "third.onnx"
    save_calibrated_model(path, T, first, output_key="logits")
    save_calibrated_model(first, 0.5, second, output_key="logits")
    model = onnx_graph.inspect_onnx(second).model
    assert sum(n.name.startswith(onnx_graph.DIV_NODE) for n in model.graph.node) == 1
    assert len(model.graph.initializer) == 3
    assert np.array_equal(run_onnx_file(second, X, "logits"), run_onnx_file(path, X, "logits") / np.float32(0.5))
    save_calibrated_model(first, 2.0, third, output_key="probs")  # the division moves to the other output
    assert np.array_equal(run_onnx_file(third, X, "logits"), run_onnx_file(path, X, "logits"))


def test_altered_temperature_is_refused(tmp_path):
    """Metadata T and the Div's initializer must agree (as the extra file and buffer of a .pt2)."""
    path = gemm_model(tmp_path / "m.onnx")
    out = tmp_path / "calibrated.onnx"
    save_calibrated_model(path, T, out)
    model = onnx.load(str(out))
    for prop in model.metadata_props:
        if prop.key == "tempcal.temperature":
            prop.value = "2.5"
    altered = tmp_path / "altered.onnx"
    onnx.save_model(model, altered)
    with pytest.raises(TempcalError, match=r"says T = 2\.5 but the model divides by 1\.73") as caught:
        onnx_runtime.load(altered, "cpu")
    one_line(caught.value)


def test_float16_and_double_outputs(tmp_path):
    for elem, dtype in ((TensorProto.FLOAT16, np.float16), (TensorProto.DOUBLE, np.float64)):
        model = onnx_model([helper.make_node("Gemm", ["x", "W", "b"], ["z"], transB=1),
                            helper.make_node("Cast", ["z"], ["logits"], to=elem)],
                           [helper.make_tensor_value_info("logits", elem, ["N", 3])],
                           [numpy_helper.from_array(W.T.copy(), "W"), numpy_helper.from_array(B, "b")], features=4)
        path = tmp_path / f"{dtype.__name__}.onnx"
        onnx.save_model(model, path)
        out = tmp_path / f"{dtype.__name__}-calibrated.onnx"
        save_calibrated_model(path, T, out)
        got, want = run_onnx_file(out, X), run_onnx_file(path, X) / dtype(T)
        assert got.dtype == dtype
        if dtype is np.float64:
            assert np.array_equal(got, want)
        else:  # the runtime's float16 Div may round differently from numpy's: at most one unit in the last place
            assert np.max(np.abs(got.view(np.int16).astype(int) - want.view(np.int16).astype(int))) <= 1


def test_integer_output_is_refused(tmp_path):
    model = onnx_model([helper.make_node("Gemm", ["x", "W", "b"], ["z"], transB=1),
                        helper.make_node("ArgMax", ["z"], ["label"], axis=1)],
                       [helper.make_tensor_value_info("label", TensorProto.INT64, ["N", 1])],
                       [numpy_helper.from_array(W.T.copy(), "W"), numpy_helper.from_array(B, "b")], features=4)
    path = tmp_path / "argmax.onnx"
    onnx.save_model(model, path)
    with pytest.raises(TempcalError, match="INT64") as caught:
        save_calibrated_model(path, T, tmp_path / "out.onnx")
    one_line(caught.value)
    assert not (tmp_path / "out.onnx").exists()


def test_external_data_runs_and_is_copied_beside_the_output(tmp_path):
    path = external_onnx(tmp_path / "release", W, B)
    assert onnx_graph.inspect_onnx(path).external == (("W", "weights.bin"),)
    np.testing.assert_allclose(run(path), X @ W + B, rtol=1e-5, atol=1e-5)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "calibrated.onnx"
    save_calibrated_model(path, T, out, check_inputs=torch.from_numpy(X))
    assert sorted(p.name for p in out.parent.iterdir()) == ["calibrated.onnx", "calibrated.onnx.data"]
    original = run_onnx_file(path, X)
    (tmp_path / "release" / "weights.bin").unlink()  # the calibrated model does not need the original's files
    assert np.array_equal(run_onnx_file(out, X), original / np.float32(T))
    assert np.array_equal(run(out), original)


def test_the_write_is_atomic(tmp_path, monkeypatch):
    path = gemm_model(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous")
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def recording(src, dst):
        renames.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording)
    save_calibrated_model(path, T, out)
    ((src, dst),) = renames
    assert Path(src).parent == tmp_path and Path(dst) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]
    # a division that does not reproduce logits / T: refused, nothing written
    out.write_bytes(b"previous")
    real_add = onnx_graph.add_division
    monkeypatch.setattr(onnx_runtime, "add_division", lambda m, o, t, label="": real_add(m, o, t * 1.01, label))
    with pytest.raises(TempcalError, match="does not reproduce its logits divided by T; nothing written") as caught:
        save_calibrated_model(path, T, out)
    one_line(caught.value)
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]


def test_with_external_data_nothing_changes_unless_both_files_are_written(tmp_path, monkeypatch):
    path = external_onnx(tmp_path / "release", W, B)
    out = tmp_path / "release" / "out.onnx"
    out.write_bytes(b"previous")

    def failing(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing)  # the first rename (the model's) fails: OUT.data is never renamed
    with pytest.raises(TempcalError, match="No space left on device") as caught:
        save_calibrated_model(path, T, out)
    one_line(caught.value)
    monkeypatch.undo()
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx", "out.onnx", "weights.bin"]


# -- external data that leaves the folder: refused, never read ---------------------------------------------------------


@pytest.fixture
def opened_paths():
    """Paths opened by Python code during the test (an audit hook; hooks cannot be removed, so it is gated)."""
    seen: list[str] = []
    state = {"on": True}

    def hook(event: str, args: tuple) -> None:
        if state["on"] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            seen.append(os.fsdecode(args[0]))

    sys.addaudithook(hook)
    yield seen
    state["on"] = False


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "nested-dotdot"])
def test_traversal_is_refused_and_the_outside_file_never_read(tmp_path, how, opened_paths):
    outside = tmp_path / "outside.bin"
    os.mkfifo(outside)  # opening it for reading would block: any read of it hangs the test
    folder = tmp_path / "release"
    folder.mkdir()
    location = {"dotdot": "../outside.bin", "absolute": str(outside), "symlink": "link.bin",
                "nested-dotdot": "sub/../../outside.bin"}[how]
    if how == "symlink":
        (folder / "link.bin").symlink_to(outside)
    path = external_onnx(folder, W, B, location, write_data=False)
    inputs = write_inputs(folder / "x.safetensors", torch.from_numpy(X), torch.from_numpy(Y))
    for attempt in (lambda: onnx_graph.inspect_onnx(path), lambda: onnx_runtime.load(path, "cpu"),
                    lambda: run_model_source(path, inputs),
                    lambda: save_calibrated_model(path, T, folder / "out.onnx")):
        with pytest.raises(TempcalError, match="tensor 'W' has external data at") as caught:
            attempt()
        message = one_line(caught.value)
        assert "refused" in message and location in message
    assert not any(os.path.realpath(p) == str(outside) for p in opened_paths)
    assert not (folder / "out.onnx").exists()


def test_missing_external_file(tmp_path):
    path = external_onnx(tmp_path / "release", W, B, write_data=False)
    with pytest.raises(TempcalError, match="no such file in the model's folder") as caught:
        onnx_runtime.load(path, "cpu")
    one_line(caught.value)


# -- damaged files -------------------------------------------------------------------------------------------------


def test_truncated_and_corrupted_models_are_one_line_or_run(tmp_path):
    data = two_output_model(tmp_path / "m.onnx").read_bytes()
    rng = random.Random(15)
    cases = [data[:cut] for cut in (0, 1, 10, len(data) // 4, len(data) // 2, len(data) - 7, len(data) - 1)]
    for _ in range(40):
        blob = bytearray(data)
        blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        cases.append(bytes(blob))
    refused = 0
    for body in cases:
        damaged = tmp_path / "damaged.onnx"
        damaged.write_bytes(body)
        for attempt in (lambda d=damaged: run(d, key="logits"),
                        lambda d=damaged: save_calibrated_model(d, T, tmp_path / "out.onnx", output_key="logits")):
            try:
                attempt()
            except TempcalError as exc:
                one_line(exc)
                refused += 1
        (tmp_path / "out.onnx").unlink(missing_ok=True)  # a flip in a weight still gives a (different) model
    assert refused > 20


def test_not_onnx(tmp_path):
    for name, data in (("text.onnx", b"hello, world\n" * 10), ("empty.onnx", b"")):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(TempcalError, match="ONNX model") as caught:
            onnx_runtime.load(path, "cpu")
        one_line(caught.value)
    with pytest.raises(TempcalError, match="no such file"):
        onnx_runtime.load(tmp_path / "absent.onnx", "cpu")


# -- what onnxruntime cannot do; the optional extra ------------------------------------------------------------------


def test_odin_needs_gradients_so_onnx_is_refused(tmp_path):
    path = gemm_model(tmp_path / "m.onnx")
    with pytest.raises(TempcalError, match=r"odin_eps: ODIN steps along the gradient.*ONNX model") as caught:
        odin_scores(path, torch.from_numpy(X), tau=1.0, eps=0.01, device="cpu")
    one_line(caught.value)


@pytest.mark.parametrize("package", ["onnxruntime", "onnx"])
def test_missing_extra_says_how_to_install(tmp_path, monkeypatch, package):
    path = gemm_model(tmp_path / "m.onnx")
    inputs = write_inputs(tmp_path / "x.safetensors", torch.from_numpy(X), torch.from_numpy(Y))
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` raise ImportError
    for attempt in (lambda: onnx_runtime.load(path, "cpu"), lambda: run_model_source(path, inputs),
                    lambda: save_calibrated_model(path, T, tmp_path / "o.onnx"),
                    lambda: read_model_temperature(path)):
        with pytest.raises(TempcalError, match=r"pip install 'tempcal\[onnx\]'") as caught:
            attempt()
        assert f"the '{package}' package is not installed" in one_line(caught.value)
    assert not (tmp_path / "o.onnx").exists()


def test_the_extra_is_declared_and_in_dev():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("onnx", "dev"):
        assert {"onnx>=1.16", "onnxruntime>=1.21"} <= set(extras[extra]), extra


def test_the_digits_mlp_as_onnx_gives_its_logits(digits, tmp_path):
    path = onnx_mlp(digits["mlp"], tmp_path / "digits.onnx")
    data, stored = run_model_source(path, digits["inputs"])
    with torch.no_grad():
        want = digits["mlp"](digits["x"])
    assert stored is None and torch.equal(data.labels, digits["y"])
    torch.testing.assert_close(data.logits, want, rtol=1e-5, atol=1e-5)

"""Sizes a model file declares are bounded before anything is read or allocated (.pt2 members, ONNX tensors), and the
sample inputs of a .pt2 are judged by torch's own weights-only rules. Every file is a real archive or model, then
altered the way a damaged or hostile one would be."""

from __future__ import annotations

import collections
import datetime
import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import Evil
from model_builders import MLP, SAMPLE_INPUTS, external_onnx, onnx_model, read_member, rewrite_zip, save_program
from onnx import TensorProto, helper, numpy_helper

from tempcal.errors import TempcalError
from tempcal.models import export, onnx_graph, pt2_archive


@pytest.fixture(scope="module")
def mlp_pt2(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_program(MLP(), torch.randn(4, 8), tmp_path_factory.mktemp("sizes") / "mlp.pt2")


def _declare_size(path: Path, target: Path, short: str, size: int) -> Path:
    """A copy of the zip whose central directory declares ``size`` bytes (stored and compressed) for one member."""
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/" + short)).encode()
    entry = -1
    while True:
        entry = blob.index(b"PK\x01\x02", entry + 1)
        length = struct.unpack_from("<H", blob, entry + 28)[0]
        if bytes(blob[entry + 46:entry + 46 + length]) == name:
            break
    struct.pack_into("<II", blob, entry + 20, size, size)
    target.write_bytes(bytes(blob))
    return target


def test_a_member_declared_past_the_end_of_the_file_is_refused_before_any_read(mlp_pt2, tmp_path, monkeypatch):
    hostile = _declare_size(mlp_pt2, tmp_path / "big.pt2", "data/weights/weight_0", 0x7FFF0000)
    opened = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, name, *a, **k: (opened.append(name),
                                                                               real_open(self, name, *a, **k))[1])
    with pytest.raises(TempcalError, match=r"member 'data/weights/weight_0' declares 2147418112 bytes at offset \d+, "
                                           r"past the end of the file \(\d+ bytes\)") as caught:
        export.load(hostile, "cpu")
    assert "\n" not in str(caught.value) and opened == []


def test_text_and_json_members_are_read_below_a_limit(mlp_pt2, monkeypatch):
    monkeypatch.setattr(pt2_archive, "_JSON_LIMIT", 64)
    size = len(read_member(mlp_pt2, "data/weights/model_weights_config.json"))
    with pytest.raises(TempcalError, match=rf"^\S+: member 'data/weights/model_weights_config\.json' declares {size} "
                                           r"bytes, more than the 64 tempcal reads for it; refused$"):
        export.load_program(mlp_pt2)


def test_compressed_records_inside_the_sample_inputs_are_refused(mlp_pt2, tmp_path):
    """torch.save stores its records; a deflated one (a zip bomb, say) is refused, never inflated."""
    inner = io.BytesIO()
    torch.save(((torch.zeros(1000),), {}), inner)
    deflated = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(inner.getvalue())) as source, \
            zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info))
    hostile = rewrite_zip(mlp_pt2, tmp_path / "deflated.pt2", replace={SAMPLE_INPUTS: deflated.getvalue()})
    with pytest.raises(TempcalError, match=r"data/sample_inputs/model\.pt': record 'archive/data\.pkl' is compressed"):
        export.load_program(hostile)


Pair = collections.namedtuple("Pair", "a b")


def _tensor_with_attribute() -> torch.Tensor:
    x = torch.ones(2, 3)
    x._specialize_on = {0: []}  # what torch.export attaches with Dim.DYNAMIC
    return x


SAMPLES = {
    "tensors": lambda: ((torch.ones(2, 3),), {}),
    "tensor with attributes": lambda: ((_tensor_with_attribute(),), {}),
    "parameter and dicts": lambda: ((torch.nn.Parameter(torch.ones(2)),), {"a": collections.OrderedDict(b=1)}),
    "sets, bytes, complex": lambda: (({1, 2}, b"raw", 1 + 2j), {}),
    "a namedtuple": lambda: ((Pair(1, 2),), {}),
    "a datetime": lambda: ((datetime.date(2024, 1, 1),), {}),
    "a payload": lambda: ((Evil("/nonexistent/never-written"),), {}),
}


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_sample_inputs_pass_exactly_when_torch_weights_only_load_does(mlp_pt2, tmp_path, kind):
    buffer = io.BytesIO()
    torch.save(SAMPLES[kind](), buffer)
    blob = buffer.getvalue()
    try:
        torch.load(io.BytesIO(blob), weights_only=True)
        torch_accepts = True
    except Exception:  # torch's weights-only unpickler refuses it
        torch_accepts = False
    archive = rewrite_zip(mlp_pt2, tmp_path / "sample.pt2", replace={SAMPLE_INPUTS: blob})
    try:
        export.load_program(archive)
        tempcal_accepts = True
    except TempcalError as exc:
        assert "data/sample_inputs/model.pt" in str(exc) and "weights-only" in str(exc)
        tempcal_accepts = False
    assert tempcal_accepts == torch_accepts
    assert torch_accepts == (kind not in ("a namedtuple", "a datetime", "a payload"))


# -- ONNX: tensors whose dims claim more data than they hold ------------------------------------------------------


def test_onnx_tensor_dims_beyond_its_data_are_refused(tmp_path):
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    weight.dims[:] = [4, 3_000_000_000]  # 48 GB by its dims, 48 bytes of data
    model = onnx_model([helper.make_node("MatMul", ["x", "W"], ["logits"])],
                       [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], [weight],
                       features=4, check=False)
    path = tmp_path / "dims.onnx"
    onnx.save_model(model, path)
    with pytest.raises(TempcalError, match=r"tensor 'W' declares dims \[4, 3000000000\] \(12000000000 values, "
                                           r"48000000000 bytes\) but holds 48 bytes"):
        onnx_graph.inspect_onnx(path)
    typed = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], np.ones(12, np.float32).tolist())
    typed.dims[:] = [4, 300]
    model = onnx_model([helper.make_node("MatMul", ["x", "W"], ["logits"])],
                       [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 300])], [typed],
                       features=4, check=False)
    onnx.save_model(model, path)
    with pytest.raises(TempcalError, match=r"tensor 'W' declares dims \[4, 300\] .* but holds 12 values"):
        onnx_graph.inspect_onnx(path)


def test_onnx_external_dims_beyond_the_stored_length_are_refused(tmp_path):
    weight, bias = np.ones((4, 3), np.float32), np.zeros(3, np.float32)
    path = external_onnx(tmp_path / "ext", weight, bias)
    model = onnx.load(str(path), load_external_data=False)
    model.graph.initializer[0].dims[:] = [4, 3_000_000]
    path.write_bytes(model.SerializeToString())
    with pytest.raises(TempcalError, match=r"tensor 'W' has external data at 'weights\.bin': its dims \[4, 3000000\] "
                                           r"imply 48000000 bytes but the file holds 48 there"):
        onnx_graph.inspect_onnx(path)


def test_onnx_models_holding_their_data_still_load(tmp_path):
    """Every way a tensor holds its data: raw bytes, typed values, float16 in int32 fields, external data."""
    half = helper.make_tensor("H", TensorProto.FLOAT16, [3], np.ones(3, np.float16).view(np.uint16).tolist())
    model = onnx_model([helper.make_node("Cast", ["H"], ["h"], to=TensorProto.FLOAT),
                        helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "h"],
                                                                                          ["logits"])],
                       [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
                       [numpy_helper.from_array(np.ones((4, 3), np.float32), "W"), half], features=4)
    onnx.save_model(model, tmp_path / "ok.onnx")
    assert [o.name for o in onnx_graph.inspect_onnx(tmp_path / "ok.onnx").model.graph.output] == ["logits"]
    assert onnx_graph.inspect_onnx(external_onnx(tmp_path / "ext", np.ones((4, 3)), np.zeros(3))).external

"""Bad input to ``tempcal fit``: exit status 2, one ``error:`` line naming the problem, nothing written or changed."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest
import torch
from conftest import overconfident, overconfident_binary, raw_safetensors, snapshot, write_shards
from safetensors.torch import save_file

from tempcal.cli.main import main

N = 400  # samples of overconfident()


def assert_bad_input(tmp_path: Path, cli, argv: list[str], details: list[str]) -> str:
    """Run ``tempcal`` and check the contract for bad input; returns the error line."""
    before = snapshot(tmp_path)
    code, out, err = cli(argv)
    assert code == 2, (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert err.endswith("\n")
    line = lines[0]
    assert line.startswith("error:"), line
    for detail in details:
        assert detail in line, (detail, line)
    # Nothing written or changed: same files with the same bytes, no temporary files left behind.
    assert snapshot(tmp_path) == before
    return line


def assert_accepted(tmp_path: Path, cli, argv: list[str]) -> None:
    before = snapshot(tmp_path)
    code, out, err = cli(argv)
    assert code == 0, (code, out, err)
    assert "error" not in err
    if "--no-write" in argv:
        assert snapshot(tmp_path) == before


# -- files that are not (valid) safetensors -----------------------------------------------------------------


def _valid_bytes(tmp_path: Path) -> bytes:
    logits, labels = overconfident(8)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    save_file({"logits": logits, "labels": labels}, str(scratch / "v.safetensors"))
    data = (scratch / "v.safetensors").read_bytes()
    (scratch / "v.safetensors").unlink()
    scratch.rmdir()
    return data


def _logits_labels_header(logits_offsets, labels_offsets, *, logits_shape=(4, 2), labels_shape=(4,)) -> dict:
    return {
        "logits": {"dtype": "F32", "shape": list(logits_shape), "data_offsets": list(logits_offsets)},
        "labels": {"dtype": "I64", "shape": list(labels_shape), "data_offsets": list(labels_offsets)},
    }


def _random_text(tmp_path):
    return b"These are not the logits you are looking for.\n" * 20, ["not a safetensors file"]


def _empty(tmp_path):
    return b"", ["not a safetensors file", "0 bytes"]


def _short(tmp_path):
    return b"\x10\x00\x00", ["not a safetensors file", "3 bytes"]


def _truncated(tmp_path):
    data = _valid_bytes(tmp_path)
    # the last tensor in the file is the one that ends at the (now missing) last bytes
    return data[:-5], ["truncated", "data ends at byte"]


def _header_length_lies(tmp_path):
    body = raw_safetensors(_logits_labels_header([0, 32], [32, 64]), b"\0" * 64, length=10_000)
    return body, ["header claims 10000 bytes"]


def _header_not_json(tmp_path):
    text = b"{this is not json}   "
    return struct.pack("<Q", len(text)) + text + b"\0" * 16, ["not a safetensors file", "JSON"]


def _header_not_object(tmp_path):
    text = b"[1, 2, 3]"
    return struct.pack("<Q", len(text)) + text, ["not a safetensors file", "JSON object"]


def _offsets_beyond_data(tmp_path):
    # labels claim bytes 32..64 but only 40 data bytes follow the header
    return raw_safetensors(_logits_labels_header([0, 32], [32, 64]), b"\0" * 40), ["'labels'", "64", "40"]


def _shape_bytes_mismatch(tmp_path):
    # logits [4, 2] float32 need 32 bytes; the offsets give 16
    return raw_safetensors(_logits_labels_header([0, 16], [16, 48]), b"\0" * 48), ["'logits'", "32", "16"]


def _overlapping(tmp_path):
    return raw_safetensors(_logits_labels_header([0, 32], [16, 48]), b"\0" * 48), ["'logits'", "'labels'", "overlap"]


def _gap_between_tensors(tmp_path):
    # passes tempcal's own header checks (no overlap, inside the file) but safetensors refuses holes
    return raw_safetensors(_logits_labels_header([0, 32], [40, 72]), b"\0" * 72), ["cannot read tensor"]


def _trailing_bytes(tmp_path):
    return raw_safetensors(_logits_labels_header([0, 32], [32, 64]), b"\0" * 80), ["cannot read tensor"]


def _unknown_dtype(tmp_path):
    header = _logits_labels_header([0, 32], [32, 64])
    header["logits"]["dtype"] = "F128"
    return raw_safetensors(header, b"\0" * 64), ["'logits'", "F128"]


def _metadata_not_strings(tmp_path):
    header = _logits_labels_header([0, 32], [32, 64])
    header["__metadata__"] = {"tempcal.temperature": 2.0}
    return raw_safetensors(header, b"\0" * 64), ["metadata"]


RAW_CASES = [
    pytest.param(_random_text, id="random-text"),
    pytest.param(_empty, id="empty-file"),
    pytest.param(_short, id="shorter-than-length-field"),
    pytest.param(_truncated, id="truncated"),
    pytest.param(_header_length_lies, id="header-length-lies"),
    pytest.param(_header_not_json, id="header-not-json"),
    pytest.param(_header_not_object, id="header-not-object"),
    pytest.param(_offsets_beyond_data, id="offsets-beyond-data"),
    pytest.param(_shape_bytes_mismatch, id="shape-bytes-mismatch"),
    pytest.param(_overlapping, id="overlapping-tensors"),
    pytest.param(_gap_between_tensors, id="gap-between-tensors"),
    pytest.param(_trailing_bytes, id="trailing-bytes"),
    pytest.param(_unknown_dtype, id="unknown-dtype"),
    pytest.param(_metadata_not_strings, id="metadata-not-strings"),
]


@pytest.mark.parametrize("build", RAW_CASES)
def test_malformed_file_is_refused(tmp_path, cli, build):
    body, details = build(tmp_path)
    path = tmp_path / "bad.safetensors"
    path.write_bytes(body)
    line = assert_bad_input(tmp_path, cli, ["fit", str(path)], details)
    assert str(path) in line


def test_missing_file(tmp_path, cli):
    path = tmp_path / "nope.safetensors"
    line = assert_bad_input(tmp_path, cli, ["fit", str(path)], [str(path)])
    assert "no such file" in line.lower()
    assert not path.exists()


def test_directory(tmp_path, cli):
    path = tmp_path / "folder.safetensors"
    path.mkdir()
    assert_bad_input(tmp_path, cli, ["fit", str(path)], [str(path), "not a regular file"])


# -- valid safetensors holding bad tensors -------------------------------------------------------------------


def _with(**changes):
    logits, labels = overconfident()
    tensors = {"logits": logits.clone(), "labels": labels.clone()}
    for key, value in changes.items():
        tensors[key] = value(tensors) if callable(value) else value
    return tensors


def _set(tensor: torch.Tensor, items) -> torch.Tensor:
    tensor = tensor.clone()
    for index, value in items:
        tensor[index] = value
    return tensor


def _true_class_neginf(t):
    z = t["logits"].clone()
    for i in (13, 99):
        z[i, t["labels"][i]] = -math.inf
    return z


def _bad_probs(t):
    p = torch.softmax(t["logits"], 1)
    for i in (4, 7, 300):
        p[i] *= 0.5
    return p


def _binary(labels_changes=()):
    logits, labels = overconfident_binary()
    return {"logits": logits, "labels": _set(labels, labels_changes)}


def _binary_n1(labels_changes=()):
    logits, labels = overconfident_binary()
    return {"logits": logits[:, None].contiguous(), "labels": _set(labels, labels_changes)}


def _small(n):
    logits, labels = overconfident(n)
    return {"logits": logits, "labels": labels}


TENSOR_CASES = [
    # (tensors, extra arguments, details the one-line error must contain)
    pytest.param(lambda: {"scores": overconfident()[0], "labels": overconfident()[1]}, [],
                 ["'logits'", "'scores'", "'labels'", "--logits-key"], id="missing-logits-key"),
    pytest.param(lambda: {"logits": overconfident()[0], "target": overconfident()[1]}, [],
                 ["'labels'", "'target'", "'logits'", "--labels-key"], id="missing-labels-key"),
    pytest.param(lambda: _with(), ["--logits-key", "scores"], ["'scores'", "'logits'", "--logits-key"],
                 id="renamed-logits-key-missing"),
    pytest.param(lambda: _with(logits=lambda t: t["logits"].reshape(100, 4, 5), labels=lambda t: t["labels"][:100]),
                 [], ["'logits'", "[100, 4, 5]"], id="logits-3d"),
    pytest.param(lambda: _with(labels=lambda t: t["labels"].reshape(200, 2)), [], ["'labels'", "[200, 2]"],
                 id="labels-2d"),
    pytest.param(lambda: _with(labels=lambda t: t["labels"].float()), [], ["'labels'", "float32", "integer"],
                 id="float-labels"),
    pytest.param(lambda: _with(logits=lambda t: (10 * t["logits"]).long()), [], ["'logits'", "int64"],
                 id="int64-logits"),
    pytest.param(lambda: _with(logits=lambda t: t["logits"].to(torch.int32)), [], ["'logits'", "int32"],
                 id="int32-logits"),
    pytest.param(lambda: _with(labels=lambda t: _set(t["labels"], [(5, 7), (9, -1)])), [],
                 ["2 labels outside 0..4", "first at index 5"], id="labels-out-of-range"),
    pytest.param(lambda: _with(labels=lambda t: _set(t["labels"], [(17, 5)])), [],
                 ["1 label outside 0..4", "first at index 17"], id="label-equal-to-num-classes"),
    pytest.param(lambda: _with(logits=lambda t: _set(t["logits"], [((7, 2), math.nan), ((20, 0), math.nan),
                                                                     ((20, 1), math.nan), ((333, 4), math.nan)])),
                 [], ["3 rows with NaN", "first at index 7"], id="nan-logits"),
    pytest.param(lambda: _with(logits=lambda t: _set(t["logits"], [((11, 3), math.inf), ((300, 0), math.inf)])),
                 [], ["2 rows with +inf", "first at index 11"], id="posinf-logits"),
    pytest.param(lambda: _with(logits=lambda t: _set(t["logits"], [(42, -math.inf)])), [],
                 ["1 row whose logits are all -inf", "first at index 42"], id="row-all-neginf"),
    pytest.param(lambda: _with(logits=_true_class_neginf), [],
                 ["2 rows whose true class has logit -inf", "first at index 13"], id="true-class-neginf"),
    pytest.param(lambda: _with(labels=lambda t: t["labels"][:397].clone()), [], ["400", "397"],
                 id="length-mismatch"),
    pytest.param(lambda: _binary([(3, 2), (8, 2)]), [], ["2 labels outside 0..1", "first at index 3"],
                 id="binary-label-2"),
    pytest.param(lambda: _binary_n1([(6, -1)]), [], ["1 label outside 0..1", "first at index 6"],
                 id="binary-n1-label-minus-1"),
    pytest.param(lambda: _binary() | {"logits": _set(overconfident_binary()[0], [(12, math.nan)])}, [],
                 ["1 row with NaN", "first at index 12"], id="binary-nan"),
    pytest.param(lambda: _small(3), ["--val-fraction", "0.3"], ["1 sample", "at least 2"],
                 id="one-fitting-sample-of-three"),
    pytest.param(lambda: _small(1), ["--val-fraction", "1.0"], ["1 sample", "at least 2"], id="one-sample-file"),
    pytest.param(lambda: _small(0), [], [], id="zero-samples"),
    pytest.param(lambda: _with(), ["--val-fraction", "0"], ["--val-fraction", "0"], id="val-fraction-0"),
    pytest.param(lambda: _with(), ["--val-fraction", "1.5"], ["--val-fraction", "1.5"], id="val-fraction-1.5"),
    pytest.param(lambda: _with(), ["--val-fraction", "-0.5"], ["--val-fraction"], id="val-fraction-negative"),
    pytest.param(lambda: _with(), ["--val-fraction", "nan"], ["--val-fraction"], id="val-fraction-nan"),
    pytest.param(lambda: _with(), ["--no-write", "--output", "OUT"], ["--output", "--no-write"],
                 id="output-with-no-write"),
    pytest.param(lambda: _with(logits=_bad_probs), ["--probs"], ["3 rows", "row 4", "sum to 1"],
                 id="probs-rows-not-summing-to-1"),
    pytest.param(lambda: _with(logits=lambda t: torch.softmax(t["logits"], 1) * 1.5), ["--probs"],
                 ["--probs", "outside [0, 1]"], id="probs-values-above-1"),
    pytest.param(lambda: _with(), ["--max-ece", "-0.1"], ["--max-ece"], id="max-ece-negative"),
    pytest.param(lambda: _with(), ["--bins", "0"], ["--bins"], id="bins-0"),
    pytest.param(lambda: _with(), ["--objective", "mse"], ["--objective"], id="unknown-objective"),
    pytest.param(lambda: _with(), ["--no-such-option"], ["--no-such-option"], id="unknown-option"),
    pytest.param(lambda: _with(), ["--eval", "MISSING"], ["no such file"], id="eval-file-missing"),
    pytest.param(lambda: _with(), ["--device", "nonsense"], ["--device", "nonsense"], id="device-nonsense"),
    pytest.param(lambda: _with(), ["--device", "cuda"], ["--device", "cuda", "CUDA"], id="device-cuda",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
]


@pytest.mark.parametrize(("build", "extra", "details"), TENSOR_CASES)
def test_bad_tensors_are_refused(tmp_path, cli, build, extra, details):
    path = tmp_path / "bad.safetensors"
    save_file(build(), str(path))
    extra = [str(tmp_path / a) if a in ("OUT", "MISSING") else a for a in extra]
    assert_bad_input(tmp_path, cli, ["fit", str(path), *extra], details)


def test_eval_file_with_other_class_count(tmp_path, cli):
    logits, labels = overconfident()
    source, other = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"logits": logits, "labels": labels}, str(source))
    z, y = overconfident(50, 7, seed=1)
    save_file({"logits": z, "labels": y}, str(other))
    assert_bad_input(tmp_path, cli, ["fit", str(source), "--eval", str(other)], ["7", "5"])


def test_bad_eval_file_values_are_refused(tmp_path, cli):
    logits, labels = overconfident()
    source, other = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"logits": logits, "labels": labels}, str(source))
    z, y = overconfident(50, seed=1)
    z[31, 0] = math.nan
    save_file({"logits": z, "labels": y}, str(other))
    assert_bad_input(tmp_path, cli, ["fit", str(source), "--eval", str(other)], ["1 row with NaN", "index 31"])


def test_bad_eval_file_values_name_the_file(tmp_path, cli):
    logits, labels = overconfident()
    source, other = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"logits": logits, "labels": labels}, str(source))
    z, y = overconfident(50, seed=1)
    z[31, 0] = math.nan
    save_file({"logits": z, "labels": y}, str(other))
    assert_bad_input(tmp_path, cli, ["fit", str(source), "--eval", str(other)], [str(other), "index 31"])


@pytest.mark.parametrize("device", [
    pytest.param("mps", marks=pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS works here")),
    "meta",
    "xla",
])
def test_unusable_device_is_usage_error(tmp_path, cli, device):
    logits, labels = overconfident()
    path = tmp_path / "a.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    assert_bad_input(tmp_path, cli, ["fit", str(path), "--device", device], ["--device", device])


def test_output_into_missing_folder(tmp_path, cli):
    logits, labels = overconfident()
    source = tmp_path / "a.safetensors"
    save_file({"logits": logits, "labels": labels}, str(source))
    target = tmp_path / "no" / "such" / "folder" / "out.safetensors"
    assert_bad_input(tmp_path, cli, ["fit", str(source), "--output", str(target)], [str(target)])


def test_output_is_a_folder(tmp_path, cli):
    logits, labels = overconfident()
    source = tmp_path / "a.safetensors"
    save_file({"logits": logits, "labels": labels}, str(source))
    (tmp_path / "dest").mkdir()
    assert_bad_input(tmp_path, cli, ["fit", str(source), "--output", str(tmp_path / "dest")], ["dest"])


def test_model_source_without_support_is_usage_error(tmp_path, cli):
    path = tmp_path / "model.pt"
    path.write_bytes(b"not really a model")
    assert_bad_input(tmp_path, cli, ["fit", str(path)], [str(path)])


# -- what the contract allows must be accepted ---------------------------------------------------------------


def _neginf_in_other_classes():
    logits, labels = overconfident()
    z = logits.clone()
    g = torch.Generator().manual_seed(3)
    impossible = torch.rand(z.shape, generator=g) < 0.3
    impossible[torch.arange(N), labels] = False
    impossible[0] = True  # every class but the true one is impossible in row 0
    impossible[0, labels[0]] = False
    return {"logits": z.masked_fill(impossible, -math.inf), "labels": labels}


VALID_CASES = [
    pytest.param(lambda: _with(), id="float32-int64"),
    pytest.param(lambda: _with(logits=lambda t: t["logits"].half(), labels=lambda t: t["labels"].int()),
                 id="float16-int32"),
    pytest.param(lambda: _with(logits=lambda t: t["logits"].bfloat16(), labels=lambda t: t["labels"].to(torch.uint8)),
                 id="bfloat16-uint8"),
    pytest.param(lambda: _with(logits=lambda t: t["logits"].double(), labels=lambda t: t["labels"].to(torch.int16)),
                 id="float64-int16"),
    pytest.param(lambda: _binary(), id="binary-[N]"),
    pytest.param(lambda: _binary_n1(), id="binary-[N,1]"),
    pytest.param(_neginf_in_other_classes, id="neginf-in-non-true-classes"),
]


@pytest.mark.parametrize("build", VALID_CASES)
def test_valid_file_is_accepted(tmp_path, cli, build):
    path = tmp_path / "good.safetensors"
    save_file(build(), str(path))
    assert_accepted(tmp_path, cli, ["fit", str(path), "--no-write"])


def test_valid_file_with_other_keys_is_accepted(tmp_path, cli):
    logits, labels = overconfident()
    path = tmp_path / "good.safetensors"
    save_file({"z": logits, "y": labels, "extra": torch.zeros(3)}, str(path))
    assert_accepted(tmp_path, cli, ["fit", str(path), "--no-write", "--logits-key", "z", "--labels-key", "y"])


def test_two_samples_with_full_fraction_are_accepted(tmp_path, cli):
    path = tmp_path / "tiny.safetensors"
    save_file({"logits": torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "labels": torch.tensor([0, 0])}, str(path))
    assert_accepted(tmp_path, cli, ["fit", str(path), "--no-write", "--val-fraction", "1.0"])


def test_valid_file_is_accepted_and_written(tmp_path, cli):
    """The helpers build files tempcal accepts, and a write-back leaves no stray file."""
    path = tmp_path / "good.safetensors"
    save_file(_with(), str(path))
    assert_accepted(tmp_path, cli, ["fit", str(path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.safetensors"]


# -- shards -----------------------------------------------------------------------------------------------------


def test_glob_without_match_and_mixed_shards_are_bad_input(tmp_path, capsys):
    assert main(["fit", str(tmp_path / "nothing-*.safetensors")]) == 2
    assert "no file matches" in capsys.readouterr().err
    write_shards(tmp_path, [50], c=4)
    other = tmp_path / "other.safetensors"
    save_file({"logits": torch.randn(30, 5), "labels": torch.zeros(30, dtype=torch.long)}, str(other))
    assert main(["fit", str(tmp_path / "part-00.safetensors"), str(other), "--no-write"]) == 2
    assert "unlike the shards before it" in capsys.readouterr().err

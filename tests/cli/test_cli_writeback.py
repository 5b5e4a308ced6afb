"""``tempcal fit`` writes T into the metadata (tensors byte-identical, failures change nothing); its JSON and gate."""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import assert_one_error_line, fail_after_partial_copy, files_in, no_duplicates, overconfident
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import tempcal.io.paths
import tempcal.io.safetensors_header

KEY = "tempcal.temperature"
METRICS = ("nll", "ece", "mce", "brier", "accuracy")


def split(raw: bytes) -> tuple[dict, bytes]:
    """(header JSON, data section) of safetensors bytes; duplicate JSON keys are an error."""
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length], object_pairs_hook=no_duplicates), raw[8 + length :]


def metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def assert_same_tensors(a: Path, b: Path) -> None:
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and ta[name].shape == tb[name].shape
        assert torch.equal(ta[name].view(torch.uint8), tb[name].view(torch.uint8)), name


# -- (a) in-place write-back ---------------------------------------------------------------------------------


def test_fit_writes_temperature_and_keeps_everything_else(tmp_path, source, cli):
    original = source.read_bytes()
    reference = tmp_path / "reference.safetensors"
    reference.write_bytes(original)
    code, _, err = cli(["fit", str(source), "--json", str(tmp_path / "out.json")])
    assert code == 0, err
    report = json.loads((tmp_path / "out.json").read_text())

    raw = source.read_bytes()
    old_header, old_data = split(original)
    new_header, new_data = split(raw)
    assert new_data == old_data  # the data section is copied byte for byte
    assert (len(raw) - len(new_data) - 8) % 8 == 0  # JSON header padded to 8-byte alignment
    meta = new_header.pop("__metadata__")
    old_meta = old_header.pop("__metadata__")
    assert new_header == old_header  # every tensor entry (dtype, shape, offsets) unchanged
    assert meta == old_meta | {KEY: meta[KEY], "tempcal.split": meta["tempcal.split"]}
    split_json = json.loads(meta["tempcal.split"])  # the rows that fitted T, beside it
    assert split_json["fit"] == "split" and split_json["n_fit"] == report["n_fit"]
    assert split_json["rows"] == report["n_fit"] + report["n_eval"]

    text = meta[KEY]
    assert isinstance(text, str)
    assert float(text) == report["temperature"]  # exactly, not approximately
    assert float(text) > 0
    assert 2.0 < float(text) < 4.5  # overconfident by about 3x

    assert metadata(source) == {"model": "resnet-18", "split": "val", KEY: text, "tempcal.split": meta["tempcal.split"]}
    with safe_open(str(source), framework="pt") as f:
        assert sorted(f.keys()) == ["features", "labels", "logits"]
    assert_same_tensors(source, reference)
    assert report["written"] == str(source)
    assert files_in(tmp_path) == ["logits.safetensors", "out.json", "reference.safetensors"]


def test_temperature_string_round_trips_through_the_cli_output(tmp_path, source, cli):
    code, out, _ = cli(["fit", str(source), "--json", "-"])
    assert code == 0
    assert metadata(source)[KEY] == repr(json.loads(out)["temperature"])


def test_symlinked_source_is_written_through_or_refused(tmp_path, cli):
    logits, labels = overconfident()
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "real.safetensors"
    save_file({"logits": logits, "labels": labels}, str(real))
    original = real.read_bytes()
    link = tmp_path / "link.safetensors"
    link.symlink_to(real)
    code, _, err = cli(["fit", str(link)])
    if code == 2:  # refusing is fine, as long as nothing changed
        assert_one_error_line(err, str(link))
        assert real.read_bytes() == original
    else:  # writing is fine, as long as it goes into the file the link points to
        assert code == 0, err
        assert KEY in metadata(real)
        assert split(real.read_bytes())[1] == split(original)[1]
    assert link.is_symlink()
    assert link.resolve() == real.resolve()
    assert files_in(tmp_path) == ["link.safetensors", "store"]
    assert files_in(tmp_path / "store") == ["real.safetensors"]


# -- (b) --output and --no-write -----------------------------------------------------------------------------


def test_output_leaves_source_untouched(tmp_path, source, cli):
    original = source.read_bytes()
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "calibrated.safetensors"
    code, out, err = cli(["fit", str(source), "--output", str(target), "--json", "-"])
    assert code == 0, err
    assert source.read_bytes() == original
    assert KEY not in metadata(source)
    report = json.loads(out)
    assert report["written"] == str(target)
    assert float(metadata(target)[KEY]) == report["temperature"]
    assert metadata(target)["model"] == "resnet-18"
    assert split(target.read_bytes())[1] == split(original)[1]
    assert_same_tensors(source, target)
    assert files_in(tmp_path) == ["logits.safetensors", "sub"]
    assert files_in(tmp_path / "sub") == ["calibrated.safetensors"]


def test_output_replaces_an_existing_file(tmp_path, source, cli):
    target = tmp_path / "calibrated.safetensors"
    target.write_bytes(b"old contents")
    code, _, err = cli(["fit", str(source), "--output", str(target)])
    assert code == 0, err
    assert KEY in metadata(target)
    assert_same_tensors(source, target)
    assert files_in(tmp_path) == ["calibrated.safetensors", "logits.safetensors"]


def test_no_write_changes_nothing(tmp_path, source, cli):
    original = source.read_bytes()
    code, out, err = cli(["fit", str(source), "--no-write", "--json", "-"])
    assert code == 0, err
    assert source.read_bytes() == original
    assert files_in(tmp_path) == ["logits.safetensors"]
    assert json.loads(out)["written"] is None


# -- (c) fitting twice ---------------------------------------------------------------------------------------


def test_second_fit_overwrites_the_key(tmp_path, source, cli):
    original = source.read_bytes()
    code, out, _ = cli(["fit", str(source), "--json", "-"])
    assert code == 0
    first = json.loads(out)["temperature"]
    code, out, _ = cli(["fit", str(source), "--json", "-", "--val-fraction", "1.0"])
    assert code == 0
    second = json.loads(out)["temperature"]
    assert second != first  # a different fitting part, so the second value is distinguishable

    header, data = split(source.read_bytes())  # split() fails on duplicate keys
    meta = header["__metadata__"]
    assert list(meta).count(KEY) == 1
    assert float(meta[KEY]) == second
    assert meta == {"model": "resnet-18", "split": "val", KEY: meta[KEY], "tempcal.split": meta["tempcal.split"]}
    assert data == split(original)[1]
    assert files_in(tmp_path) == ["logits.safetensors"]

    # and a third run on an already-written file gives the same bytes as the second (idempotent)
    before = source.read_bytes()
    code, _, _ = cli(["fit", str(source), "--val-fraction", "1.0"])
    assert code == 0
    assert source.read_bytes() == before


# -- (d) failures in the middle of the write -----------------------------------------------------------------


def test_disk_full_mid_write_changes_nothing(tmp_path, source, cli, monkeypatch):
    original = source.read_bytes()
    monkeypatch.setattr(tempcal.io.safetensors_header.shutil, "copyfileobj",
                        fail_after_partial_copy(OSError(errno.ENOSPC, "No space left on device")))
    code, _, err = cli(["fit", str(source), "--json", str(tmp_path / "out.json")])
    assert code == 2
    assert_one_error_line(err, str(source), "No space left on device")
    assert source.read_bytes() == original
    assert files_in(tmp_path) == ["logits.safetensors"]  # no temporary file, no JSON for a failed run


def test_disk_full_mid_write_to_output_changes_nothing(tmp_path, source, cli, monkeypatch):
    original = source.read_bytes()
    target = tmp_path / "calibrated.safetensors"
    monkeypatch.setattr(tempcal.io.safetensors_header.shutil, "copyfileobj",
                        fail_after_partial_copy(OSError(errno.ENOSPC, "No space left on device")))
    code, _, err = cli(["fit", str(source), "--output", str(target)])
    assert code == 2
    assert_one_error_line(err, str(target), "No space left on device")
    assert source.read_bytes() == original
    assert files_in(tmp_path) == ["logits.safetensors"]


@pytest.mark.parametrize("name", ["fsync", "replace", "chmod"])
def test_failure_at_later_steps_changes_nothing(tmp_path, source, cli, monkeypatch, name):
    original = source.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tempcal.io.paths.os, name, fail)
    code, _, err = cli(["fit", str(source)])
    monkeypatch.undo()
    assert code == 2
    assert_one_error_line(err, "Input/output error")
    assert source.read_bytes() == original
    assert files_in(tmp_path) == ["logits.safetensors"]


def test_unwritable_folder_changes_nothing(tmp_path, source, cli, monkeypatch):
    original = source.read_bytes()

    def mkstemp(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)  # the module the atomic writer imports
    code, _, err = cli(["fit", str(source)])
    assert code == 2
    assert_one_error_line(err, "Permission denied")
    assert source.read_bytes() == original


# -- (e) permissions -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o600, 0o664])
def test_in_place_write_keeps_permissions(source, cli, mode):
    os.chmod(source, mode)
    code, _, err = cli(["fit", str(source)])
    assert code == 0, err
    assert KEY in metadata(source)
    assert stat.S_IMODE(source.stat().st_mode) == mode


def test_output_over_existing_file_keeps_its_permissions(tmp_path, source, cli):
    target = tmp_path / "calibrated.safetensors"
    target.write_bytes(b"old")
    os.chmod(target, 0o600)
    code, _, err = cli(["fit", str(source), "--output", str(target)])
    assert code == 0, err
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


# -- (f) JSON output -----------------------------------------------------------------------------------------


def _check_report(report: dict) -> None:
    for key in ("temperature", "n_fit", "n_eval", "num_classes", "before", "after", "passes", "converged"):
        assert key in report, key
    assert isinstance(report["temperature"], float) and report["temperature"] > 0
    assert report["n_fit"] + report["n_eval"] == 400
    assert report["n_fit"] == 200
    assert report["num_classes"] == 5
    assert isinstance(report["passes"], int) and report["passes"] >= 1
    assert report["converged"] is True
    for side in ("before", "after"):
        for metric in METRICS:
            assert isinstance(report[side][metric], float), (side, metric)
        assert 0 <= report[side]["ece"] <= report[side]["mce"] <= 1
        assert 0 <= report[side]["accuracy"] <= 1
    assert report["after"]["accuracy"] == report["before"]["accuracy"]  # T > 0 keeps the arg-max
    assert report["after"]["nll"] < report["before"]["nll"]
    assert report["after"]["ece"] < report["before"]["ece"]


def test_json_file(tmp_path, source, cli):
    out_json = tmp_path / "report.json"
    code, _, err = cli(["fit", str(source), "--no-write", "--json", str(out_json)])
    assert code == 0, err
    _check_report(json.loads(out_json.read_text()))
    assert files_in(tmp_path) == ["logits.safetensors", "report.json"]


def test_json_to_stdout_prints_only_json(source, cli):
    code, out, err = cli(["fit", str(source), "--no-write", "--json", "-"])
    assert code == 0, err
    _check_report(json.loads(out))


def test_json_to_stdout_with_write_back_prints_only_json(source, cli):
    code, out, err = cli(["fit", str(source), "--json", "-"])
    assert code == 0, err
    report = json.loads(out)
    _check_report(report)
    assert float(metadata(source)[KEY]) == report["temperature"]


# -- (g) --max-ece gate --------------------------------------------------------------------------------------


def test_gate_fails_with_status_3_and_still_writes_json(tmp_path, source, cli):
    out_json = tmp_path / "report.json"
    code, _, err = cli(["fit", str(source), "--no-write", "--json", str(out_json), "--max-ece", "0"])
    assert code == 3
    assert "error:" not in err
    assert "--max-ece" in err
    report = json.loads(out_json.read_text())
    _check_report(report)
    assert report["after"]["ece"] > 0


def test_gate_fails_with_json_on_stdout(source, cli):
    code, out, _ = cli(["fit", str(source), "--no-write", "--json", "-", "--max-ece", "0"])
    assert code == 3
    _check_report(json.loads(out))


def test_generous_gate_passes(tmp_path, source, cli):
    out_json = tmp_path / "report.json"
    code, _, err = cli(["fit", str(source), "--no-write", "--json", str(out_json), "--max-ece", "1"])
    assert code == 0, err
    _check_report(json.loads(out_json.read_text()))


def test_gate_threshold_is_the_calibrated_ece(tmp_path, source, cli):
    code, out, _ = cli(["fit", str(source), "--no-write", "--json", "-"])
    assert code == 0
    ece = json.loads(out)["after"]["ece"]
    assert ece > 0
    assert cli(["fit", str(source), "--no-write", "--max-ece", repr(ece)])[0] == 0
    assert cli(["fit", str(source), "--no-write", "--max-ece", repr(ece * 0.999)])[0] == 3

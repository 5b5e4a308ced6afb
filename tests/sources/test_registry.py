"""open_source and the stored T (tempcal.sources.registry) on every kind of logits file, written by its own library."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import logits_of, numpy_logits, one_line, write_logits
from reference import optimal_temperature
from safetensors import safe_open
from safetensors.torch import save_file

from tempcal.core.fitting import fit_temperature
from tempcal.errors import TEMPERATURE_KEY, TempcalError
from tempcal.io.paths import sidecar_path
from tempcal.sources.registry import open_source, read_stored_temperature, write_stored_temperature

# -- loading ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["npz", "npy", "pt", "pt-legacy", "safetensors"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_format_loads_the_saved_values_exactly_and_fits_scipys_optimum(tmp_path, kind, dtype):
    z, y = numpy_logits()
    z = z.astype(dtype)
    path = write_logits(kind, tmp_path, z, y)
    loaded = open_source(path)
    assert loaded.kind.name == kind.removesuffix("-legacy")
    assert loaded.has_labels and loaded.warnings == [] and loaded.stored_temperature is None
    assert loaded.paths == [path]
    assert logits_of(loaded.data).dtype == torch.from_numpy(z).dtype
    assert np.array_equal(logits_of(loaded.data).numpy(), z)
    assert np.array_equal(loaded.data.labels.numpy(), y)
    if dtype != np.float16:  # float16 rounding makes scipy's optimum on the rounded values the reference
        expected = optimal_temperature(torch.from_numpy(z), torch.from_numpy(y))
        fitted = fit_temperature(logits_of(loaded.data), loaded.data.labels, device="cpu").temperature
        assert abs(fitted - expected) / expected < 1e-6


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_bfloat16_logits_keep_their_bits(tmp_path, kind):
    z, y = numpy_logits(n=50)
    logits = torch.from_numpy(z).to(torch.bfloat16)
    path = write_logits(kind, tmp_path, logits, torch.from_numpy(y))
    loaded = open_source(path)
    assert logits_of(loaded.data).dtype == torch.bfloat16
    assert torch.equal(logits_of(loaded.data).view(torch.int16), logits.view(torch.int16))


@pytest.mark.parametrize("kind", ["npz", "npy", "pt"])
def test_netcal_style_keys(tmp_path, kind):
    z, y = numpy_logits(n=40)
    path = write_logits(kind, tmp_path, z, y, logits_key="predictions", labels_key="ground_truth")
    loaded = open_source(path, logits_key="predictions", labels_key="ground_truth")
    assert np.array_equal(logits_of(loaded.data).numpy(), z) and np.array_equal(loaded.data.labels.numpy(), y)


@pytest.mark.parametrize("kind", ["npz", "pt"])
@pytest.mark.parametrize("missing", ["logits", "labels"])
def test_missing_key_lists_the_keys_and_the_option(tmp_path, kind, missing):
    z, y = numpy_logits(n=40)
    path = write_logits(kind, tmp_path, z, y, logits_key="scores", labels_key="targets")
    keys = {"logits_key": "scores", "labels_key": "targets"}
    keys[f"{missing}_key"] = missing
    with pytest.raises(TempcalError) as exc:
        open_source(path, **keys)
    message = one_line(exc)
    assert message.startswith(f"{path}: no ") and f"'{missing}'" in message
    assert "'scores'" in message and "'targets'" in message and f"--{missing}-key" in message


def test_probs_flag_reads_probabilities_as_log_probabilities(tmp_path):
    z, y = numpy_logits(n=30)
    p = np.exp(z.astype(np.float64) - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.savez(tmp_path / "p.npz", logits=p, labels=y)
    loaded = open_source(tmp_path / "p.npz", probs=True)
    np.testing.assert_allclose(logits_of(loaded.data).numpy(), np.log(p), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("name", "content", "words"), [
    ("x.tsv", b"1\t2", ["unknown logits file type", ".npz"]),
    ("x.csv", b"1,2", ["confidence table", "--confidence COLUMN"]),
    ("noise.npz", b"not a zip", ["not an .npz archive"]),
    ("noise.npy", b"not numpy", ["not an .npy array"]),
    ("noise.pt", b"not torch", ["not a torch.save file"]),
    ("broken.pt", b"\x80\x02garbage", ["not a readable torch.save file"]),
])
def test_unreadable_files_are_one_line_errors(tmp_path, name, content, words):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / name, labels_key="labels.npy" if name.endswith(".npy") else "labels")
    message = one_line(exc)
    assert all(w in message for w in words), message


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(TempcalError, match="no such file"):
        open_source(tmp_path / "absent.npz")
    (tmp_path / "folder.pt").mkdir()
    with pytest.raises(TempcalError, match="not a regular file"):
        open_source(tmp_path / "folder.pt")


@pytest.mark.parametrize("kind", ["npz", "pt", "safetensors"])
def test_ignore_index_rows_are_left_out_like_cross_entropy(tmp_path, kind):
    z, y = numpy_logits(n=50)
    y[[3, 17, 18]] = -100
    path = write_logits(kind, tmp_path, z, y)
    keep = y != -100
    loaded = open_source(path)
    assert np.array_equal(logits_of(loaded.data).numpy(), z[keep])
    assert np.array_equal(loaded.data.labels.numpy(), y[keep])
    custom = y.copy()
    custom[keep & (y == 0)] = 7  # another ignore value; -100 rows are then ordinary (bad) labels
    path.unlink()
    path = write_logits(kind, tmp_path, z, custom)
    loaded = open_source(path, ignore_index=7)
    assert np.array_equal(loaded.data.labels.numpy(), custom[custom != 7])
    assert int(loaded.data.num_samples) == int((custom != 7).sum())


def test_token_level_logits_without_labels(tmp_path):
    z = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "tokens.npz", logits=z)
    loaded = open_source(tmp_path / "tokens.npz", labels_optional=True)
    assert not loaded.has_labels
    assert np.array_equal(logits_of(loaded.data).numpy(), z.reshape(6, 4))


# -- optional labels (out-of-distribution files) ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["npz", "npy", "pt", "safetensors"])
def test_absent_labels_are_allowed_when_not_required(tmp_path, kind):
    z, _ = numpy_logits(n=12)
    if kind == "npz":
        np.savez(tmp_path / "ood.npz", logits=z)
        path = tmp_path / "ood.npz"
    elif kind == "npy":
        path = tmp_path / "ood_logits.npy"
        np.save(path, z)
    elif kind == "pt":
        path = tmp_path / "ood.pt"
        torch.save({"logits": torch.from_numpy(z)}, path)
    else:
        path = tmp_path / "ood.safetensors"
        save_file({"logits": torch.from_numpy(z)}, str(path))
    loaded = open_source(path, labels_optional=True)
    assert not loaded.has_labels
    assert np.array_equal(logits_of(loaded.data).numpy(), z)
    assert loaded.data.labels.shape == (12,) and not bool(loaded.data.labels.any())
    with pytest.raises(TempcalError, match="labels"):
        open_source(path)


def test_present_labels_are_read_when_not_required(tmp_path):
    z, y = numpy_logits(n=12)
    path = write_logits("npz", tmp_path, z, y)
    loaded = open_source(path, labels_optional=True)
    assert loaded.has_labels and np.array_equal(loaded.data.labels.numpy(), y)


# -- the stored temperature: safetensors metadata or a sidecar --------------------------------------------------


def test_safetensors_write_goes_into_the_metadata_not_a_sidecar(tmp_path):
    z, y = numpy_logits(n=20)
    path = write_logits("safetensors", tmp_path, z, y)
    assert write_stored_temperature(path, 2.5) == path
    with safe_open(str(path), "pt") as f:
        assert f.metadata()[TEMPERATURE_KEY] == "2.5"
        assert np.array_equal(f.get_tensor("logits").numpy(), z)
    assert not sidecar_path(path).exists()
    assert read_stored_temperature(path) == (2.5, []) and open_source(path).stored_temperature == 2.5


def test_output_copies_npz_and_pt_and_stores_t_beside_the_copy(tmp_path):
    z, y = numpy_logits(n=20)
    for kind in ("npz", "pt"):
        source = write_logits(kind, tmp_path, z, y)
        before = source.read_bytes()
        output = tmp_path / f"calibrated{source.suffix}"
        written = write_stored_temperature(source, 1.75, output)
        assert written == sidecar_path(output)
        assert output.read_bytes() == before and source.read_bytes() == before
        assert not sidecar_path(source).exists()
        assert read_stored_temperature(output) == (1.75, [])
        assert np.array_equal(logits_of(open_source(output).data).numpy(), z)


def test_output_is_refused_where_no_copy_can_hold_t(tmp_path):
    z, y = numpy_logits(n=20)
    npy = write_logits("npy", tmp_path, z, y)
    with pytest.raises(TempcalError) as exc:
        write_stored_temperature(npy, 2.0, tmp_path / "out.npy")
    assert "--no-write" in one_line(exc)
    npz = write_logits("npz", tmp_path, z, y)
    with pytest.raises(TempcalError, match="suffix"):
        write_stored_temperature(npz, 2.0, tmp_path / "out.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([npy.name, "val_labels.npy", npz.name])


def test_a_folder_as_source_is_called_a_folder_and_suffixes_are_listed_once(tmp_path, cli):
    (tmp_path / "logs").mkdir()
    code, _, err = cli(["fit", str(tmp_path / "logs"), "--no-config"])
    assert code == 2 and err.count("\n") == 1 and "is a folder, not a logits file" in err and "--head" in err
    odd = tmp_path / "x.abc"
    odd.write_bytes(b"")
    code, _, err = cli(["fit", str(odd), "--no-config"])
    listed = err.split("expected one of ", 1)[1].rstrip(")\n").split(", ")
    assert code == 2 and len(listed) == len(set(listed)) and ".safetensors" in listed

"""``tempcal apply``: the calibrated probabilities (or logits / T, log-probabilities) of every kind of SOURCE at the
stored T, streamed; files written by the libraries that own the formats, outputs read back by them."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from conftest import (
    EXAMPLE,
    assert_one_error_line,
    files_in,
    hidden_and_head,
    miscalibrated,
    miscalibrated_binary,
    write_inputs,
    write_logits,
)
from lm_eval_logs import padded, random_mc_records, write_log
from model_builders import MLP, save_program
from reference import two_class
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from scipy.special import log_softmax, softmax

import tempcal
from tempcal.core.scan import Scan


def fitted_copy(tmp_path, cli):
    """The README's digits logits, fitted (T written into the copy's metadata)."""
    path = tmp_path / "digits.safetensors"
    path.write_bytes(EXAMPLE.read_bytes())
    code, _, err = cli(["fit", str(path), "-q"])
    assert code == 0, err
    return path, tempcal.read_header(path).stored_temperature()


def test_probabilities_logits_and_log_probabilities_at_the_stored_t(tmp_path, cli, run_json):
    path, t = fitted_copy(tmp_path, cli)
    data = load_file(str(path))
    z = data["logits"].double().numpy()
    out = run_json(["apply", str(path), "--output", str(tmp_path / "p.safetensors")])
    assert out["temperature"] == t and out["tau_from"] == "stored" and out["shape"] == [1348, 10]
    written = load_file(str(tmp_path / "p.safetensors"))
    assert set(written) == {"probs", "labels"} and written["probs"].dtype == torch.float32
    np.testing.assert_allclose(written["probs"].numpy(), softmax(z / t, axis=1), rtol=1e-6, atol=1e-7)
    assert torch.equal(written["labels"], data["labels"])
    with safe_open(str(tmp_path / "p.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta["tempcal.applied"] == "probs" and float(meta["tempcal.applied_temperature"]) == t
    assert "tempcal.temperature" not in meta  # the values are calibrated already: no T to apply again

    run_json(["apply", str(path), "-o", str(tmp_path / "z.safetensors"), "--as", "logits"])
    scaler = tempcal.TemperatureScaler()
    scaler.temperature_ = t  # the Python equivalent: the scaler's transform
    np.testing.assert_allclose(load_file(str(tmp_path / "z.safetensors"))["logits"].numpy(),
                               scaler.transform(data["logits"].numpy()), rtol=1e-6)
    run_json(["apply", str(path), "-o", str(tmp_path / "l.safetensors"), "--as", "log-probs"])
    np.testing.assert_allclose(load_file(str(tmp_path / "l.safetensors"))["log_probs"].numpy(),
                               log_softmax(z / t, axis=1), rtol=1e-5, atol=1e-6)


def test_the_console_names_t_and_the_file_written(tmp_path, cli):
    path, t = fitted_copy(tmp_path, cli)
    code, out, _ = cli(["apply", str(path), "-o", str(tmp_path / "p.npz")])
    assert code == 0
    assert f"T = {t:.6g} (stored)" in out and f"wrote the calibrated probabilities to {tmp_path / 'p.npz'}" in out


@pytest.mark.parametrize("suffix", [".npz", ".npy"])
def test_npz_and_npy_outputs_read_back_with_numpy(tmp_path, cli, run_json, suffix):
    path, _ = fitted_copy(tmp_path, cli)
    target = tmp_path / f"out{suffix}"
    out = run_json(["apply", str(path), "-o", str(target), "--tau", "2"])
    z = load_file(str(path))["logits"].double().numpy()
    loaded = np.load(target, allow_pickle=False)
    probs = loaded["probs"] if suffix == ".npz" else loaded
    np.testing.assert_allclose(probs, softmax(z / 2, axis=1), rtol=1e-6, atol=1e-7)
    assert out["temperature"] == 2.0 and out["tau_from"] == "tau"
    assert out["labels"] == (suffix == ".npz")  # a .npy file holds one array


def test_rows_are_streamed_chunk_by_chunk(tmp_path, cli, monkeypatch):
    """The pass goes through the scan's row blocks (shared among the threads, bounded reads), as many as
    --chunk-rows makes, and the file is the same as the one from whole chunks."""
    path, _ = fitted_copy(tmp_path, cli)
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")  # read from the file a chunk at a time
    sizes: list[int] = []
    original = Scan.block_pass

    def counted(self, fn, **kwargs):
        def sized(block, scratch):
            sizes.append(block.z.shape[0])
            return fn(block, scratch)
        return original(self, sized, **kwargs)

    monkeypatch.setattr(Scan, "block_pass", counted)
    code, _, err = cli(["apply", str(path), "-o", str(tmp_path / "small.safetensors"), "--chunk-rows", "100", "-q"])
    assert code == 0, err
    assert sorted(sizes, reverse=True) == [100] * 13 + [48]
    monkeypatch.undo()
    code, _, _ = cli(["apply", str(path), "-o", str(tmp_path / "whole.safetensors"), "-q"])
    assert load_file(str(tmp_path / "small.safetensors"))["probs"].equal(
        load_file(str(tmp_path / "whole.safetensors"))["probs"])


def test_a_file_without_labels_and_a_binary_logit(tmp_path, run_json):
    z, _ = miscalibrated_binary(300, 3.0)
    path = tmp_path / "scores.safetensors"
    save_file({"logits": z}, str(path))  # deployment data: no labels
    out = run_json(["apply", str(path), "-o", str(tmp_path / "p.safetensors"), "--tau", "3"])
    assert out["labels"] is False and out["shape"] == [300, 2]
    written = load_file(str(tmp_path / "p.safetensors"))
    assert set(written) == {"probs"}
    np.testing.assert_allclose(written["probs"].numpy(), softmax(two_class(z.double().numpy()) / 3, axis=1),
                               rtol=1e-6, atol=1e-7)
    out = run_json(["apply", str(path), "-o", str(tmp_path / "z.safetensors"), "--tau", "3", "--as", "logits"])
    assert out["shape"] == [300]  # one binary logit stays one
    np.testing.assert_allclose(load_file(str(tmp_path / "z.safetensors"))["logits"].numpy(), z.numpy() / 3, rtol=1e-6)


def test_token_logits_keep_every_row_in_order(tmp_path, run_json):
    """[B, L, V] with -100 labels (padding): all B * L rows are written, in order, labels as they are."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(4, 6, 9, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 9, (4, 6), generator=g)
    y[:, 4:] = -100
    path = tmp_path / "tokens.safetensors"
    save_file({"logits": z, "labels": y}, str(path))
    out = run_json(["apply", str(path), "-o", str(tmp_path / "p.safetensors"), "--tau", "1.5"])
    written = load_file(str(tmp_path / "p.safetensors"))
    assert out["shape"] == [24, 9] and written["probs"].dtype == torch.float64
    np.testing.assert_allclose(written["probs"].numpy(), softmax(z.reshape(24, 9).numpy() / 1.5, axis=1), rtol=1e-12)
    assert torch.equal(written["labels"], y.reshape(-1))


@pytest.mark.parametrize("kind", ["npz", "npy", "pt"])
def test_other_formats_use_their_sidecar_t(tmp_path, cli, run_json, kind):
    logits, labels = miscalibrated(500, 4, 2.5, seed=len(kind))
    path = write_logits(kind, tmp_path, logits.numpy(), labels.numpy())
    code, _, err = cli(["fit", str(path), "-q"])
    assert code == 0, err
    t = tempcal.read_stored_temperature(path)[0]
    out = run_json(["apply", str(path), "-o", str(tmp_path / "p.safetensors")])
    assert out["temperature"] == t
    np.testing.assert_allclose(load_file(str(tmp_path / "p.safetensors"))["probs"].numpy(),
                               softmax(logits.double().numpy() / t, axis=1), rtol=1e-6, atol=1e-7)


def test_no_stored_t_names_where_it_would_be(tmp_path, cli):
    logits, labels = miscalibrated(100, 3, 2.0)
    path = write_logits("npz", tmp_path, logits.numpy(), labels.numpy())
    before = files_in(tmp_path)
    code, _, err = cli(["apply", str(path), "-o", str(tmp_path / "p.safetensors")])
    assert code == 2
    assert_one_error_line(err, "has no stored temperature", f"sidecar {path}.tempcal.json", "--tau T")
    assert "metadata" not in err.replace("has no metadata", "")  # an .npz keeps T in its sidecar
    assert files_in(tmp_path) == before


def test_probabilities_fitted_with_probs_are_scaled_as_log_p(tmp_path, cli, run_json):
    logits, labels = miscalibrated(400, 5, 3.0)
    p = torch.softmax(logits.double(), 1).float()
    path = tmp_path / "probs.safetensors"
    save_file({"logits": p, "labels": labels}, str(path))
    code, _, err = cli(["apply", str(path), "-o", str(tmp_path / "x.safetensors"), "--tau", "2"])
    assert code == 2 and "--probs" in err  # probabilities are never read as logits silently
    code, _, err = cli(["fit", str(path), "--probs", "-q"])
    assert code == 0, err
    t = tempcal.read_header(path).stored_temperature()
    run_json(["apply", str(path), "-o", str(tmp_path / "p.safetensors")])  # --probs remembered with T
    np.testing.assert_allclose(load_file(str(tmp_path / "p.safetensors"))["probs"].numpy(),
                               softmax(np.log(p.double().numpy()) / t, axis=1), rtol=1e-5, atol=1e-7)


def test_per_group_temperatures_where_stored(tmp_path, run_json):
    """Metadata as ``fit --group-by KEY`` writes it: each row at its group's T, the global T for a group without one
    (with a warning); --no-groups and --tau use one T for every row."""
    logits, labels = miscalibrated(60, 4, 2.0, dtype=torch.float64)
    group = torch.arange(60) % 3
    path = tmp_path / "g.safetensors"
    save_file({"logits": logits, "labels": labels, "domain": group}, str(path),
              metadata={"tempcal.temperature": "2.0", "tempcal.group_key": "domain",
                        "tempcal.group_temperatures": json.dumps({"0": 1.5, "1": 3.0})})
    out = run_json(["apply", str(path), "-o", str(tmp_path / "p.safetensors"), "--as", "logits"])
    expected = logits.numpy() / np.array([1.5, 3.0, 2.0])[group.numpy()][:, None]
    np.testing.assert_allclose(load_file(str(tmp_path / "p.safetensors"))["logits"].numpy(), expected, rtol=1e-12)
    assert out["group_key"] == "domain" and out["group_temperatures"] == {"0": 1.5, "1": 3.0, "2": 2.0}
    assert any("group(s) of 'domain' have no stored temperature (first: '2'); their 20 rows" in w
               for w in out["warnings"])
    run_json(["apply", str(path), "-o", str(tmp_path / "q.safetensors"), "--as", "logits", "--no-groups"])
    np.testing.assert_allclose(load_file(str(tmp_path / "q.safetensors"))["logits"].numpy(), logits.numpy() / 2)


def test_a_stored_group_key_that_is_not_there(tmp_path, cli):
    logits, labels = miscalibrated(30, 3, 2.0)
    path = tmp_path / "g.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path),
              metadata={"tempcal.temperature": "2.0", "tempcal.group_key": "domain",
                        "tempcal.group_temperatures": "{\"0\": 1.5}"})
    code, _, err = cli(["apply", str(path), "-o", str(tmp_path / "p.safetensors")])
    assert code == 2
    assert_one_error_line(err, "no tensor 'domain'", "tempcal.group_key")
    assert not (tmp_path / "p.safetensors").exists()


def test_hidden_states_with_a_head(tmp_path, run_json):
    h, w, b, y = hidden_and_head(200, 8, 30)
    path, head = tmp_path / "hidden.safetensors", tmp_path / "head.safetensors"
    save_file({"hidden": h, "labels": y}, str(path))
    save_file({"weight": w, "bias": b}, str(head))
    run_json(["apply", str(path), "--head", str(head), "-o", str(tmp_path / "p.safetensors"), "--tau", "2.5"])
    z = (h.double() @ w.double().T + b.double()).numpy()
    np.testing.assert_allclose(load_file(str(tmp_path / "p.safetensors"))["probs"].numpy(),
                               softmax(z / 2.5, axis=1), rtol=1e-5, atol=1e-7)


def test_a_model_run_over_its_inputs(tmp_path, run_json):
    torch.manual_seed(0)
    net = MLP().eval()
    x = torch.randn(50, 8)
    model = save_program(net, x[:2], tmp_path / "model.pt2")
    inputs = write_inputs(tmp_path / "inputs.safetensors", x)  # unlabelled deployment inputs
    run_json(["apply", str(model), "--inputs", str(inputs), "-o", str(tmp_path / "p.npz"), "--tau", "1.7"])
    with torch.no_grad():
        z = net(x).double().numpy()
    np.testing.assert_allclose(np.load(tmp_path / "p.npz")["probs"], softmax(z / 1.7, axis=1), rtol=1e-5, atol=1e-7)


def test_an_lm_eval_log(tmp_path, cli, run_json):
    records, rows, labels = random_mc_records(80, seed=2)
    path = write_log(tmp_path / "samples_arc_easy_2024-09-05T12-34-56.jsonl", records)
    code, _, err = cli(["fit", str(path), "-q"])
    assert code == 0, err
    t = tempcal.read_stored_temperature(path)[0]
    out = run_json(["apply", str(path), "-o", str(tmp_path / "p.safetensors")])
    probs = load_file(str(tmp_path / "p.safetensors"))["probs"].numpy()
    with np.errstate(invalid="ignore"):
        expected = softmax(padded(rows) / t, axis=1)
    np.testing.assert_allclose(probs, expected, rtol=1e-12, atol=0)  # padded choices: probability 0
    assert out["labels"] and load_file(str(tmp_path / "p.safetensors"))["labels"].tolist() == labels


REFUSED = {"p.txt": "suffix '.txt'", "same": "would overwrite the input file", "hard": "would overwrite the input file",
           "link": "is a symbolic link to", "pipe": "is a named pipe", "read-only": "read-only"}


@pytest.mark.parametrize("bad", list(REFUSED))
def test_refused_outputs_write_nothing(tmp_path, cli, bad):
    path = tmp_path / "digits.safetensors"
    path.write_bytes(EXAMPLE.read_bytes())
    target = tmp_path / f"{bad}.safetensors"
    if bad == "p.txt":
        target = tmp_path / "p.txt"
    elif bad == "same":
        target = path
    elif bad == "hard":
        os.link(path, target)
    elif bad == "link":
        os.symlink(tmp_path / "elsewhere.safetensors", target)
    elif bad == "pipe":
        os.mkfifo(target)
    else:
        (tmp_path / "locked").mkdir(mode=0o555)
        target = tmp_path / "locked" / "p.safetensors"
    before = files_in(tmp_path)
    code, _, err = cli(["apply", str(path), "-o", str(target), "--tau", "2"])
    assert code == 2
    assert_one_error_line(err, REFUSED[bad])
    assert files_in(tmp_path) == before and path.read_bytes() == EXAMPLE.read_bytes()


def test_a_failure_while_writing_leaves_no_file(tmp_path, cli, monkeypatch):
    path = tmp_path / "digits.safetensors"
    path.write_bytes(EXAMPLE.read_bytes())
    original = Scan.block_pass

    def fails_midway(self, fn, **kwargs):
        def failing(block, scratch):  # the fourth block of the output pass
            if block.start >= 3 * 64 and self.passes == 2:
                raise OSError(28, "No space left on device")
            return fn(block, scratch)
        return original(self, failing, **kwargs)

    monkeypatch.setattr(Scan, "block_pass", fails_midway)
    before = files_in(tmp_path)
    code, _, err = cli(["apply", str(path), "-o", str(tmp_path / "p.safetensors"), "--tau", "2", "--chunk-rows", "64"])
    assert code == 2 and "No space left on device" in err
    assert files_in(tmp_path) == before  # no output, no temporary file


def test_the_python_api(tmp_path):
    logits, labels = miscalibrated(120, 3, 2.0)
    path = tmp_path / "x.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    result = tempcal.apply_file(path, tmp_path / "y.safetensors", tau=4.0, as_="log_probs")
    assert isinstance(result, tempcal.ApplyResult) and result.key == "log_probs" and result.passes == 2
    with pytest.raises(tempcal.TempcalError, match=r"has no stored temperature \(metadata 'tempcal.temperature'"):
        tempcal.apply_file(path, tmp_path / "z.safetensors")


def test_a_configuration_file_names_source_output_and_as(tmp_path, cli, monkeypatch):
    path, t = fitted_copy(tmp_path, cli)
    (tmp_path / "tempcal.toml").write_text(f'source = "{path.name}"\n[apply]\noutput = "out/cal.npz"\nas = "logits"\n')
    (tmp_path / "out").mkdir()
    (tmp_path / "deep").mkdir()
    monkeypatch.chdir(tmp_path / "deep")  # relative paths are the configuration file's
    code, _, err = cli(["apply", "-q"])
    assert code == 0, err
    z = load_file(str(path))["logits"].numpy()
    np.testing.assert_allclose(np.load(tmp_path / "out" / "cal.npz")["logits"], z / t, rtol=1e-6)
    (tmp_path / "tempcal.toml").write_text('[apply]\nas = "odds"\n')
    code, _, err = cli(["apply", str(path), "-o", str(tmp_path / "x.npz")])
    assert code == 2 and "as" in assert_one_error_line(err)


def test_per_group_temperatures_are_announced_as_such_and_the_groups_kept(tmp_path, cli):
    """With per-group temperatures the console does not name one T as the one applied, and the group tensor is
    written beside the values (flattened with token-level rows), so the output stays grouped."""
    logits, labels = miscalibrated(60, 4, 2.0, dtype=torch.float64)
    group = torch.arange(60) % 3 + 10
    path = tmp_path / "g.safetensors"
    save_file({"logits": logits, "labels": labels, "domain": group}, str(path),
              metadata={"tempcal.temperature": "2.5", "tempcal.group_key": "domain",
                        "tempcal.group_temperatures": json.dumps({"10": 1.5, "11": 3.0, "12": 4.0})})
    code, out, err = cli(["apply", str(path), "-o", str(tmp_path / "p.safetensors")])
    assert code == 0, err
    first, second = out.splitlines()[:2]
    assert "T = 2.5" not in first and "at each row's group T (stored per group of 'domain')" in first
    assert first.endswith("labels and 'domain' copied")
    assert second == "T per group of 'domain': 10: 1.5, 11: 3, 12: 4 (the global T = 2.5 for a group with none stored)"
    written = load_file(str(tmp_path / "p.safetensors"))
    assert set(written) == {"probs", "labels", "domain"} and torch.equal(written["domain"], group)
    t = np.array([1.5, 3.0, 4.0])[group.numpy() - 10][:, None]
    np.testing.assert_allclose(written["probs"].numpy(), softmax(logits.numpy() / t, axis=1), rtol=1e-12)

    code, out, _ = cli(["apply", str(path), "-o", str(tmp_path / "q.npz"), "--no-groups"])
    assert code == 0 and "at T = 2.5 (stored)" in out and "domain" not in out
    assert sorted(np.load(tmp_path / "q.npz")) == ["labels", "probs"]

    tokens = tmp_path / "tokens.safetensors"  # token-level rows: the group of each of B * L rows
    save_file({"logits": logits.reshape(6, 10, 4), "labels": labels.reshape(6, 10), "domain": group.reshape(6, 10)},
              str(tokens), metadata={"tempcal.temperature": "2.5", "tempcal.group_key": "domain",
                                     "tempcal.group_temperatures": json.dumps({"10": 1.5})})
    code, out, err = cli(["apply", str(tokens), "-o", str(tmp_path / "t.npz"), "--as", "logits", "--json", "-"])
    assert code == 0, err
    result = json.loads(out)
    assert result["group_copied"] is True and result["group_temperatures"] == {"10": 1.5, "11": 2.5, "12": 2.5}
    with np.load(tmp_path / "t.npz") as saved:
        np.testing.assert_array_equal(saved["domain"], group.numpy())
        t = np.where(group.numpy() == 10, 1.5, 2.5)[:, None]
        np.testing.assert_allclose(saved["logits"], logits.numpy() / t, rtol=1e-12)


def test_a_group_key_named_like_an_output_tensor_is_not_copied(tmp_path, run_json):
    logits, labels = miscalibrated(30, 3, 2.0)
    path = tmp_path / "g.safetensors"
    save_file({"logits": logits, "y": labels, "labels": torch.arange(30) % 2}, str(path),
              metadata={"tempcal.temperature": "2.0", "tempcal.group_key": "labels",
                        "tempcal.group_temperatures": json.dumps({"0": 1.5, "1": 3.0})})
    out = run_json(["apply", str(path), "--labels-key", "y", "-o", str(tmp_path / "p.safetensors")])
    assert out["group_copied"] is False
    assert any("the group tensor 'labels' is not copied" in w for w in out["warnings"])
    assert torch.equal(load_file(str(tmp_path / "p.safetensors"))["labels"], labels)

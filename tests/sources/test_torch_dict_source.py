""".pt dicts of tensors as SOURCE (tempcal.sources.torch_dict): read with weights_only, anything else refused unrun."""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
import zipfile

import pytest
import torch
from conftest import MARKER, Evil, logits_of, numpy_logits, one_line

from tempcal.errors import TempcalError
from tempcal.sources.registry import open_source


def test_pt_with_arbitrary_objects_is_refused_without_running_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    z, y = numpy_logits(n=10)
    torch.save({"logits": torch.from_numpy(z), "labels": torch.from_numpy(y), "extra": Evil()}, "evil.pt")
    with pytest.raises(TempcalError) as exc:
        open_source("evil.pt")
    message = one_line(exc)
    assert "refused" in message and "weights_only=True" in message and ".open" in message
    assert not (tmp_path / MARKER).exists()


def test_numpy_arrays_inside_pt_are_refused_with_a_hint(tmp_path):
    z, y = numpy_logits(n=10)
    torch.save({"logits": z, "labels": y}, tmp_path / "np.pt")
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "np.pt")
    assert "numpy arrays" in one_line(exc)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torchscript_archive_is_not_read_as_a_tensor_dict(tmp_path):
    torch.jit.script(torch.nn.Linear(3, 2)).save(str(tmp_path / "model.pt"))
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "model.pt")
    message = one_line(exc)
    assert "TorchScript model" in message and "--inputs" in message


@pytest.mark.parametrize("content", [torch.zeros(3, 2), [torch.zeros(3, 2), torch.zeros(3)]])
def test_pt_that_is_not_a_dict(tmp_path, content):
    torch.save(content, tmp_path / "plain.pt")
    with pytest.raises(TempcalError, match="not a dict of tensors"):
        open_source(tmp_path / "plain.pt")


def test_pt_value_that_is_not_a_tensor(tmp_path):
    torch.save({"logits": [[1.0, 2.0]], "labels": torch.zeros(1, dtype=torch.int64)}, tmp_path / "list.pt")
    with pytest.raises(TempcalError, match="'logits' is a list, not a tensor"):
        open_source(tmp_path / "list.pt")


# -- storage sizes the pickle declares, bounded before torch allocates or maps them ------------------------------------


def claim_numel(pickled: bytes, numel: int) -> bytes:
    """The pickle with its first storage's element count replaced by ``numel`` (the opcode after the location)."""
    ops = list(pickletools.genops(pickled))
    at = next(i for i, (op, arg, _) in enumerate(ops) if arg == "cpu")
    at += 2 if ops[at + 1][0].name.endswith("PUT") else 1
    op, _, pos = ops[at]
    assert op.name.startswith("BININT")
    end = ops[at + 1][2]
    return pickled[:pos] + b"J" + struct.pack("<i", numel) + pickled[end:]


def rewrite_pt(source, target, numel: int | None) -> None:
    """A copy of a zip-format torch.save file (via zipfile), its data.pkl claiming ``numel`` elements if given."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl") and numel is not None:
                data = claim_numel(data, numel)
            out.writestr(info.filename, data)


def test_a_storage_declared_larger_than_its_member_exits_2(tmp_path, cli):
    """torch.save's zip with data.pkl doctored to declare 2e9 float64 elements (16 GB) for a 400-byte storage."""
    logits, labels = torch.randn(10, 5, dtype=torch.float64), torch.arange(10) % 5
    torch.save({"logits": logits, "labels": labels}, tmp_path / "saved.pt")
    rewrite_pt(tmp_path / "saved.pt", tmp_path / "copy.pt", None)  # the rewriting alone changes nothing
    assert torch.equal(logits_of(open_source(tmp_path / "copy.pt").data), logits)
    rewrite_pt(tmp_path / "saved.pt", tmp_path / "claims.pt", 2 * 10**9)
    code, _, err = cli(["fit", str(tmp_path / "claims.pt"), "--no-write"])
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {tmp_path / 'claims.pt'}: storage '0' (2000000000 elements of DoubleStorage): "
                          "declares 16000000000 bytes but member 'saved/data/0' holds 400"), err


def test_a_legacy_pickle_declaring_more_storage_than_the_file_exits_2(tmp_path, cli):
    """The legacy (pre-zip) format allocates each storage at its declared size before reading it: refused first."""
    logits, labels = torch.randn(10, 5, dtype=torch.float64), torch.arange(10) % 5
    torch.save({"logits": logits, "labels": labels}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    raw = (tmp_path / "old.pt").read_bytes()
    assert torch.equal(logits_of(open_source(tmp_path / "old.pt").data), logits)
    f = io.BytesIO(raw)
    for _ in range(3):  # magic number, protocol version, system information
        pickle.load(f)
    start = f.tell()  # the object's pickle, then the storages' bytes
    (tmp_path / "claims.pt").write_bytes(raw[:start] + claim_numel(raw[start:], 2 * 10**9))
    code, _, err = cli(["fit", str(tmp_path / "claims.pt"), "--no-write"])
    size = (tmp_path / "claims.pt").stat().st_size
    assert code == 2 and err.count("\n") == 1, err
    assert f"error: {tmp_path / 'claims.pt'}: its pickle declares 2 storages of 16000000080 bytes in all, more " \
           f"than the {size} bytes of the file" in err, err


def test_compressed_members_and_a_truncated_pickle_are_refused(tmp_path):
    torch.save({"logits": torch.randn(10, 5), "labels": torch.arange(10) % 5}, tmp_path / "saved.pt")
    with zipfile.ZipFile(tmp_path / "saved.pt") as src, \
            zipfile.ZipFile(tmp_path / "deflated.pt", "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "deflated.pt")
    assert "member 'saved/data/0' is compressed" in one_line(exc)
    torch.save({"logits": torch.randn(10, 5)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "cut.pt").write_bytes((tmp_path / "old.pt").read_bytes()[:200])
    with pytest.raises(TempcalError) as exc:
        open_source(tmp_path / "cut.pt")
    assert one_line(exc).startswith(f"{tmp_path / 'cut.pt'}: not a readable torch.save file (its pickle: ")

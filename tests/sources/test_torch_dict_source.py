""".pt dicts of tensors as SOURCE (tempcal.sources.torch_dict): read with weights_only, anything else refused unrun."""

from __future__ import annotations

import pytest
import torch
from conftest import MARKER, Evil, numpy_logits, one_line

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

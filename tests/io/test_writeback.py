"""Writing T into a safetensors file (write_temperature): it reads back exactly; a failed write changes nothing."""

from __future__ import annotations

import errno

import pytest
from conftest import fail_after_partial_copy, files_in

import tempcal.io.safetensors_header
from tempcal.errors import TempcalError


def test_report_reads_what_fit_wrote(source):
    """The stored value is what the loader reads back as the stored T."""
    from tempcal.io.safetensors_header import read_header

    path = tempcal.io.safetensors_header.write_temperature(source, 2.718281828459045)
    assert path == source
    assert read_header(source).stored_temperature() == 2.718281828459045


@pytest.mark.parametrize("exc", [RuntimeError("interrupted"), KeyboardInterrupt()], ids=["RuntimeError",
                                                                                         "KeyboardInterrupt"])
def test_other_exception_mid_write_changes_nothing(tmp_path, source, monkeypatch, exc):
    original = source.read_bytes()
    monkeypatch.setattr(tempcal.io.safetensors_header.shutil, "copyfileobj", fail_after_partial_copy(exc))
    with pytest.raises(type(exc)):
        tempcal.io.safetensors_header.write_temperature(source, 1.5)
    assert source.read_bytes() == original
    assert files_in(tmp_path) == ["logits.safetensors"]


def test_oserror_mid_write_is_a_tempcal_error(tmp_path, source, monkeypatch):
    original = source.read_bytes()
    monkeypatch.setattr(tempcal.io.safetensors_header.shutil, "copyfileobj",
                        fail_after_partial_copy(OSError(errno.EIO, "Input/output error")))
    with pytest.raises(TempcalError, match="Input/output error") as info:
        tempcal.io.safetensors_header.write_temperature(source, 1.5)
    assert "\n" not in str(info.value)
    assert source.read_bytes() == original
    assert files_in(tmp_path) == ["logits.safetensors"]

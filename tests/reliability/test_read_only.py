"""A read-only file or folder: one clear error line, exit 2, nothing written.

These tests may run as root, for whom permission bits do not stop a write. tempcal therefore
also refuses a file or folder that has no write bit at all (someone marked it read-only), so
the in-process tests hold for root too; the subprocess test drops to the ``nobody`` user to
see the kernel's own refusal (skipped when not root, where the in-process tests already see it).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import assert_one_error_line, snapshot
from reliability_support import (
    PYTHON,
    child_env,
    run_inprocess,
    valid_file,
)


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "data" / "logits.safetensors"
    path.parent.mkdir()
    path.write_bytes(valid_file(200, 4))
    return path


def refused(tmp_path: Path, argv: list[str], *details: str) -> str:
    before = snapshot(tmp_path)
    code, _, err, _ = run_inprocess(argv)
    assert code == 2, (code, err)
    line = assert_one_error_line(err, *details)
    assert snapshot(tmp_path) == before
    return line


@pytest.mark.parametrize("mode", [0o444, 0o400, 0o555])
def test_read_only_file(tmp_path, source, mode):
    os.chmod(source, mode)
    try:
        refused(tmp_path, ["fit", str(source), "--json", str(tmp_path / "out.json")], str(source), "read-only",
                f"{mode:04o}", "nothing written")
    finally:
        os.chmod(source, 0o644)


def test_read_only_folder(tmp_path, source):
    os.chmod(source.parent, 0o555)
    try:
        refused(tmp_path, ["fit", str(source)], str(source), "folder", "read-only", "nothing written")
    finally:
        os.chmod(source.parent, 0o755)


def test_output_into_read_only_folder(tmp_path, source):
    target = tmp_path / "locked" / "out.safetensors"
    target.parent.mkdir()
    os.chmod(target.parent, 0o555)
    try:
        refused(tmp_path, ["fit", str(source), "--output", str(target)], str(target), "read-only")
    finally:
        os.chmod(target.parent, 0o755)


def test_output_over_read_only_file(tmp_path, source):
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"keep me")
    os.chmod(target, 0o444)
    try:
        refused(tmp_path, ["fit", str(source), "--output", str(target)], str(target), "read-only")
    finally:
        os.chmod(target, 0o644)


def test_read_only_source_with_output_elsewhere_is_fine(tmp_path, source):
    """Only the destination must be writable: a read-only SOURCE can still be copied with T."""
    os.chmod(source, 0o444)
    target = tmp_path / "out.safetensors"
    try:
        for _ in range(2):  # the copy is writable by its owner: a second run may replace it
            code, _, err, _ = run_inprocess(["fit", str(source), "--quiet", "--output", str(target)])
            assert code == 0, err
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
    finally:
        os.chmod(source, 0o644)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to switch to nobody")
def test_kernel_refusal_as_an_unprivileged_user():
    """As ``nobody``: a folder and file owned by root (0755 / 0644) cannot be written; tempcal says so."""
    folder = Path(tempfile.mkdtemp(prefix="tempcal-nobody-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        source = folder / "logits.safetensors"
        source.write_bytes(valid_file(200, 4))
        before = snapshot(folder)
        try:
            result = subprocess.run([PYTHON, "-m", "tempcal", "fit", str(source), "--quiet"], capture_output=True,
                                    text=True, timeout=180, cwd=folder, user=65534, group=65534, extra_groups=[],
                                    env=child_env(HOME=str(folder)))
        except PermissionError:
            pytest.skip(f"the user nobody is not allowed to run {PYTHON} here")
        if result.returncode != 2 and "ModuleNotFoundError" in result.stderr:
            pytest.skip("nobody cannot read the Python environment here")
        assert result.returncode == 2, result.stderr
        assert_one_error_line(result.stderr, str(source), "nothing written")
        assert snapshot(folder) == before
    finally:
        shutil.rmtree(folder)


# -- the kernel's own refusal, as root: an immutable file or folder (chattr +i) -------------------------------


@pytest.fixture
def immutable():
    """Mark paths immutable with chattr (skipped where that is not allowed); always cleared afterwards."""
    marked: list[Path] = []

    def mark(path: Path) -> None:
        chattr = shutil.which("chattr")
        if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available here")
        marked.append(path)

    yield mark
    for path in marked:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize("what", ["file", "folder"])
@pytest.mark.parametrize("precheck", [True, False], ids=["precheck", "kernel"])
def test_immutable_file_or_folder(tmp_path, source, immutable, monkeypatch, what, precheck):
    """Refused up front (write access is checked), and by the kernel when that check is skipped."""
    if not precheck:
        import tempcal.io.paths

        monkeypatch.setattr(tempcal.io.paths, "refuse_read_only", lambda destination, folder, label: None)
    immutable(source if what == "file" else source.parent)
    line = refused(tmp_path, ["fit", str(source), "--json", str(tmp_path / "out.json")], str(source))
    assert ("read-only" if precheck else "Operation not permitted") in line

"""$GITHUB_STEP_SUMMARY: a command's section appended in one write, after what is there; nothing without the
variable; a warning, never a failure, when the file cannot be written."""

from __future__ import annotations

import os
import threading

import pytest

from tempcal.output import files
from tempcal.output.files import STEP_SUMMARY_ENV, append_step_summary


def test_nothing_happens_without_the_variable(monkeypatch):
    monkeypatch.delenv(STEP_SUMMARY_ENV, raising=False)
    assert append_step_summary(lambda: pytest.fail("the summary is not even made")) is None
    monkeypatch.setenv(STEP_SUMMARY_ENV, "")
    assert append_step_summary(lambda: pytest.fail("the summary is not even made")) is None


def test_appended_after_what_is_there_with_the_gate(tmp_path, monkeypatch):
    path = tmp_path / "summary.md"
    path.write_text("## An earlier step\n")
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(path))
    assert append_step_summary(lambda: "## Calibration\n\ntable\n") is None
    assert append_step_summary(lambda: "## Calibration\n", gate="calibrated ECE 0.1 is above --max-ece 0.05") is None
    assert path.read_text() == ("## An earlier step\n## Calibration\n\ntable\n\n"
                                "## Calibration\n\n**Release gate failed:** calibrated ECE 0.1 is above --max-ece "
                                "0.05.\n\n")


def test_a_missing_file_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(tmp_path / "new.md"))
    assert append_step_summary(lambda: "é") is None
    assert (tmp_path / "new.md").read_bytes() == "é\n\n".encode()


def test_one_write_per_section(tmp_path, monkeypatch):
    """Each section is one os.write on a file opened with O_APPEND: concurrent sections never interleave."""
    path = tmp_path / "summary.md"
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(path))
    calls = []
    real_write, real_open = os.write, os.open

    def spy_open(name, flags, *args):
        assert flags & os.O_APPEND
        return real_open(name, flags, *args)

    def spy_write(fd, data):
        calls.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(files.os, "write", spy_write)
    monkeypatch.setattr(files.os, "open", spy_open)
    sections = [f"## section {k}\n" + "x" * 20000 + "\n" for k in range(8)]
    threads = [threading.Thread(target=append_step_summary, args=(lambda s=s: s,)) for s in sections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 8
    text = path.read_text()
    assert sorted(part for part in text.split("\n\n") if part) == sorted(s.rstrip("\n") for s in sections)


def test_an_unwritable_destination_is_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(tmp_path))  # a folder
    problem = append_step_summary(lambda: "text")
    assert problem is not None and problem.startswith(f"${STEP_SUMMARY_ENV} {tmp_path}: cannot open it")

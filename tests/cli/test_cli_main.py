"""The tempcal command itself: fast help and version, python -m, exit statuses after the fast exit, plain output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import EXAMPLE

import tempcal


@pytest.mark.parametrize("argv", [["--help"], ["fit", "--help"], ["report", "--help"], ["ood", "--help"],
                                  ["apply", "--help"], ["--version"], ["help"], ["help", "fit"], ["help", "lm"],
                                  ["help", "--help"]])
def test_help_does_not_import_torch(argv):
    code = (f"import sys\nfrom tempcal.cli.main import main\ncode = main({argv!r})\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "tempcal" in done.stdout


def test_a_bare_tempcal_shows_the_help_as_a_usage_error(cli):
    """No command: the app's help on standard error, exit 2 (click's no_args_is_help), and no empty error line."""
    code, out, err = cli([])
    assert code == 2 and out == ""
    assert err.startswith("Usage: tempcal [OPTIONS] COMMAND") and "fit" in err and "error:" not in err


def test_python_dash_m_runs():
    done = subprocess.run([sys.executable, "-m", "tempcal", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("tempcal ")


def test_the_command_flushes_everything_before_its_fast_exit(tmp_path):
    """``tempcal`` ends with os._exit after flushing: JSON, files, errors and exit statuses all arrive."""
    copy = tmp_path / "digits.safetensors"
    copy.write_bytes(EXAMPLE.read_bytes())
    command = [sys.executable, "-m", "tempcal", "fit", str(copy), "--max-ece", "0", "--json", "-",
               "--markdown", str(tmp_path / "card.md")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr  # the gate: nothing reaches an ECE of 0
    report = json.loads(done.stdout)
    assert (tmp_path / "card.md").read_text().strip()
    assert tempcal.read_header(copy).stored_temperature() == report["temperature"]
    bad = subprocess.run([sys.executable, "-m", "tempcal", "fit", str(tmp_path / "missing.safetensors")],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error:")


def test_a_long_path_keeps_the_header_on_one_line(tmp_path):
    """A checkout or data folder deep in the file system: the header is not broken at the terminal's width."""
    folder = tmp_path.joinpath(*["a-rather-long-folder-name"] * 6)
    folder.mkdir(parents=True)
    copy = folder / "digits.safetensors"
    copy.write_bytes(EXAMPLE.read_bytes())
    for command in (["fit", str(copy), "--no-write"], ["report", str(copy)]):
        done = subprocess.run([sys.executable, "-m", "tempcal", *command], capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "80"}, timeout=300)
        assert done.returncode == 0, done.stderr
        header = done.stdout.splitlines()[0]
        assert header.startswith(f"{copy}: ") and len(header) > 80
        assert ("T fitted on 674 rows; figures on the 674 held-out rows" in header) == (command[0] == "fit")


def test_plain_output_without_a_terminal_or_with_no_color(tmp_path):
    env = {**__import__("os").environ, "NO_COLOR": "1", "FORCE_COLOR": ""}
    env.pop("FORCE_COLOR")
    done = subprocess.run([sys.executable, "-m", "tempcal", "report", str(EXAMPLE)], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0 and "\x1b[" not in done.stdout and "NLL" in done.stdout


@pytest.mark.parametrize(("command", "workflow", "extra"), [
    ("fit", "tempcal.workflows.fit.fit_file", ["--no-write"]),
    ("report", "tempcal.workflows.report.report_file", []),
    ("ood", "tempcal.workflows.ood.ood_file", ["--ood", str(EXAMPLE)]),
    ("apply", "tempcal.workflows.apply.apply_file", ["--output", "OUT"]),
    ("inspect", "tempcal.workflows.inspect.inspect_file", []),
])
def test_ctrl_c_in_any_command_is_status_1_and_one_line(tmp_path, cli, monkeypatch, command, workflow, extra):
    """The contract's exit statuses: an interrupted run is "anything else", 1 (not Typer's 130), said in one line."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(workflow, interrupted)
    extra = [str(tmp_path / "out.npz") if arg == "OUT" else arg for arg in extra]
    code, out, err = cli([command, str(EXAMPLE), *extra, "--no-config"])
    assert (code, out, err) == (1, "", "interrupted\n")
    assert list(tmp_path.iterdir()) == []

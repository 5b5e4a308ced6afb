"""What the command line checks before reading anything: every number in its range, choices in any case; and that
those checks need no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from conftest import assert_one_error_line, overconfident
from safetensors.torch import save_file

from tempcal.cli import app
from tempcal.cli.config_schema import command_schema

GROUP = typer.main.get_command(app)
COMMANDS = {name: command_schema(cmd) for name, cmd in GROUP.commands.items()}  # type: ignore[attr-defined]
HUGE = "9" * 400  # a 400-digit integer: an int option keeps it, a float option reads it as inf


def test_what_the_cli_checks_before_reading_stays_torch_and_numpy_free():
    """Options, model detection and validation are checked without slowing ``tempcal --help``."""
    code = ("import sys, tempcal.cli.options, tempcal.models.detect, tempcal.errors\n"
            "assert not {'torch', 'numpy'} & set(sys.modules), sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _numeric_options() -> list[tuple[str, str, str]]:
    """(command, flag, kind) for every option of every command that takes a number."""
    found = []
    for name, schema in COMMANDS.items():
        for spec in {spec.param_name: spec for spec in schema.options.values()}.values():
            if spec.kind in ("int", "float"):
                found.append((name, f"--{spec.key}", spec.kind))
    return found


NUMERIC = _numeric_options()


def test_the_commands_take_the_numbers_the_checks_are_meant_for():
    flags = {(command, flag) for command, flag, _ in NUMERIC}
    for command in ("fit", "report", "ood"):
        assert {(command, "--seed"), (command, "--chunk-rows"), (command, "--batch-size"),
                (command, "--softcap")} <= flags
    assert {("fit", "--val-fraction"), ("fit", "--max-ece"), ("fit", "--ignore-index"), ("ood", "--gen-gamma"),
            ("ood", "--gen-top"), ("ood", "--react"), ("ood", "--min-auroc"), ("ood", "--max-fpr95"),
            ("ood", "--odin-eps"), ("report", "--bins"), ("report", "--bootstrap")} <= flags


@pytest.mark.parametrize(("command", "flag", "kind"), NUMERIC)
@pytest.mark.parametrize("value", [HUGE, f"-{HUGE}"])
def test_every_number_is_range_checked_before_the_data(tmp_path, cli, command, flag, kind, value):
    """A 400-digit integer (either sign) given to any numeric option: exit 2, one line naming the option, and SOURCE
    (which does not exist) is never looked at."""
    missing = tmp_path / "missing.safetensors"
    code, out, err = cli([command, str(missing), flag, value, "--no-config"])
    assert code == 2 and out == ""
    line = assert_one_error_line(err, flag)
    assert "missing.safetensors" not in line and "internal error" not in err
    if kind == "float":
        assert "inf" in line or "greater than or equal" in line or "less than or equal" in line, line


@pytest.mark.parametrize(("argv", "message"), [
    (["fit", "--seed", "-5"], "error: --seed -5: expected a whole number from 0 to 9223372036854775807"),
    (["ood", "--seed", HUGE], "error: --seed 999999999999... (400 digits): expected a whole number from 0 to "
                              "9223372036854775807"),
    (["fit", "--val-fraction", "1e308"], "error: --val-fraction 1e+308: expected a number in (0, 1]"),
    (["fit", "--val-fraction", "0"], "error: --val-fraction 0.0: expected a number in (0, 1]"),
    (["fit", "--max-ece", HUGE], "error: --max-ece inf: expected a finite number >= 0"),
    (["report", "--ignore-index", HUGE], "error: --ignore-index 999999999999... (400 digits): expected a whole "
                                         "number from -9223372036854775808 to 9223372036854775807"),
    (["ood", "--gen-gamma", "nan"], "error: --gen-gamma nan: expected a finite number > 0"),
    (["ood", "--react", "0"], "error: --react 0.0: expected a number in (0, 100]"),
    (["ood", "--max-fpr95", "-0.1"], "error: --max-fpr95 -0.1: expected a number from 0 to 1"),
    (["ood", "--odin-eps", "-1"], "error: --odin-eps -1.0: expected a number >= 0"),
    (["report", "--softcap", "0"], "error: --softcap 0.0: expected a number > 0"),
    (["ood", "--tau", "2", "--tau", HUGE], "error: --tau " + HUGE + ": expected a number > 0 or 'fitted'"),
])
def test_out_of_range_messages(tmp_path, cli, argv, message):
    code, out, err = cli([argv[0], str(tmp_path / "missing.safetensors"), *argv[1:], "--no-config"])
    assert code == 2 and out == "" and err == message + "\n"


@pytest.fixture
def logits_file(tmp_path):
    logits, labels = overconfident()
    save_file({"logits": logits, "labels": labels}, str(tmp_path / "val.safetensors"))
    return tmp_path / "val.safetensors"


def test_choices_in_any_case(logits_file, run_json):
    out = run_json(["fit", str(logits_file), "--objective", "ECE", "--device", "CPU", "--estimators", "RMS_CE",
                    "--no-write", "--no-config"])
    assert out["objective"] == "ece" and out["device"] == "cpu"
    assert "rms_ce" in out["after"]


@pytest.mark.parametrize(("flag", "value", "detail"), [
    ("--objective", "mse", "'mse' is not nll or ece"),
    ("--lm-eval-norm", "words", "'words' is not none, chars or bytes"),
])
def test_a_wrong_choice_is_said_plainly(tmp_path, cli, flag, value, detail):
    code, _, err = cli(["fit", str(tmp_path / "missing.safetensors"), flag, value, "--no-config"])
    assert code == 2
    line = assert_one_error_line(err, flag, detail)
    assert "Value error" not in line and "missing.safetensors" not in line

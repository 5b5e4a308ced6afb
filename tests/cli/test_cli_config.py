"""Project configuration through the commands: the shipped release folder, the command line winning, discovery,
--config and --no-config, pyproject.toml, and bad configurations (exit 2, one line naming the file and key, nothing
written)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from conftest import EXAMPLES, assert_one_error_line, id_ood_logits, miscalibrated, snapshot
from reference import optimal_temperature, ref_msp, sk_figures
from safetensors.torch import load_file, save_file

import tempcal
from tempcal.cli import app
from tempcal.cli.config import load_config
from tempcal.cli.config_schema import command_schema

RELEASE = EXAMPLES / "release"


@pytest.fixture(scope="module")
def release_data(tmp_path_factory) -> Path:
    """The shipped release folder's data, made once by its own script."""
    folder = tmp_path_factory.mktemp("release-data")
    done = subprocess.run([sys.executable, str(RELEASE / "make_release_data.py"), str(folder)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture
def release(tmp_path, release_data, monkeypatch) -> Path:
    """A copy of examples/release (its tempcal.toml and data) as the current folder."""
    shutil.copy(RELEASE / "tempcal.toml", tmp_path / "tempcal.toml")
    for name in ("val.safetensors", "noise.safetensors"):
        shutil.copy(release_data / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_shipped_release_folder_runs_with_no_paths(release, cli):
    """fit, report, then the call a release script most wants to write: ``tempcal ood --tau 2``."""
    code, _, err = cli(["fit", "--quiet"])
    assert code == 0, err
    fitted = json.loads((release / "fit.json").read_text())
    data = load_file(str(release / "val.safetensors"))
    assert fitted["config"] == str(release / "tempcal.toml")
    assert fitted["config_keys"] == ["[fit] html", "[fit] json", "[fit] markdown", "[fit] max-ece",
                                     "[fit] val-fraction", "source"]
    assert fitted["source"] == "val.safetensors" and fitted["gate_passed"] is True and fitted["max_ece"] == 0.05
    assert fitted["temperature"] == pytest.approx(2.3575053928861727, rel=1e-9)  # the README's digits T
    assert tempcal.read_stored_temperature(release / "val.safetensors")[0] == fitted["temperature"]
    assert "## Calibration" in (release / "calibration.md").read_text()
    assert "T = 2.35751" in (release / "fit.html").read_text()  # the reviewer's page, a CI artefact
    code, _, err = cli(["report", "--quiet"])
    assert code == 0, err
    report = json.loads((release / "report.json").read_text())
    assert [r["tau"] for r in report["results"]] == [1.0, fitted["temperature"]]  # tau = ["fitted", 1], sorted
    code, out, err = cli(["ood", "--tau", "2"])
    assert code == 0, err
    ood = json.loads((release / "ood.json").read_text())
    assert ood["config"] == str(release / "tempcal.toml")
    assert ood["config_keys"] == ["[ood] json", "[ood] markdown", "[ood] ood", "source"]  # tau: the command line's
    assert ood["taus"] == [2.0] and ood["ood_files"] == ["noise.safetensors"] and ood["source"] == "val.safetensors"
    noise = load_file(str(release / "noise.safetensors"))["logits"]
    expected = sk_figures(ref_msp(data["logits"].double().numpy(), 2.0), ref_msp(noise.double().numpy(), 2.0))
    assert ood["results"][0]["auroc"] == pytest.approx(expected["auroc"], abs=1e-9)
    assert "### `noise.safetensors`" in (release / "ood.md").read_text()
    assert "wrote the Markdown section to ood.md" in out


def test_the_command_line_wins(release, run_json, tmp_path):
    logits, labels = miscalibrated(300, 4, 3.0, seed=2)
    save_file({"logits": logits, "labels": labels}, str(tmp_path / "other.safetensors"))
    before = (release / "val.safetensors").read_bytes()
    out = run_json(["fit", "other.safetensors", "--val-fraction", "1.0", "--no-write", "--max-ece", "1"])
    assert out["source"] == "other.safetensors" and out["val_fraction"] == 1.0 and out["written"] is None
    assert out["temperature"] == pytest.approx(optimal_temperature(logits, labels), rel=1e-6)
    assert out["config_keys"] == ["[fit] html", "[fit] markdown"]  # json: '-' from the command line; max-ece too
    assert (release / "val.safetensors").read_bytes() == before and not (release / "fit.json").exists()
    # a repeatable option is replaced, not extended; a switch set in the file is turned off (no T stored here)
    report = run_json(["report", "--tau", "3", "--tau", "4", "--all-rows"])
    assert [r["tau"] for r in report["results"]] == [3.0, 4.0]


def test_a_switch_set_in_the_file_can_be_turned_off(release, run_json):
    (release / "tempcal.toml").write_text('source = "val.safetensors"\n[fit]\nno-write = true\nquiet = true\n')
    before = (release / "val.safetensors").read_bytes()
    assert run_json(["fit"])["written"] is None
    assert (release / "val.safetensors").read_bytes() == before
    assert run_json(["fit", "--write"])["written"] == "val.safetensors"
    assert (release / "val.safetensors").read_bytes() != before


def test_the_nearest_parent_and_paths_relative_to_it(release, run_json, monkeypatch):
    (release / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(release / "a" / "b")
    out = run_json(["ood", "--tau", "1"])
    assert out["config"] == str(release / "tempcal.toml")
    assert out["source"] == str(release / "val.safetensors")  # outside the current folder: absolute
    assert out["ood_files"] == [str(release / "noise.safetensors")]


def test_config_and_no_config(release, run_json, cli, tmp_path):
    z_id, y, z_ood = id_ood_logits()
    (release / "ci").mkdir()
    save_file({"logits": z_id, "labels": y}, str(release / "ci" / "id.safetensors"))
    save_file({"logits": z_ood}, str(release / "ci" / "ood.safetensors"))
    (release / "ci" / "gate.toml").write_text('source = "id.safetensors"\n[ood]\nood = "ood.safetensors"\n'
                                              'score = "energy"\ntau = 1\n')
    out = run_json(["ood", "--config", "ci/gate.toml"])
    assert out["config"] == str(release / "ci" / "gate.toml") and out["scores"] == ["energy"]
    assert out["source"] == "ci/id.safetensors" and out["ood_files"] == ["ci/ood.safetensors"]
    out = run_json(["ood", "ci/id.safetensors", "--ood", "ci/ood.safetensors", "--tau", "1", "--no-config"])
    assert out["config"] is None and out["config_keys"] == [] and out["scores"] == ["msp"]
    code, _, err = cli(["fit", "--no-config"])  # no SOURCE anywhere
    assert code == 2 and "Missing argument 'SOURCE'" in err


def test_a_pyproject_table(tmp_path, run_json, monkeypatch):
    logits, labels = miscalibrated(200, 3, 2.0, seed=3)
    save_file({"logits": logits, "labels": labels}, str(tmp_path / "v.safetensors"))
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "m"\n[tool.tempcal]\nsource = "v.safetensors"\n'
                                             "[tool.tempcal.report]\ntau = 2\nbins = 10\n")
    monkeypatch.chdir(tmp_path)
    out = run_json(["report"])
    assert out["config"] == str(tmp_path / "pyproject.toml") and out["bins_count"] == 10
    assert [r["tau"] for r in out["results"]] == [2.0] and len(out["results"][0]["bins"]) == 10


def test_no_configuration_found_is_null_in_the_json(tmp_path, run_json):
    logits, labels = miscalibrated(100, 3, 2.0)
    save_file({"logits": logits, "labels": labels}, str(tmp_path / "x.safetensors"))
    out = run_json(["report", str(tmp_path / "x.safetensors")])  # run from the repository, which has none
    assert out["config"] is None and out["config_keys"] == []


BAD = [
    (["ood", "--tau", "2"], 'source = "val.safetensors"\n[ood]\nood = "noise.safetensors"\ntau = true\n',
     'tempcal.toml: [ood] tau: expected a number or "fitted" or a list of them, got true'),
    (["ood", "--tau", "2"], 'source = "val.safetensors"\n[ood]\nood = ["missing.safetensors"]\n',
     "tempcal.toml: [ood] ood: no such file: missing.safetensors"),
    (["fit"], 'source = "gone.safetensors"\n', "tempcal.toml: source: no such file: gone.safetensors"),
    (["fit"], 'source = "val.safetensors"\n[fit]\neval = "gone.safetensors"\n',
     "tempcal.toml: [fit] eval: no such file: gone.safetensors"),
    (["fit"], 'source = "val.safetensors"\n[report]\nbinz = 3\n',
     "tempcal.toml: [report] binz: unknown key (did you mean 'bins'?)"),
    (["report"], 'source = "val.safetensors"\n[report]\ntau = "hot"\n',
     'tempcal.toml: [report] tau: expected a number > 0 or "fitted", got "hot"'),
    (["fit"], "[fit]\nseed = \n", "tempcal.toml: invalid TOML: Invalid value (at line 2, column 8)"),
    (["fit"], 'source = "val.safetensors"\n[fit]\nmax-ece = "0.05"\n',
     'tempcal.toml: [fit] max-ece: expected a number, got "0.05"'),
    (["fit"], 'source = "val.safetensors"\n[fit]\nval-fraction = 1.5\n',  # out of range: before any file is read
     "tempcal.toml: [fit] val-fraction: expected a number in (0, 1], got 1.5"),
    (["fit", "--output", "copy.safetensors"], 'source = "val.safetensors"\n[fit]\nno-write = true\n',  # fit's own check
     "--output and --no-write contradict each other (--no-write is set in tempcal.toml: [fit] no-write)"),
    (["ood", "--config", "nope.toml"], "", "--config nope.toml: no such file"),
    (["ood", "--config", "tempcal.toml", "--no-config"], "", "--config and --no-config contradict each other"),
]


@pytest.mark.parametrize(("argv", "toml", "message"), BAD)
def test_a_bad_configuration_is_exit_2_one_line_and_nothing_written(release, cli, argv, toml, message):
    (release / "tempcal.toml").write_text(toml)
    before = snapshot(release)
    code, out, err = cli([*argv, "--json", "out.json"])
    assert code == 2 and out == ""
    assert_one_error_line(err, message)
    assert err == f"error: {message}\n"
    assert snapshot(release) == before


def test_a_missing_configured_file_the_command_line_replaces_is_not_looked_at(release, run_json):
    (release / "tempcal.toml").write_text('source = "gone.safetensors"\n[ood]\nood = ["gone-too.safetensors"]\n')
    out = run_json(["ood", "val.safetensors", "--ood", "noise.safetensors", "--tau", "1"])
    assert out["config_keys"] == [] and out["ood_files"] == ["noise.safetensors"]


def test_help_and_usage_errors_come_before_the_file(release, cli):
    (release / "tempcal.toml").write_text("[fit\n")  # not valid TOML
    code, out, _ = cli(["fit", "--help"])
    assert code == 0 and "--no-config" in out
    code, _, err = cli(["fit", "--bogus"])
    assert code == 2 and "No such option: --bogus" in err


def test_the_shipped_configuration_holds_only_keys_the_commands_take():
    group = typer.main.get_command(app)
    config = load_config(RELEASE / "tempcal.toml")
    config.check({name: command_schema(cmd) for name, cmd in group.commands.items()})  # type: ignore[attr-defined]
    assert config.data["source"] == "val.safetensors" and set(config.data) == {"source", "fit", "report", "ood"}


# -- values out of range, checked before any file is read ----------------------------------------------------

HUGE = "9" * 400
SHOWN = "999999999999... (400 digits)"

OUT_OF_RANGE = [
    (["fit"], f"[fit]\nmax-ece = {HUGE}\n", f"tempcal.toml: [fit] max-ece: expected a finite number >= 0, got {SHOWN}"),
    (["fit"], f"[fit]\nval-fraction = {HUGE}\n",
     f"tempcal.toml: [fit] val-fraction: expected a finite number in (0, 1], got {SHOWN}"),
    (["report"], f"[report]\ntau = [1, {HUGE}]\n",
     f'tempcal.toml: [report] tau[1]: expected a number > 0 or "fitted", got {SHOWN}'),
    (["fit"], "[fit]\nseed = -5\n", "tempcal.toml: [fit] seed: expected a whole number from 0 to 9223372036854775807, "
                                    "got -5"),
    (["ood"], "[report]\nbootstrap = -1\n",  # another command's table: checked on every run
     "tempcal.toml: [report] bootstrap: expected a whole number from 0 to 100000, got -1"),
    (["fit"], "[fit]\nval-fraction = 1e308\n",
     "tempcal.toml: [fit] val-fraction: expected a number in (0, 1], got 1e+308"),
    (["report"], "[report]\ntau = " + "[" * 3000 + "]" * 3000 + "\n",
     "tempcal.toml: [report] tau: nested more than 64 brackets deep (line 2); a value is a number, a string, or a list "
     "of them"),
    (["report"], "[report]\ntau = " + "[" * 100_000 + "\n",
     "tempcal.toml: [report] tau: nested more than 64 brackets deep (line 2); a value is a number, a string, or a list "
     "of them"),
]


@pytest.mark.parametrize(("argv", "toml", "message"), OUT_OF_RANGE)
def test_a_value_out_of_range_is_named_before_the_data_is_read(tmp_path, monkeypatch, cli, argv, toml, message):
    """SOURCE does not exist: were it opened before the file's values were checked, the error would name it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tempcal.toml").write_text(toml)
    ood = ["--ood", "missing.safetensors"] if argv == ["ood"] else []
    code, out, err = cli([*argv, "missing.safetensors", *ood, "--json", "out.json"])
    assert code == 2 and out == "" and err == f"error: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tempcal.toml"]


def test_a_value_in_range_goes_on_to_the_data(tmp_path, monkeypatch, cli):
    """The control for the test above: with the value in range the same run reaches SOURCE."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tempcal.toml").write_text("[fit]\nseed = 5\nmax-ece = 0.5\n")
    code, _, err = cli(["fit", "missing.safetensors"])
    assert code == 2 and "missing.safetensors" in assert_one_error_line(err)


# -- what is read as a configuration file --------------------------------------------------------------------


def _limited_memory() -> None:  # pragma: no cover - runs in the child
    """A child that reads /dev/zero into memory fails with MemoryError instead of exhausting the machine."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _not_regular(tmp_path: Path, case: str) -> tuple[list[str], Path, str]:
    """A folder holding a tempcal.toml a silent skip would find, and below it the file of ``case``: (argv, cwd,
    the name the error must give)."""
    (tmp_path / "tempcal.toml").write_text("[fit]\nseed = 1\n")
    here = tmp_path / "here"
    here.mkdir()
    if case == "--config FIFO":
        os.mkfifo(here / "gate.toml")
        return ["--config", "gate.toml"], here, "--config gate.toml: is a named pipe (FIFO)"
    if case == "--config /dev/zero":
        return ["--config", "/dev/zero"], here, "--config /dev/zero: is a character device"
    if case == "found FIFO":
        os.mkfifo(here / "tempcal.toml")
        return [], here, "tempcal.toml: is a named pipe (FIFO)"
    if case == "found link to /dev/zero":
        os.symlink("/dev/zero", here / "tempcal.toml")
        return [], here, "tempcal.toml: is a character device (a link to /dev/zero)"
    if case == "found folder":
        (here / "tempcal.toml").mkdir()
        return [], here, "tempcal.toml: is a folder"
    os.mkfifo(here / "pyproject.toml")  # "found pyproject FIFO"
    return [], here, "pyproject.toml: is a named pipe (FIFO)"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
@pytest.mark.parametrize("case", ["--config FIFO", "--config /dev/zero", "found FIFO", "found link to /dev/zero",
                                  "found folder", "found pyproject FIFO"])
def test_a_configuration_that_is_not_a_regular_file_is_refused_at_once(tmp_path, case):
    """Run as a separate process with a timeout and a memory limit: the failure this guards against is a hang
    (a FIFO waits for a writer) or reading /dev/zero until memory runs out."""
    argv, cwd, named = _not_regular(tmp_path, case)
    done = subprocess.run([sys.executable, "-m", "tempcal", "fit", "missing.safetensors", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=60, preexec_fn=_limited_memory,
                          env={**os.environ, "PYTHONPATH": str(Path(tempcal.__file__).parents[1])})
    assert done.returncode == 2 and done.stdout == ""
    line = assert_one_error_line(done.stderr, named, "a configuration file must be a regular file")
    assert line.startswith(f"error: {named}")


# -- saying which file was applied ---------------------------------------------------------------------------


def test_the_file_applied_is_named_on_standard_error_even_under_quiet(tmp_path, monkeypatch, cli):
    """``config: PATH`` (as found from the current folder) on standard error; standard output stays pure JSON."""
    logits, labels = miscalibrated(300, 4, 3.0, seed=2)
    save_file({"logits": logits, "labels": labels}, str(tmp_path / "val.safetensors"))
    (tmp_path / "tempcal.toml").write_text('source = "val.safetensors"\n[fit]\nno-write = true\n')
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "gate.toml").write_text('source = "../val.safetensors"\n[report]\ntau = 2\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    code, out, err = cli(["fit", "--quiet", "--json", "-"])
    assert code == 0 and err == f"config: {os.path.join('..', 'tempcal.toml')}\n"
    assert json.loads(out)["config"] == str(tmp_path / "tempcal.toml")
    code, out, err = cli(["report", "--config", "../ci/gate.toml"])
    assert code == 0 and err == "config: ../ci/gate.toml\n" and "config:" not in out
    code, out, err = cli(["fit", "../val.safetensors", "--no-write", "--no-config", "--quiet"])
    assert code == 0 and out == "" and err == ""

"""The project configuration module: discovery, reading, the schema derived from the real commands, values, paths
and every bad value (one line naming the file and key)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Annotated, Optional

import pytest
import typer

import tempcal.cli.config as cfg
from tempcal.cli import app
from tempcal.cli.config import ConfigError, load_config, resolve_config
from tempcal.cli.config_schema import INPUTS, PathValue, command_schema
from tempcal.errors import MAX_BINS, Bounds, TempcalError

GROUP = typer.main.get_command(app)
SCHEMAS = {name: command_schema(cmd) for name, cmd in GROUP.commands.items()}  # type: ignore[attr-defined]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def config_in(tmp_path: Path, text: str | None, name: str = "tempcal.toml") -> cfg.Config:
    """The file ``name`` holding ``text`` (None: as it is), read."""
    path = tmp_path / name if text is None else write(tmp_path / name, text)
    return load_config(path, display=name)


# -- discovery -----------------------------------------------------------------------------------------------


def find_config(start):
    """The file a run in ``start`` uses (no --config, no --no-config), or None."""
    config = resolve_config(None, False, start)
    return config.path if config is not None else None


def test_found_in_the_current_folder_or_the_nearest_parent(tmp_path):
    top = write(tmp_path / "tempcal.toml", "")
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    assert find_config(tmp_path) == top and find_config(deep) == top
    nearer = write(tmp_path / "a" / "tempcal.toml", "")
    assert find_config(deep) == nearer


def test_a_pyproject_counts_only_with_the_table(tmp_path):
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n[tool.tempcal]\nsource = "val.safetensors"\n')
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n[tool.ruff]\nline-length = 100\n')
    assert find_config(tmp_path / "pkg") == tmp_path / "pyproject.toml"  # the search goes on past pkg's


def test_tempcal_toml_first_in_a_folder_and_a_nearer_pyproject_first_overall(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.tempcal]\n")
    assert find_config(tmp_path) == tmp_path / "pyproject.toml"
    write(tmp_path / "tempcal.toml", "")
    assert find_config(tmp_path) == tmp_path / "tempcal.toml"
    write(tmp_path / "p" / "pyproject.toml", "[tool.tempcal.fit]\nseed = 1\n")
    assert find_config(tmp_path / "p") == tmp_path / "p" / "pyproject.toml"


def test_a_broken_pyproject_on_the_way_up(tmp_path):
    """One that never mentions tempcal is skipped unread; one that does must parse."""
    write(tmp_path / "tempcal.toml", "")
    write(tmp_path / "sub" / "pyproject.toml", "[project\nname = 1\n")
    assert find_config(tmp_path / "sub") == tmp_path / "tempcal.toml"
    write(tmp_path / "sub" / "pyproject.toml", "[tool.tempcal]\nsource = \n")
    with pytest.raises(ConfigError, match=r"pyproject\.toml: invalid TOML: .*\(at line 2, column 10\)"):
        find_config(tmp_path / "sub")
    write(tmp_path / "sub" / "pyproject.toml", '[tool]\ntempcal = "yes"\n')
    with pytest.raises(ConfigError, match=r"pyproject\.toml: \[tool\] tempcal: must be a table, got \"yes\""):
        find_config(tmp_path / "sub")


def test_this_repository_has_no_configuration_of_its_own():
    """The project's own pyproject.toml has no [tool.tempcal]: the tests run without a configuration."""
    here = Path(__file__).resolve().parents[2]
    found = find_config(here)
    assert found is None or not str(found).startswith(str(here))


# -- reading -------------------------------------------------------------------------------------------------


def test_resolve_modes(tmp_path, monkeypatch):
    write(tmp_path / "tempcal.toml", "")
    other = write(tmp_path / "ci" / "release.toml", "[fit]\nseed = 3\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config(None, False).path == tmp_path / "tempcal.toml"  # type: ignore[union-attr]
    assert resolve_config(None, True) is None
    assert resolve_config("ci/release.toml", False).path == other  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"^--config and --no-config contradict each other$"):
        resolve_config("ci/release.toml", True)
    with pytest.raises(ConfigError, match=r"^--config nope\.toml: no such file$"):
        resolve_config("nope.toml", False)
    assert issubclass(ConfigError, TempcalError)  # exit status 2


@pytest.mark.parametrize(("text", "pattern"), [
    ('source = "a"\n[fit]\nbins = 10\nseed = = 1\n', r"^tempcal\.toml: invalid TOML: .*\(at line 4, column 8\)$"),
    ("[fit]\nseed = 1\nseed = 2\n", r"^tempcal\.toml: invalid TOML: .*line 3"),  # a key given twice
])
def test_syntax_errors_name_the_line(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        config_in(tmp_path, text)


def test_not_utf8_a_folder_and_a_pyproject_without_the_table(tmp_path):
    (tmp_path / "tempcal.toml").write_bytes(b'source = "\xff"\n')
    with pytest.raises(ConfigError, match=r"^tempcal\.toml: not UTF-8 text \(byte 11\)$"):
        load_config(tmp_path / "tempcal.toml", display="tempcal.toml")
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(tmp_path)
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=r"pyproject\.toml: has no \[tool\.tempcal\] table"):
        load_config(tmp_path / "pyproject.toml", display="pyproject.toml")


def test_python_310_without_tomli(tmp_path, monkeypatch):
    monkeypatch.setattr(cfg, "_toml", None)
    write(tmp_path / "tempcal.toml", "")
    with pytest.raises(ConfigError, match=r"needs Python >= 3\.11 or the 'tomli' package"):
        find_config(tmp_path)


def test_a_found_file_that_is_not_a_regular_one_is_an_error_not_skipped(tmp_path, monkeypatch):
    """A folder or a dangling link named tempcal.toml or pyproject.toml stops the search with its name."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "tempcal.toml", "[fit]\nseed = 1\n")  # what a silent skip would find instead
    (tmp_path / "a" / "tempcal.toml").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"^a/tempcal\.toml: is a folder; a configuration file must be a regular"):
        resolve_config(None, False, cwd=tmp_path / "a")
    (tmp_path / "b").mkdir()
    os.symlink(tmp_path / "gone.toml", tmp_path / "b" / "pyproject.toml")
    with pytest.raises(ConfigError, match=r"pyproject\.toml: is a link to .*gone\.toml, which does not exist$"):
        find_config(tmp_path / "b")


def test_a_file_over_1_mib_is_refused_unread(tmp_path):
    path = tmp_path / "tempcal.toml"
    with open(path, "wb") as f:  # a sparse file: its size, not its bytes, is over the limit
        f.truncate(cfg.MAX_CONFIG_BYTES + 1)
    with pytest.raises(ConfigError, match=rf"^tempcal\.toml: is {(1 << 20) + 1} bytes; a configuration file may hold "
                                          r"at most 1 MiB$"):
        config_in(tmp_path, None)
    path.write_bytes(b"# " + b"x" * (cfg.MAX_CONFIG_BYTES - 3) + b"\n")  # exactly 1 MiB is read
    assert config_in(tmp_path, None).data == {}


@pytest.mark.parametrize("depth", [3_000, 100_000])
def test_deep_nesting_names_the_key_and_line(tmp_path, depth):
    """Nested past the limit: one line naming the key, not a RecursionError from the parser."""
    text = f'source = "v.st"\n[report]\nbins = 10\ntau = [\n  {"[" * depth}{"]" * depth}]\n'
    with pytest.raises(ConfigError) as caught:
        config_in(tmp_path, text)
    assert str(caught.value) == (f"tempcal.toml: [report] tau: nested more than {cfg.MAX_NESTING} brackets "
                                 "deep (line 5); a value is a number, a string, or a list of them")


def test_nesting_up_to_the_limit_is_left_to_the_parser_and_strings_do_not_count(tmp_path):
    """Brackets in strings and comments are not nesting; inline tables are."""
    deep = cfg.MAX_NESTING
    text = (f'a = "[[[[" # [[[[\nb = \'\'\'\n{"[" * 500}\'\'\'\nc = {"[" * deep}{"]" * deep}\n'
            f'[ood]\nd = """{"{" * 500}"""\n')
    data = config_in(tmp_path, text).data
    assert data["a"] == "[[[[" and data["b"] == "[" * 500 and data["ood"]["d"] == "{" * 500
    with pytest.raises(ConfigError, match=r"^tempcal\.toml: \[ood\] e: nested more than"):
        config_in(tmp_path, "[ood]\ne = " + "{x = " * (deep + 1) + "1" + "}" * (deep + 1) + "\n")


def test_an_integer_too_long_for_python_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^tempcal\.toml: \[fit\] seed: an integer of 5000 digits \(line 2\)"):
        config_in(tmp_path, "[fit]\nseed = " + "9" * 5000 + "\n")
    assert config_in(tmp_path, 'source = "' + "9" * 5000 + '"\n').data["source"] == "9" * 5000  # text, not a number


# -- the schema, from the commands' own parameters -----------------------------------------------------------


def test_the_schema_comes_from_the_commands():
    fit, report, ood = SCHEMAS["fit"], SCHEMAS["report"], SCHEMAS["ood"]
    assert fit.options["val-fraction"].param_name == "val_fraction"
    assert fit.options["max-ece"].bounds == Bounds(0.0)  # type: ignore[union-attr]
    assert fit.options["bins"].bounds == Bounds(1, MAX_BINS)  # type: ignore[union-attr]
    assert fit.options["val-fraction"].bounds == Bounds(0, 1, low_open=True)  # type: ignore[union-attr]
    assert ood.options["seed"].bounds == Bounds(0) and ood.options["gen-gamma"].bounds.low_open  # type: ignore
    assert fit.options["objective"].choices == ("nll", "ece")  # type: ignore[union-attr]
    assert fit.options["lm-eval-norm"].choices == ("none", "chars", "bytes")  # type: ignore[union-attr]
    assert fit.options["eval"].path == INPUTS and fit.options["inputs"].path == PathValue(must_exist=True)  # type: ignore
    assert fit.options["json"].path == PathValue(allow_dash=True)  # type: ignore[union-attr]
    assert fit.options["output"].path == PathValue()  # type: ignore[union-attr]
    assert fit.options["no-write"].negative == ("write",) and fit.options["probs"].negative == ("no-probs",)  # type: ignore
    assert fit.options["quiet"].kind == "bool"  # type: ignore[union-attr]
    assert ood.options["ood"].param_name == "ood_files" and ood.options["ood"].multiple  # type: ignore[union-attr]
    assert ood.options["tau"].kind == "custom" and report.options["tau"].kind == "custom"  # type: ignore[union-attr]
    assert "markdown" in ood.options and report.options["sweep"].kind == "str"  # type: ignore[union-attr]
    for schema in SCHEMAS.values():
        assert schema.source is not None and schema.source.multiple and schema.source.kind == "path"
        assert not {"config", "no-config", "help"} & set(schema.options)
        assert set(schema.refused) == {"config", "no-config"}


def test_a_new_option_needs_no_second_declaration():
    demo = typer.Typer()

    @demo.command()
    def cmd(
        source: Annotated[list[str], typer.Argument()],
        gen_gamma: Annotated[float, typer.Option("--gen-gamma", "--gamma", min=0.0)] = 0.1,
        react: Annotated[Optional[float], typer.Option("--react"), Bounds(0, 100, low_open=True)] = None,
        top: Annotated[Optional[list[int]], typer.Option("--top")] = None,
        head: Annotated[Optional[Path], typer.Option("--head")] = None,
        pair: Annotated[tuple[int, int], typer.Option("--pair")] = (1, 2),
    ) -> None:
        pass

    schema = command_schema(typer.main.get_command(demo))
    assert schema.options["gen-gamma"] is schema.options["gamma"]
    assert schema.options["gen-gamma"].kind == "float" and schema.options["gen-gamma"].bounds == Bounds(0.0)  # type: ignore
    assert schema.options["react"].kind == "float" and schema.options["react"].bounds.low_open  # type: ignore
    assert schema.options["top"].kind == "int" and schema.options["top"].multiple  # type: ignore[union-attr]
    assert schema.options["head"].kind == "path"  # type: ignore[union-attr]
    assert "pair" in schema.refused


# -- values --------------------------------------------------------------------------------------------------


def test_values_become_command_line_values(tmp_path):
    config = config_in(tmp_path, """
        source = ["a.safetensors", "/abs/b.safetensors"]
        [fit]
        val-fraction = 1
        seed = 7
        objective = "ece"
        bins = 10
        json = "-"
        output = "out/cal.safetensors"
        no-write = true
        max-ece = 0.05
        lm-eval-norm = "chars"
        [report]
        tau = [1, 2.5, "fitted", "3"]
        [ood]
        ood = "noise.safetensors"
        tau = 2
        score = "energy"
    """)
    config.check(SCHEMAS)
    fit = config.defaults_for("fit", SCHEMAS["fit"], check_files=False)
    assert fit == {"val_fraction": 1.0, "seed": 7, "objective": "ece", "bins": 10, "json_out": "-",
                   "output": str(tmp_path / "out" / "cal.safetensors"), "no_write": True, "max_ece": 0.05,
                   "lm_eval_norm": "chars", "source": [str(tmp_path / "a.safetensors"), "/abs/b.safetensors"]}
    assert isinstance(fit["val_fraction"], float)
    assert config.defaults_for("report", SCHEMAS["report"], check_files=False)["tau"] == ["1", "2.5", "fitted", "3"]
    ood = config.defaults_for("ood", SCHEMAS["ood"], given={"source"}, check_files=False)
    assert ood["ood_files"] == [str(tmp_path / "noise.safetensors")] and ood["tau"] == ["2"]
    assert ood["score"] == "energy"


def test_relative_paths_are_relative_to_the_file(tmp_path, monkeypatch):
    write(tmp_path / "release" / "tempcal.toml", 'source = "../data/val.safetensors"\n[ood]\nood = ["n.st"]\n')
    (tmp_path / "release" / "deep").mkdir()
    monkeypatch.chdir(tmp_path / "release" / "deep")
    config = resolve_config(None, False)
    assert config is not None
    out = config.defaults_for("ood", SCHEMAS["ood"], check_files=False)
    assert out["source"] == [str(tmp_path / "data" / "val.safetensors")]  # outside the current folder: absolute
    assert out["ood_files"] == [str(tmp_path / "release" / "n.st")]
    monkeypatch.chdir(tmp_path / "release")
    out = config.defaults_for("ood", SCHEMAS["ood"], check_files=False)
    assert out["ood_files"] == ["n.st"]  # in the current folder: as the user would type it
    assert os.path.abspath(out["ood_files"][0]) == str(tmp_path / "release" / "n.st")


def test_a_command_table_source_wins_over_the_top_level_one(tmp_path):
    config = config_in(tmp_path, 'source = ["a", "b"]\n[ood]\nsource = "id.st"\n')
    assert config.defaults_for("ood", SCHEMAS["ood"], check_files=False)["source"] == [str(tmp_path / "id.st")]
    assert config.defaults_for("fit", SCHEMAS["fit"], check_files=False)["source"] == [str(tmp_path / "a"),
                                                                                       str(tmp_path / "b")]


BAD_VALUES = [
    ("[ood]\ntau = true\n", 'tempcal.toml: [ood] tau: expected a number or "fitted" or a list of them, got true'),
    ("[ood]\ntau = [1, true]\n", 'tempcal.toml: [ood] tau[1]: expected a number or "fitted", got true'),
    ("[ood]\ntau = -1\n", 'tempcal.toml: [ood] tau: expected a number > 0 or "fitted", got -1'),
    ("[ood]\ntau = \"hot\"\n", 'tempcal.toml: [ood] tau: expected a number > 0 or "fitted", got "hot"'),
    ("[ood]\ntau = []\n", 'tempcal.toml: [ood] tau: expected a number or "fitted" or a list of them, got an empty'
                          " list"),
    ("[fit]\nval-fraction = \"0.2\"\n", 'tempcal.toml: [fit] val-fraction: expected a number, got "0.2"'),
    ("[fit]\nval-fraction = nan\n", "tempcal.toml: [fit] val-fraction: expected a number, got nan"),
    ("[fit]\nmax-ece = -0.1\n", "tempcal.toml: [fit] max-ece: expected a number >= 0, got -0.1"),
    ("[fit]\nseed = 1.5\n", "tempcal.toml: [fit] seed: expected an integer, got 1.5"),
    ("[fit]\nseed = -5\n", "tempcal.toml: [fit] seed: expected a whole number from 0 to 9223372036854775807, got -5"),
    (f"[fit]\nmax-ece = {'9' * 400}\n",
     "tempcal.toml: [fit] max-ece: expected a finite number >= 0, got 999999999999... (400 digits)"),
    (f"[fit]\nval-fraction = {'9' * 400}\n",
     "tempcal.toml: [fit] val-fraction: expected a finite number in (0, 1], got 999999999999... (400 digits)"),
    ("[fit]\nval-fraction = 1e308\n", "tempcal.toml: [fit] val-fraction: expected a number in (0, 1], got 1e+308"),
    ("[fit]\nmax-ece = inf\n", "tempcal.toml: [fit] max-ece: expected a finite number >= 0, got inf"),
    (f"[ood]\ntau = [1, {'9' * 400}]\n",
     'tempcal.toml: [ood] tau[1]: expected a number > 0 or "fitted", got 999999999999... (400 digits)'),
    (f"[report]\nignore-index = -{'9' * 400}\n", "tempcal.toml: [report] ignore-index: expected a whole number from "
     "-9223372036854775808 to 9223372036854775807, got -999999999999... (400 digits)"),
    ("[report]\nchunk-rows = 9223372036854775808\n",
     "tempcal.toml: [report] chunk-rows: expected a whole number from 1 to 9223372036854775807, got "
     "9223372036854775808"),
    ("[ood]\ngen-gamma = 0\n", "tempcal.toml: [ood] gen-gamma: expected a number > 0, got 0"),
    ("[ood]\nreact = 100.5\n", "tempcal.toml: [ood] react: expected a number in (0, 100], got 100.5"),
    ("[ood]\nmin-auroc = 1.5\n", "tempcal.toml: [ood] min-auroc: expected a number from 0 to 1, got 1.5"),
    ("[ood]\nodin-eps = -0.1\n", "tempcal.toml: [ood] odin-eps: expected a number >= 0, got -0.1"),
    ("[fit]\nsoftcap = -1\n", "tempcal.toml: [fit] softcap: expected a number > 0, got -1"),
    ("[fit]\nseed = true\n", "tempcal.toml: [fit] seed: expected an integer, got true"),
    ("[report]\nbins = 0\n", "tempcal.toml: [report] bins: expected a whole number from 1 to 100000, got 0"),
    ("[fit]\nno-write = \"yes\"\n", 'tempcal.toml: [fit] no-write: expected true or false, got "yes"'),
    ("[fit]\nno-write = 1\n", "tempcal.toml: [fit] no-write: expected true or false, got 1"),
    ("[fit]\nobjective = \"mse\"\n", 'tempcal.toml: [fit] objective: expected one of "nll", "ece", got "mse"'),
    ("[fit]\nobjective = [\"nll\"]\n", 'tempcal.toml: [fit] objective: expected one of "nll", "ece", got a list'),
    ("[ood]\nlm-eval-norm = \"words\"\n",
     'tempcal.toml: [ood] lm-eval-norm: expected one of "none", "chars", "bytes", got "words"'),
    ("[fit]\neval = 3\n", "tempcal.toml: [fit] eval: expected a path (a string), got 3"),
    ("[fit]\noutput = \"\"\n", "tempcal.toml: [fit] output: expected a path, got an empty string"),
    ("[fit]\nmax-ece = 2024-01-01\n", "tempcal.toml: [fit] max-ece: expected a number, got a date"),
    ("[fit]\nval_fraction = 0.2\n", "tempcal.toml: [fit] val_fraction: unknown key (did you mean 'val-fraction'?)"),
    ("[fit]\nwrite = true\n", "tempcal.toml: [fit] write: unknown key; write no-write = false"),
    ("[fit]\nno-probs = true\n", "tempcal.toml: [fit] no-probs: unknown key; write probs = false"),
    ("[fit]\nno-config = true\n", "tempcal.toml: [fit] no-config: cannot be set in a configuration file"),
    ("[fit]\nconfig = \"x.toml\"\n", "tempcal.toml: [fit] config: cannot be set in a configuration file"),
    ("[ood]\nsweep = \"1:2:3\"\n", "tempcal.toml: [ood] sweep: unknown key (did you mean 'seed'?)"),
    ("[ood]\nsweeping = 3\n", "tempcal.toml: [ood] sweeping: unknown key (ood options: "),
    ("tau = 2\n", "tempcal.toml: tau: unknown key; the top level holds 'source' and the tables [fit], [ood], "
                  "[report], [inspect], [apply]; options go in a command's table ([ood], [report], [apply])"),
    ("[plot]\nx = 1\n", "tempcal.toml: plot: unknown table; the tables are [fit], [ood], [report], [inspect], "
                        "[apply]"),
    ("fit = 1\n", "tempcal.toml: fit: must be a table of fit's options ([fit]), got 1"),
    ("source = 3\n", "tempcal.toml: source: expected a path (a string) or a list of them, got 3"),
    ("source = [\"a\", 3]\n", "tempcal.toml: source[1]: expected a path (a string), got 3"),
]


@pytest.mark.parametrize(("text", "message"), BAD_VALUES)
def test_bad_values_name_the_file_and_the_key(tmp_path, text, message):
    config = config_in(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        config.check(SCHEMAS)
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_pyproject_tables_are_named_as_written(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.tempcal]\nsource = 1\n")
    config = load_config(tmp_path / "pyproject.toml", display="pyproject.toml")
    with pytest.raises(ConfigError, match=r"^pyproject\.toml: \[tool\.tempcal\] source: expected a path"):
        config.check(SCHEMAS)
    write(tmp_path / "pyproject.toml", "[tool.tempcal.ood]\ntau = true\n")
    config = load_config(tmp_path / "pyproject.toml", display="pyproject.toml")
    with pytest.raises(ConfigError, match=r'^pyproject\.toml: \[tool\.tempcal\.ood\] tau: expected a number or '):
        config.check(SCHEMAS)


def test_an_option_set_twice_under_two_names(tmp_path):
    demo = typer.Typer()

    @demo.command()
    def cmd(gamma: Annotated[float, typer.Option("--gen-gamma", "--gamma")] = 0.1) -> None:
        pass

    config = config_in(tmp_path, "[cmd]\ngen-gamma = 0.2\ngamma = 0.3\n")
    with pytest.raises(ConfigError, match=r"\[cmd\] gamma: sets the same option as 'gen-gamma'"):
        config.defaults_for("cmd", command_schema(typer.main.get_command(demo)))


# -- files that must exist -----------------------------------------------------------------------------------


def test_a_missing_input_is_named_only_when_it_is_used(tmp_path):
    config = config_in(tmp_path, 'source = "val.st"\n[ood]\nood = ["noise.st"]\n[fit]\noutput = "new/x.st"\n')
    with pytest.raises(ConfigError, match=r"^tempcal\.toml: source: no such file: .*val\.st$"):
        config.defaults_for("fit", SCHEMAS["fit"])
    touch(tmp_path / "val.st")
    config.defaults_for("fit", SCHEMAS["fit"])  # an output need not exist; [ood] is not fit's business
    with pytest.raises(ConfigError, match=r"^tempcal\.toml: \[ood\] ood: no such file: .*noise\.st$"):
        config.defaults_for("ood", SCHEMAS["ood"])
    config.defaults_for("ood", SCHEMAS["ood"], given={"ood_files"})  # the command line names the OOD files
    gone = config_in(tmp_path, 'source = "gone.st"\n')
    assert gone.defaults_for("fit", SCHEMAS["fit"], given={"source"}) == {"source": [str(tmp_path / "gone.st")]}


def test_a_glob_source_must_match(tmp_path):
    config = config_in(tmp_path, 'source = "shards/*.safetensors"\n')
    with pytest.raises(ConfigError, match=r"source: the pattern .*shards/\*\.safetensors matches no file"):
        config.defaults_for("fit", SCHEMAS["fit"])
    touch(tmp_path / "shards" / "0.safetensors")
    assert config.defaults_for("fit", SCHEMAS["fit"]) == {"source": [str(tmp_path / "shards" / "*.safetensors")]}


def test_messages_name_the_file_as_found_from_the_current_folder(tmp_path, monkeypatch):
    write(tmp_path / "tempcal.toml", "[fit]\nseed = true\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    config = resolve_config(None, False)
    assert config is not None and config.display == os.path.join("..", "tempcal.toml")
    with pytest.raises(ConfigError, match=r"^\.\./tempcal\.toml: \[fit\] seed"):
        config.check(SCHEMAS)

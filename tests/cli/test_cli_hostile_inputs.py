"""Hostile values and names: exit status 2 and one line (never an internal error or a traceback), or a sane result;
nothing written on refusal."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, snapshot
from safetensors.torch import load_file, save_file

BIDI = "\u202e"


@pytest.fixture
def data(tmp_path):
    """``s.safetensors``: 200 rows, 5 classes, a ``group`` tensor (7 groups); ``o.safetensors``: 100 OOD rows."""
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(200, 5, generator=g) * 3, torch.randint(0, 5, (200,), generator=g)
    save_file({"logits": logits, "labels": labels, "group": torch.arange(200) % 7}, str(tmp_path / "s.safetensors"))
    save_file({"logits": torch.randn(100, 5, generator=g)}, str(tmp_path / "o.safetensors"))
    return tmp_path


def with_metadata(folder, name, **metadata):
    tensors = load_file(str(folder / "s.safetensors"))
    path = folder / name
    save_file(tensors, str(path), metadata=metadata)
    return path


def refused(cli, folder, argv, *details):
    before = snapshot(folder)
    code, out, err = cli(argv)
    assert code == 2, err
    assert_one_error_line(err, *details)
    assert snapshot(folder) == before
    return out


@pytest.mark.parametrize("argv, details", [
    (["report", "{s}", "--tau", "1e-310"], ["--tau 1e-310: too small: 1 / T overflows"]),
    (["ood", "{s}", "--ood", "{o}", "--tau", "1e-310"], ["--tau 1e-310: too small"]),
    (["apply", "{s}", "--tau", "1e-310", "--output", "{out}"], ["--tau 1e-310: too small"]),
    (["report", "{s}", "--tau", "1e-307", "--json", "-"], ["at T = 1e-307 the NLL overflows float64"]),
    (["apply", "{s}", "--tau", "1e-308", "--as", "logits", "--output", "{out}"], ["the logits / T overflow float32"]),
    (["fit", "{s}", "--group-by", "group", "--group-prior", "1e308"], ["--group-prior 1e+308", "1e+15"]),
])
def test_extreme_temperatures_and_priors_are_one_line(tmp_path, cli, data, argv, details):
    args = [a.format(s=data / "s.safetensors", o=data / "o.safetensors", out=data / "out.safetensors") for a in argv]
    refused(cli, data, args, *details)


def test_apply_at_a_tiny_temperature_gives_the_arg_max_not_nan(cli, data):
    """At T = 1e-308 (given, or stored) softmax(z / T) is the one-hot arg-max (a plain numpy arg-max checks it)."""
    logits = load_file(str(data / "s.safetensors"))["logits"].numpy()
    stored = with_metadata(data, "stored.safetensors", **{"tempcal.temperature": "1e-308"})
    for argv in (["apply", str(data / "s.safetensors"), "--tau", "1e-308"], ["apply", str(stored)]):
        out = data / "p.safetensors"
        code, _, err = cli([*argv, "--output", str(out), "--quiet"])
        assert code == 0, err
        probs = load_file(str(out))["probs"].numpy()
        assert np.isfinite(probs).all()
        np.testing.assert_array_equal(probs, np.eye(5, dtype=np.float32)[logits.argmax(1)])
        out.unlink()


def test_a_stored_temperature_whose_inverse_overflows_is_bad_input(cli, data):
    path = with_metadata(data, "tiny.safetensors", **{"tempcal.temperature": "1e-310"})
    refused(cli, data, ["report", str(path)], "'tempcal.temperature' is '1e-310', too small: 1 / T overflows")


@pytest.mark.parametrize("digits", [401, 5001])
@pytest.mark.parametrize("command", ["report", "ood", "apply", "inspect"])
def test_huge_integers_in_stored_group_temperatures_name_the_key(cli, data, digits, command):
    path = with_metadata(data, "g.safetensors", **{"tempcal.temperature": "1.5", "tempcal.group_key": "group",
                                                   "tempcal.group_temperatures": '{"0": ' + "1" * digits + "}"})
    argv = {"report": ["report", str(path), "--group-by", "group", "--tau", "fitted"],
            "ood": ["ood", str(path), "--ood", str(data / "o.safetensors"), "--group-by", "group", "--tau", "fitted"],
            "apply": ["apply", str(path), "--output", str(data / "out.safetensors")],
            "inspect": ["inspect", str(path)]}[command]
    detail = "'tempcal.group_temperatures': group '0' has temperature inf"
    if command == "inspect":  # inspect shows problems rather than refusing: once
        code, out, err = cli(argv)
        assert code == 0, err
        assert out.count(detail) == 1
    else:
        refused(cli, data, argv, detail)


@pytest.mark.parametrize("option, suffix", [("--json", ".json"), ("--plot", ".png"), ("--html", ".html"),
                                            ("--markdown", ".md"), ("--output", ".safetensors"), ("--output", ".npz")])
def test_an_output_name_over_255_bytes_names_the_option(cli, data, option, suffix):
    name = str(data / ("x" * 300 + suffix))
    refused(cli, data, ["fit", str(data / "s.safetensors"), option, name], f"{option} {name}",
            "the file name is", "more than the 255")


def test_dollar_signs_in_a_path_do_not_reach_mathtext(cli, data):
    """A ``$...$`` pair in a SOURCE name is drawn as written in --plot and --html; the JSON is written too."""
    path = data / "a$x^{$b.safetensors"
    os.rename(data / "s.safetensors", path)
    code, _, err = cli(["report", str(path), "--plot", str(data / "p.png"), "--html", str(data / "p.html"),
                        "--json", str(data / "r.json"), "--quiet"])
    assert code == 0, err
    assert (data / "p.png").stat().st_size > 0 and "a$x^{$b.safetensors" in (data / "p.html").read_text()
    assert json.loads((data / "r.json").read_text())["results"]


def test_tight_layout_warning_is_not_shown():
    from tempcal.output.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(0.5, 0.5))
    ax.set_ylabel("a label far too long for the figure " * 20)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        pyplot()  # the setup every figure goes through
        fig.tight_layout()
    plt.close(fig)
    assert not [w for w in seen if "Tight layout" in str(w.message)]


def test_bidi_controls_are_escaped_on_the_console_and_the_page(cli, data):
    path = data / f"evil{BIDI}gnp.safetensors"
    os.rename(data / "s.safetensors", path)
    code, out, err = cli(["report", str(path), "--html", str(data / "p.html"), "--markdown", str(data / "p.md")])
    assert code == 0, err
    for text in (out, err, (data / "p.html").read_text(), (data / "p.md").read_text()):
        assert BIDI not in text
    assert "evil\\u202egnp" in out and "evil\\u202egnp" in (data / "p.html").read_text()


def test_markdown_keeps_a_hostile_source_name_inside_its_code_span(cli, data, monkeypatch):
    """A backtick and raw HTML in SOURCE's name: the card and the step summary show the name, inert (CommonMark,
    rendered by markdown-it, the parser rich ships with)."""
    from markdown_it import MarkdownIt

    name = "a`b<img src=x onerror=alert(1)>``c.safetensors"
    os.rename(data / "s.safetensors", data / name)
    summary = data / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, _, err = cli(["fit", str(data / name), "--no-write", "--markdown", str(data / "card.md"), "--quiet"])
    assert code == 0, err
    for text in ((data / "card.md").read_text(), summary.read_text()):
        html = MarkdownIt("commonmark").render(text)
        assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
        assert f"<code>{str(data / name).replace('<', '&lt;').replace('>', '&gt;')}</code>" in html


def test_a_bracket_in_an_existing_path_is_that_path_and_patterns_still_expand(cli, data, run_json):
    literal = data / "run[1].safetensors"
    os.rename(data / "s.safetensors", literal)
    assert run_json(["report", str(literal)])["results"][0]["count"] == 200
    shard = data / "run1.safetensors"
    save_file({"logits": torch.randn(10, 5), "labels": torch.zeros(10, dtype=torch.int64)}, str(shard))
    assert run_json(["report", str(data / "run[0-9].safetensors")])["results"][0]["count"] == 10


@pytest.mark.parametrize("how", ["same", "hardlink", "glob"])
def test_the_same_file_named_twice_is_bad_input(cli, data, how):
    path = str(data / "s.safetensors")
    other = {"same": path, "hardlink": str(data / "h.safetensors"), "glob": str(data / "s*.safetensors")}[how]
    if how == "hardlink":
        os.link(path, other)
    refused(cli, data, ["fit", path, other], "the same file named twice")


def test_groups_without_fitting_rows_are_one_note_and_silent_under_quiet(cli, tmp_path):
    g = torch.Generator().manual_seed(1)
    n = 2000  # 1,000 groups of 2 rows: a seeded half split leaves many groups without a fitting row
    save_file({"logits": torch.randn(n, 4, generator=g), "labels": torch.randint(0, 4, (n,), generator=g),
               "group": torch.arange(n) % 1000}, str(tmp_path / "g.safetensors"))
    code, out, err = cli(["fit", str(tmp_path / "g.safetensors"), "--group-by", "group", "--no-write", "--json", "-"])
    assert code == 0, err
    empty = [g["group"] for g in json.loads(out)["groups"] if g["n_fit"] == 0]
    notes = [line for line in err.splitlines() if "no fitting rows" in line]
    assert len(empty) > 5 and notes == [f"note: {len(empty)} group(s) have no fitting rows "
                                        f"({', '.join(empty[:5])}, ...); their rows are evaluated at the global T"]
    code, _, err = cli(["fit", str(tmp_path / "g.safetensors"), "--group-by", "group", "--no-write", "--quiet"])
    assert code == 0 and "no fitting rows" not in err


@pytest.mark.parametrize("split, detail", [
    ({"fit": "split", "val_fraction": 0.5, "seed": 0, "rows": 200, "n_fit": 1000, "labels": "x"},
     "'n_fit' is 1000 of 'rows' 200"),
    ({"fit": "split", "val_fraction": 0.5, "seed": 0, "rows": 200, "n_fit": 0, "labels": "x"}, "'n_fit' is 0"),
])
def test_stored_split_fields_are_checked_against_each_other(cli, data, split, detail):
    metadata = {"tempcal.temperature": "1.5", "tempcal.split": json.dumps(split)}
    path = with_metadata(data, "split.safetensors", **metadata)
    refused(cli, data, ["report", str(path), "--eval-rows"], detail)


def test_inspect_lists_each_problem_once(cli, data):
    path = with_metadata(data, "hot.safetensors", **{"tempcal.temperature": "hot"})
    code, out, err = cli(["inspect", str(path)])
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("problem:")] == [
        f"problem: {path}: metadata 'tempcal.temperature' is 'hot', not a positive number"]

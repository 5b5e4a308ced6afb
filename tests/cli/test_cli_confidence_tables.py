"""Confidence tables through the commands: fit (T against scipy, the sidecar, the JSON's source_kind, clipped and the
RMS calibration error), report, ood, apply, inspect, --group-by COLUMN, --folds, --confidence-scale, a configuration
file, and bad tables (exit 2, one line naming the file and row, nothing written)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from confidence_tables import logits_of, make_rows, write_table
from conftest import assert_one_error_line, snapshot
from reference import optimal_temperature, ref_msp, sk_figures

from tempcal.io.paths import sidecar_path
from tempcal.io.sidecar import read_sidecar

COLUMNS = ["--confidence", "confidence", "--correct", "correct"]


@pytest.fixture
def table(tmp_path):
    rows = make_rows(500, seed=11)
    rows["confidence"][[0, 1]] = [1.0, 0.0]  # clipped
    return write_table(tmp_path / "answers.csv", rows), rows


def test_fit_then_report_at_the_stored_t(table, run_json):
    path, rows = table
    z, y = logits_of(rows["confidence"]), rows["correct"]
    fitted = run_json(["fit", str(path), *COLUMNS, "--val-fraction", "1.0"])
    assert fitted["temperature"] == pytest.approx(optimal_temperature(z, y), rel=1e-6)
    assert fitted["source_kind"] == "confidence-table" and fitted["clipped"] == 2
    assert any("2 confidences of exactly 0 or 1 clipped" in w for w in fitted["warnings"])
    assert fitted["num_classes"] == 2 and fitted["n_fit"] == 500
    assert read_sidecar(path)[0]["tempcal.temperature"] == repr(fitted["temperature"])
    assert fitted["written"] == str(sidecar_path(path))
    assert 0 <= fitted["after"]["ece"] <= fitted["after"]["rms_ce"] <= fitted["after"]["mce"]
    report = run_json(["report", str(path), *COLUMNS])
    (row,) = report["results"]
    assert row["tau"] == fitted["temperature"] and row["stored"]
    assert row["rms_ce"] == pytest.approx(fitted["after"]["rms_ce"], rel=1e-12)
    assert report["source_kind"] == "confidence-table" and report["clipped"] == 2


def test_console_and_markdown_show_the_rms_error_beside_ece(table, cli, tmp_path):
    path, _ = table
    markdown = tmp_path / "card.md"
    code, out, err = cli(["fit", str(path), *COLUMNS, "--markdown", str(markdown), "--no-write"])
    assert code == 0, err
    assert "RMS calibration error" in out
    rows = [line for line in markdown.read_text().splitlines() if line.startswith("| ")]
    names = [line.split("|")[1].strip() for line in rows]
    assert names.index("RMS calibration error") == names.index("ECE") + 1


def test_percentages_give_the_same_t(tmp_path, run_json):
    rows = make_rows(300, seed=12)
    plain = run_json(["fit", str(write_table(tmp_path / "p.jsonl", rows)), *COLUMNS, "--val-fraction", "1",
                      "--no-write"])
    percent = run_json(["fit", str(write_table(tmp_path / "q.jsonl", rows, scale=100)), *COLUMNS,
                        "--confidence-scale", "100", "--val-fraction", "1", "--no-write"])
    assert percent["temperature"] == pytest.approx(plain["temperature"], rel=1e-9)
    assert percent["confidence_scale"] == 100


def test_group_by_a_column_and_folds(tmp_path, run_json):
    rows = make_rows(600, seed=13)
    path = write_table(tmp_path / "t.parquet", rows)
    fitted = run_json(["fit", str(path), *COLUMNS, "--group-by", "task", "--folds", "5"])
    assert [g["group"] for g in fitted["groups"]] == ["algebra", "biology", "chemistry"]
    assert fitted["folds"]["k"] == 5
    assert fitted["temperature"] == pytest.approx(optimal_temperature(logits_of(rows["confidence"]),
                                                                      rows["correct"]), rel=1e-6)
    stored = read_sidecar(path)[0]
    assert stored["tempcal.group_key"] == "task"
    assert set(json.loads(stored["tempcal.group_temperatures"])) == {"algebra", "biology", "chemistry"}
    report = run_json(["report", str(path), *COLUMNS, "--group-by", "task", "--tau", "fitted"])
    groups = report["results"][-1]["groups"]
    assert sorted(g["group"] for g in groups) == ["algebra", "biology", "chemistry"]
    levels = run_json(["fit", str(path), *COLUMNS, "--group-by", "level", "--no-write"])
    assert [g["group"] for g in levels["groups"]] == [str(v) for v in sorted(set(rows["level"].tolist()))]


def test_ood_between_two_tables(tmp_path, run_json):
    rows, other = make_rows(300, seed=14), make_rows(200, seed=15)
    other["confidence"] = other["confidence"] ** 3 + 1e-7  # less confident, and no score tied with a row of a
    a, b = write_table(tmp_path / "a.csv", rows), write_table(tmp_path / "b.csv", other)
    result = run_json(["ood", str(a), "--ood", str(b), *COLUMNS, "--tau", "1", "--tau", "2"])
    assert result["source_kind"] == "confidence-table"
    for r in result["results"]:
        expected = sk_figures(ref_msp(logits_of(rows["confidence"]), r["tau"]),
                              ref_msp(logits_of(other["confidence"]), r["tau"]))
        assert r["auroc"] == pytest.approx(expected["auroc"], abs=1e-9)


def test_apply_writes_the_table_with_calibrated_confidence(table, cli, tmp_path):
    path, rows = table
    assert cli(["fit", str(path), *COLUMNS, "--val-fraction", "1", "-q"])[0] == 0
    t = float(read_sidecar(path)[0]["tempcal.temperature"])
    out = tmp_path / "calibrated.csv"
    code, _, err = cli(["apply", str(path), *COLUMNS, "-o", str(out)])
    assert code == 0, err
    with open(out, newline="") as f:
        written = list(csv.DictReader(f))
    assert list(written[0]) == ["id", "confidence", "correct", "task", "level", "calibrated_confidence"]
    calibrated = np.array([float(r["calibrated_confidence"]) for r in written])
    np.testing.assert_allclose(calibrated, 1 / (1 + np.exp(-logits_of(rows["confidence"]) / t)), rtol=1e-12)
    before = snapshot(tmp_path)
    code, _, err = cli(["apply", str(path), *COLUMNS, "-o", str(tmp_path / "wrong.safetensors")])
    assert code == 2 and "suffix .csv" in assert_one_error_line(err)
    code, _, err = cli(["apply", str(out), *COLUMNS, "--tau", "2", "-o", str(tmp_path / "again.csv")])
    assert code == 2 and "calibrated_confidence" in assert_one_error_line(err)
    assert snapshot(tmp_path) == before


def test_apply_gives_each_csv_row_its_own_value_across_blank_lines(tmp_path, cli):
    """Blank lines are no rows: each data row gets its calibrated confidence, sigmoid(logit(c) / 2) at --tau 2."""
    path = tmp_path / "gaps.csv"
    path.write_text("confidence,correct\n0.9,1\n\n0.2,0\n\n\n0.6,1\n")
    out = tmp_path / "out.csv"
    code, _, err = cli(["apply", str(path), *COLUMNS, "--tau", "2", "-o", str(out)])
    assert code == 0, err
    with open(out, newline="") as f:
        written = list(csv.DictReader(f))
    assert [r["confidence"] for r in written] == ["0.9", "0.2", "0.6"]
    expected = 1 / (1 + np.exp(-logits_of(np.array([0.9, 0.2, 0.6])) / 2))
    np.testing.assert_allclose([float(r["calibrated_confidence"]) for r in written], expected, rtol=1e-12)


def test_inspect_describes_the_table(table, cli):
    path, _ = table
    code, out, err = cli(["inspect", str(path), *COLUMNS])
    assert code == 0, err
    assert "confidence table, 500 rows" in out and "2 clipped" in out
    code, out, _ = cli(["inspect", str(path)])
    assert "--confidence COLUMN" in out and "'confidence', 'correct'" in out


def test_a_configuration_file_sets_the_columns(tmp_path, cli, run_json, monkeypatch):
    rows = make_rows(200, seed=16)
    write_table(tmp_path / "t.csv", rows, scale=100)
    (tmp_path / "tempcal.toml").write_text('source = "t.csv"\n[fit]\nconfidence = "confidence"\n'
                                           'correct = "correct"\nconfidence-scale = 100\nval-fraction = 1.0\n')
    monkeypatch.chdir(tmp_path)
    fitted = run_json(["fit"])
    assert fitted["temperature"] == pytest.approx(optimal_temperature(logits_of(rows["confidence"]),
                                                                      rows["correct"]), rel=1e-6)
    assert fitted["config"] == str(tmp_path / "tempcal.toml")
    (tmp_path / "tempcal.toml").write_text('[fit]\nconfidence-scale = "percent"\n')
    code, _, err = cli(["fit", "t.csv"])
    assert code == 2 and "confidence-scale" in assert_one_error_line(err)


@pytest.mark.parametrize(("body", "detail"), [
    ("1,0.5,1\n2,1.5,0\n", "row 2: 'confidence' (--confidence): '1.5' is outside [0, 1]"),
    ("1,0.5,1\n2,,0\n", "row 2: 'confidence' (--confidence): missing value"),
    ("1,0.5,1\n2,0.5,1\n3,0.5,maybe\n", "row 3: 'correct' (--correct): 'maybe' is not 0/1 or true/false"),
])
def test_bad_rows_exit_2_naming_the_row_and_write_nothing(tmp_path, cli, body, detail):
    path = tmp_path / "bad.csv"
    path.write_text("id,confidence,correct\n" + body)
    before = snapshot(tmp_path)
    code, _, err = cli(["fit", str(path), *COLUMNS])
    assert code == 2
    assert_one_error_line(err, str(path), detail)
    assert snapshot(tmp_path) == before


def test_a_missing_column_and_missing_options(tmp_path, cli):
    path = write_table(tmp_path / "t.csv", make_rows(20))
    code, _, err = cli(["fit", str(path), "--confidence", "conf", "--correct", "correct"])
    assert code == 2
    assert_one_error_line(err, "no column 'conf' (--confidence)", "'id', 'confidence', 'correct', 'task', 'level'")
    code, _, err = cli(["fit", str(path)])
    assert code == 2 and "--confidence COLUMN" in assert_one_error_line(err)
    code, _, err = cli(["fit", str(path), *COLUMNS, "--confidence-scale", "0"])
    assert code == 2 and "confidence-scale" in assert_one_error_line(err)


def test_parquet_without_pyarrow_names_the_extra(tmp_path, cli, monkeypatch):
    import builtins

    path = write_table(tmp_path / "t.parquet", make_rows(20))
    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    monkeypatch.setattr("importlib.import_module", lambda name, *a: no_pyarrow(name))
    code, _, err = cli(["fit", str(path), *COLUMNS])
    assert code == 2 and "pip install 'tempcal[logs]'" in assert_one_error_line(err)


def test_apply_at_each_rows_stored_group_t(tmp_path, cli):
    rows = make_rows(300, seed=17)
    path = write_table(tmp_path / "t.jsonl", rows)
    assert cli(["fit", str(path), *COLUMNS, "--group-by", "task", "-q"])[0] == 0
    per_group = json.loads(read_sidecar(path)[0]["tempcal.group_temperatures"])
    out = tmp_path / "out.jsonl"
    code, _, err = cli(["apply", str(path), *COLUMNS, "-o", str(out)])
    assert code == 0, err
    written = [json.loads(line) for line in out.read_text().splitlines()]
    t = np.array([per_group[task] for task in rows["task"]])
    expected = 1 / (1 + np.exp(-logits_of(rows["confidence"]) / t))
    np.testing.assert_allclose([r["calibrated_confidence"] for r in written], expected, rtol=1e-12)
    assert [r["task"] for r in written] == rows["task"].tolist()


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_report_reads_the_table_as_the_stored_t_was_fitted(tmp_path, run_json, cli, suffix):
    """The columns and scale of a fit are kept in the sidecar: ``report FILE`` alone reads percentages and the
    renamed columns as the fit did (no "outside [0, 1]"), and a note says what was taken."""
    rows = make_rows(300, seed=21)
    rows["c"], rows["k"] = rows.pop("confidence"), rows.pop("correct")
    path = write_table(tmp_path / f"pct{suffix}", {**rows, "confidence": rows["c"]}, scale=100)
    renamed = ["--confidence", "confidence", "--correct", "k", "--confidence-scale", "100"]
    fitted = run_json(["fit", str(path), *renamed, "--val-fraction", "1"])
    assert fitted["temperature"] == pytest.approx(optimal_temperature(logits_of(rows["c"]), rows["k"]), rel=1e-6)
    stored = read_sidecar(path)[0]
    assert (stored["tempcal.confidence"], stored["tempcal.correct"]) == ("confidence", "k")
    assert float(stored["tempcal.confidence_scale"]) == 100
    report = run_json(["report", str(path)])
    (row,) = report["results"]
    assert row["stored"] and row["tau"] == fitted["temperature"]
    assert row["ece"] == pytest.approx(fitted["after"]["ece"], rel=1e-12)
    assert report["confidence_scale"] == 100 and report["correct_column"] == "k"
    (note,) = [w for w in report["warnings"] if "read as the stored T was fitted" in w]
    assert "confidence column 'confidence', correct column 'k', confidence scale 100" in note
    described = run_json(["inspect", str(path)])  # described as read, with no hint to name the columns
    assert (described["details"]["confidence"], described["details"]["confidence_scale"]) == ("confidence", 100)
    assert described["details"]["correct_rows"] == int(rows["k"].sum()) and described["hints"] == []
    # A column given on the command line wins; what is not given is still taken from the sidecar.
    mine = run_json(["report", str(path), "--confidence", "c", "--tau", "1"])
    assert (mine["confidence_column"], mine["correct_column"], mine["confidence_scale"]) == ("c", "k", 100)
    # The table changed since: its sidecar is stale, and the columns are asked for again (not read as an lm-eval log).
    if suffix != ".parquet":
        path.write_bytes(path.read_bytes() + b"\n")
        code, out, err = cli(["report", str(path)])
        assert out == ""
        assert code == 2 and "name its columns with --confidence COLUMN and --correct COLUMN" in \
            assert_one_error_line(err)


def test_apply_takes_the_stored_columns_and_writes_the_table(table, cli, tmp_path):
    """After a fit, ``apply TABLE -o OUT.csv`` needs no column options: OUT is a table, not a tensor file."""
    path, rows = table
    assert cli(["fit", str(path), *COLUMNS, "--val-fraction", "1", "-q"])[0] == 0
    t = float(read_sidecar(path)[0]["tempcal.temperature"])
    out = tmp_path / "calibrated.csv"
    code, _, err = cli(["apply", str(path), "-o", str(out)])
    assert code == 0, err
    with open(out, newline="") as f:
        calibrated = np.array([float(r["calibrated_confidence"]) for r in csv.DictReader(f)])
    np.testing.assert_allclose(calibrated, 1 / (1 + np.exp(-logits_of(rows["confidence"]) / t)), rtol=1e-12)
    before = snapshot(tmp_path)
    code, _, err = cli(["apply", str(path), "-o", str(tmp_path / "wrong.safetensors")])
    assert code == 2 and "suffix .csv" in assert_one_error_line(err)
    assert snapshot(tmp_path) == before

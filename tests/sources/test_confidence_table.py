"""Confidence tables (tempcal.sources.confidence_table) read from CSV, JSON Lines and parquet tables written by the
tests from a known generating process: the logits against ``ln(c / (1 - c))`` in float64, T against scipy's bounded
optimiser on the binary NLL, every figure against the same data as a one-logit safetensors file, the scale,
clipping, groups and bad input naming its row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from confidence_tables import OVERCONFIDENCE, logits_of, make_rows, write_table
from reference import ece_loop, nll_at, optimal_temperature
from safetensors.torch import save_file

import tempcal
from tempcal.errors import DataError, TempcalError
from tempcal.sources.base import SourceOptions
from tempcal.sources.registry import open_source

FORMATS = (".csv", ".jsonl", ".parquet")
READ = SourceOptions(confidence="confidence", correct="correct")


def opened_table(path, **options):
    return open_source(path, READ.but(**options))


def figures(block: dict) -> dict:
    return {k: block[k] for k in ("nll", "ece", "rms_ce", "mce", "brier", "accuracy", "entropy", "smece", "aurc")}


@pytest.mark.parametrize("suffix", FORMATS)
def test_rows_are_the_logits_of_the_confidences(tmp_path, suffix):
    rows = make_rows(300, seed=1)
    opened = opened_table(write_table(tmp_path / f"t{suffix}", rows))
    assert opened.kind.name == "confidence-table" and opened.data.binary
    z = opened.data.logits.numpy()
    assert z.dtype == np.float64 and z.shape == (300,)
    np.testing.assert_allclose(z, logits_of(rows["confidence"]), rtol=1e-12, atol=1e-12)
    assert opened.data.labels.tolist() == rows["correct"].tolist()
    assert opened.json["source_kind"] == "confidence-table" and opened.json["clipped"] == 0


@pytest.mark.parametrize("suffix", FORMATS)
def test_fitted_t_is_scipys_and_every_figure_is_the_safetensors_files(tmp_path, suffix):
    rows = make_rows(600, seed=2)
    table = write_table(tmp_path / f"t{suffix}", rows)
    z, y = torch.from_numpy(logits_of(rows["confidence"])), torch.from_numpy(rows["correct"])
    reference = optimal_temperature(z, y)
    assert reference == pytest.approx(OVERCONFIDENCE, rel=0.3)  # the generating process's overconfidence
    st = tmp_path / "same.safetensors"
    save_file({"logits": z.contiguous(), "labels": y}, str(st))
    from_table = tempcal.fit_file(str(table), val_fraction=1.0, device="cpu", options=READ).to_json()
    from_tensor = tempcal.fit_file(str(st), val_fraction=1.0, device="cpu").to_json()
    assert from_table["temperature"] == pytest.approx(reference, rel=1e-6)
    assert from_table["temperature"] == pytest.approx(from_tensor["temperature"], rel=1e-12)
    for name in ("before", "after"):
        assert figures(from_table[name]) == pytest.approx(figures(from_tensor[name]), rel=1e-9, abs=1e-12)
    t = from_table["temperature"]
    assert from_table["after"]["nll"] == pytest.approx(nll_at(z.numpy(), y.numpy(), t), rel=1e-9)
    assert from_table["after"]["ece"] == pytest.approx(ece_loop(z, y, t)[0], abs=1e-9)
    assert from_table["source_kind"] == "confidence-table" and "source_kind" not in from_tensor


def test_percentages_read_with_confidence_scale_100(tmp_path):
    rows = make_rows(200, seed=3)
    plain = opened_table(write_table(tmp_path / "p.csv", rows))
    percent = opened_table(write_table(tmp_path / "pct.csv", rows, scale=100), confidence_scale=100)
    np.testing.assert_allclose(percent.data.logits.numpy(), plain.data.logits.numpy(), rtol=1e-9)
    with pytest.raises(DataError, match=r"row \d+: 'confidence' \(confidence\): .* is outside \[0, 1\]"):
        opened_table(tmp_path / "pct.csv")  # percentages read as probabilities: refused, never misread


@pytest.mark.parametrize("suffix", FORMATS)
def test_zero_and_one_are_clipped_and_counted(tmp_path, suffix):
    rows = make_rows(50, seed=4)
    rows["confidence"][[3, 7, 9]] = [0.0, 1.0, 1.0]
    opened = opened_table(write_table(tmp_path / f"t{suffix}", rows))
    z = opened.data.logits.numpy()
    assert opened.json["clipped"] == 3
    assert z[3] == pytest.approx(np.log(1e-6 / (1 - 1e-6)), rel=1e-12) and z[7] == pytest.approx(-z[3], rel=1e-9)
    assert any("3 confidences of exactly 0 or 1 clipped" in w for w in opened.warnings)


@pytest.mark.parametrize("suffix", FORMATS)
def test_true_false_correct_column(tmp_path, suffix):
    rows = make_rows(40, seed=5)
    opened = opened_table(write_table(tmp_path / f"t{suffix}", rows, correct_as="bool"))
    assert opened.data.labels.tolist() == rows["correct"].tolist()


def _bad_csv(tmp_path, body: str):
    path = tmp_path / "bad.csv"
    path.write_text("id,confidence,correct,task\n" + body)
    return path


@pytest.mark.parametrize(("body", "expected"), [
    ("1,0.5,1,a\n2,1.5,0,a\n", "row 2: 'confidence' (confidence): '1.5' is outside [0, 1]"),
    ("1,0.5,1,a\n2,-0.1,0,a\n", "row 2: 'confidence' (confidence): '-0.1' is outside [0, 1]"),
    ("1,0.5,1,a\n2,,0,a\n3,0.2,1,a\n", "row 2: 'confidence' (confidence): missing value"),
    ("1,0.5,1,a\n2,0.4,,a\n", "row 2: 'correct' (correct): missing value"),
    ("1,0.5,1,a\n2,0.4,2,a\n", "row 2: 'correct' (correct): '2' is not 0/1 or true/false"),
    ("1,0.5,yes,a\n", "row 1: 'correct' (correct): 'yes' is not 0/1 or true/false"),
    ("1,high,1,a\n", "row 1: 'confidence' (confidence): 'high' is not a number"),
    ("1,nan,1,a\n", "row 1: 'confidence' (confidence): missing value"),
])
def test_bad_csv_rows_name_their_row(tmp_path, body, expected):
    path = _bad_csv(tmp_path, body)
    with pytest.raises(DataError) as info:
        opened_table(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value).replace("(--", "(")  # the command line spells the options with dashes


@pytest.mark.parametrize("suffix", (".jsonl", ".parquet"))
def test_bad_values_in_jsonl_and_parquet(tmp_path, suffix):
    rows = make_rows(10, seed=6)
    rows["confidence"] = rows["confidence"].astype(object)
    rows["confidence"][4] = None
    with pytest.raises(DataError, match=r"row 5: 'confidence' .*missing value"):
        opened_table(write_table(tmp_path / f"t{suffix}", rows))
    rows = make_rows(10, seed=6)
    rows["correct"] = rows["correct"].copy()
    rows["correct"][2] = 3
    with pytest.raises(DataError, match=r"row 3: 'correct' .*3 is not 0/1 or true/false"):
        opened_table(write_table(tmp_path / f"u{suffix}", rows))


def test_an_integer_past_floats_range_is_out_of_range_not_a_crash(tmp_path):
    path = tmp_path / "huge.jsonl"
    path.write_text('{"confidence": 0.5, "correct": 1}\n{"confidence": 1' + "0" * 400 + ', "correct": 0}\n')
    with pytest.raises(DataError, match=r"row 2: 'confidence' .*is outside \[0, 1\]"):
        opened_table(path)


@pytest.mark.parametrize("suffix", FORMATS)
def test_a_missing_column_is_named_with_the_columns_there_are(tmp_path, suffix):
    path = write_table(tmp_path / f"t{suffix}", make_rows(10))
    with pytest.raises(DataError, match=r"no column 'conf' \(.*confidence\); its columns are 'id', 'confidence', "
                                        r"'correct', 'task', 'level'"):
        opened_table(path, confidence="conf")


def test_without_the_columns_named_a_table_is_refused_with_the_options(tmp_path):
    path = write_table(tmp_path / "t.csv", make_rows(10))
    with pytest.raises(TempcalError, match=r"confidence COLUMN and .*correct COLUMN"):
        open_source(path)


@pytest.mark.parametrize("suffix", FORMATS)
def test_groups_by_a_string_or_an_integer_column(tmp_path, suffix):
    from tempcal.subsets.options import read_groups

    rows = make_rows(90, seed=7)
    opened = opened_table(write_table(tmp_path / f"t{suffix}", rows))
    by_task = read_groups(opened, "task")
    assert by_task.names == ["algebra", "biology", "chemistry"] and not by_task.numeric
    assert [by_task.names[i] for i in by_task.index] == rows["task"].tolist()
    by_level = read_groups(opened, "level")
    assert by_level.names == [str(v) for v in sorted(set(rows["level"].tolist()))] and by_level.numeric
    assert [int(by_level.names[i]) for i in by_level.index] == rows["level"].tolist()
    with pytest.raises(DataError, match="is not a string or an integer"):
        read_groups(opened, "confidence")  # a float column names no groups


def test_group_fit_per_task_against_scipy(tmp_path):
    rows = make_rows(600, seed=8)
    table = write_table(tmp_path / "t.parquet", rows)
    report = tempcal.fit_file(str(table), val_fraction=1.0, group_by="task", group_prior=0.0, device="cpu",
                              options=READ).to_json()
    z = logits_of(rows["confidence"])
    for group in report["groups"]:
        mine = rows["task"] == group["group"]
        assert group["temperature"] == pytest.approx(optimal_temperature(z[mine], rows["correct"][mine]), rel=1e-5)


def test_folds_give_the_global_t_and_out_of_fold_figures(tmp_path):
    rows = make_rows(300, seed=9)
    table = write_table(tmp_path / "t.jsonl", rows)
    report = tempcal.fit_file(str(table), folds=5, device="cpu", options=READ).to_json()
    z, y = logits_of(rows["confidence"]), rows["correct"]
    assert report["temperature"] == pytest.approx(optimal_temperature(z, y), rel=1e-6)
    assert report["folds"]["k"] == 5 and sum(report["folds"]["sizes"]) == 300


@pytest.mark.parametrize("suffix", FORMATS)
def test_apply_adds_calibrated_confidence(tmp_path, suffix):
    rows = make_rows(120, seed=10)
    table = write_table(tmp_path / f"t{suffix}", rows)
    t = tempcal.fit_file(str(table), val_fraction=1.0, device="cpu", options=READ).temperature
    out = tmp_path / f"out{suffix}"
    tempcal.apply_file(str(table), out, tau=t, options=READ, device="cpu")
    calibrated = _column(out, "calibrated_confidence")
    expected = 1 / (1 + np.exp(-logits_of(rows["confidence"]) / t))
    np.testing.assert_allclose(calibrated, expected, rtol=1e-12)
    np.testing.assert_allclose(_column(out, "confidence"), rows["confidence"], rtol=1e-12)  # the rest kept


def _column(path, name):
    if path.suffix == ".csv":
        import csv

        with open(path, newline="") as f:
            return np.array([float(r[name]) for r in csv.DictReader(f)])
    if path.suffix == ".jsonl":
        import json

        return np.array([json.loads(line)[name] for line in path.read_text().splitlines()])
    import pyarrow.parquet as pq

    return np.array(pq.read_table(path).column(name).to_pylist(), dtype=np.float64)


def test_the_example_table_is_what_its_script_makes(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    out = tmp_path / "again.csv"
    subprocess.run([sys.executable, str(examples / "make_confidence_table.py"), str(out)], check=True,
                   capture_output=True)
    assert out.read_bytes() == (examples / "confidence_table.csv").read_bytes()

"""lm-evaluation-harness sample logs through the commands: fit (T against a float64 reference on the padded matrix,
the sidecar), report and ood, --lm-eval-norm, and bad logs (exit 2, one line naming the file and line, nothing
written)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import EXAMPLE, assert_one_error_line, snapshot
from lm_eval_logs import (
    NAME,
    as_written,
    generate_until_record,
    mc_record,
    padded,
    random_mc_records,
    record_line,
    write_gz_run,
    write_log,
)
from reference import ece_loop, nll_at, optimal_temperature, ref_msp, sk_figures

from tempcal.io.paths import sidecar_path
from tempcal.io.sidecar import read_sidecar


@pytest.fixture
def log(tmp_path):
    """A gzip-compressed log of 500 records with 2..6 choices (lm-eval 0.4.4 layout): (path, records, rows, labels)."""
    records, rows, labels = random_mc_records(500, seed=7, choice_counts=(2, 3, 4, 6), temperature=2.2)
    return write_log(tmp_path / (NAME + ".gz"), records, "0.4.4"), records, rows, labels


def test_fit_report_and_ood_on_a_log(log, tmp_path, run_json):
    path, _, rows, labels = log
    z, y = torch.from_numpy(padded(rows)), torch.tensor(labels)
    reference = optimal_temperature(z, y)
    fitted = run_json(["fit", str(path), "--val-fraction", "1.0"])
    assert fitted["temperature"] == pytest.approx(reference, rel=1e-6)
    assert fitted["num_classes"] == 6 and fitted["n_fit"] == 500
    assert fitted["after"]["nll"] == pytest.approx(nll_at(z.numpy(), y.numpy(), fitted["temperature"]), rel=1e-9)
    assert fitted["written"] == str(sidecar_path(path))
    stored = read_sidecar(path)[0]
    assert json.loads(stored.pop("tempcal.split")) == {"fit": "all", "rows": fitted["n_fit"]}
    assert stored == {"tempcal.temperature": repr(fitted["temperature"]), "tempcal.lm_eval_norm": "none"}
    report = run_json(["report", str(path)])  # the stored T by default
    (row,) = report["results"]
    assert row["tau"] == fitted["temperature"] and row["stored"]
    assert row["ece"] == pytest.approx(ece_loop(z, y, row["tau"])[0], abs=1e-9)
    other_records, other_rows, _ = random_mc_records(200, seed=8, choice_counts=(2, 3))  # narrower: padded to 6
    other = write_log(tmp_path / "samples_arc_easy_2024-09-05T12-34-56.jsonl", other_records, "0.4.3")
    ood = run_json(["ood", str(path), "--ood", str(other), "--tau", "fitted", "--tau", "1"])
    assert [r["tau"] for r in ood["results"]] == [fitted["temperature"], 1.0]
    for r in ood["results"]:
        expected = sk_figures(ref_msp(z.numpy(), r["tau"]), ref_msp(padded(other_rows), r["tau"]))
        assert r["auroc"] == pytest.approx(expected["auroc"], abs=1e-9)


def test_the_normalisation_is_fitted_and_stored(log, run_json, cli):
    path, records, rows, labels = log
    chars = [[ll / len(c.lstrip()) for ll, (_, c) in zip(row, r["arguments"], strict=True)]
             for row, r in zip(rows, records, strict=True)]
    fitted = run_json(["fit", str(path), "--val-fraction", "1.0", "--lm-eval-norm", "chars"])
    assert fitted["temperature"] == pytest.approx(optimal_temperature(torch.from_numpy(padded(chars)),
                                                                      torch.tensor(labels)), rel=1e-6)
    assert read_sidecar(path)[0]["tempcal.lm_eval_norm"] == "chars"
    code, out, err = cli(["report", str(path), "--json", "-"])  # read raw: the stored T does not apply
    assert code == 0 and json.loads(out)["results"][0]["tau"] == 1.0
    assert "fitted with --lm-eval-norm chars, so it is ignored here (--lm-eval-norm none)" in err
    same = run_json(["report", str(path), "--lm-eval-norm", "chars"])
    assert same["results"][0]["tau"] == fitted["temperature"]


def test_no_write_and_output(log, tmp_path, run_json):
    path, *_ = log
    run_json(["fit", str(path), "--no-write"])
    assert not sidecar_path(path).exists()
    copy = tmp_path / "calibrated.jsonl.gz"
    fitted = run_json(["fit", str(path), "--output", str(copy)])
    assert copy.read_bytes() == path.read_bytes() and not sidecar_path(path).exists()
    assert read_sidecar(copy)[0]["tempcal.temperature"] == repr(fitted["temperature"])


def test_lm_eval_norm_needs_a_log(tmp_path, cli):
    code, _, err = cli(["report", str(EXAMPLE), "--lm-eval-norm", "bytes"])
    assert code == 2
    assert_one_error_line(err, "--lm-eval-norm bytes applies to lm-evaluation-harness sample logs", str(EXAMPLE))


def good(doc_id: int) -> str:
    return json.dumps(as_written(mc_record(doc_id, "q", ["a", "b"], [-1.0, -2.0], 0)))


NO_CHOICE = json.dumps({**as_written(mc_record(2, "q", ["a", "b"], [-1.0, -2.0], 0)), "target": "c"})
GENERATION = json.dumps(as_written(generate_until_record(1)))


@pytest.mark.parametrize(("name", "content", "details"), [
    (NAME, (good(0) + "\n" + '{"doc_id": 1, "target": \n').encode(), [f"{NAME}: line 2: not JSON"]),
    (NAME + ".gz", (good(0) + "\n").encode(), [f"{NAME}.gz: not a gzip file"]),
    (NAME, (good(0) + "\n" + good(1) + "\n" + NO_CHOICE + "\n").encode(),
     [f"{NAME}: line 3: target \"c\" matches no choice"]),
    (NAME, (good(0) + "\n" + GENERATION + "\n").encode(), [f"{NAME}: line 2: a generate_until record"]),
])
@pytest.mark.parametrize("command", [["fit"], ["report", "--markdown", "card.md"]])
def test_bad_logs_are_exit_2_naming_the_line_and_write_nothing(tmp_path, cli, monkeypatch, name, content, details,
                                                               command):
    (tmp_path / name).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = cli([command[0], name, *command[1:], "--json", "result.json"])
    assert code == 2 and out == ""
    assert_one_error_line(err, *details)
    assert snapshot(tmp_path) == before


def test_bins_carry_wilson_intervals_for_logs_too(log, run_json):
    path, *_ = log
    report = run_json(["report", str(path), "--bins", "10"])
    bins = report["results"][0]["bins"]
    assert sum(b["count"] for b in bins) == 500
    for b in bins:
        if b["count"]:
            assert 0 <= b["accuracy_low"] <= b["accuracy"] <= b["accuracy_high"] <= 1
        else:
            assert b["accuracy_low"] is None and b["accuracy_high"] is None
    assert np.isfinite([b["accuracy_low"] for b in bins if b["count"]]).all()


def _surrogate_choice() -> str:
    record = json.loads(record_line(1))
    record["arguments"]["gen_args_0"]["arg_1"] = " a\ud800"  # written as the JSON escape \ud800
    return json.dumps(record)


HOSTILE = {  # name: (file name, the lines after a good record, or the gz run after it; extra options; detail)
    "gz of spaces": (NAME + ".gz", (b" ", 72 << 20), [], "line 2: more than 64 MiB"),
    "gz of newlines": (NAME + ".gz", (b"\n", 128 << 20), [], f"lines 2-{2 + (64 << 20)}: more than 64 MiB"),
    "nesting": (NAME, '{"doc": ' + "[" * 100_000 + "]" * 100_000 + "}", [], "line 2: JSON nested more than 200"),
    "5,000 digits": (NAME, record_line(1).replace('"doc_id": 1', '"doc_id": ' + "9" * 5000), [],
                     "line 2: an integer of 5,000 digits"),
    "choices": (NAME, record_line(1, [f"c{i}" for i in range(10_001)]), [], "line 2: 10,001 choices"),
    "surrogate": (NAME, _surrogate_choice(), ["--lm-eval-norm", "bytes"],
                  "line 2: choice 0's text holds a lone surrogate ('\\ud800' at character 2)"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_logs_are_exit_2_on_one_line(tmp_path, cli, monkeypatch, case):
    name, rest, options, detail = HOSTILE[case]
    if isinstance(rest, tuple):
        write_gz_run(tmp_path / name, (record_line(0) + "\n").encode(), *rest)
    else:
        (tmp_path / name).write_text(record_line(0) + "\n" + rest + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = cli(["fit", name, *options, "--json", "result.json"])
    assert code == 2 and out == ""
    line = assert_one_error_line(err, f"{name}: {detail}")
    assert len(line) < 400
    if "--lm-eval-norm" in options:
        assert line.endswith("(--lm-eval-norm bytes)")
    assert snapshot(tmp_path) == before

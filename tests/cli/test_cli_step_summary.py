"""$GITHUB_STEP_SUMMARY through the commands: fit, report and ood append their Markdown section (the --markdown
text without the plot link), a failed gate says so, rank 0 alone appends, and bad input appends nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import EXAMPLE, write_shards

from tempcal.output.files import STEP_SUMMARY_ENV


@pytest.fixture
def summary(tmp_path, monkeypatch):
    path = tmp_path / "step-summary.md"
    path.write_text("# Release\n")
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(path))
    return path


def test_fit_appends_its_model_card_section(tmp_path, summary, cli):
    code, out, err = cli(["fit", str(EXAMPLE), "--no-write", "--markdown", str(tmp_path / "card.md"), "--json", "-"])
    assert code == 0, err
    card = (tmp_path / "card.md").read_text()
    assert summary.read_text() == "# Release\n" + card + "\n"
    assert f"**T = {json.loads(out)['temperature']:.6g}**" in card


def test_report_and_ood_append_after_each_other(ood_files, summary, run_json):
    id_path, ood_path, _, _ = ood_files
    report = run_json(["report", str(id_path), "--tau", "1", "--tau", "2"])
    ood = run_json(["ood", str(id_path), "--ood", str(ood_path), "--tau", "1", "--tau", "3", "--score", "both"])
    text = summary.read_text()
    assert text.index("# Release") < text.index("## Calibration") < text.index("## Out-of-distribution detection")
    for r in report["results"]:
        assert f"| {r['tau']:.4g} | {r['nll']:.4f} |" in text
    for r in ood["results"]:
        assert re.search(rf"\| {r['tau']:.4g}( \([^)]*\))? \| {r['auroc']:.4f} \| {r['fpr95']:.4f} \|", text)
    for best in ood["best"]:
        assert best["sentence"] in text


def test_a_failed_gate_is_in_the_summary(tmp_path, summary, cli):
    code, _, err = cli(["fit", str(EXAMPLE), "--no-write", "--max-ece", "0", "--quiet"])
    assert code == 3 and "gate failed" in err
    assert summary.read_text().rstrip().endswith("**Release gate failed:** calibrated ECE 0.0285 is above --max-ece 0.")


def test_bad_input_appends_nothing(tmp_path, summary, cli):
    code, _, _ = cli(["fit", str(tmp_path / "missing.safetensors")])
    assert code == 2 and summary.read_text() == "# Release\n"


def test_an_unwritable_summary_is_a_warning_not_a_failure(tmp_path, monkeypatch, cli):
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(tmp_path))  # a folder
    code, out, err = cli(["report", str(EXAMPLE), "--json", "-"])
    assert code == 0 and json.loads(out)["n"] == 1348
    assert err.startswith(f"warning: ${STEP_SUMMARY_ENV} {tmp_path}: cannot open it to append the summary")


def test_only_rank_0_appends(summary, monkeypatch, cli):
    import tempcal.core.parallel as parallel

    monkeypatch.setattr(parallel, "rank", lambda: 1)
    code, out, _ = cli(["report", str(EXAMPLE), "--json", "-"])
    assert code == 0 and out == "" and summary.read_text() == "# Release\n"


def _torchrun() -> list[str] | None:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else None


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
def test_two_gloo_processes_append_one_section(tmp_path, summary):
    write_shards(tmp_path, [500, 400], seed=3)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "tempcal", "fit",
                           str(tmp_path / "part-*.safetensors"), "--no-write", "--device", "cpu", "--quiet"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert summary.read_text().count("## Calibration") == 1


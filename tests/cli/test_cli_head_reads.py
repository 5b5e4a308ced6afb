"""The whole ``tempcal fit --head`` command pushes at most 3.5 N rows through ``h @ W.T``: the validating scan every
row, each of the fit's passes after it the fitting rows, then one read of the evaluation rows that gives the figures
before (T = 1) and after (the fitted T) together. Counted at the head's matmul, in one process (the hidden states
kept in memory or read a chunk at a time) and under torchrun (every rank's rows added up); the figures equal float64
numpy on the materialised logits."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import hidden_and_head
from reference import brier, ece_loop, entropy, nll_at, optimal_temperature, predictions
from safetensors.torch import save_file

import tempcal
import tempcal.workflows.fit as fit_workflow
from tempcal.models.head import OutputHead

#: Rows, width, vocabulary: the fit takes its typical 2 passes (the validating scan and one read) on both splits.
N, D, V = 2400, 16, 1500


class HeadRows:
    """Rows through the head's matmul: in all, and when the fit started and ended."""

    def __init__(self):
        self.rows = 0
        self.at_fit: int | None = None
        self.after_fit: int | None = None


@pytest.fixture
def counted(monkeypatch) -> HeadRows:
    seen = HeadRows()
    plain_logits, plain_fit = OutputHead.logits, fit_workflow.fit_temperature

    def logits(self, h, out, *rest):
        seen.rows += h.shape[0]
        return plain_logits(self, h, out, *rest)

    def fit_temperature(*args, **kwargs):
        seen.at_fit = seen.rows
        result = plain_fit(*args, **kwargs)
        seen.after_fit = seen.rows
        return result

    monkeypatch.setattr(OutputHead, "logits", logits)
    monkeypatch.setattr(fit_workflow, "fit_temperature", fit_temperature)
    return seen


@pytest.fixture
def files(tmp_path):
    """Hidden states and a head written as safetensors files; the float32 logits they give and the labels."""
    h, w, b, y = hidden_and_head(N, D, V, seed=12, scale=2.5)
    save_file({"hidden": h, "labels": y}, str(tmp_path / "hidden.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    return tmp_path / "hidden.safetensors", tmp_path / "head.safetensors", h @ w.T + b, y


def split_rows(labels: torch.Tensor, val_fraction: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The fitting and evaluation rows of the command's split (``None``: the default, half the rows)."""
    if val_fraction == 1.0:
        every = np.arange(len(labels))
        return every, every
    fit, evaluation = tempcal.stratified_split(labels.numpy(), 0.5 if val_fraction is None else val_fraction, 0)
    return fit, evaluation


def assert_reference_figures(result: dict, logits: torch.Tensor, labels: torch.Tensor, fit: np.ndarray,
                             evaluation: np.ndarray) -> None:
    """T is scipy's optimum on the fitting rows; before and after equal float64 numpy on the evaluation rows."""
    expected = optimal_temperature(logits[fit], labels[fit])
    assert abs(result["temperature"] / expected - 1) < 1e-6
    z, y = logits[evaluation].double().numpy(), labels[evaluation].numpy()
    for side, tau in (("before", 1.0), ("after", result["temperature"])):
        figures = result[side]
        ece, mce = ece_loop(z, y, tau)
        assert figures["nll"] == pytest.approx(nll_at(z, y, tau), abs=1e-5), side
        assert figures["ece"] == pytest.approx(ece, abs=1e-5) and figures["mce"] == pytest.approx(mce, abs=1e-5)
        assert figures["brier"] == pytest.approx(brier(z, y, tau), abs=1e-5), side
        assert figures["entropy"] == pytest.approx(entropy(z, tau), abs=1e-5), side
        assert figures["accuracy"] == pytest.approx(float(np.mean(predictions(z) == y)), abs=1e-12), side


def expected_rows(result: dict) -> int:
    """The validating scan's N, the fit's reads of its rows after it, one read of the evaluation rows."""
    return N + (result["passes"] - 1) * result["n_fit"] + result["n_eval"]


@pytest.mark.parametrize("reads", ["streamed", "resident"], indirect=True)
@pytest.mark.parametrize("val_fraction", [None, pytest.param(1.0, marks=pytest.mark.slow)])
def test_the_whole_command_multiplies_at_most_three_and_a_half_n_rows(files, run_json, counted, reads,
                                                                      val_fraction):
    hidden, head, logits, labels = files
    split = [] if val_fraction is None else ["--val-fraction", str(val_fraction)]
    result = run_json(["fit", str(hidden), "--head", str(head), "--no-write", "--chunk-rows", "150", *split])
    fit, evaluation = split_rows(labels, val_fraction)
    assert (result["n_fit"], result["n_eval"]) == (len(fit), len(evaluation))
    assert result["passes"] == 2 and result["fit_method"] == "certified"
    assert counted.at_fit == N  # the validating scan, every row once
    assert counted.after_fit is not None and counted.after_fit - counted.at_fit == len(fit)
    assert counted.rows - counted.after_fit == len(evaluation)  # before and after from one read
    assert counted.rows == expected_rows(result) <= 3.5 * N, counted.rows / N
    assert_reference_figures(result, logits, labels, fit, evaluation)


#: Runs ``tempcal ARGV`` with the head's matmul counted, and writes this rank's rows to ``COUNT-<rank>``.
COUNTING = """
import os, sys
from tempcal.cli.main import main
from tempcal.models.head import OutputHead
rows, plain = [0], OutputHead.logits
def logits(self, h, out, *rest):
    rows[0] += h.shape[0]
    return plain(self, h, out, *rest)
OutputHead.logits = logits
code = main(sys.argv[2:])
with open(sys.argv[1] + "-" + os.environ.get("RANK", "0"), "w") as f:
    f.write(str(rows[0]))
sys.exit(code)
"""


def _torchrun() -> str | None:
    return shutil.which("torchrun", path=os.path.dirname(sys.executable))


@pytest.mark.slow  # two processes under torchrun
@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
@pytest.mark.parametrize("val_fraction", [None, 1.0])
def test_under_torchrun_every_ranks_rows_add_up_to_the_same_bound(files, tmp_path, val_fraction):
    hidden, head, logits, labels = files
    script = tmp_path / "counting.py"
    script.write_text(COUNTING)
    split = [] if val_fraction is None else ["--val-fraction", str(val_fraction)]
    argv = [str(script), str(tmp_path / "count"), "fit", str(hidden), "--head", str(head), "--no-write",
            "--device", "cpu", "--quiet", "--chunk-rows", "150", "--json", str(tmp_path / "fit.json"), *split]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TEMPCAL_RESIDENT_BYTES": "0"}
    done = subprocess.run([_torchrun(), "--standalone", "--nproc-per-node", "2", *argv], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "fit.json").read_text())
    per_rank = [int((tmp_path / f"count-{rank}").read_text()) for rank in (0, 1)]
    assert min(per_rank) > 0  # both ranks multiplied their own share
    assert sum(per_rank) == expected_rows(result) <= 3.5 * N, per_rank
    fit, evaluation = split_rows(labels, val_fraction)
    assert (result["n_fit"], result["n_eval"]) == (len(fit), len(evaluation))
    assert_reference_figures(result, logits, labels, fit, evaluation)

"""The commands under torchrun (tempcal.core.parallel, gloo on two processes) match one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import hidden_and_head, id_ood_logits, write_shards
from safetensors.torch import save_file


def _torchrun() -> list[str] | None:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else None


def one_and_two_processes(tmp_path, argv: list[str], *, nproc: int = 2) -> tuple[dict, dict]:
    """The JSON of ``tempcal ARGV`` run by one process and by ``nproc`` gloo processes under torchrun.

    ``{run}`` in an argument becomes ``one`` or ``two``, so that other outputs can be compared too.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # with TEMPCAL_RESIDENT_BYTES as the test set it

    def common(run: str) -> list[str]:
        return [*(a.replace("{run}", run) for a in argv), "--device", "cpu", "--quiet", "--json",
                str(tmp_path / f"{run}.json")]

    single = subprocess.run([sys.executable, "-m", "tempcal", *common("one")], capture_output=True, text=True,
                            env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    launched = subprocess.run([*_torchrun(), "--standalone", "--nproc-per-node", str(nproc), "-m", "tempcal",
                               *common("two")], capture_output=True, text=True, env=env, timeout=300)
    assert launched.returncode == 0, launched.stderr[-2000:]
    return json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text())


def assert_same_figures(one, two, path: str = "") -> None:
    """Every field of two JSON results equal: numbers to 1e-9 (relative above 1), everything else exactly."""
    if isinstance(one, dict):
        assert isinstance(two, dict) and set(one) == set(two), f"{path}: keys {sorted(one)} vs {sorted(two)}"
        for key in one:
            assert_same_figures(one[key], two[key], f"{path}.{key}")
    elif isinstance(one, list):
        assert isinstance(two, list) and len(one) == len(two), f"{path}: {one} vs {two}"
        for k, (a, b) in enumerate(zip(one, two, strict=True)):
            assert_same_figures(a, b, f"{path}[{k}]")
    elif isinstance(one, float) and isinstance(two, float):
        assert abs(one - two) <= 1e-9 * max(1.0, abs(one)), f"{path}: {one} (one process) vs {two} (torchrun)"
    else:
        assert one == two, f"{path}: {one!r} (one process) vs {two!r} (torchrun)"


#: Reading files whole or a chunk at a time goes through the same reductions: the default run keeps the chunks.
READS = pytest.mark.parametrize("reads", ["streamed", pytest.param("resident", marks=pytest.mark.slow)], indirect=True)


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
@READS
def test_two_processes_with_gloo_match_one(tmp_path, reads):
    write_shards(tmp_path, [900, 650, 1100], seed=9, dtype=torch.float32)
    pattern = str(tmp_path / "part-*.safetensors")
    one, two = one_and_two_processes(tmp_path, ["fit", pattern, "--no-write", "--val-fraction", "0.6", "--seed", "2"])
    assert abs(one["temperature"] - two["temperature"]) / one["temperature"] < 1e-6
    assert one["passes"] == two["passes"] <= 3  # rows are sampled for the fit's start alike on one rank or two
    assert (one["n_fit"], one["n_eval"]) == (two["n_fit"], two["n_eval"])
    for side in ("before", "after"):
        for key in ("nll", "ece", "mce", "brier", "accuracy", "entropy"):
            assert two[side][key] == pytest.approx(one[side][key], abs=1e-6)


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
@pytest.mark.slow  # a head under two processes: also in test_ood_with_react_takes_the_percentile_of_every_rank
def test_hidden_states_and_a_head_under_two_processes_match_one(tmp_path):
    h, w, b, y = hidden_and_head(1200, 16, 700, seed=5)
    save_file({"hidden": h, "labels": y}, str(tmp_path / "hidden.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    one, two = one_and_two_processes(tmp_path, ["fit", str(tmp_path / "hidden.safetensors"), "--head",
                                                str(tmp_path / "head.safetensors"), "--no-write"])
    assert abs(one["temperature"] - two["temperature"]) / one["temperature"] < 1e-6
    assert one["passes"] == two["passes"] <= 3
    for side in ("before", "after"):
        for key in ("nll", "ece", "mce", "brier", "accuracy", "entropy"):
            assert two[side][key] == pytest.approx(one[side][key], abs=1e-6)


# -- every figure of every command, with every option that adds figures, on unequal shards ----------------------

needs_torchrun = pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
EXTRA = ("ece_equal_mass", "ece_classwise", "rms_ce", "l2_ce_debiased", "ece_ci", "nll_ci")


@needs_torchrun
@READS
def test_report_with_every_estimator_and_the_bootstrap_matches_one_process(tmp_path, reads):
    """The issue's case: the equal-mass, classwise and debiased estimators and the bootstrap intervals described
    rank 0's rows only; now every figure describes every row, and the intervals come from the same draws."""
    write_shards(tmp_path, [900, 650, 1100, 300], seed=9, dtype=torch.float32)
    one, two = one_and_two_processes(tmp_path, ["report", str(tmp_path / "part-*.safetensors"), "--tau", "0.7",
                                                "--tau", "2", "--estimators", "all", "--bootstrap", "200", "--seed",
                                                "4", "--bins", "12", "--markdown", str(tmp_path / "{run}.md")])
    assert_same_figures(one, two)
    assert two["n"] == 2950
    for row_one, row_two in zip(one["results"], two["results"], strict=True):
        assert all(name in row_two for name in EXTRA)
        assert (row_one["ece_ci"], row_one["nll_ci"]) == (row_two["ece_ci"], row_two["nll_ci"])  # the same draws
    assert (tmp_path / "one.md").read_text() == (tmp_path / "two.md").read_text()


@needs_torchrun
@pytest.mark.slow  # a split under two processes and every estimator under two: the first and the report test
def test_fit_with_a_split_every_estimator_and_the_bootstrap_matches_one_process(tmp_path):
    write_shards(tmp_path, [900, 650, 1100, 300], seed=9, dtype=torch.float32)
    one, two = one_and_two_processes(tmp_path, ["fit", str(tmp_path / "part-*.safetensors"), "--no-write",
                                                "--val-fraction", "0.6", "--seed", "2", "--estimators", "all",
                                                "--bootstrap", "100", "--markdown", str(tmp_path / "{run}.md")])
    assert_same_figures(one, two)
    for side in ("before", "after"):
        assert all(name in two[side] for name in EXTRA)
        assert one[side]["ece_ci"] == two[side]["ece_ci"]
    assert (tmp_path / "one.md").read_text() == (tmp_path / "two.md").read_text()


@needs_torchrun
@pytest.mark.slow  # the ECE fit under torchrun: also in test_a_rank_without_rows_matches_one_process
def test_fit_minimising_ece_matches_one_process(tmp_path):
    write_shards(tmp_path, [700, 1200, 450], seed=11, dtype=torch.float32)
    one, two = one_and_two_processes(tmp_path, ["fit", str(tmp_path / "part-*.safetensors"), "--no-write",
                                                "--objective", "ece", "--seed", "1", "--estimators", "all"])
    assert one["objective"] == "ece" and one["fit_method"] == "ece-search"
    assert_same_figures(one, two)


@needs_torchrun
def test_ood_with_several_files_scores_and_the_bootstrap_matches_one_process(tmp_path):
    """Rankings need every sample's score: ID and every OOD file's scores are gathered in rank order."""
    from safetensors.torch import load_file

    z_id, y, z_ood = id_ood_logits(900, 700, seed=5)
    save_file({"logits": z_id[:520].contiguous(), "labels": y[:520].contiguous()}, str(tmp_path / "id-0.safetensors"))
    save_file({"logits": z_id[520:].contiguous(), "labels": y[520:].contiguous()}, str(tmp_path / "id-1.safetensors"))
    save_file({"logits": z_ood[:300].contiguous()}, str(tmp_path / "near.safetensors"))
    save_file({"logits": (0.5 * z_ood[300:]).contiguous()}, str(tmp_path / "far.safetensors"))
    one, two = one_and_two_processes(tmp_path, ["ood", str(tmp_path / "id-*.safetensors"), "--ood",
                                                str(tmp_path / "near.safetensors"), "--ood",
                                                str(tmp_path / "far.safetensors"), "--score", "all", "--tau", "1",
                                                "--tau", "3", "--bootstrap", "50",
                                                "--scores", str(tmp_path / "{run}.scores.safetensors")])
    assert one.pop("scores_file").endswith("one.scores.safetensors")
    assert two.pop("scores_file").endswith("two.scores.safetensors")
    assert_same_figures(one, two)
    assert two["n_id"] == 900 and two["n_ood"] == [300, 400] and len(two["scores"]) > 2
    assert all("auroc_ci" in row for row in two["results"])
    first, second = (load_file(str(tmp_path / f"{run}.scores.safetensors")) for run in ("one", "two"))
    assert set(first) == set(second) and all(torch.equal(first[k], second[k]) for k in first)


@needs_torchrun
def test_ood_with_react_takes_the_percentile_of_every_rank(tmp_path):
    """ReAct clips at a percentile of SOURCE's hidden states: of every rank's rows, so the threshold is global."""
    h, w, b, y = hidden_and_head(700, 16, 9, seed=3)
    save_file({"hidden": h, "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"hidden": 1.5 * h[:333] + 0.4}, str(tmp_path / "ood.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    one, two = one_and_two_processes(tmp_path, ["ood", str(tmp_path / "id.safetensors"), "--ood",
                                                str(tmp_path / "ood.safetensors"), "--head",
                                                str(tmp_path / "head.safetensors"), "--react", "80", "--score",
                                                "both", "--tau", "1"])
    assert_same_figures(one, two)
    assert one["react_threshold"] == float(torch.quantile(h.double().flatten(), 0.8).float())


@needs_torchrun
def test_a_rank_without_rows_matches_one_process(tmp_path):
    """Two fitting rows over three processes: rank 0's share is empty, for the ECE fit as for every figure."""
    (tmp_path / "fit").mkdir()
    write_shards(tmp_path / "fit", [2], seed=3, dtype=torch.float32)
    write_shards(tmp_path, [500, 300], seed=4, dtype=torch.float32)
    one, two = one_and_two_processes(tmp_path, ["fit", str(tmp_path / "fit" / "part-00.safetensors"), "--eval",
                                                str(tmp_path / "part-0*.safetensors"), "--objective", "ece",
                                                "--no-write", "--estimators", "all", "--bootstrap", "50"], nproc=3)
    assert one["n_fit"] == 2 and one["n_eval"] == 800
    assert_same_figures(one, two)


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
@pytest.mark.slow  # the default run: test_cli_decisions_folds.test_folds_groups_and_sets_under_two_processes_match_one
def test_folds_and_groups_under_two_processes_match_one(tmp_path):
    g = torch.Generator().manual_seed(12)
    for k, n in enumerate((700, 500)):
        z = torch.randn(n, 6, generator=g) * 2
        y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
        domain = torch.randint(0, 4, (n,), generator=g)
        save_file({"logits": z * (1 + domain[:, None] / 3), "labels": y, "domain": domain},
                  str(tmp_path / f"part-{k}.safetensors"))
    pattern = str(tmp_path / "part-*.safetensors")
    one, two = one_and_two_processes(tmp_path, ["fit", pattern, "--no-write", "--folds", "5", "--group-by", "domain",
                                                "--estimators", "ece_equal_mass", "--bootstrap", "20"])
    for result in (one, two):  # timing and the device's name aside, every figure agrees
        result.pop("device")
    assert_same_figures(one, two)
    one, two = one_and_two_processes(tmp_path, ["report", pattern, "--group-by", "domain", "--tau", "1.5"])
    for result in (one, two):
        result.pop("device")
    assert_same_figures(one, two)


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
@pytest.mark.slow  # report under torchrun in the default run: test_report_with_every_estimator_and_the_bootstrap_...
def test_report_on_the_held_out_rows_under_two_processes_matches_one(tmp_path):
    g = torch.Generator().manual_seed(13)
    z = torch.randn(900, 5, generator=g) * 3
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g)[:, 0]
    domain = torch.randint(0, 3, (900,), generator=g)
    path = tmp_path / "val.safetensors"
    save_file({"logits": z, "labels": y, "domain": domain}, str(path))
    subprocess.run([sys.executable, "-m", "tempcal", "fit", str(path), "--group-by", "domain", "-q"], check=True,
                   timeout=300)
    one, two = one_and_two_processes(tmp_path, ["report", str(path), "--eval-rows", "--group-by", "domain"])
    for result in (one, two):
        result.pop("device")
    assert one["eval_rows"] is True and one["n"] == 450
    assert_same_figures(one, two)

"""The commands under torchrun (tempcal.core.distributed, gloo on two processes) match one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import hidden_and_head, write_shards
from safetensors.torch import save_file


def _torchrun() -> list[str] | None:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else None


def one_and_two_processes(tmp_path, argv: list[str]) -> tuple[dict, dict]:
    """The JSON of ``tempcal ARGV`` run by one process and by two gloo processes under torchrun."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # with TEMPCAL_RESIDENT_BYTES as the test set it
    common = [*argv, "--device", "cpu", "--quiet"]
    single = subprocess.run([sys.executable, "-m", "tempcal", *common, "--json", str(tmp_path / "one.json")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    launched = subprocess.run([*_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "tempcal", *common,
                               "--json", str(tmp_path / "two.json")], capture_output=True, text=True, env=env,
                              timeout=300)
    assert launched.returncode == 0, launched.stderr[-2000:]
    return json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text())


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
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

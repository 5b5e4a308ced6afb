"""tempcal fit under torchrun (tempcal.core.distributed, gloo on two processes) matches one process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import write_shards


def _torchrun() -> list[str] | None:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else None


@pytest.mark.skipif(_torchrun() is None, reason="torchrun not installed")
def test_two_processes_with_gloo_match_one(tmp_path, reads):
    write_shards(tmp_path, [900, 650, 1100], seed=9, dtype=torch.float32)
    pattern = str(tmp_path / "part-*.safetensors")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # with TEMPCAL_RESIDENT_BYTES as ``reads`` set it
    common = ["fit", pattern, "--no-write", "--device", "cpu", "--quiet", "--val-fraction", "0.6", "--seed", "2"]
    single = subprocess.run([sys.executable, "-m", "tempcal", *common, "--json", str(tmp_path / "one.json")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert single.returncode == 0, single.stderr
    launched = subprocess.run([*_torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "tempcal", *common,
                               "--json", str(tmp_path / "two.json")], capture_output=True, text=True, env=env,
                              timeout=300)
    assert launched.returncode == 0, launched.stderr[-2000:]
    one = json.loads((tmp_path / "one.json").read_text())
    two = json.loads((tmp_path / "two.json").read_text())
    assert abs(one["temperature"] - two["temperature"]) / one["temperature"] < 1e-6
    assert (one["n_fit"], one["n_eval"]) == (two["n_fit"], two["n_eval"])
    for side in ("before", "after"):
        for key in ("nll", "ece", "mce", "brier", "accuracy", "entropy"):
            assert two[side][key] == pytest.approx(one[side][key], abs=1e-6)

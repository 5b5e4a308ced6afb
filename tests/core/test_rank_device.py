"""Which device a torchrun process computes on, and the process group's end (tempcal.core.parallel).

The device choice runs against a faked CUDA device count; the process group is a real gloo group of two
processes started by torchrun.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from tempcal.core import parallel
from tempcal.errors import TempcalError


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(count, local_rank, per_node, visible=None)``: the environment torchrun and CUDA would give."""

    def setup(count: int, local_rank: int = 0, per_node: int = 1, visible: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(per_node))
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)

    return setup


@pytest.mark.parametrize(("device", "count", "local_rank", "per_node", "visible", "expected"), [
    ("cpu", 4, 1, 2, None, "cpu"),
    ("auto", 0, 1, 2, None, "cpu"),
    ("cuda", 4, 3, 4, None, "cuda:3"),            # one node, a GPU per process
    ("auto", 4, 2, 4, None, "cuda:2"),
    ("cuda", 1, 3, 4, "3", "cuda:0"),             # CUDA_VISIBLE_DEVICES set per rank: each sees one GPU
    ("cuda:1", 2, 0, 1, None, "cuda:1"),          # one process per node: the device asked for, not LOCAL_RANK's
    ("cuda:1", 2, 1, 2, "2,3", "cuda:1"),         # per-rank visible sets: the user placed them
])
def test_each_process_gets_the_device_it_can_use(gpus, device, count, local_rank, per_node, visible, expected):
    gpus(count, local_rank, per_node, visible)
    assert parallel.rank_device(device) == torch.device(expected)


def test_a_local_rank_without_its_gpu_is_bad_input(gpus):
    gpus(2, local_rank=3, per_node=4)
    with pytest.raises(TempcalError, match="LOCAL_RANK 3 but sees 2 CUDA devices; start at most 2 processes"):
        parallel.rank_device("cuda")


def test_one_explicit_gpu_for_every_process_of_a_node_is_bad_input(gpus):
    gpus(4, local_rank=1, per_node=2)
    with pytest.raises(TempcalError, match="2 processes torchrun started on this node would all use cuda:1"):
        parallel.rank_device("cuda:1")


def test_a_gpu_the_process_does_not_see_is_bad_input(gpus):
    gpus(2)
    with pytest.raises(TempcalError, match="cuda:2: this machine has 2 CUDA device"):
        parallel.rank_device("cuda:2")


def test_the_chosen_gpu_is_made_current_before_the_nccl_group_starts(gpus, monkeypatch):
    import torch.distributed as dist

    gpus(4, local_rank=1, per_node=4)
    monkeypatch.setenv("WORLD_SIZE", "4")
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(calls) and calls[-1][0] == "init")
    monkeypatch.setattr(dist, "init_process_group", lambda backend: calls.append(("init", backend)))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(("destroy",)))
    assert parallel.init_from_environment("cuda") == "cuda:1"
    parallel.shutdown()
    parallel.shutdown()  # once only
    assert calls == [("set_device", torch.device("cuda:1")), ("init", "nccl"), ("destroy",)]


def test_a_group_tempcal_did_not_start_is_left_alone(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # the caller's own group
    monkeypatch.setattr(dist, "destroy_process_group", lambda: pytest.fail("destroyed the caller's group"))
    assert parallel.init_from_environment("cpu") == "cpu"
    parallel.shutdown()


_DRIVER = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    from tempcal.cli.main import main
    code = main(sys.argv[1:])
    print(f"rank exit {code} group left initialised: {dist.is_available() and dist.is_initialized()}")
""")


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
                    reason="torchrun not installed")
def test_the_cli_destroys_its_process_group_before_it_returns(tmp_path):
    g = torch.Generator().manual_seed(0)
    path = tmp_path / "val.safetensors"
    save_file({"logits": torch.randn(400, 5, generator=g), "labels": torch.randint(0, 5, (400,), generator=g)},
              str(path))
    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    done = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(driver), "fit", str(path),
                           "--no-write", "--device", "cpu", "--json", str(tmp_path / "fit.json")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("rank exit 0 group left initialised: False") == 2, done.stdout

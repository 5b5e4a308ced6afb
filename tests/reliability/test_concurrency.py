"""Concurrent write-backs end with a valid file holding one result.

The rule: the check that the source is the version that was read and the rename run under
an advisory lock on the source, so of write-backs that read the same version the first to
rename wins and every other one refuses (exit 2, one line, nothing written). Writers into
the same ``--output`` from different sources all succeed: the last rename wins, and the
file is always one complete result.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import assert_one_error_line
from reliability_support import (
    DRIVER,
    KEY,
    PYTHON,
    REPO,
    assert_complete_update,
    child_env,
    parse,
    tempcal_command,
    temporaries,
    valid_file,
)


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=child_env())


def finish(proc: subprocess.Popen, timeout: float = 180.0) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in out + err, err
    return proc.returncode, out, err


def driver(source: Path, temperature: float, barrier: Path, count: int, output: Path | None = None) -> list[str]:
    args = [PYTHON, str(DRIVER), str(source), repr(temperature), "--barrier", str(barrier), str(count)]
    return args + (["--output", str(output)] if output else [])


def run_fits(tmp_path: Path, source: Path, original: bytes, round_: int) -> tuple[int, int]:
    """Two ``tempcal fit`` processes on one file at once; returns (how many wrote, how many refused)."""
    variants = [["--val-fraction", "0.5"], ["--val-fraction", "1.0"]]  # two different T
    outs = [tmp_path / f"out-{round_}-{k}.json" for k in range(2)]
    procs = [start(tempcal_command("fit", str(source), "--quiet", "--json", str(out), *variant))
             for out, variant in zip(outs, variants, strict=True)]
    results = [finish(proc) for proc in procs]
    written = []
    for (code, _, err), out in zip(results, outs, strict=True):
        assert code in (0, 2), err
        if code == 0:
            written.append(json.loads(out.read_text())["temperature"])
        else:
            assert_one_error_line(err, str(source), "changed since tempcal read it", "nothing written")
            assert not out.exists()  # a refused run writes no JSON either
    assert written, "at least one of the two must succeed"
    stored = assert_complete_update(source.read_bytes(), original)
    assert stored in written
    assert temporaries(tmp_path) == []
    return len(written), 2 - len(written)


@pytest.mark.parametrize("rounds", [1, pytest.param(8, marks=pytest.mark.slow)])
def test_two_fit_processes_on_one_file(tmp_path, rounds):
    source = tmp_path / "logits.safetensors"
    original = valid_file(2000, 10, metadata={"model": "m"})
    outcomes = []
    for round_ in range(rounds):
        source.write_bytes(original)
        outcomes.append(run_fits(tmp_path, source, original, round_))
    print(f"\n(wrote, refused) per round: {outcomes}")


@pytest.mark.parametrize(("count", "rounds"), [(2, 3), pytest.param(4, 25, marks=pytest.mark.slow)])
def test_write_backs_of_the_same_version_one_wins(tmp_path, count, rounds):
    """All writers read the same version, then write at once (a barrier): exactly one wins, the rest refuse."""
    source = tmp_path / "logits.safetensors"
    original = valid_file(200, 4, metadata={"model": "m"})
    for round_ in range(rounds):
        source.write_bytes(original)
        barrier = tmp_path / f"barrier-{round_}"
        barrier.mkdir()
        temperatures = [1.25 + k for k in range(count)]
        procs = [start(driver(source, t, barrier, count)) for t in temperatures]
        results = [finish(proc) for proc in procs]
        winners = [t for t, (code, _, _) in zip(temperatures, results, strict=True) if code == 0]
        assert len(winners) == 1, results
        for code, _, err in results:
            if code != 0:
                assert code == 2
                assert_one_error_line(err, str(source), "changed since tempcal read it")
        assert assert_complete_update(source.read_bytes(), original) == winners[0]
        assert temporaries(tmp_path) == []


def test_two_sources_into_one_output(tmp_path):
    """Different sources, the same --output: both succeed, the output is one of the two complete results."""
    sources = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    originals = [valid_file(300, 4, seed=1), valid_file(500, 4, seed=2)]
    for path, body in zip(sources, originals, strict=True):
        path.write_bytes(body)
    output = tmp_path / "calibrated.safetensors"
    for round_ in range(3):
        barrier = tmp_path / f"barrier-{round_}"
        barrier.mkdir()
        procs = [start(driver(path, 2.0 + k, barrier, 2, output)) for k, path in enumerate(sources)]
        assert [finish(proc)[0] for proc in procs] == [0, 0]
        stored = float(parse(output.read_bytes())[0][KEY])
        k = [2.0, 3.0].index(stored)
        assert_complete_update(output.read_bytes(), originals[k], stored)
        assert [p.read_bytes() for p in sources] == originals
        assert temporaries(tmp_path) == []

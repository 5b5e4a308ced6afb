"""Size-like options bounded by the data and the free memory (tempcal.core.limits): exit 2 naming the limit.

Free memory is faked (``available_bytes``) so that the refusals are exact and the machine's memory is never
at risk; the message's "at most" figure is checked against the arithmetic written out here.
"""

from __future__ import annotations

import pytest
import torch
from conftest import overconfident, snapshot, write_inputs
from safetensors.torch import save_file

import tempcal
import tempcal.core.limits as limits
from tempcal.errors import MAX_BINS, MAX_RESAMPLES, TempcalError

# the digits model is TorchScript, which torch 2.13 deprecates; the contract reads it.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


@pytest.fixture
def logits_file(tmp_path):
    logits, labels = overconfident()  # 400 rows
    path = tmp_path / "val.safetensors"
    save_file({"logits": logits.float().contiguous(), "labels": labels}, str(path))
    return path, int(logits.shape[0]), int(logits.shape[1])


@pytest.fixture
def free_memory(monkeypatch):
    """``free_memory(nbytes)``: what every device is said to have free from now on."""

    def setup(nbytes: int) -> None:
        monkeypatch.setattr(limits, "available_bytes", lambda device: nbytes)

    return setup


def _refused(tmp_path, cli, argv: list[str]) -> str:
    before = snapshot(tmp_path)
    code, out, err = cli(argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith("error: "), (code, out, err)
    assert snapshot(tmp_path) == before  # nothing written, T not stored
    return err


@pytest.mark.parametrize(("argv", "limit"), [
    (["fit", "{file}", "--bins", "1000000000"], MAX_BINS),
    (["report", "{file}", "--bins", str(MAX_BINS + 1)], MAX_BINS),
    (["report", "{file}", "--bootstrap", "1000000000"], MAX_RESAMPLES),
    (["ood", "{file}", "--ood", "{file}", "--bootstrap", str(MAX_RESAMPLES + 1)], MAX_RESAMPLES),
])
def test_counts_beyond_their_fixed_limit_are_refused_before_reading(tmp_path, cli, logits_file, argv, limit):
    path = logits_file[0]
    err = _refused(tmp_path, cli, [a.replace("{file}", str(path)) for a in argv])
    assert argv[-2] in err and f"less than or equal to {limit}" in err


def test_the_largest_counts_allowed_still_run(tmp_path, run_json, logits_file):
    result = run_json(["report", str(logits_file[0]), "--bins", str(MAX_BINS)])
    assert len(result["results"][0]["bins"]) == MAX_BINS
    assert sum(b["count"] for b in result["results"][0]["bins"]) == logits_file[1]


def test_the_library_refuses_absurd_bins_before_allocating():
    logits, labels = overconfident()
    with pytest.raises(TempcalError, match=f"bins must be at most {MAX_BINS}, got 1000000000"):
        tempcal.calibration_metrics(logits, labels, bins=10**9, device="cpu")


def test_bins_at_many_temperatures_beyond_memory_name_the_bins_that_fit(tmp_path, cli, logits_file, free_memory):
    free_memory(10**8)
    err = _refused(tmp_path, cli, ["report", str(logits_file[0]), "--bins", "50000", "--sweep", "0.5:5:100"])
    temperatures = 100 + 0 + 1  # the sweep, no --tau, the stored or default T
    assert f"--bins 50000: 50000 bins at up to {temperatures} temperatures" in err
    assert f"at most {10**8 // (512 * temperatures)} fits" in err


def test_chunk_rows_beyond_the_data_are_cut_to_the_rows(run_json, logits_file):
    path, rows, _ = logits_file
    huge = run_json(["fit", str(path), "--no-write", "--chunk-rows", "100000000000"])
    default = run_json(["fit", str(path), "--no-write"])
    assert huge["temperature"] == pytest.approx(default["temperature"], rel=1e-9)
    assert tempcal.Scan(tempcal.open_source(path).data, device="cpu", chunk_rows=10**11).chunk_rows == rows


def test_chunk_rows_beyond_memory_name_the_rows_that_fit(tmp_path, cli, logits_file, free_memory):
    path, _rows, classes = logits_file
    free = 100 * classes * limits.CHUNK_BYTES_PER_LOGIT + 5
    free_memory(free)
    err = _refused(tmp_path, cli, ["fit", str(path), "--chunk-rows", "300"])
    assert f"--chunk-rows 300: a chunk of 300 rows of {classes} logits" in err and "at most 100 fits" in err
    free_memory(free)
    code, _, err = cli(["fit", str(path), "--no-write", "--chunk-rows", "100", "--json", str(tmp_path / "o.json")])
    assert code == 0, err


def test_batch_size_beyond_memory_names_the_batch_that_fits(tmp_path, cli, digits, free_memory):
    values = int(torch.tensor(digits["x"].shape[1:]).prod())
    free = 50 * values * limits.BATCH_BYTES_PER_VALUE
    free_memory(free)
    err = _refused(tmp_path, cli, ["fit", str(digits["model"]), "--inputs", str(digits["inputs"]), "--batch-size",
                                   "200", "--device", "cpu"])
    assert f"--batch-size 200: a model batch of 200 rows of {values} input values" in err
    assert "at most 50 fits" in err


def test_batch_size_beyond_the_inputs_is_cut_to_the_rows(tmp_path):
    inputs = write_inputs(tmp_path / "x.safetensors", torch.randn(30, 4), torch.zeros(30, dtype=torch.int64))
    from tempcal.models.run import InputsFile, bounded_batches

    assert bounded_batches(10**12, InputsFile(inputs), "cpu") == 30


def test_free_memory_is_read_from_the_system():
    free = limits.available_bytes("cpu")
    assert free is None or 0 < free < 1 << 50


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_free_cuda_memory_is_what_the_driver_and_the_cache_leave():
    free, total = torch.cuda.mem_get_info()
    assert 0 < limits.available_bytes("cuda") <= total
    assert limits.available_bytes("cuda") >= free

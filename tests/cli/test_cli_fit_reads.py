"""``tempcal fit`` reads its data at most 3 times, the validating scan included, and the JSON ``passes`` says how
many: counted here independently, at the sources (rows yielded by a file's chunk reader, rows through an output
head's matmul), for an in-memory file, a streamed and sharded one, hidden states with ``--head``, the default
split, ``--eval`` and ``--val-fraction 1.0``; T is the float64 optimum on the fitting rows within 1e-6."""

from __future__ import annotations

import collections

import pytest
import torch
from conftest import hidden_and_head, miscalibrated, write_shards
from reference import optimal_temperature
from safetensors.torch import save_file

import tempcal
import tempcal.workflows.fit as fit_workflow
from tempcal.core.data import HeldRows
from tempcal.models.head import OutputHead
from tempcal.sources.safetensors import ShardedLogits


class Reads:
    """Per file: chunk reads started (each one a read of the file, or of the rows selected from it; a pass whose
    threads take their blocks from the file kept in memory counts as one) and rows yielded; rows through an output
    head; and the counts when the fit started and ended."""

    def __init__(self):
        self.reads: collections.Counter[str] = collections.Counter()
        self.rows: collections.Counter[str] = collections.Counter()
        self.head_rows = 0
        self.at_fit: tuple[dict, dict, int] | None = None
        self.after_fit: tuple[dict, dict, int] | None = None

    def snapshot(self) -> tuple[dict, dict, int]:
        return dict(self.reads), dict(self.rows), self.head_rows

    def during_fit(self, name: str) -> int:
        assert self.at_fit is not None and self.after_fit is not None
        return self.after_fit[0].get(name, 0) - self.at_fit[0].get(name, 0)


class _CountedRows(HeldRows):
    """Rows kept in memory whose blocks, as the threads take them, add to the file's rows read."""

    def __init__(self, logits, rows, name: str, reads: Reads):
        super().__init__(logits, rows)
        object.__setattr__(self, "counted", (name, reads))

    def block(self, start, stop, dtype, buffers=None):
        name, reads = self.counted
        reads.rows[name] += stop - start
        return super().block(start, stop, dtype, buffers)


@pytest.fixture
def counted(monkeypatch) -> Reads:
    reads = Reads()
    plain_chunks, plain_logits, plain_fit = ShardedLogits.chunks, OutputHead.logits, fit_workflow.fit_temperature
    plain_held = ShardedLogits.held_rows

    def chunks(self, *args, **kwargs):
        name = self.shards[0].header.path.name
        reads.reads[name] += 1
        for item in plain_chunks(self, *args, **kwargs):
            reads.rows[name] += item[1].shape[0]
            yield item

    def held_rows(self, device):
        held = plain_held(self, device)
        if held is None:
            return None
        name = self.shards[0].header.path.name
        reads.reads[name] += 1
        return _CountedRows(held.logits, held.rows, name, reads)

    def logits(self, h, out, *rest):
        reads.head_rows += h.shape[0]
        return plain_logits(self, h, out, *rest)

    def fit_temperature(*args, **kwargs):
        reads.at_fit = reads.snapshot()
        result = plain_fit(*args, **kwargs)
        reads.after_fit = reads.snapshot()
        return result

    monkeypatch.setattr(ShardedLogits, "chunks", chunks)
    monkeypatch.setattr(ShardedLogits, "held_rows", held_rows)
    monkeypatch.setattr(OutputHead, "logits", logits)
    monkeypatch.setattr(fit_workflow, "fit_temperature", fit_temperature)
    return reads


def fit_rows(labels: torch.Tensor, val_fraction: float) -> torch.Tensor:
    if val_fraction == 1.0:
        return torch.arange(len(labels))
    return torch.from_numpy(tempcal.stratified_split(labels.numpy(), val_fraction, 0)[0])


def check(result: dict, counted: Reads, name: str, logits: torch.Tensor, labels: torch.Tensor, rows) -> None:
    """``passes`` equals the validating scan plus the reads during the fit, at most 3; T is the optimum."""
    assert result["converged"] is True and result["fit_method"] == "certified"
    assert result["passes"] == 1 + counted.during_fit(name) <= 3, (result["passes"], counted.reads)
    assert counted.at_fit is not None and counted.at_fit[0][name] == 1  # the validating scan alone
    expected = optimal_temperature(logits[rows], labels[rows])
    assert abs(result["temperature"] / expected - 1) < 1e-6


@pytest.mark.parametrize("val_fraction", [0.3, 1.0])
def test_a_file_is_read_at_most_three_times(tmp_path, run_json, counted, reads, val_fraction):
    logits, labels = miscalibrated(8000, 40, 2.3, seed=31)  # 320k float32 logits: the fit takes passes
    path = tmp_path / "logits.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    result = run_json(["fit", str(path), "--no-write", "--val-fraction", str(val_fraction), "--chunk-rows", "700"])
    rows = fit_rows(labels, val_fraction)
    check(result, counted, path.name, logits, labels, rows)
    assert result["n_fit"] == len(rows)
    assert result["passes"] >= 2  # too large for the whole fit to happen within the scan


def test_shards_streamed_in_small_chunks_with_an_eval_file(tmp_path, run_json, counted, monkeypatch):
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")
    _, logits, labels = write_shards(tmp_path, [3000, 2500, 4000], c=30, seed=4, dtype=torch.float32)
    evaluation = tmp_path / "eval.safetensors"
    save_file({"logits": logits[:500].contiguous(), "labels": labels[:500].clone()}, str(evaluation))
    result = run_json(["fit", str(tmp_path / "part-*.safetensors"), "--eval", str(evaluation), "--no-write",
                       "--chunk-rows", "300"])
    check(result, counted, "part-00.safetensors", logits, labels, torch.arange(len(labels)))
    assert counted.during_fit("eval.safetensors") == 0
    assert result["n_fit"] == len(labels) and result["n_eval"] == 500


@pytest.mark.parametrize("val_fraction", [0.5, pytest.param(1.0, marks=pytest.mark.slow)])
def test_hidden_states_through_a_head_are_multiplied_at_most_three_times(tmp_path, run_json, counted,
                                                                         val_fraction):
    h, w, b, y = hidden_and_head(3000, 16, 2000, seed=6)
    save_file({"hidden": h, "labels": y}, str(tmp_path / "hidden.safetensors"))
    save_file({"weight": w, "bias": b}, str(tmp_path / "head.safetensors"))
    result = run_json(["fit", str(tmp_path / "hidden.safetensors"), "--head", str(tmp_path / "head.safetensors"),
                       "--no-write", "--val-fraction", str(val_fraction)])
    rows = fit_rows(y, val_fraction)
    check(result, counted, "hidden.safetensors", h @ w.T + b, y, rows)
    assert counted.at_fit is not None and counted.after_fit is not None
    # The scan multiplied every row once (its start recomputes nothing); each pass after it, the fitting rows.
    assert counted.at_fit[2] == len(y)
    assert counted.after_fit[2] - counted.at_fit[2] == (result["passes"] - 1) * len(rows)

"""lighteval details files as SOURCE: the committed files written by lighteval 0.13 read as its own reader reads them
(the reference JSON; pandas and, when installed, lighteval's own loader live), T against scipy on those rows,
--lm-eval-norm against a plain loop, incomplete rows counted, and bad files refused on one line."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lighteval_details import FIXTURES, complete, copied, fixture, matrix, mc_rows, reference_rows, write_details
from reference import optimal_temperature

import tempcal
from tempcal.errors import TempcalError
from tempcal.io.paths import sidecar_path
from tempcal.io.sidecar import read_sidecar
from tempcal.sources import lighteval as lighteval_kind
from tempcal.sources.base import SourceOptions
from tempcal.sources.lighteval import LightevalDetailsError, LightevalKind, read_details
from tempcal.sources.lm_eval import task_from_filename
from tempcal.sources.registry import kind_of, open_source

TASKS = ("tempcal_mc", "tempcal_listed")


# -- the committed files, as lighteval wrote them -------------------------------------------------------------


def test_the_fixtures_are_lightevals_own_and_small() -> None:
    files = sorted(FIXTURES.glob("details_*.parquet"))
    assert len(files) == 2 and all(f.stat().st_size < 300_000 for f in files)
    for task in TASKS:
        path = fixture(task)
        ref = json.loads(path.with_name(path.name + ".reference.json").read_text())
        assert ref["columns"] == ["doc", "metric", "model_response"] and ref["lighteval"].startswith("0.13")


@pytest.mark.parametrize("task", TASKS)
def test_rows_are_the_reference_rows(task: str) -> None:
    rows = complete(reference_rows(task))
    z, y = matrix(rows)
    opened = open_source(fixture(task))
    assert opened.data.dtype == torch.float64 and opened.data.num_samples == len(rows)
    np.testing.assert_array_equal(opened.data.logits.numpy(), z)  # bit for bit: float64 as lighteval wrote it
    assert opened.data.labels.tolist() == y.tolist()
    assert isinstance(opened.kind, LightevalKind) and kind_of([fixture(task)]).name == "lighteval"


def test_the_listed_task_has_one_row_with_two_gold_indices() -> None:
    rows = reference_rows("tempcal_listed")
    several = [i for i, r in enumerate(rows) if len(r["gold_index"]) > 1]
    assert len(several) == 1 and len(complete(rows)) == len(rows) - 1
    info = read_details(fixture("tempcal_listed"))[1]
    assert info.incomplete == {"several_targets": 1, "logprobs_count": 0}
    assert info.first_incomplete == several[0] + 1 and info.gold_forms == {"list": len(rows)}
    opened = open_source(fixture("tempcal_listed"))
    assert opened.json == {"source_kind": "lighteval",
                                  "rows_incomplete": {"several_targets": 1, "logprobs_count": 0}}
    assert any(f"1 of {len(rows)} rows left out as incomplete (1 with several gold indices; the first is row "
               f"{several[0] + 1})" in w for w in opened.warnings)


@pytest.mark.parametrize("task", TASKS)
def test_a_live_read_agrees_with_the_reference(task: str) -> None:
    """pandas (pyarrow) now, and lighteval's own loader (``datasets``' parquet reader) when it is installed."""
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(fixture(task))
    rows = reference_rows(task)
    assert [list(v) for v in frame["model_response"].map(lambda r: r["logprobs"])] == [r["logprobs"] for r in rows]
    assert [list(d["choices"]) for d in frame["doc"]] == [r["choices"] for r in rows]
    if importlib.util.find_spec("lighteval") is None or importlib.util.find_spec("datasets") is None:
        pytest.skip("lighteval is not installed: the reference JSON stands for its reader")
    from datasets import load_dataset  # what lighteval's EvaluationTracker.load_details_datasets uses

    loaded = load_dataset("parquet", data_files=str(fixture(task)), split="train")
    assert [d["logprobs"] for d in loaded["model_response"]] == [r["logprobs"] for r in rows]
    assert [d["gold_index"] for d in loaded["doc"]] == [r["gold_index"] for r in rows]


@pytest.mark.parametrize("task", TASKS)
def test_lightevals_own_acc_is_the_argmax_of_the_rows_read(task: str) -> None:
    """lighteval scored each row ``acc = argmax(logprobs) in gold``: the rows tempcal reads reproduce it."""
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(fixture(task))
    kept = [i for i, r in enumerate(reference_rows(task)) if r in complete(reference_rows(task))]
    acc = [int(frame["metric"][i]["acc"]) for i in kept]
    opened = open_source(fixture(task))
    mine = (opened.data.logits.argmax(dim=1) == opened.data.labels).int().tolist()
    assert mine == acc and 0 < sum(acc) < len(acc)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("norm", ["none", "chars", "bytes"])
def test_fitted_t_matches_scipy_on_the_reference_rows(task: str, norm: str) -> None:
    z, y = matrix(complete(reference_rows(task)), norm)
    reference = optimal_temperature(torch.from_numpy(z), torch.from_numpy(y))
    opened = open_source(fixture(task), lm_eval_norm=norm)
    np.testing.assert_allclose(opened.data.logits.numpy(), z, rtol=1e-15)
    result = tempcal.fit_temperature(tempcal.Scan(opened.data, device="cpu"))
    assert result.temperature == pytest.approx(reference, rel=1e-6)


def test_chars_and_bytes_differ_on_non_ascii_choices() -> None:
    rows = complete(reference_rows("tempcal_mc"))
    assert any(len(c.lstrip()) != len(c.lstrip().encode()) for r in rows for c in r["choices"])
    chars, byte = (open_source(fixture("tempcal_mc"), lm_eval_norm=n).data.logits.numpy() for n in ("chars", "bytes"))
    assert not np.array_equal(chars, byte)
    # the leading space lighteval scores is not counted: " café" is 4 characters, 5 bytes
    row = next(i for i, r in enumerate(rows) if " café" in r["choices"])
    j = rows[row]["choices"].index(" café")
    assert chars[row, j] == rows[row]["logprobs"][j] / 4 and byte[row, j] == rows[row]["logprobs"][j] / 5


def test_two_tasks_are_one_source_padded_to_the_widest(tmp_path: Path) -> None:
    first, second = copied("tempcal_listed", tmp_path), copied("tempcal_mc", tmp_path)
    opened = open_source(str(tmp_path / "details_*.parquet"))
    rows = complete(reference_rows("tempcal_listed")) + complete(reference_rows("tempcal_mc"))
    z, y = matrix(rows)
    np.testing.assert_array_equal(opened.data.logits.numpy(), z)
    assert opened.data.labels.tolist() == y.tolist() and opened.paths == [first, second]
    assert opened.file_rows == [len(complete(reference_rows(t))) for t in ("tempcal_listed", "tempcal_mc")]


def test_rows_out_of_dataset_order_give_the_same_fit(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(fixture("tempcal_mc"))
    order = np.random.default_rng(0).permutation(table.num_rows)
    shuffled = tmp_path / "details_shuffled.parquet"
    pq.write_table(table.take(order), shuffled)
    a = open_source(fixture("tempcal_mc")).data
    b = open_source(shuffled).data
    np.testing.assert_array_equal(b.logits.numpy(), a.logits.numpy()[order])
    t_a = tempcal.fit_temperature(tempcal.Scan(a, device="cpu")).temperature
    t_b = tempcal.fit_temperature(tempcal.Scan(b, device="cpu")).temperature
    assert t_b == pytest.approx(t_a, rel=1e-9)


@pytest.mark.parametrize(("name", "task"), [
    ("details_tempcal_mc_0_2026-12-05T03-46-28.635053.parquet", "tempcal_mc_0"),
    ("details_leaderboard|arc:challenge|25_2025-01-02T10-11-12.123456.parquet", "leaderboard|arc:challenge|25"),
    ("details_mmlu.parquet", "mmlu"), ("details_.parquet", None), ("samples_x.parquet", None), ("x.jsonl", None)])
def test_task_from_filename(name: str, task: str | None) -> None:
    assert task_from_filename(name, "details_", (".parquet",)) == task


def test_the_name_claims_the_file() -> None:
    assert kind_of([Path("details_x.PARQUET")]).name == "lighteval"
    assert not LightevalKind().claims([Path("table.parquet")], SourceOptions())  # a table, not lighteval's details


# -- incomplete and bad rows --------------------------------------------------------------------------------


def test_a_wrong_logprob_count_is_incomplete(tmp_path: Path) -> None:
    rows = mc_rows(6, seed=1)
    rows[2]["logprobs"] = rows[2]["logprobs"][:-1]
    rows[4]["logprobs"] = [*rows[4]["logprobs"], -1.0]
    path = write_details(tmp_path / "details_t.parquet", rows)
    opened = open_source(path)
    assert opened.json["rows_incomplete"] == {"several_targets": 0, "logprobs_count": 2}
    z, y = matrix([r for i, r in enumerate(rows) if i not in (2, 4)])
    np.testing.assert_array_equal(opened.data.logits.numpy(), z)
    assert opened.data.labels.tolist() == y.tolist()


def test_none_complete_is_an_error(tmp_path: Path) -> None:
    rows = mc_rows(3, seed=2)
    for r in rows:
        r["gold_index"] = [0, 1]
    path = write_details(tmp_path / "details_t.parquet", rows)
    with pytest.raises(LightevalDetailsError, match=r"details_t.parquet: none of its 3 rows is complete \(3 with "
                                                    r"several gold indices\)"):
        open_source(path)
    empty = [{"gold_index": 0, "choices": [" a", " b"], "logprobs": []}]  # a generative task's rows
    with pytest.raises(LightevalDetailsError, match=r"none of its 1 rows is complete \(1 without one "
                                                    r"log-probability per choice\)"):
        open_source(write_details(tmp_path / "details_gen.parquet", empty))


def _one(**change) -> list[dict]:
    """Three rows of three choices; row 2 (counted from 1) changed. A listed gold index lists every row's."""
    rows = mc_rows(3, seed=3, choices=(3,))
    if isinstance(change.get("gold_index"), list):
        for r in rows:
            r["gold_index"] = [r["gold_index"]]
    rows[1].update(change)
    return rows


@pytest.mark.parametrize(("rows", "drop", "message"), [
    (mc_rows(3), ("model_response",), r"details_t.parquet: no column 'model_response.logprobs'"),
    (mc_rows(3), ("doc.gold_index",), r"details_t.parquet: no column 'doc.gold_index'"),
    (mc_rows(3), ("doc.choices",), r"details_t.parquet: no column 'doc.choices'"),
    (_one(gold_index=3), (), r"details_t.parquet: row 2: doc.gold_index 3 names no choice of the 3"),
    (_one(gold_index=[]), (), r"row 2: doc.gold_index \[\] names no choice"),
    (_one(gold_index=-1), (), r"row 2: doc.gold_index -1 names no choice"),
    (_one(choices=[" a"], logprobs=[-1.0]), (), r"row 2: doc.choices holds 1 choices"),
    (_one(logprobs=[-1.0, float("nan"), -2.0]), (), r"row 2: model_response.logprobs\[1\] is nan"),
    (_one(logprobs=[-1.0, float("inf"), -2.0]), (), r"row 2: model_response.logprobs\[1\] is inf"),
    (_one(gold_index=0, logprobs=[float("-inf"), -1.0, -2.0]), (), r"row 2: the gold choice \(0\) has "
                                                                   r"log-probability -inf"),
])
def test_bad_rows_and_columns_name_the_file_and_row(tmp_path: Path, rows, drop, message) -> None:
    path = write_details(tmp_path / "details_t.parquet", rows, drop=drop)
    with pytest.raises(LightevalDetailsError, match=message):
        open_source(path)


def test_wrong_column_types(tmp_path: Path) -> None:
    rows = [{"gold_index": "A", "choices": [" a", " b"], "logprobs": [-1.0, -2.0]}]
    with pytest.raises(LightevalDetailsError, match=r"column 'doc.gold_index' is string; expected an integer"):
        open_source(write_details(tmp_path / "details_s.parquet", rows))
    rows = [{"gold_index": 0, "choices": [" a", " b"], "logprobs": ["x", "y"]}]
    with pytest.raises(LightevalDetailsError, match=r"'model_response.logprobs' is list<element: string>; expected a "
                                                    r"list of numbers"):
        open_source(write_details(tmp_path / "details_l.parquet", rows))


def test_an_empty_choice_cannot_be_normalised(tmp_path: Path) -> None:
    path = write_details(tmp_path / "details_t.parquet", _one(choices=[" a", " ", " c"]))
    open_source(path)  # fine without normalisation
    with pytest.raises(LightevalDetailsError, match=r"row 2: choice 1 has an empty text"):
        open_source(path, lm_eval_norm="chars")


@pytest.mark.parametrize("content", [b"", b"not a parquet file\n", b"PAR1" + b"\0" * 40])
def test_not_parquet(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "details_t.parquet"
    path.write_bytes(content)
    with pytest.raises(LightevalDetailsError, match=r"^\S*details_t.parquet: not a readable parquet file \("):
        open_source(path)


def test_a_truncated_file(tmp_path: Path) -> None:
    data = fixture("tempcal_mc").read_bytes()
    path = tmp_path / "details_t.parquet"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LightevalDetailsError, match=r"details_t.parquet: not a readable parquet file"):
        open_source(path)


def test_a_row_group_over_the_limit_is_refused_before_it_is_read(tmp_path: Path, monkeypatch) -> None:
    path = write_details(tmp_path / "details_t.parquet", mc_rows(200, seed=4), row_group_size=100)
    assert open_source(path).data.num_samples == 200
    monkeypatch.setattr(lighteval_kind, "MAX_ROW_GROUP_BYTES", 1000)
    with pytest.raises(LightevalDetailsError, match=r"details_t.parquet: row group 0 holds .* tempcal reads row "
                                                    r"groups of at most 1000 bytes"):
        open_source(path)


def test_batches_cover_every_row(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(lighteval_kind, "BATCH_ROWS", 7)
    rows = mc_rows(50, seed=5)
    opened = open_source(write_details(tmp_path / "details_t.parquet", rows, row_group_size=16))
    z, y = matrix(rows)
    np.testing.assert_array_equal(opened.data.logits.numpy(), z)
    assert opened.data.labels.tolist() == y.tolist()


def test_without_pyarrow_the_error_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    path = copied("tempcal_mc", tmp_path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(TempcalError, match=r"details_tempcal_mc_0_.*: reading a lighteval details file needs "
                                           r"pyarrow, which is not installed: pip install 'tempcal\[logs\]'"):
        open_source(path)


def test_probs_and_a_bad_norm_are_refused() -> None:
    with pytest.raises(TempcalError, match=r"^probs applies to logits files; .* lighteval details file"):
        open_source(fixture("tempcal_mc"), probs=True)
    with pytest.raises(TempcalError, match=r"^lm_eval_norm words: expected one of none, chars, bytes$"):
        open_source(fixture("tempcal_mc"), lm_eval_norm="words")


# -- the sidecar --------------------------------------------------------------------------------------------


def test_t_goes_to_the_sidecar_with_the_normalisation(tmp_path: Path) -> None:
    path = copied("tempcal_mc", tmp_path)
    before = path.read_bytes()
    written = open_source(path, lm_eval_norm="bytes").write_temperature(1.5)
    assert written == [sidecar_path(path)] and path.read_bytes() == before
    assert read_sidecar(path)[0] == {"tempcal.temperature": "1.5", "tempcal.lm_eval_norm": "bytes"}
    assert open_source(path, lm_eval_norm="bytes").stored_temperature == 1.5
    assert open_source(path).stored_temperature is None  # fitted under another normalisation

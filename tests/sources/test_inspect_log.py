"""inspect_ai logs as SOURCE: rows against the reference that inspect_ai's own parser read (and the live parser
when inspect_ai is importable), the three member compressions and the .json log, token letters and the answer
position, and bad logs (one line naming the file and the member or sample)."""

from __future__ import annotations

import json
import math
import zipfile

import numpy as np
import pytest
from inspect_logs import FIXTURES, expected_rows, fixture, members, reference, rewritten, write_eval

from tempcal.errors import TempcalError
from tempcal.sources import inspect_files
from tempcal.sources.base import SourceOptions
from tempcal.sources.inspect_log import (
    InspectLogInfo,
    InspectLogKind,
    SampleRow,
    answer_position,
    letter_of,
    read_inspect_log,
)
from tempcal.sources.registry import kind_of, open_source

LOGS = ["mc_word.eval", "mc_bpe.eval", "mc_cot_word.eval", "mc_cot_bpe.eval", "mc_json_bpe.json", "mc_zip_bpe.eval",
        "mc_zip_bpe_deflated.eval", "mc_zip_bpe_stored.eval", "multi/alpha_word1.eval", "multi/beta_word3.eval"]


@pytest.mark.parametrize("name", LOGS)
def test_rows_match_the_reference_read_by_inspect_ai(name):
    z, y, left = expected_rows(name)
    opened = open_source(fixture(name))
    assert isinstance(opened.kind, InspectLogKind)
    assert np.array_equal(opened.data.labels.numpy(), y)
    got = opened.data.logits.numpy()
    assert got.shape == z.shape
    finite = np.isfinite(z)
    assert np.array_equal(np.isfinite(got), finite)
    assert np.allclose(got[finite], z[finite], rtol=0, atol=1e-12)
    assert opened.json == {"source_kind": "inspect", "rows_incomplete": left}
    info = read_inspect_log(fixture(name))
    ref = reference(name)
    assert (info.task, info.model) == (ref["task"], ref["model"])
    assert info.samples == len(ref["samples"]) and info.epochs == {s["epoch"] for s in ref["samples"]}


def test_the_fixtures_cover_what_the_contract_names():
    """Real pieces such as ``ĠB``, several epochs, 3 and 4 choices, and samples left out for each of two reasons."""
    bpe = reference("mc_bpe.eval")["samples"]
    assert any(t["token"].startswith("\u0120") for s in bpe for t in s["top_logprobs"])
    assert {s["epoch"] for s in reference("mc_word.eval")["samples"]} == {1, 2}
    assert {len(s["choices"]) for s in bpe} == {3, 4}
    left = expected_rows("mc_bpe.eval")[2]
    assert left["no_answer"] > 0 and left["missing_choice"] > 0


def test_the_live_parser_reads_the_same_rows():
    log = pytest.importorskip("inspect_ai.log")
    for name in ["mc_bpe.eval", "mc_json_bpe.json", "mc_zip_bpe_stored.eval"]:
        live = log.read_eval_log(str(fixture(name)))
        ref = reference(name)["samples"]
        assert [(s.id, s.epoch, s.target) for s in live.samples] == [(s["id"], s["epoch"], s["target"]) for s in ref]
        for s, r in zip(live.samples, ref, strict=True):
            if r["answer_index"] is not None:
                top = s.output.choices[0].logprobs.content[r["answer_index"]].top_logprobs
                assert [(t.token, t.logprob) for t in top] == [(t["token"], t["logprob"]) for t in r["top_logprobs"]]


def test_three_member_compressions_and_the_json_log_read_the_same():
    zstd = open_source(fixture("mc_zip_bpe.eval")).data
    with zipfile.ZipFile(fixture("mc_zip_bpe.eval")) as z:
        assert {i.compress_type for i in z.infolist()} == {inspect_files.ZIP_ZSTD}
    for name, method in [("mc_zip_bpe_deflated.eval", zipfile.ZIP_DEFLATED), ("mc_zip_bpe_stored.eval",
                                                                               zipfile.ZIP_STORED)]:
        with zipfile.ZipFile(fixture(name)) as z:
            assert {i.compress_type for i in z.infolist()} == {method}
        other = open_source(fixture(name)).data
        assert np.array_equal(other.logits.numpy(), zstd.logits.numpy())
        assert np.array_equal(other.labels.numpy(), zstd.labels.numpy())


@pytest.mark.parametrize(("token", "letters", "expected"), [
    ("\u0120B", "ABCD", 1), ("\u2581b", "ABCD", 1), (" C\n", "ABCD", 2), ("a", "ABC", 0), ("D", "ABC", None),
    ("AB", "ABCD", None), ("\u0120", "ABCD", None), ("", "AB", None), (None, "AB", None), ("B)", "ABCD", None)])
def test_token_letters(token, letters, expected):
    assert letter_of(token, letters) == expected


@pytest.mark.parametrize(("tokens", "expected"), [
    (["ANSWER:", "B"], 1), (["B", "is", "ANSWER", " :", "\u0120C"], 4), (["answer:", "x", "C"], 2),
    (["C", "ANSWER:", "D", "ANSWER:", "x", "A"], 5), (["The", "B"], 1), (["ANSWER:", "x"], None), ([], None),
    (["A", "ANSWER:"], None)])
def test_the_answer_position(tokens, expected):
    assert answer_position(tokens, "ABCD") == expected


def _first_sample(path):
    content = members(path)
    name = next(n for n in content if n.startswith("samples/"))
    return json.loads(content[name])


def test_several_targets_are_counted_and_a_target_naming_no_choice_is_refused(tmp_path):
    several = rewritten(fixture("mc_word.eval"), tmp_path / "several.eval",
                        lambda s: {**s, "target": ["A", "B"]} if s["id"] == "q03" else s)
    assert read_inspect_log(several).incomplete["several_targets"] == 2  # two epochs
    single = rewritten(fixture("mc_word.eval"), tmp_path / "single.eval",
                       lambda s: {**s, "target": [s["target"]]})
    assert np.array_equal(open_source(single).data.labels.numpy(), open_source(fixture("mc_word.eval")).data.labels)
    bad = rewritten(fixture("mc_word.eval"), tmp_path / "bad.eval",
                    lambda s: {**s, "target": "D"} if s["id"] == "q01" else s)  # q01 has 3 choices
    with pytest.raises(TempcalError, match=r"bad\.eval: sample id 'q01' epoch \d: its target 'D' names no choice"):
        read_inspect_log(bad)


def test_a_log_without_logprobs_names_the_options():
    with pytest.raises(TempcalError, match="written without log-probabilities; run inspect eval with --logprobs "
                                           "--top-logprobs 20"):
        open_source(fixture("mc_nolp_word.eval"))


def test_choices_shuffled_by_the_plan_are_refused():
    with pytest.raises(TempcalError, match=r"mc_shuffled_word\.eval: its plan's multiple_choice shuffled the choices"):
        open_source(fixture("mc_shuffled_word.eval"))


def test_several_models_are_refused_unless_grouped_by_model():
    folder = FIXTURES / "multi"
    with pytest.raises(TempcalError, match=r"logs of 2 models .*group_by model"):
        open_source(folder)
    opened = open_source(folder, group_by="model")
    assert len(opened.paths) == 4 and opened.file_rows is not None and sum(opened.file_rows) == 48
    groups = opened.kind.read_groups(opened, "model", "--group-by")
    assert groups.names == ["hf/word1", "hf/word3"] and groups.sizes() == [24, 24]
    with pytest.raises(TempcalError, match="by task or model, not 'label'"):
        opened.kind.read_groups(opened, "label", "--group-by")


def test_a_folder_and_a_glob_are_claimed(tmp_path):
    assert isinstance(kind_of([FIXTURES / "multi"]), InspectLogKind)
    opened = open_source(str(FIXTURES / "multi" / "*_word1.eval"))
    assert [p.name for p in opened.paths] == ["alpha_word1.eval", "beta_word1.eval"]
    groups = opened.kind.read_groups(opened, "task", "--group-by")
    assert groups.names == ["alpha", "beta"]
    other = tmp_path / "config.json"
    other.write_text('{"a": 1}')
    # A folder of other .json files is no log folder; a .json named alone is claimed, so that opening it says
    # what an inspect_ai log would have (the sidecar of a log is never claimed).
    assert not InspectLogKind().claims([tmp_path], SourceOptions())
    assert InspectLogKind().claims([other], SourceOptions())
    assert not InspectLogKind().claims([tmp_path / "x.eval.tempcal.json"], SourceOptions())
    with pytest.raises(TempcalError, match=r"config\.json: .*inspect_ai log.*no keys 'version', 'status', 'eval'"):
        open_source(other)


def test_a_truncated_or_corrupt_zip_is_refused(tmp_path):
    blob = fixture("mc_zip_bpe.eval").read_bytes()
    cut = tmp_path / "cut.eval"
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(TempcalError, match=r"cut\.eval: not a readable \.eval log"):
        read_inspect_log(cut)
    with zipfile.ZipFile(fixture("mc_zip_bpe.eval")) as z:
        info = next(i for i in z.infolist() if i.filename.startswith("samples/"))
    broken = bytearray(blob)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 20
    broken[start:start + 40] = bytes(40)
    (tmp_path / "corrupt.eval").write_bytes(bytes(broken))
    with pytest.raises(TempcalError, match=rf"corrupt\.eval: member {info.filename}: corrupt"):
        read_inspect_log(tmp_path / "corrupt.eval")


def test_a_member_over_the_limit_is_refused(tmp_path, monkeypatch):
    content = members(fixture("mc_zip_bpe.eval"))
    monkeypatch.setattr(inspect_files, "MAX_MEMBER_BYTES", 10_000)
    with pytest.raises(TempcalError, match=r"member samples/q\d+_epoch_1\.json: .* over tempcal's limit of 9\.77 KiB"):
        read_inspect_log(fixture("mc_zip_bpe.eval"))
    content = {name: blob for name, blob in content.items() if not name.startswith("samples/")}
    path = write_eval(tmp_path / "big.eval", {**content, "samples/zz_epoch_1.json": b" " * 20_000 + b"{}"})
    with pytest.raises(TempcalError, match=r"big\.eval: member samples/zz_epoch_1\.json: 19\.5 KiB decompressed"):
        read_inspect_log(path)
    # a zstd member whose directory entry understates its size is stopped as it decompresses
    blob = bytearray(fixture("mc_zip_bpe.eval").read_bytes())
    name = b"samples/q00_epoch_1.json"
    entry = blob.index(b"PK\x01\x02", blob.index(b"PK\x01\x02"))
    while blob[entry + 46: entry + 46 + len(name)] != name:
        entry = blob.index(b"PK\x01\x02", entry + 4)
    blob[entry + 24: entry + 28] = (100).to_bytes(4, "little")
    (tmp_path / "understated.eval").write_bytes(bytes(blob))
    with pytest.raises(TempcalError, match=r"understated\.eval: member samples/q00_epoch_1\.json: decompresses past"):
        read_inspect_log(tmp_path / "understated.eval")


def test_a_json_log_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(inspect_files, "MAX_JSON_LOG_BYTES", 1000)
    with pytest.raises(TempcalError, match=r"mc_json_bpe\.json: .* over tempcal's limit of 1000 bytes on a \.json log"):
        read_inspect_log(fixture("mc_json_bpe.json"))


def test_the_json_limit_admits_a_100_mb_log():
    assert inspect_files.MAX_JSON_LOG_BYTES >= 100 << 20 and inspect_files.MAX_MEMBER_BYTES >= 16 << 20


def test_missing_zstandard_names_the_extra(monkeypatch):
    import importlib

    real = importlib.import_module

    def fake(name, *args):
        if name == "zstandard":
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(TempcalError, match=r"needs zstandard, which is not installed: pip install 'tempcal\[logs\]'"):
        read_inspect_log(fixture("mc_zip_bpe.eval"))
    assert open_source(fixture("mc_zip_bpe_deflated.eval")).data.num_samples > 0


def test_logsumexp_over_several_pieces_of_one_letter(tmp_path):
    """``B`` and ``ĠB`` at the answer position are one choice: their probabilities add up."""
    def change(sample):
        content = sample["output"]["choices"][0]["logprobs"]["content"]
        content[:] = [{"token": "ANSWER:", "logprob": -0.1, "top_logprobs": []},
                      {"token": "B", "logprob": -1.0, "top_logprobs": [
                          {"token": "B", "logprob": -1.0}, {"token": "\u0120B", "logprob": -2.0},
                          {"token": "a", "logprob": -1.5}, {"token": "C", "logprob": -3.0},
                          {"token": "\u2581D", "logprob": -4.0}, {"token": "x", "logprob": -0.5}]}]
        return sample

    path = rewritten(fixture("mc_zip_bpe.eval"), tmp_path / "pieces.eval", change)
    info = read_inspect_log(path)
    four = next(r for r in info.rows if r.choices == 4)
    assert four.logits == pytest.approx([-1.5, math.log(math.exp(-1.0) + math.exp(-2.0)), -3.0, -4.0], abs=1e-15)
    assert info.incomplete["missing_choice"] == 0


def test_memory_stays_flat_in_the_log_size(tmp_path):
    """Samples are read one at a time: the peak while reading 400 samples is a small share of their bytes."""
    import tracemalloc

    content = members(fixture("mc_word.eval"))
    one = json.loads(content["samples/q00_epoch_1.json"])
    header = {name: blob for name, blob in content.items() if not name.startswith("samples/")}

    def peak(n: int) -> tuple[int, int]:
        samples = {f"samples/s{k:04d}_epoch_1.json": json.dumps({**one, "id": f"s{k:04d}"}).encode()
                   for k in range(n)}
        path = write_eval(tmp_path / f"n{n}.eval", {**header, **samples})
        del samples
        tracemalloc.start()
        info = read_inspect_log(path)
        size = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert info.complete == n
        return size, n * len(content["samples/q00_epoch_1.json"])

    small, _ = peak(40)
    large, nbytes = peak(400)
    assert large < nbytes / 5 and large < 3 * small


def test_choice_counts_are_listed_in_numeric_order(tmp_path):
    from tempcal.sources.inspect_log import _choice_counts

    info = InspectLogInfo(tmp_path / "x.eval", rows=[SampleRow(k, 1, choices=c) for k, c in enumerate([10, 2, 10, 3])])
    counts = _choice_counts(info)
    assert list(counts) == ["2", "3", "10"] and counts == {"2": 1, "3": 1, "10": 2}

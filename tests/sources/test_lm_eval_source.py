"""lm-evaluation-harness sample logs as SOURCE: every layout lm-eval writes, padding, normalisations, targets, the
sidecar's T and every bad input (one line naming the file and the line)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_eval_logs import (
    FIELDS,
    NAME,
    VERSIONS,
    as_written,
    generate_until_record,
    loglikelihood_record,
    mc_record,
    padded,
    random_mc_records,
    rolling_record,
    write_log,
)
from reference import optimal_temperature

import tempcal
from tempcal.errors import DataError, TempcalError, for_cli
from tempcal.io.paths import sidecar_path
from tempcal.io.sidecar import read_sidecar
from tempcal.sources.lm_eval import (
    NORM_KEY,
    LmEvalKind,
    LmEvalLogError,
    is_lm_eval_log,
    read_lm_eval_log,
    task_from_filename,
)
from tempcal.sources.lm_eval_records import first_argmax
from tempcal.sources.registry import kind_of, open_source, read_stored_temperature, write_stored_temperature

# -- layouts -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("gz", [False, True])
def test_every_layout_reads_the_same_rows(tmp_path: Path, version: str, gz: bool) -> None:
    records, rows, labels = random_mc_records(40, seed=1)
    path = write_log(tmp_path / (NAME + (".gz" if gz else "")), records, version)
    logits, y, info = read_lm_eval_log(path)
    assert logits.dtype == torch.float64 and y.dtype == torch.int64
    np.testing.assert_array_equal(logits.numpy(), padded(rows))  # str(float) reads back exactly
    assert y.tolist() == labels
    assert info.records == 40 and info.task == "hellaswag" and info.filter == "none"
    assert info.arguments_forms == {"pairs" if version == "pairs" else "gen_args": 40}
    assert info.check_metric == "acc" and info.check_disagree == 0 and info.check_agree == 40
    assert info.warnings() == []


def test_the_builder_writes_lm_evals_fields(tmp_path: Path) -> None:
    """The on-disk record has exactly lm-eval's fields, with strings where lm-eval >= 0.4.4 puts them."""
    on_disk = json.loads(json.dumps(as_written(mc_record(7, "Q?", ["yes", "no"], [-0.3, -1.9], 0), "0.4.4")))
    assert set(on_disk) == {*FIELDS, "acc", "acc_norm"}
    assert on_disk["arguments"] == {"gen_args_0": {"arg_0": "Q?", "arg_1": " yes"},
                                    "gen_args_1": {"arg_0": "Q?", "arg_1": " no"}}
    assert on_disk["filtered_resps"] == [["-0.3", "True"], ["-1.9", "False"]]
    assert on_disk["resps"] == [[["-0.3", "True"]], [["-1.9", "False"]]]
    assert on_disk["target"] == "0"


def test_padding_and_choice_counts(tmp_path: Path) -> None:
    records = [mc_record(0, "a", ["x", "y"], [-1.0, -2.0], 1),
               mc_record(1, "b", ["x", "y", "z", "w"], [-1.0, -2.0, -3.0, -0.5], 3),
               mc_record(2, "c", ["x", "y", "z"], [-1.0, -2.0, -3.0], 0)]
    logits, labels, info = read_lm_eval_log(write_log(tmp_path / NAME, records))
    assert logits.shape == (3, 4)
    assert torch.isneginf(logits[0, 2:]).all() and torch.isneginf(logits[2, 3]) and torch.isfinite(logits[1]).all()
    assert labels.tolist() == [1, 3, 0]
    assert info.choice_counts == {2: 1, 3: 1, 4: 1} and info.max_choices == 4


def test_gen_args_in_index_order_not_key_order(tmp_path: Path) -> None:
    """gen_args_10 comes after gen_args_9, whatever the order of the keys in the object."""
    choices = [f"c{i}" for i in range(12)]
    lls = [-float(i + 1) for i in range(12)]
    record = as_written(mc_record(0, "q", choices, lls, 11), "0.4.4")
    record["arguments"] = dict(sorted(record["arguments"].items()))  # lexical: gen_args_0, _1, _10, _11, _2...
    path = tmp_path / NAME
    path.write_text(json.dumps(record) + "\n")
    logits, labels, _ = read_lm_eval_log(path)
    assert logits[0].tolist() == lls and labels.tolist() == [11]


def test_wrapped_pairs_numbers_and_minus_infinity(tmp_path: Path) -> None:
    """[[ll, greedy]] per choice (the nesting of 'resps'), JSON numbers, -Infinity and "-inf" for a wrong choice."""
    record = as_written(mc_record(0, "q", ["a", "b", "c"], [-1.0, -2.0, -3.0], 0), "pairs")
    record["filtered_resps"] = [[[-1.0, True]], [[-2.0, False]], [[float("-inf"), False]]]
    other = as_written(mc_record(1, "q", ["a", "b"], [-1.0, -2.0], 0), "0.4.4")
    other["filtered_resps"][1] = ["-inf", "False"]
    path = tmp_path / NAME
    path.write_text(json.dumps(record) + "\n" + json.dumps(other) + "\n")  # json writes -Infinity
    logits, _, _ = read_lm_eval_log(path)
    assert logits.tolist() == [[-1.0, -2.0, -math.inf], [-1.0, -math.inf, -math.inf]]


def test_blank_lines_bom_and_crlf(tmp_path: Path) -> None:
    lines = [json.dumps(as_written(mc_record(i, "q", ["a", "b"], [-1.0, -2.0], i % 2))) for i in range(3)]
    path = tmp_path / NAME
    path.write_bytes(("\ufeff" + lines[0] + "\r\n\r\n" + lines[1] + "\r\n" + lines[2]).encode("utf-8"))
    _, labels, info = read_lm_eval_log(path)
    assert info.records == 3 and labels.tolist() == [0, 1, 0]


def test_mutual_info_records_keep_the_conditional_half(tmp_path: Path) -> None:
    record = mc_record(0, "q", ["a", "bb", "c"], [-1.0, -2.0, -0.5], 2, mutual_info_lls=[-3.0, -3.5, -4.0])
    logits, labels, _ = read_lm_eval_log(write_log(tmp_path / NAME, [record]))
    assert logits.tolist() == [[-1.0, -2.0, -0.5]] and labels.tolist() == [2]


@pytest.mark.parametrize(("name", "task"), [
    ("samples_mmlu_abstract_algebra_2024-07-01T10-11-12.123456.jsonl", "mmlu_abstract_algebra"),
    ("samples_arc_easy_2025-01-02T03-04-05.jsonl.gz", "arc_easy"),
    ("samples_piqa.jsonl", "piqa"),
    ("results.jsonl", None),
    ("samples_x.json", None),
])
def test_task_from_filename(name: str, task: str | None) -> None:
    assert task_from_filename(name) == task


def test_the_suffix_claims_the_file() -> None:
    assert is_lm_eval_log("a/samples_x_2024.jsonl") and is_lm_eval_log("S.JSONL.GZ") and is_lm_eval_log("run.jsonl")
    assert not is_lm_eval_log("x.safetensors") and not is_lm_eval_log("x.json") and not is_lm_eval_log("x.gz")
    assert isinstance(kind_of([Path("renamed.jsonl.gz")]), LmEvalKind)


# -- normalisations ------------------------------------------------------------------------------------------


def test_chars_and_bytes_divide_by_the_choice_text_length(tmp_path: Path) -> None:
    choices = ["ab", "é", "naïve words"]  # characters 2, 1, 11; UTF-8 bytes 2, 2, 12
    path = write_log(tmp_path / NAME, [mc_record(0, "q", choices, [-2.0, -3.0, -6.0], 1)])
    chars, _, _ = read_lm_eval_log(path, "chars")
    nbytes, _, _ = read_lm_eval_log(path, "bytes")
    assert chars[0].tolist() == [-1.0, -3.0, -6.0 / 11]
    assert nbytes[0].tolist() == [-1.0, -1.5, -0.5]


@pytest.mark.parametrize("norm", ["none", "chars", "bytes"])
def test_argmax_reproduces_lm_evals_own_metrics(tmp_path: Path, norm: str) -> None:
    """The rows' arg-max reproduces each record's acc / acc_norm / acc_bytes, as lm-eval computed them."""
    records, _, _ = random_mc_records(300, seed=3)
    path = write_log(tmp_path / NAME, records, "0.4.4")
    logits, labels, info = read_lm_eval_log(path, norm)
    metric = {"none": "acc", "chars": "acc_norm", "bytes": "acc_bytes"}[norm]
    assert info.check_metric == metric and info.check_disagree == 0 and info.check_agree == 300
    ours = (logits.argmax(1) == labels).double()  # torch.argmax: the first maximum on ties, like numpy's
    assert torch.equal(ours, torch.tensor([r[metric] for r in records], dtype=torch.float64))
    if norm != "none":  # the normalisation changes predictions on this data, so the check has teeth
        raw, _, _ = read_lm_eval_log(path, "none")
        assert (raw.argmax(1) != logits.argmax(1)).any()


def test_a_metric_that_disagrees_is_a_warning(tmp_path: Path) -> None:
    record = mc_record(1, "q", ["a", "b"], [-1.0, -2.0], 0)
    record["acc"] = 0.0  # lm-eval would have written 1.0
    path = write_log(tmp_path / NAME, [mc_record(0, "q", ["a", "b"], [-1.0, -2.0], 0), record])
    _, _, info = read_lm_eval_log(path)
    assert info.check_disagree == 1 and info.first_disagree_line == 2
    opened = open_source(path)
    assert any("1 of 2 records have a 'acc' that disagrees" in w and "line 2" in w for w in opened.warnings)


def test_first_argmax_matches_numpy_on_ties() -> None:
    for values in ([1.0, 1.0], [0.0, 2.0, 2.0], [-math.inf, -1.0, -1.0], [3.0]):
        assert first_argmax(values) == int(np.argmax(values))


# -- targets -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("target", "version", "kind"), [
    (2, "pairs", "index"),           # an int, as the in-memory record holds it
    (2, "0.4.3", "index"),           # v0.4.3 leaves the target's type alone
    (2, "0.4.4", "index"),           # "2": a numeric string
    ("gamma", "0.4.4", "text"),      # the text of a choice
    ([2], "pairs", "index"),         # a multiple-target task with one target
    ([2], "0.4.4", "index"),         # ... written as "[2]"
])
def test_target_forms(tmp_path: Path, target: object, version: str, kind: str) -> None:
    record = mc_record(0, "q", ["alpha", "beta", "gamma", "delta"], [-1.0, -2.0, -3.0, -4.0], target)
    _, labels, info = read_lm_eval_log(write_log(tmp_path / NAME, [record], version))
    assert labels.tolist() == [2] and info.targets == {kind: 1}


def test_numeric_choices_are_settled_by_acc(tmp_path: Path) -> None:
    """Choices "1".."4" and target "1": index 1 (choice "2") or the text "1" (index 0); the record's acc decides."""
    choices = ["1", "2", "3", "4"]
    right = mc_record(0, "q", choices, [-3.0, -0.5, -2.0, -4.0], 1)  # gold index 1, predicted 1: acc 1
    wrong = mc_record(1, "q", choices, [-0.5, -3.0, -2.0, -4.0], 1)  # gold index 1, predicted 0: acc 0
    _, labels, info = read_lm_eval_log(write_log(tmp_path / NAME, [right, wrong], "0.4.4"))
    assert labels.tolist() == [1, 1] and info.targets == {"acc": 2}


def test_winogrande_style_shared_continuation(tmp_path: Path) -> None:
    """Multiple-input tasks: the choices differ in the context, the target is the shared continuation."""
    records = []
    for i, (lls, gold) in enumerate((([-2.0, -1.0], 1), ([-2.0, -1.0], 0), ([-1.0, -2.0], 0))):
        record = mc_record(i, "x", ["the trophy", "the suitcase"], lls, "was too big.", gold_index=gold,
                           metrics=("acc",))
        record["arguments"] = [["The trophy doesn't fit: the trophy", " was too big."],
                               ["The trophy doesn't fit: the suitcase", " was too big."]]
        records.append(record)
    _, labels, info = read_lm_eval_log(write_log(tmp_path / NAME, records))
    assert labels.tolist() == [1, 0, 0] and info.targets == {"acc": 3}


# -- bad input -----------------------------------------------------------------------------------------------


def good_line(doc_id: int = 0) -> str:
    return json.dumps(as_written(mc_record(doc_id, "q", ["a", "b"], [-1.0, -2.0], 0)))


def edited(change: dict, drop: tuple[str, ...] = ()) -> str:
    record = as_written(mc_record(1, "q", ["alpha", "beta"], [-1.0, -2.0], 0))
    record.update(change)
    for key in drop:
        del record[key]
    return json.dumps(record)


BAD_LINES = [
    ('{"doc_id": 1, "target": ', r"line 2: not JSON \(Expecting value at column 25\)"),
    ("[1, 2]", r"line 2: expected a JSON object \(an lm-eval sample record\), got a list"),
    (json.dumps(as_written(generate_until_record(1))), r"line 2: a generate_until record"),
    (json.dumps(as_written(loglikelihood_record(1))), r"line 2: a record with a single continuation"),
    (json.dumps(as_written(rolling_record(1))), r"line 2: a loglikelihood_rolling \(perplexity\) record"),
    (edited({"target": "omega"}), r"line 2: target \"omega\" matches no choice \(choices \"alpha\", \"beta\"\)"),
    (edited({"target": "7"}), r"line 2: target \"7\" matches no choice .*out of range for 2 choices"),
    (edited({"target": 7}), r"line 2: target 7 is out of range for 2 choices"),
    (edited({"target": "[0, 1]"}), r"line 2: target \[0, 1\] lists 2 correct choices"),
    (edited({"target": None}), r"line 2: target must be a choice index or the text of a choice, got null"),
    (edited({"target": True}), r"line 2: target must be .*, got true"),
    (edited({"filtered_resps": [["abc", "False"], ["-2.0", "False"]]}),
     r"line 2: 'filtered_resps\[0\]' log-likelihood \"abc\" is not a number"),
    (edited({"filtered_resps": [["nan", "False"], ["-2.0", "False"]]}),
     r"line 2: 'filtered_resps\[0\]' log-likelihood is nan"),
    (edited({"filtered_resps": [["inf", "False"], ["-2.0", "False"]]}),
     r"log-likelihood is inf; expected a finite number or -inf"),
    (edited({"filtered_resps": [[True, "False"], ["-2.0", "False"]]}), r"log-likelihood must be a number, got true"),
    (edited({"filtered_resps": [["-inf", "False"], ["-2.0", "False"]]}),
     r"line 2: the correct choice \(0\) has log-likelihood -inf"),
    (edited({"filtered_resps": [["-1.0", "False"]]}), r"line 2: 'filtered_resps' holds 1 responses for 2 requests"),
    (edited({}, drop=("filtered_resps",)), r"line 2: no 'filtered_resps' field"),
    (edited({}, drop=("arguments",)), r"line 2: no 'arguments' field"),
    (edited({"arguments": {"gen_args_0": {"arg_0": "q", "arg_1": " a"}, "gen_args_2": {"arg_0": "q", "arg_1": " b"}}}),
     r"line 2: 'arguments' keys are not gen_args_0 \.\. gen_args_1"),
    (edited({"arguments": {"choice_0": {}}}), r"'arguments' has a key 'choice_0'"),
    (edited({"arguments": "q"}), r"'arguments' must be a list of \[context, continuation\] pairs"),
    (edited({"filter": "strict-match"}), r"line 2: filter \"strict-match\" differs from \"none\" on line 1"),
    (good_line(0), r"line 2: doc_id 0 appears again \(first on line 1\)"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_bad_lines_name_the_file_and_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / NAME
    path.write_text(good_line(0) + "\n" + line + "\n" + good_line(5) + "\n", encoding="utf-8")
    with pytest.raises(LmEvalLogError, match=message) as caught:
        open_source(path)
    assert isinstance(caught.value, DataError)  # bad input: exit status 2 on the command line
    text = str(caught.value)
    assert text.startswith(f"{path}: line 2: ") and "\n" not in text


def test_an_ambiguous_target_without_acc_is_an_error(tmp_path: Path) -> None:
    record = mc_record(0, "q", ["1", "2", "3"], [-3.0, -0.5, -2.0], 1, metrics=())
    with pytest.raises(LmEvalLogError, match=r"line 1: target \"1\" is ambiguous: it could be choice 0, 1"):
        read_lm_eval_log(write_log(tmp_path / NAME, [record], "0.4.4"))


def test_acc_mutual_info_with_another_layout(tmp_path: Path) -> None:
    record = mc_record(0, "q", ["a", "b"], [-1.0, -2.0], 0, mutual_info_lls=[-3.0, -4.0])
    record["arguments"][3] = ["", " c"]
    with pytest.raises(LmEvalLogError, match="line 1: an acc_mutual_info record"):
        read_lm_eval_log(write_log(tmp_path / NAME, [record]))


def test_an_empty_choice_cannot_be_normalised(tmp_path: Path) -> None:
    path = write_log(tmp_path / NAME, [mc_record(0, "q", ["", "b"], [-1.0, -2.0], 1)])
    read_lm_eval_log(path, "none")
    with pytest.raises(LmEvalLogError, match=r"line 1: choice 0 has an empty text") as caught:
        read_lm_eval_log(path, "chars")
    assert for_cli(caught.value).endswith("(--lm-eval-norm chars)")


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_and_blank_files(tmp_path: Path, content: bytes) -> None:
    (tmp_path / NAME).write_bytes(content)
    with pytest.raises(LmEvalLogError, match=r": no records \(an empty file\)"):
        read_lm_eval_log(tmp_path / NAME)


@pytest.mark.parametrize("content", [(good_line() + "\n").encode(), b""])
def test_a_gz_name_without_gzip_data(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / (NAME + ".gz")
    path.write_bytes(content)
    with pytest.raises(LmEvalLogError, match=rf"^{path}: not a gzip file \(a \.gz name, but no gzip header\)$"):
        open_source(path)


def test_a_plain_name_holding_gzip_data(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes(gzip.compress((good_line() + "\n").encode()))
    with pytest.raises(LmEvalLogError, match=rf"{NAME}: holds gzip-compressed data; name it {NAME}\.gz"):
        read_lm_eval_log(path)


def test_truncated_and_corrupt_gzip(tmp_path: Path) -> None:
    data = gzip.compress("".join(good_line(i) + "\n" for i in range(200)).encode())
    path = tmp_path / (NAME + ".gz")
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LmEvalLogError, match=r"truncated gzip data \(the file ends inside the compressed stream"):
        read_lm_eval_log(path)
    broken = bytearray(data)
    broken[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(broken))
    with pytest.raises(LmEvalLogError, match=r"(corrupt gzip data|not JSON|not UTF-8)"):
        read_lm_eval_log(path)


def test_the_pre_0_4_3_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "pretrained__gpt2_hellaswag.jsonl"
    path.write_text(json.dumps([as_written(mc_record(0, "q", ["a", "b"], [-1.0, -2.0], 0), "pairs")], indent=2))
    with pytest.raises(LmEvalLogError, match=r"line 1: not JSON Lines but one JSON array \(lm-eval before 0\.4\.3"):
        read_lm_eval_log(path)


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_bytes((good_line() + "\n").encode() + b'{"x": "\xff"}\n')
    with pytest.raises(LmEvalLogError, match=r"line 2: not UTF-8 text"):
        read_lm_eval_log(path)


def test_missing_file_folder_bad_norm_and_probs(tmp_path: Path) -> None:
    with pytest.raises(TempcalError, match="no such file"):
        open_source(tmp_path / NAME)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(TempcalError, match="not a regular file"):
        open_source(tmp_path / "dir.jsonl")
    path = write_log(tmp_path / NAME, [mc_record(0, "q", ["a", "b"], [-1.0, -2.0], 0)])
    with pytest.raises(TempcalError, match=r"^lm_eval_norm words: expected one of none, chars, bytes$"):
        open_source(path, lm_eval_norm="words")
    with pytest.raises(TempcalError, match=r"^probs applies to logits files; .* lm-evaluation-harness log"):
        open_source(path, probs=True)


# -- the source: T on the padded matrix, shards, the sidecar -------------------------------------------------


@pytest.mark.parametrize("norm", ["none", "chars"])
def test_fitted_t_matches_a_float64_reference_on_the_padded_matrix(tmp_path: Path, norm: str) -> None:
    records, rows, labels = random_mc_records(600, seed=11, choice_counts=(2, 3, 4, 5, 8), temperature=2.5)
    path = write_log(tmp_path / (NAME + ".gz"), records, "0.4.4")
    if norm == "chars":  # divided here by the choice texts' lengths, independently of tempcal
        rows = [[ll / len(c.lstrip()) for ll, (_, c) in zip(row, r["arguments"], strict=True)]
                for row, r in zip(rows, records, strict=True)]
    reference = optimal_temperature(torch.from_numpy(padded(rows)), torch.tensor(labels))
    assert abs(math.log(reference)) > 0.1  # far from 1: the fit has something to find
    opened = open_source(path, lm_eval_norm=norm)
    assert opened.data.num_classes == 8 and opened.data.dtype == torch.float64
    result = tempcal.fit_temperature(tempcal.Scan(opened.data, device="cpu"))
    assert result.temperature == pytest.approx(reference, rel=1e-6)
    report = tempcal.fit_file(path, val_fraction=1.0, device="cpu", lm_eval_norm=norm)
    assert report.temperature == pytest.approx(reference, rel=1e-6)


def test_several_logs_are_one_source_padded_to_the_widest(tmp_path: Path) -> None:
    first, rows_a, labels_a = random_mc_records(30, seed=1, choice_counts=(2, 3))
    second, rows_b, labels_b = random_mc_records(20, seed=2, choice_counts=(4, 5))
    write_log(tmp_path / "samples_a_2024-01-01T00-00-00.jsonl", first)
    write_log(tmp_path / "samples_b_2024-01-01T00-00-00.jsonl.gz", second)  # each log's doc_ids start at 0
    opened = open_source(str(tmp_path / "samples_*"))
    np.testing.assert_array_equal(opened.data.logits.numpy(), padded(rows_a + rows_b))
    assert opened.data.labels.tolist() == labels_a + labels_b and len(opened.paths) == 2
    with pytest.raises(TempcalError, match=r"shards must be lm-eval files like"):
        open_source([tmp_path / "samples_a_2024-01-01T00-00-00.jsonl", tmp_path / "x.safetensors"])


def test_a_related_log_with_fewer_choices_is_padded(tmp_path: Path) -> None:
    wide = write_log(tmp_path / "samples_wide.jsonl", random_mc_records(20, seed=1, choice_counts=(5,))[0])
    narrow_records, rows, _ = random_mc_records(10, seed=2, choice_counts=(2, 3))
    narrow = write_log(tmp_path / "samples_narrow.jsonl", narrow_records)
    related = open_source(wide).open_related(str(narrow), labels_optional=True)
    assert related.data.num_classes == 5
    np.testing.assert_array_equal(related.data.logits.numpy(), np.pad(padded(rows), ((0, 0), (0, 2)),
                                                                      constant_values=-np.inf))


def test_t_goes_to_the_sidecar_with_the_normalisation(tmp_path: Path) -> None:
    path = write_log(tmp_path / NAME, random_mc_records(50, seed=4)[0])
    before = path.read_bytes()
    opened = open_source(path, lm_eval_norm="chars")
    assert opened.stored_temperature is None
    written = opened.write_temperature(1.75)
    assert written == [sidecar_path(path)] and path.read_bytes() == before
    assert read_sidecar(path)[0] == {"tempcal.temperature": "1.75", NORM_KEY: "chars"}
    assert open_source(path, lm_eval_norm="chars").stored_temperature == 1.75
    raw = open_source(path)  # read under another normalisation: the stored T does not apply
    assert raw.stored_temperature is None
    assert any("was fitted with lm_eval_norm chars, so it is ignored here (lm_eval_norm none)" in w
               for w in raw.warnings)
    assert read_stored_temperature(path) == (1.75, [])  # the API reads a log's T whatever its normalisation
    write_stored_temperature(path, 2.5)  # ... and stores one without saying which: every reading then uses it
    assert read_sidecar(path)[0] == {"tempcal.temperature": "2.5"}
    assert open_source(path).stored_temperature == 2.5


def test_output_copies_the_log_and_gives_the_copy_a_sidecar(tmp_path: Path) -> None:
    path = write_log(tmp_path / (NAME + ".gz"), random_mc_records(20, seed=5)[0])
    copy = tmp_path / "copy.jsonl.gz"
    written = open_source(path, lm_eval_norm="bytes").write_temperature(3.0, copy)
    assert written == [sidecar_path(copy)] and copy.read_bytes() == path.read_bytes()
    assert not sidecar_path(path).exists()
    assert read_sidecar(copy)[0] == {"tempcal.temperature": "3.0", NORM_KEY: "bytes"}

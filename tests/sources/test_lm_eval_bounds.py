"""Hostile lm-evaluation-harness logs are refused fast, in flat memory, with one line naming the file and line:
lines and blank runs past the line limit, records of too many choices or JSON values, padded matrices past
their bound, nesting, huge integers and lone surrogates. Each file is made the way the hostile one was."""

from __future__ import annotations

import gzip
import io
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from lm_eval_logs import NAME, as_written, mc_record, record_line, write_gz_run, write_log

from tempcal.errors import DataError
from tempcal.sources import lm_eval
from tempcal.sources.bounded_lines import BoundedLines, OverLimit
from tempcal.sources.lm_eval import MAX_LINE_BYTES, LmEvalLogError, read_lm_eval_log
from tempcal.sources.lm_eval_records import MAX_DEPTH, count_values
from tempcal.sources.registry import open_source

MiB = 1 << 20


def refused(read: Callable[[], object]) -> tuple[str, float, int]:
    """The one-line message ``read`` is refused with, the CPU seconds and the peak bytes traced until then."""
    tracemalloc.start()
    start = time.process_time()
    try:
        with pytest.raises(LmEvalLogError) as caught:
            read()
        seconds, peak = time.process_time() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(caught.value, DataError)  # exit status 2 on the command line
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    return message, seconds, peak


# -- the reader ----------------------------------------------------------------------------------------------


class CountingStream(io.BytesIO):
    """A stream that remembers how many bytes were asked of it and handed out."""

    handed = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.handed += len(data)
        return data


def test_lines_come_back_as_split_whatever_the_block_size() -> None:
    data = b'  {"a": 1}\r\n\n   \n{"b": [2, 3]}\n\t\n        {"c": "x y"}   \n\n{"d": 4}'
    expected = [(i, line) for i, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
    for block in (1, 2, 3, 5, 7, 64, MiB):
        got = list(BoundedLines(io.BytesIO(data), limit=100, block=block))
        # leading whitespace that began in an earlier block comes back as as many spaces
        assert [(n, len(line), line.lstrip()) for n, line in got] == [(n, len(line), line.lstrip())
                                                                      for n, line in expected], block


def test_a_line_over_the_limit_is_refused_having_read_little() -> None:
    stream = CountingStream(b'{"a": 1}\n' + b"x" * 100_000 + b"\n" + b'{"b": 2}\n')
    lines = BoundedLines(stream, limit=1000, block=64)
    with pytest.raises(OverLimit) as caught:
        list(lines)
    assert (caught.value.line, caught.value.first, caught.value.blank) == (2, 2, False)
    assert stream.handed <= 9 + 1000 + 2 * 64


def test_a_line_at_the_limit_is_read() -> None:
    line = b"y" * 1000
    assert list(BoundedLines(io.BytesIO(line + b"\n" + line), limit=1000, block=7)) == [(1, line), (2, line)]
    with pytest.raises(OverLimit):
        list(BoundedLines(io.BytesIO(line + b"z"), limit=1000, block=7))


@pytest.mark.parametrize("block", [3, 64, MiB])
def test_a_blank_run_over_the_limit_names_the_line_that_passes_it(block: int) -> None:
    data = b'{"a": 1}\n' + b" \r\n" * 400  # line k (from 2) ends at byte 3 (k - 1) of the run
    with pytest.raises(OverLimit) as caught:
        list(BoundedLines(io.BytesIO(data), limit=100, block=block))
    # byte 101 of the run passes the limit: it is on line 2 + 100 // 3
    assert (caught.value.first, caught.value.line, caught.value.blank) == (2, 2 + 100 // 3, True)


# -- lines and blank runs in real files ----------------------------------------------------------------------


def test_a_gzip_log_of_spaces_after_a_record_is_refused_at_once(tmp_path: Path) -> None:
    """The issue's file: one record, then gigabytes of spaces compressed a thousandfold (here 72 MiB, at the real
    limit): refused after the limit is read, holding none of it."""
    path = write_gz_run(tmp_path / (NAME + ".gz"), (record_line() + "\n").encode(), b" ", 72 * MiB)
    assert path.stat().st_size < 200_000
    message, seconds, peak = refused(lambda: open_source(path))
    assert message == (f"{path}: line 2: more than 64 MiB (tempcal's limit on a line of an lm-eval log) of blank "
                       "lines and whitespace in a row; an lm-eval log holds one record per line")
    assert seconds < 5 and peak < 8 * MiB


def test_a_gzip_log_of_newlines_is_refused_fast(tmp_path: Path) -> None:
    """128 MiB of newlines (130 KB compressed): refused at the line where the blank run passes the limit."""
    path = write_gz_run(tmp_path / (NAME + ".gz"), (record_line() + "\n").encode(), b"\n", 128 * MiB)
    message, seconds, peak = refused(lambda: read_lm_eval_log(path))
    assert message.startswith(f"{path}: lines 2-{2 + MAX_LINE_BYTES}: more than 64 MiB ")
    assert seconds < 5 and peak < 8 * MiB


def test_a_long_line_in_gzip_at_the_real_limit(tmp_path: Path) -> None:
    path = write_gz_run(tmp_path / (NAME + ".gz"), (record_line() + '\n{"doc": "').encode(), b"x", 72 * MiB)
    message, seconds, peak = refused(lambda: read_lm_eval_log(path))
    assert message == (f"{path}: line 2: longer than 64 MiB (tempcal's limit on a line of an lm-eval log); an "
                       "lm-eval sample record is kilobytes, so this is not a sample log (or is damaged)")
    assert seconds < 5 and peak < MAX_LINE_BYTES + 16 * MiB  # the line is held up to the limit, no further


def test_memory_stays_flat_in_the_size_of_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain log whose line is 16 times the limit (and a record followed by spaces on its own line, in gzip)."""
    monkeypatch.setattr(lm_eval, "MAX_LINE_BYTES", MiB)
    plain = tmp_path / NAME
    with open(plain, "wb") as f:
        f.write((record_line() + '\n{"doc": "').encode())
        for _ in range(16):
            f.write(b"x" * MiB)
        f.write(b'"}\n')
    message, _, peak = refused(lambda: read_lm_eval_log(plain))
    assert message.startswith(f"{plain}: line 2: longer than 1 MiB ") and peak < 4 * MiB
    same_line = write_gz_run(tmp_path / "samples_x.jsonl.gz", record_line().encode(), b" ", 32 * MiB)
    message, _, peak = refused(lambda: read_lm_eval_log(same_line))
    assert message.startswith(f"{same_line}: line 1: longer than 1 MiB ") and peak < 6 * MiB  # gzip's buffers too


def test_a_record_padded_to_the_limit_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lm_eval, "MAX_LINE_BYTES", 4096)
    line = record_line(1).encode()
    path = tmp_path / NAME
    path.write_bytes(record_line(0).encode() + b"\n" + line + b" " * (4096 - len(line)) + b"\n")
    assert read_lm_eval_log(path)[0].shape == (2, 2)
    path.write_bytes(record_line(0).encode() + b"\n" + line + b" " * (4097 - len(line)) + b"\n")
    assert refused(lambda: read_lm_eval_log(path))[0].startswith(f"{path}: line 2: longer than 4 KiB ")


# -- choices, values and the padded matrix -------------------------------------------------------------------


def ordinary_records(n: int) -> str:
    """``n`` two-choice records, doc_id 0 .. n - 1 (one record written by lm-eval's layout, its doc_id changed)."""
    first = record_line(0)
    assert first.startswith('{"doc_id": 0, ')
    return "".join(first.replace('"doc_id": 0', f'"doc_id": {i}', 1) + "\n" for i in range(n))


def test_a_record_of_too_many_choices_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / NAME
    wide = record_line(3000, [f"c{i}" for i in range(10_001)])
    path.write_text(ordinary_records(3000) + wide + "\n", encoding="utf-8")
    message, seconds, _ = refused(lambda: read_lm_eval_log(path))
    assert message == (f"{path}: line 3001: 10,001 choices; tempcal reads records of at most 10,000 choices "
                       "(lm-eval's multiple-choice tasks have a few)")
    assert seconds < 10
    path.write_text(record_line(0, [f"c{i}" for i in range(10_000)]) + "\n", encoding="utf-8")
    assert read_lm_eval_log(path)[0].shape == (1, 10_000)  # at the limit


@pytest.mark.slow
def test_the_issues_record_of_300000_choices(tmp_path: Path) -> None:
    """3,000 ordinary records and one of 300,000 choices (35 MB): refused before it is parsed."""
    path = tmp_path / NAME
    path.write_text(ordinary_records(3000) + record_line(3000, [f"c{i}" for i in range(300_000)]) + "\n")
    message, seconds, peak = refused(lambda: read_lm_eval_log(path))
    assert message.startswith(f"{path}: line 3001: 300,000 requests in 'arguments' and ")
    assert seconds < 10 and peak < 300 * MiB


def test_too_many_json_values_are_refused_before_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tempcal.sources import lm_eval_records

    monkeypatch.setattr(lm_eval_records, "MAX_VALUES", 5000)
    record = json.loads(record_line(1))
    record["doc"] = {"rows": [[i, i + 1] for i in range(2000)]}  # [[0, 1], ...]: 3 values per row
    path = tmp_path / NAME
    path.write_text(record_line(0) + "\n" + json.dumps(record) + "\n")
    message, _, _ = refused(lambda: read_lm_eval_log(path))
    assert message.startswith(f"{path}: line 2: ") and " JSON values and keys; " in message
    monkeypatch.setattr(lm_eval_records, "MAX_VALUES", 100_000)
    assert read_lm_eval_log(path)[0].shape == (2, 2)


def test_count_values_skips_strings() -> None:
    value = {"a,b": ["x,:[{\\\"", 1, {"b": [], "c:": "\\"}], "[{": ",,,"}
    text = json.dumps(value).encode()
    blanked = b'{"": ["", 1, {"": [], "": ""}], "": ""}'  # the same JSON with every string emptied
    assert count_values(text) == sum(blanked.count(mark) for mark in (b",", b":", b"[", b"{"))
    assert count_values(text) < sum(text.count(mark) for mark in (b",", b":", b"[", b"{"))


def test_a_padded_matrix_over_the_bound_is_refused_at_the_record(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lm_eval, "MAX_PADDED_BYTES", 64 << 10)
    ten = [f"c{i}" for i in range(10)]
    path = tmp_path / NAME
    path.write_text(ordinary_records(1000) + record_line(1000, ten) + "\n")  # 1,001 x 10 x 8 bytes > 64 KiB
    message, _, _ = refused(lambda: read_lm_eval_log(path))
    assert message.startswith(f"{path}: line 1001: 1,001 records padded to its 10 choices would be a 78.2 KiB "
                              "matrix of float64 log-likelihoods; tempcal pads the rows of a SOURCE to at most 64 KiB")
    path.write_text(record_line(0, ten).replace('"doc_id": 0', '"doc_id": -1') + "\n" + ordinary_records(1999))
    first_over = next(n for n in range(1, 2000) if n * 10 * 8 > 64 << 10)
    message, _, _ = refused(lambda: read_lm_eval_log(path))
    assert message.startswith(f"{path}: line {first_over}: {first_over} records padded to line 1's 10 choices ")


def test_logs_padded_together_over_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lm_eval, "MAX_PADDED_BYTES", 64 << 10)
    wide = tmp_path / "samples_wide.jsonl"
    wide.write_text(ordinary_records(10) + record_line(10, [f"c{i}" for i in range(10)]) + "\n")
    narrow = tmp_path / "samples_narrow.jsonl"
    narrow.write_text(ordinary_records(900))  # 911 x 10 x 8 bytes padded together; each alone is within
    message, _, _ = refused(lambda: open_source(str(tmp_path / "samples_*")))
    assert message.startswith(f"{wide}: line 11: its 10 choices pad the 911 records of 2 logs to a 71.2 KiB matrix")


# -- nesting, integers, surrogates ---------------------------------------------------------------------------


def with_doc(doc_json: str, doc_id: int = 1) -> str:
    """A record whose ``doc`` is the given JSON text, spliced in as a hand-edited file would be."""
    record = json.loads(record_line(doc_id))
    record["doc"] = "@DOC@"
    return json.dumps(record).replace('"@DOC@"', doc_json)


@pytest.mark.parametrize(("depth", "opener", "closer"), [(50_000, "[", "]"), (100_000, '{"a": ', "}"),
                                                         (300, "[", "]")])
def test_deep_nesting_is_refused(tmp_path: Path, depth: int, opener: str, closer: str) -> None:
    path = tmp_path / NAME
    path.write_text(record_line(0) + "\n" + with_doc(opener * depth + "1" + closer * depth) + "\n")
    message, seconds, _ = refused(lambda: read_lm_eval_log(path))
    assert message == (f"{path}: line 2: JSON nested more than {MAX_DEPTH} levels deep; an lm-eval sample record "
                       "nests a few levels, so this is not a sample log")
    assert seconds < 5


def test_a_deep_but_bounded_doc_still_reads(tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.write_text(record_line(0) + "\n" + with_doc("[" * 150 + "]" * 150) + "\n")
    assert read_lm_eval_log(path)[0].shape == (2, 2)


def test_integers_of_thousands_of_digits(tmp_path: Path) -> None:
    path = tmp_path / NAME
    pairs = json.loads(record_line(1, version="0.4.3"))  # 0.4.3 keeps an int target an int
    pairs["target"] = "@T@"
    for line in (json.dumps(pairs).replace('"@T@"', "7" * 5000), with_doc('{"n": -' + "9" * 5000 + "}"),
                 record_line(1).replace('"doc_id": 1', '"doc_id": ' + "1" * 5000)):
        path.write_text(record_line(0) + "\n" + line + "\n")
        message, seconds, _ = refused(lambda: read_lm_eval_log(path))
        assert message == (f"{path}: line 2: an integer of 5,000 digits; tempcal reads integers of at most 4,300 "
                           "digits (an lm-eval record's are indices and counts)")
        assert seconds < 2


def test_a_target_string_of_thousands_of_digits(tmp_path: Path) -> None:
    path = tmp_path / NAME
    record = json.loads(record_line(1))
    path.write_text(record_line(0) + "\n" + json.dumps({**record, "target": "7" * 5000}) + "\n")
    message, _, _ = refused(lambda: read_lm_eval_log(path))
    assert message.startswith(f'{path}: line 2: target "777') and "out of range for 2 choices" in message
    path.write_text(record_line(0) + "\n" + json.dumps({**record, "target": "0" * 5000 + "1"}) + "\n")
    assert read_lm_eval_log(path)[1].tolist() == [0, 1]  # leading zeros: still the index 1


def test_a_gen_args_key_of_thousands_of_digits(tmp_path: Path) -> None:
    record = json.loads(record_line(1))
    record["arguments"]["gen_args_" + "1" * 5000] = record["arguments"].pop("gen_args_1")
    path = tmp_path / NAME
    path.write_text(record_line(0) + "\n" + json.dumps(record) + "\n")
    message, _, _ = refused(lambda: read_lm_eval_log(path))
    assert message == f"{path}: line 2: 'arguments' has a key 'gen_args_1111111111111111111111111111...'; " \
                      "expected gen_args_0, gen_args_1, ..."


def test_a_lone_surrogate_under_bytes(tmp_path: Path) -> None:
    record = as_written(mc_record(1, "q", ["a", "b"], [-1.0, -2.0], 0))
    record["arguments"]["gen_args_0"]["arg_1"] = " a\ud800"  # json.dumps writes it as the escape \ud800
    path = write_log(tmp_path / NAME, [mc_record(0, "q", ["a", "b"], [-1.0, -2.0], 0)])
    path.write_text(path.read_text() + json.dumps(record) + "\n")
    message, _, _ = refused(lambda: read_lm_eval_log(path, "bytes"))
    assert message == (f"{path}: line 2: choice 0's text holds a lone surrogate ('\\ud800' at character 2), which "
                       "is not Unicode text and has no length in UTF-8 bytes (lm_eval_norm bytes)")
    assert read_lm_eval_log(path, "chars")[0].shape == (2, 2)


def test_stream_failures_name_the_line(tmp_path: Path) -> None:
    data = gzip.compress(ordinary_records(300).encode())
    path = tmp_path / (NAME + ".gz")
    path.write_bytes(data[: len(data) // 2])
    message, _, _ = refused(lambda: read_lm_eval_log(path))
    assert message.startswith(f"{path}: truncated gzip data (the file ends inside the compressed stream, on line ")

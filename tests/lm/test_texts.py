"""tempcal.lm.texts: the texts of .txt and .jsonl files, as written by editors and by json.dumps."""

from __future__ import annotations

import hashlib
import json

import pytest

from tempcal.errors import TempcalError
from tempcal.lm.texts import read_texts


def test_txt_one_text_per_line_keeps_each_line_as_written(tmp_path):
    """Windows line ends dropped, a byte-order mark dropped, blank lines skipped, leading tabs and spaces kept."""
    raw = "\ufeffthe first text\r\n\r\n\tindented text  \r\n   \nlast line without newline".encode()
    path = tmp_path / "texts.txt"
    path.write_bytes(raw)
    texts = read_texts(path)
    assert texts.texts == ["the first text", "\tindented text  ", "last line without newline"]
    assert texts.lines == [1, 3, 5]
    assert texts.sha256 == hashlib.sha256(raw).hexdigest() and texts.field is None


def test_jsonl_reads_the_named_field_of_each_object(tmp_path):
    path = tmp_path / "texts.jsonl"
    records = [{"id": 1, "body": "first\nwith a newline", "text": "ignored"}, {"body": "caf\u00e9 \u2603"},
               {"body": ""}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=k == 0) for k, r in enumerate(records)) + "\n\n",
                    encoding="utf-8")
    texts = read_texts(path, "body")
    assert texts.texts == ["first\nwith a newline", "caf\u00e9 \u2603"]  # an empty text is skipped
    assert texts.lines == [1, 2] and texts.field == "body"


@pytest.mark.parametrize("content, message", [
    (b"ok\n\xff\xfe\n", "line 2: not UTF-8 text (byte 1 of the line)"),
    (b"", "holds no text (an empty file, or only blank lines)"),
])
def test_txt_problems_name_the_line(tmp_path, content, message):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(TempcalError) as exc:
        read_texts(path)
    assert str(exc.value) == f"{path}: {message}"


def test_a_folder_and_a_missing_file_are_refused(tmp_path):
    (tmp_path / "folder.txt").mkdir()
    with pytest.raises(TempcalError, match="not a regular file"):
        read_texts(tmp_path / "folder.txt")
    with pytest.raises(TempcalError, match="no such file"):
        read_texts(tmp_path / "missing.txt")


def test_deeply_nested_json_is_one_error_not_a_crash(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "fine"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(TempcalError, match="line 2: not valid JSON"):
        read_texts(path)


def test_a_long_line_is_cut_to_the_budget_and_the_rest_still_hashed_and_checked(tmp_path, monkeypatch):
    """A line is never held whole: its first ``max_chars`` characters are kept (a multi-byte character split by a
    block boundary included), the rest is hashed and checked to be UTF-8, then dropped."""
    import tempcal.lm.texts as texts_module

    monkeypatch.setattr(texts_module, "BLOCK_BYTES", 7)  # lines and characters cross block boundaries
    long = "\u00e9a\u2603 " * 50
    raw = f"short one\r\n{long}\r\n\n   \nlast".encode()
    path = tmp_path / "texts.txt"
    path.write_bytes(raw)
    texts = read_texts(path, max_chars=10)
    assert texts.texts == ["short one", long[:10], "last"]
    assert texts.cut == [False, True, False] and texts.lines == [1, 2, 5]
    assert texts.sha256 == hashlib.sha256(raw).hexdigest()
    path.write_bytes(long.encode() + b"\xff tail\n")
    with pytest.raises(TempcalError, match=rf"line 1: not UTF-8 text \(byte {len(long.encode()) + 1} of the line\)"):
        read_texts(path, max_chars=10)


def test_a_line_of_spaces_past_the_budget_with_words_behind_is_kept(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_bytes(b" " * 50 + b"word\n" + b" " * 50 + b"\n")
    texts = read_texts(path, max_chars=10)
    assert texts.texts == [" " * 10] and texts.cut == [True]


def test_jsonl_lines_are_bounded_and_texts_cut_after_parsing(tmp_path, monkeypatch):
    import tempcal.lm.texts as texts_module

    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"text": "x" * 40}) + "\n" + json.dumps({"text": "y" * 200}) + "\n")
    texts = read_texts(path, max_chars=16)
    assert texts.texts == ["x" * 16, "y" * 16] and texts.cut == [True, True]
    monkeypatch.setattr(texts_module, "MAX_JSONL_LINE_BYTES", 100)
    with pytest.raises(TempcalError, match=r"texts.jsonl: line 2: longer than 100 bytes"):
        read_texts(path, max_chars=16)


def test_a_lone_surrogate_names_its_line(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "bad \\ud800 here"}\n')
    with pytest.raises(TempcalError, match=r"texts.jsonl: line 2: 'text' holds a lone surrogate \('\\ud800' at "
                                           r"character 5\)"):
        read_texts(path)

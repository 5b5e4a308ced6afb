"""tempcal.io.paths.read_regular and tempcal.io.bounded_read: files made the way a user (or a hostile folder) makes
them, refused or read."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from tempcal.io.bounded_read import JsonLongInteger, JsonTooDeep, deeper_than, load_json
from tempcal.io.paths import NotRegularFile, TooLarge, read_regular

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev/zero: POSIX")


def returns_within(seconds: float, call):
    """``call()``'s result or exception, failing (not hanging) when it blocks, as an open of a FIFO would."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


# -- files ----------------------------------------------------------------------------------------


def test_a_regular_file_of_exactly_the_limit_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100) == b"x" * 100
    with pytest.raises(TooLarge) as caught:
        read_regular(path, 99)
    assert (caught.value.size, caught.value.limit, caught.value.grew) == (100, 99, False)
    assert caught.value.size_text == "100 bytes"


def test_an_oversized_sparse_file_is_refused_from_its_size(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(1 << 40)  # 1 TiB of nothing: reading it would never end
    with pytest.raises(TooLarge) as caught:
        read_regular(path, 1 << 20)
    assert caught.value.size == 1 << 40


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile) as caught:
        returns_within(5, lambda: read_regular(fifo, 1000))
    assert caught.value.kind == "is a named pipe (FIFO)" and caught.value.link is None


def test_a_fifo_put_in_place_after_the_check_is_opened_without_blocking(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The check before the open saw a regular file; a FIFO is there by the open (the race a swap wins)."""
    regular, fifo = tmp_path / "was.json", tmp_path / "config.json"
    regular.write_text("{}")
    os.mkfifo(fifo)
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: real_stat(regular if Path(p) == fifo else p, *a, **k))
    try:
        with pytest.raises(NotRegularFile) as caught:
            returns_within(5, lambda: read_regular(fifo, 1000))
    finally:
        monkeypatch.undo()
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # lets a blocked open (if any) finish
        os.close(fd)
    assert caught.value.kind == "is a named pipe (FIFO)"


def test_dev_zero_and_a_folder_are_refused(tmp_path: Path) -> None:
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    with pytest.raises(NotRegularFile) as caught:
        returns_within(5, lambda: read_regular("/dev/zero", 1 << 20))
    assert caught.value.kind == "is a character device"
    with pytest.raises(NotRegularFile) as caught:
        read_regular(tmp_path, 1 << 20)
    assert caught.value.kind == "is a folder"


def test_links_are_followed_to_a_file_and_named_when_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text('{"a": 1}')
    (tmp_path / "to-file").symlink_to(real)
    assert read_regular(tmp_path / "to-file", 100) == b'{"a": 1}'
    os.mkfifo(tmp_path / "pipe")
    os.symlink(tmp_path / "pipe", tmp_path / "to-pipe")
    with pytest.raises(NotRegularFile) as caught:
        returns_within(5, lambda: read_regular(tmp_path / "to-pipe", 100))
    assert caught.value.link == str(tmp_path / "pipe")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "dangling", 100)


def test_a_file_longer_than_its_status_says_is_refused_as_grown() -> None:
    """Files in /proc report size 0 and hold more: what a file growing while read looks like."""
    status = Path("/proc/self/status")
    if not status.is_file():
        pytest.skip("no /proc")
    assert os.stat(status).st_size == 0
    with pytest.raises(TooLarge) as caught:
        read_regular(status, 10)
    assert caught.value.grew and caught.value.size == 11
    assert caught.value.size_text == "more than 10 bytes (it grew as it was read)"


# -- JSON -----------------------------------------------------------------------------------------


def test_json_nested_past_python_stack_is_refused_at_its_place() -> None:
    text = '{\n  "x": ' + "[" * 100_000 + "]" * 100_000 + "\n}"
    with pytest.raises(JsonTooDeep) as caught:
        load_json(text, max_depth=100, max_int_digits=100)
    assert (caught.value.line, caught.value.column) == (2, len('  "x": ') + 99 + 1)  # the 101st level
    assert caught.value.at == "line 2 column 107: "


def test_json_within_the_stack_but_past_the_limit_is_refused_after_parsing() -> None:
    deep = "[" * 300 + "]" * 300
    assert deeper_than(json.loads(deep), 299) and not deeper_than(json.loads(deep), 300)
    with pytest.raises(JsonTooDeep) as caught:
        load_json(deep, max_depth=200, max_int_digits=100)
    assert (caught.value.line, caught.value.column) == (1, 201)
    assert load_json(deep, max_depth=300, max_int_digits=100) == json.loads(deep)


def test_brackets_in_strings_do_not_count_and_deep_nesting_wins_over_bad_json() -> None:
    value = {"note": "[[[[{{{{" * 100, "list": [1, [2, [3]]]}
    assert load_json(json.dumps(value), max_depth=4, max_int_digits=100) == value  # {"list": [1, [2, [3]]]}
    with pytest.raises(JsonTooDeep):
        load_json(json.dumps(value), max_depth=3, max_int_digits=100)
    with pytest.raises(JsonTooDeep):
        load_json("[" * 50 + "1,", max_depth=10, max_int_digits=100)  # unclosed: the nesting is what is said
    with pytest.raises(json.JSONDecodeError):
        load_json("[[1,]]", max_depth=10, max_int_digits=100)


def test_long_integers_are_refused_at_their_place_and_long_floats_read() -> None:
    text = '{"ok": 1.' + "5" * 6000 + ',\n "n": -' + "7" * 5000 + "}"
    with pytest.raises(JsonLongInteger) as caught:
        load_json(text, max_depth=10, max_int_digits=100)
    assert (caught.value.digits, caught.value.line, caught.value.column) == (5000, 2, 7)
    assert load_json("[" + "9" * 100 + "]", max_depth=10, max_int_digits=100) == [int("9" * 100)]
    assert load_json("[1" + "0" * 5000 + ".0]", max_depth=10, max_int_digits=100) == [float("inf")]


def test_a_lowered_python_digit_limit_is_a_long_integer_not_a_value_error() -> None:
    if not hasattr(sys, "set_int_max_str_digits"):
        pytest.skip("Python without an int digit limit")
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with pytest.raises(JsonLongInteger) as caught:
            load_json("[" + "3" * 1000 + "]", max_depth=10, max_int_digits=4300)
    finally:
        sys.set_int_max_str_digits(before)
    assert (caught.value.digits, caught.value.line, caught.value.column) == (1000, 1, 2)

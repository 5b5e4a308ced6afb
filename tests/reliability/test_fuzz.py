"""Hostile files through load -> fit -> write-back: success or exit 2 with one line, never a traceback or a hang.

A seeded generator mutates a valid file (truncated at every offset, flipped bytes, a lying
header length, shapes/dtypes/offsets that disagree, duplicate keys, bad metadata, ...) and
hypothesis adds random headers and random edits. Every case runs ``tempcal fit`` in-process
under a deadline; a sample also runs as a real process. A success must leave a complete,
valid file (checked with an independent parser and with safetensors itself); a refusal must
leave the folder exactly as it was.

The default run takes a fast slice of the corpus; ``pytest -m slow tests/reliability`` runs all of it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import struct
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import assert_one_error_line, snapshot, write_inputs
from conftest import raw_safetensors as raw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability_support import (
    assert_complete_update,
    clear,
    command_built_once,
    run_inprocess,
    run_process,
    tempcal_command,
    temporaries,
    valid_file,
)

from tempcal.errors import TempcalError
from tempcal.io.safetensors_header import MAX_HEADER_BYTES, read_header

#: Seconds one in-process case may take (typical: a few ms for a refusal, ~0.1 s for a fit).
CASE_SECONDS = 20.0
#: Extra seconds one real process may take (it imports torch first).
PROCESS_SECONDS = 120.0
#: Error lines known not to name the file (raised outside the loading code; reported upstream).
UNNAMED = ("error: the evaluation part holds no samples", "error: the fitting part holds ")
#: Known bugs outside the loading and write-back code, each pinned by a strict xfail test below
#: (which starts passing, and so failing, once the bug is fixed: then remove it here).
KNOWN_BUGS: dict[str, str] = {}


class KnownBug(Exception):
    pass


def base_file() -> bytes:
    """The valid file every mutation starts from: logits, labels, one more tensor and metadata."""
    return valid_file(24, 3, metadata={"model": "m", "split": "val"},
                      extra={"features": torch.arange(6, dtype=torch.float16)})


def split(body: bytes) -> tuple[int, dict, bytes]:
    (length,) = struct.unpack("<Q", body[:8])
    return length, json.loads(body[8 : 8 + length]), body[8 + length :]


def entries(logits=("F32", [24, 3], [192, 480]), labels=("I64", [24], [0, 192]), **more) -> dict:
    out = {}
    for name, (dtype, shape, offsets) in {"labels": labels, "logits": logits, **more}.items():
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
    return out


# -- the seeded corpus --------------------------------------------------------------------------------------


def structural_cases(base: bytes) -> Iterator[tuple[str, bytes]]:
    """Hand-made disagreements between a header and its data, and hostile header values."""
    _, header, data = split(base)
    meta = header["__metadata__"]
    body = data[:480]  # labels + logits of the base file

    def with_entries(**changes) -> bytes:
        return raw({"__metadata__": meta, **entries(**changes)}, body)

    yield "empty-file", b""
    yield "length-field-only", struct.pack("<Q", 0)
    yield "seven-bytes", b"\x10\0\0\0\0\0\0"
    yield "header-list", raw("[1, 2, 3]", body)
    yield "header-string", raw('"logits"', body)
    yield "header-null", raw("null", body)
    yield "header-empty-object", raw("{}", b"")
    yield "header-only-metadata", raw({"__metadata__": {"a": "b"}})
    yield "deep-nesting-array", raw("[" * 100_000 + "]" * 100_000)
    yield "deep-nesting-object", raw('{"a":' * 50_000 + "1" + "}" * 50_000)
    yield "integer-past-digit-limit", raw('{"logits":{"dtype":"F32","shape":[' + "9" * 5000
                                          + '],"data_offsets":[0,4]}}')
    yield "nan-in-shape", raw('{"logits":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}', b"\0" * 4)
    yield "float-shape", with_entries(logits=("F32", [24.0, 3], [192, 480]))
    yield "negative-shape", with_entries(logits=("F32", [-24, -3], [192, 480]))
    yield "bool-shape", with_entries(logits=("F32", [True, 3], [192, 480]))
    yield "bool-offsets", with_entries(logits=("F32", [0, 3], [False, True]))
    yield "negative-offsets", with_entries(logits=("F32", [24, 3], [-96, 192]))
    yield "reversed-offsets", with_entries(logits=("F32", [24, 3], [480, 192]))
    yield "three-offsets", with_entries(logits=("F32", [24, 3], [192, 480, 480]))
    yield "string-offsets", with_entries(logits=("F32", [24, 3], ["192", "480"]))
    yield "offsets-not-list", with_entries(logits=("F32", [24, 3], {"begin": 192}))
    yield "dtype-list", with_entries(logits=(["F32"], [24, 3], [192, 480]))
    yield "dtype-object", with_entries(logits=({"F32": 1}, [24, 3], [192, 480]))
    yield "dtype-null", with_entries(logits=(None, [24, 3], [192, 480]))
    yield "dtype-lowercase", with_entries(logits=("f32", [24, 3], [192, 480]))
    yield "dtype-unknown", with_entries(logits=("F128", [24, 3], [192, 480]))
    yield "shape-needs-more-bytes", with_entries(logits=("F32", [24, 4], [192, 480]))
    yield "shape-needs-fewer-bytes", with_entries(logits=("F32", [24, 2], [192, 480]))
    yield "dtype-needs-more-bytes", with_entries(logits=("F64", [24, 3], [192, 480]))
    yield "huge-shape", with_entries(logits=("F32", [2**40, 2**40], [192, 192 + 2**82]))
    yield "huge-offsets", with_entries(logits=("F32", [24, 3], [2**64, 2**64 + 288]))
    yield "offsets-past-end", with_entries(logits=("F32", [24, 3], [200, 488]))
    yield "overlap", with_entries(labels=("I64", [24], [0, 192]), logits=("F32", [24, 3], [100, 388]))
    yield "same-offsets", with_entries(labels=("I64", [24], [192, 384]), logits=("F32", [24, 2], [192, 384]))
    yield "gap", raw({**entries(logits=("F32", [24, 3], [200, 488])), "__metadata__": meta}, body + b"\0" * 8)
    yield "trailing-bytes", base + b"\0" * 8
    yield "million-dimensions", raw({"logits": {"dtype": "F32", "shape": [10**9] * 1_000_000,
                                                "data_offsets": [0, 4]}}, b"\0" * 4)
    yield "many-tensors", raw({f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
                               for i in range(20_000)}, b"\0" * 20_000)
    text = json.dumps({"__metadata__": meta, **entries()})
    dup = text[:-1] + ', "logits": {"dtype": "F32", "shape": [24, 3], "data_offsets": [192, 480]}}'
    yield "duplicate-tensor-key", raw(dup, body)
    dup = text[:-1] + ', "labels": {"dtype": "F32", "shape": [24, 2], "data_offsets": [0, 192]}}'
    yield "duplicate-tensor-key-disagreeing", raw(dup, body)
    yield "duplicate-metadata-key", raw(text.replace('"model": "m"', '"model": "m", "model": "n"'), body)
    yield "duplicate-temperature-key", raw(text.replace('"model": "m"', '"tempcal.temperature": "2.0", '
                                                        '"tempcal.temperature": "3.0"'), body)
    yield "metadata-not-utf8", raw(text.encode().replace(b'"m"', b'"\xff\xfe"'), body)
    yield "name-not-utf8", raw(text.encode().replace(b'"logits"', b'"log\xc3its"'), body)
    yield "metadata-value-int", raw({"__metadata__": {"model": 1}, **entries()}, body)
    yield "metadata-value-list", raw({"__metadata__": {"model": ["m"]}, **entries()}, body)
    yield "metadata-list", raw({"__metadata__": ["model", "m"], **entries()}, body)
    yield "metadata-string", raw({"__metadata__": "model=m", **entries()}, body)
    yield "metadata-number", raw({"__metadata__": 0, **entries()}, body)
    yield "metadata-false", raw({"__metadata__": False, **entries()}, body)
    yield "metadata-null", raw({"__metadata__": None, **entries()}, body)
    yield "metadata-temperature-nan", raw({"__metadata__": {"tempcal.temperature": "nan"}, **entries()}, body)
    yield "metadata-temperature-junk", raw({"__metadata__": {"tempcal.temperature": "\n\x00T"}, **entries()}, body)
    yield "metadata-one-megabyte", raw({"__metadata__": {"notes": "x" * 1_000_000}, **entries()}, body)
    yield "header-padded-with-nul", raw(text.encode() + b"\0" * 6, body)
    yield "header-with-bom", raw(b"\xef\xbb\xbf" + text.encode(), body)
    yield "header-leading-space", raw(" " + text, body)
    yield "entry-extra-field", raw({"__metadata__": meta, **{k: {**v, "note": 1} for k, v in entries().items()}},
                                   body)
    yield "entry-not-object", raw({"logits": [1, 2], "labels": entries()["labels"]}, body)
    yield "name-with-newline-bad-dtype", raw({**entries(), "x\nerror: a second line":
                                              {"dtype": "X", "shape": [], "data_offsets": [480, 480]}}, body)
    extra = {"dtype": "U8", "shape": [4], "data_offsets": [480, 484]}
    yield "name-with-newline-valid", raw({**entries(), "a\nb\r\x1b[31m": extra}, body + b"abcd")
    yield "unicode-name", raw({"__metadata__": {"ünï": "😀"}, **entries(), "é😀": extra}, body + b"abcd")
    yield "zero-rows", raw(entries(logits=("F32", [0, 3], [0, 0]), labels=("I64", [0], [0, 0])))
    yield "one-row", raw(entries(logits=("F32", [1, 3], [8, 20]), labels=("I64", [1], [0, 8])), body[:20])
    yield "logits-3d", raw(entries(logits=("F32", [24, 3, 1], [192, 480])), body)
    yield "logits-one-class", raw(entries(logits=("F32", [24, 1], [192, 288])), body[:288])
    yield "logits-binary", raw(entries(logits=("F32", [24], [192, 288])), body[:288])
    yield "logits-zero-classes", raw(entries(logits=("F32", [24, 0], [192, 192])), body[:192])
    for dtype, size in (("F8_E4M3", 1), ("F8_E5M2", 1), ("BOOL", 1), ("U8", 1), ("I16", 2), ("U16", 2),
                        ("U32", 4), ("U64", 8), ("BF16", 2), ("F16", 2), ("F64", 8)):
        n = 72 * size
        yield f"logits-{dtype}", raw(entries(logits=(dtype, [24, 3], [192, 192 + n])),
                                     body[:192] + (body[192:480] * 2)[:n])
    for dtype, size in (("F32", 4), ("F16", 2), ("BOOL", 1), ("U64", 8), ("I8", 1), ("F8_E4M3", 1)):
        n = 24 * size
        labels = bytes([1, 0, 2, 255] * 48)[:n]
        yield f"labels-{dtype}", raw(entries(labels=(dtype, [24], [0, n]), logits=("F32", [24, 3], [n, n + 288])),
                                     labels + body[192:480])
    yield "labels-2d", raw(entries(labels=("I64", [12, 2], [0, 192])), body)
    yield "labels-count-mismatch", raw(entries(labels=("I64", [23], [0, 184]),
                                               logits=("F32", [24, 3], [184, 472])), body[:184] + body[192:480])
    nan = struct.pack("<f", math.nan) * 72
    yield "logits-all-nan", raw(entries(), body[:192] + nan)
    inf = struct.pack("<f", -math.inf) * 72
    yield "logits-all-neginf", raw(entries(), body[:192] + inf)
    yield "logits-huge", raw(entries(), body[:192] + struct.pack("<f", 3e38) * 72)
    yield "logits-equal", raw(entries(), body[:192] + struct.pack("<f", 1.0) * 72)
    yield "labels-huge", raw(entries(), struct.pack("<q", 2**62) * 24 + body[192:480])
    yield "labels-one-class", raw(entries(), struct.pack("<q", 1) * 24 + body[192:480])


def length_cases(base: bytes) -> Iterator[tuple[str, bytes]]:
    """The 8-byte header length says something else than the file."""
    length = struct.unpack("<Q", base[:8])[0]
    for value in (0, 1, 2, length - 8, length - 1, length + 1, length + 8, len(base) - 8, len(base) - 7,
                  2**31, 2**32 + length, MAX_HEADER_BYTES - 1, MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1,
                  2**62, 2**63, 2**64 - 1):
        yield f"length-{value}", struct.pack("<Q", value) + base[8:]
    for i in range(8):
        for mask in (0x01, 0x80, 0xFF):
            body = bytearray(base)
            body[i] ^= mask
            yield f"length-byte-{i}-xor-{mask:#x}", bytes(body)


def corpus(full: bool) -> Iterator[tuple[str, bytes]]:
    """The seeded corpus; ``full`` is everything, otherwise a fast slice of it."""
    rng = random.Random(20240608)
    base = base_file()
    header_end = 8 + struct.unpack("<Q", base[:8])[0]
    yield from structural_cases(base)
    yield from length_cases(base)
    # truncated in every region: in the length field, in the header, in each tensor, at the very end
    cuts = range(len(base)) if full else sorted({*range(0, 9), *range(9, header_end, 7), header_end - 1, header_end,
                                                 *range(header_end + 1, len(base), 41), len(base) - 1})
    for cut in cuts:
        yield f"truncated-at-{cut}", base[:cut]
    # flipped header bytes (a flip can still parse: another digit, another letter)
    all_masks = (0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xFF)
    positions = range(8, header_end) if full else sorted(rng.sample(range(8, header_end), 60))
    for i in positions:
        for mask in all_masks if full else (rng.choice(all_masks),):
            body = bytearray(base)
            body[i] ^= mask
            yield f"header-byte-{i}-xor-{mask:#x}", bytes(body)
    # flipped data bytes: NaN, inf, labels out of range, or a file that still fits
    for k in range(400 if full else 12):
        body = bytearray(base)
        i, mask = rng.randrange(header_end, len(base)), rng.randrange(1, 256)
        body[i] ^= mask
        yield f"data-byte-{i}-xor-{mask:#x}-{k}", bytes(body)
    # a few random edits at once, then maybe cut or extended
    for k in range(500 if full else 20):
        body = bytearray(base)
        for _ in range(rng.randint(2, 6)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.3:
            body = body[: rng.randrange(len(body))]
        elif rng.random() < 0.2:
            body += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        yield f"random-edits-{k}", bytes(body)


# -- one case -----------------------------------------------------------------------------------------------


def argv_for(variant: int, path: Path, folder: Path) -> list[str]:
    """Three ways through the command: quiet in place, rendered tables in place, quiet into --output."""
    common = ["fit", str(path), "--json", str(folder / "out.json")]
    return [[*common, "--quiet"], common, [*common, "--quiet", "--output", str(folder / "out.safetensors")]][variant]


def check_case(folder: Path, case: str, body: bytes, variant: int) -> str:
    """Run one file through ``tempcal fit`` in-process and check the contract; returns what happened."""
    clear(folder)
    path = folder / "case.safetensors"
    path.write_bytes(body)
    before = snapshot(folder)
    code, out, err, seconds = run_inprocess(argv_for(variant, path, folder), CASE_SECONDS)
    assert "Traceback" not in out + err, (case, err)
    assert seconds < CASE_SECONDS, (case, seconds)
    for bug, line in KNOWN_BUGS.items():
        if code == 1 and err.startswith(line):
            assert snapshot(folder) == before, case
            raise KnownBug(bug)
    assert code in (0, 2), (case, code, err)
    if code == 2:
        line = assert_one_error_line(err, warnings=True)
        assert str(path) in line or line.startswith(UNNAMED), (case, line)
        assert snapshot(folder) == before, case  # nothing written, nothing left behind
        return "refused"
    assert all(line.startswith("warning: ") for line in err.splitlines()), (case, err)
    report = json.loads((folder / "out.json").read_text())
    temperature = report["temperature"]
    assert math.isfinite(temperature) and temperature > 0
    target = folder / "out.safetensors" if variant == 2 else path
    if variant == 2:
        assert path.read_bytes() == body, case
    assert report["written"] == str(target)
    assert_complete_update(target.read_bytes(), body, temperature)
    assert temporaries(folder) == [], case
    return "written"


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fast", "full"])
def test_seeded_corpus(tmp_path, full):
    outcomes: Counter[str] = Counter()
    with command_built_once():
        _run_corpus(tmp_path, corpus(full), outcomes, slowest := [0.0, ""])
    # the corpus reaches both ends: plenty refused, and mutations that still fit get written
    assert outcomes["refused"] > 150 and outcomes["written"] >= 3, outcomes
    print(f"\n{sum(outcomes.values())} cases: {dict(outcomes)}; slowest {slowest[1]} {slowest[0]:.2f} s")


def _run_corpus(tmp_path, cases, outcomes, slowest):
    for index, (case, body) in enumerate(cases):
        start = time.perf_counter()
        try:
            outcomes[check_case(tmp_path, case, body, index % 3)] += 1
        except KnownBug as bug:
            outcomes[f"known bug {bug}"] += 1
        except AssertionError as exc:
            raise AssertionError(f"case {case} (variant {index % 3}): {exc}") from exc
        slowest[:] = max(slowest, [time.perf_counter() - start, case])


# -- hypothesis ---------------------------------------------------------------------------------------------

DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL", "F8_E4M3", "U64", "I8"]
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "U64": 8,
         "I8": 1}


@st.composite
def laid_out_files(draw) -> bytes:
    """Headers whose offsets are laid out consistently (so the data layer is reached), random data bytes,
    and sometimes one field of the header broken afterwards."""
    n = draw(st.integers(0, 12))
    shapes = {"logits": draw(st.sampled_from([[n, 3], [n, 2], [n], [n, 1], [n, 0], [n, 2, 2], []])),
              "labels": draw(st.sampled_from([[n], [n, 1], [max(n - 1, 0)], [n, 2]]))}
    names = ["logits", "labels", *draw(st.lists(st.text(max_size=6), max_size=2, unique=True))]
    header, data = {}, b""
    for name in dict.fromkeys(names):
        if name == "__metadata__":
            continue
        dtype = draw(st.sampled_from(DTYPES))
        shape = shapes.get(name, draw(st.lists(st.integers(0, 3), max_size=2)))
        size = math.prod(shape) * SIZES[dtype]
        if name == "logits" and dtype in ("F32", "F64", "F16") and draw(st.booleans()):
            fmt = {"F32": "f", "F64": "d", "F16": "e"}[dtype]
            values = draw(st.lists(st.floats(width=32 if fmt != "e" else 16), min_size=math.prod(shape),
                                   max_size=math.prod(shape)))
            chunk = struct.pack(f"<{len(values)}{fmt}", *values)
        elif name == "labels" and dtype == "I64":
            chunk = struct.pack(f"<{math.prod(shape)}q", *draw(st.lists(st.integers(-1, 3), min_size=math.prod(shape),
                                                                        max_size=math.prod(shape))))
        else:
            chunk = draw(st.binary(min_size=size, max_size=size))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += chunk
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3))
    if draw(st.integers(0, 3)) == 0:  # break one thing
        name = draw(st.sampled_from(sorted(header)))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", None]))
        junk = draw(st.one_of(st.none(), st.integers(-3, 2**70), st.text(max_size=4),
                              st.lists(st.integers(-3, 600), max_size=3), st.booleans()))
        if field is None:
            header[name] = junk
        elif isinstance(header[name], dict):
            header[name][field] = junk
    return raw(header, data)


@st.composite
def edited_files(draw) -> bytes:
    """The base file with a few bytes set, maybe cut short or extended."""
    body = bytearray(draw(st.sampled_from([BASE])))
    for position, value in draw(st.lists(st.tuples(st.integers(0, len(body) - 1), st.integers(0, 255)),
                                         min_size=1, max_size=5)):
        body[position] = value
    cut = draw(st.one_of(st.none(), st.integers(0, len(body))))
    return bytes(body[:cut]) + draw(st.binary(max_size=8))


BASE = base_file()
FILES = st.one_of(st.binary(max_size=600), laid_out_files(), edited_files())
FAST = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Random examples (not derandomized): a failure prints the blob that reproduces it (@reproduce_failure).
FULL = settings(max_examples=3000, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def fuzz_folder(tmp_path_factory) -> Path:
    """One folder for all examples (hypothesis runs many examples per test; each case clears it first)."""
    return tmp_path_factory.mktemp("hypothesis")


def _hypothesis_case(folder: Path, body: bytes, variant: int) -> None:
    with command_built_once(), contextlib.suppress(KnownBug):
        check_case(folder, "hypothesis", body, variant)


@FAST
@given(body=FILES, variant=st.integers(0, 2))
def test_hypothesis_files(fuzz_folder, body, variant):
    _hypothesis_case(fuzz_folder, body, variant)


@pytest.mark.slow
@FULL
@given(body=FILES, variant=st.integers(0, 2))
def test_hypothesis_files_full(fuzz_folder, body, variant):
    _hypothesis_case(fuzz_folder, body, variant)


# -- untrusted sizes cost nothing before they are checked ---------------------------------------------------


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, MAX_HEADER_BYTES, MAX_HEADER_BYTES + 1, 99_999_999, 2**32])
def test_declared_header_length_is_checked_before_any_allocation(tmp_path, length):
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(struct.pack("<Q", length) + b'{"a":1}' + b" " * 57)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(TempcalError, match=f"header claims {length} bytes"):
            read_header(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 1.0
    assert peak < 256 * 1024, peak  # nothing sized by the claimed length


def test_declared_tensor_size_is_checked_before_safetensors_reads(tmp_path, monkeypatch):
    """A shape claiming 2**80 bytes is refused by the header check; the tensor reader is never called."""
    import safetensors

    def forbidden(*args, **kwargs):
        raise AssertionError("safetensors.safe_open was called on a file whose header claims more than it holds")

    monkeypatch.setattr(safetensors, "safe_open", forbidden)
    path = tmp_path / "huge.safetensors"
    path.write_bytes(raw(entries(logits=("F32", [2**40, 2**40, 4], [192, 192 + 2**84])), b"\0" * 480))
    tracemalloc.start()
    try:
        code, _, err, _ = run_inprocess(["fit", str(path), "--no-write"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2
    assert_one_error_line(err, str(path), "'logits'")
    assert peak < 4 * 1024 * 1024, peak


@pytest.mark.parametrize("case", ["million-dimensions", "deep-nesting-array", "integer-past-digit-limit",
                                  "many-tensors"])
def test_hostile_header_values_are_refused_quickly(tmp_path, case):
    body = dict(structural_cases(BASE))[case]
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(body)
    start = time.perf_counter()
    code, _, err, _ = run_inprocess(["fit", str(path)], 10.0)
    assert code == 2, err
    assert_one_error_line(err, str(path))
    assert time.perf_counter() - start < 5.0
    assert path.read_bytes() == body


def test_named_pipe_does_not_hang(tmp_path):
    """A FIFO where a file was expected: refused at once, not a read that blocks forever."""
    path = tmp_path / "pipe.safetensors"
    os.mkfifo(path)
    code, _, err, seconds = run_inprocess(["fit", str(path)], 10.0)
    assert code == 2
    assert_one_error_line(err, str(path), "not a regular file")
    assert seconds < 5.0


def test_error_line_escapes_names(tmp_path):
    """A tensor name holding a newline and a fake traceback stays inside one error line."""
    body = dict(structural_cases(BASE))["name-with-newline-bad-dtype"]
    path = tmp_path / "names.safetensors"
    path.write_bytes(body)
    code, _, err, _ = run_inprocess(["fit", str(path)])
    assert code == 2
    line = assert_one_error_line(err, str(path), "unknown dtype")
    assert "\\n" in line


# -- the real process boundary ------------------------------------------------------------------------------

#: Real processes cost seconds each (torch import): the fast run takes one refusal from deep in the
#: pipeline (header, tensors and shapes pass; the values do not); successes at the process boundary
#: are covered by the concurrency and SIGKILL tests, the wide sample runs with ``-m slow``.
FAST_PROCESS_CASES = ["logits-all-nan"]


def _process_case(folder: Path, case: str, body: bytes):
    folder.mkdir()
    path = folder / "case.safetensors"
    path.write_bytes(body)
    args = tempcal_command("fit", str(path), "--json", str(folder / "out.json"), "--quiet")
    return path, args


def _check_process(case: str, folder: Path, path: Path, body: bytes, result) -> str:
    assert "Traceback" not in result.stdout + result.stderr, (case, result.stderr)
    assert result.returncode in (0, 2), (case, result.returncode, result.stderr)
    if result.returncode == 2:
        assert_one_error_line(result.stderr, str(path))
        assert sorted(p.name for p in folder.iterdir()) == ["case.safetensors"]
        assert path.read_bytes() == body
        return "refused"
    temperature = json.loads((folder / "out.json").read_text())["temperature"]
    assert_complete_update(path.read_bytes(), body, temperature)
    return "written"


def _run_processes(tmp_path: Path, cases: list[tuple[str, bytes]], parallel: int) -> Counter[str]:
    import subprocess

    outcomes: Counter[str] = Counter()
    pending = list(cases)
    while pending:
        batch, pending = pending[:parallel], pending[parallel:]
        running = []
        for case, body in batch:
            folder = tmp_path / f"case-{len(outcomes) + len(running)}-{abs(hash(case)) % 10**6}"
            path, args = _process_case(folder, case, body)
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running.append((case, folder, path, body, proc))
        for case, folder, path, body, proc in running:
            try:
                out, err = proc.communicate(timeout=PROCESS_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise AssertionError(f"{case}: tempcal ran past {PROCESS_SECONDS} s") from None
            result = subprocess.CompletedProcess(args, proc.returncode, out, err)
            outcomes[_check_process(case, folder, path, body, result)] += 1
    return outcomes


def _named_cases() -> dict[str, bytes]:
    cases = dict(corpus(full=True))
    body = bytearray(BASE)
    body[-1] ^= 0x01  # the last byte of the float16 'features' tensor: still a valid file
    cases["data-flip-success"] = bytes(body)
    return cases


def test_real_processes_sample(tmp_path):
    cases = _named_cases()
    outcomes = _run_processes(tmp_path, [(name, cases[name]) for name in FAST_PROCESS_CASES], parallel=2)
    assert outcomes == Counter(refused=len(FAST_PROCESS_CASES))


@pytest.mark.slow
def test_real_processes_wide_sample(tmp_path):
    cases = sorted(_named_cases().items())
    sample = [*random.Random(7).sample(cases, 40), ("data-flip-success", dict(cases)["data-flip-success"])]
    outcomes = _run_processes(tmp_path, sample, parallel=2)
    assert sum(outcomes.values()) == 41 and outcomes["written"] >= 1, outcomes


# -- known bugs elsewhere, pinned ---------------------------------------------------------------------------


def test_huge_negative_logit_is_fitted(tmp_path):
    """Once a crash (math.exp overflow in the fit); now a fit."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(24, 3, generator=g)
    labels = torch.multinomial(torch.softmax(logits / 3, 1), 1, generator=g)[:, 0]
    logits[7, 1] = -2.75e8  # not row 7's true class (2): a legal, if odd, logit
    path = tmp_path / "huge.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    code, out, err, _ = run_inprocess(["fit", str(path), "--no-write", "--val-fraction", "1.0", "--json", "-"])
    assert code == 0, err
    import json
    import math
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from reference import optimal_temperature

    expected = optimal_temperature(logits, labels)
    assert math.isclose(json.loads(out)["temperature"], expected, rel_tol=1e-6)


# -- model files: truncated and corrupted .pt2 and .onnx -----------------------------------------------------------

#: Rows of the inputs file every model case runs over.
MODEL_ROWS = 24


def model_base(kind: str, folder: Path) -> bytes:
    """A valid model file (4 features -> 3 classes) written by the library that owns the format."""
    g = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(4, 3).eval()
    with torch.no_grad():
        linear.weight.copy_(3 * torch.randn(3, 4, generator=g))
        linear.bias.copy_(torch.randn(3, generator=g))
    path = folder / f"base.{kind}"
    if kind == "pt2":
        from model_builders import save_program

        save_program(linear, torch.randn(4, 4), path)
    else:
        import onnx
        from model_builders import onnx_model
        from onnx import TensorProto, helper, numpy_helper

        weights = [numpy_helper.from_array(linear.weight.detach().numpy(), "W"),
                   numpy_helper.from_array(linear.bias.detach().numpy(), "b")]
        model = onnx_model([helper.make_node("Gemm", ["x", "W", "b"], ["logits"], transB=1)],
                           [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], weights, features=4)
        onnx.save_model(model, path)
    body = path.read_bytes()
    path.unlink()
    return body


def model_corpus(kind: str, base: bytes, full: bool) -> Iterator[tuple[str, bytes]]:
    """``base`` truncated (in every region), with flipped bits, and with a few random bytes rewritten."""
    rng = random.Random(f"models-{kind}")
    step = 7 if full else max(1, len(base) // 12)
    for cut in sorted({0, 1, 2, 4, 22, *range(0, len(base), step), len(base) - 22, len(base) - 1}):
        yield f"{kind}-truncated-at-{cut}", base[:cut]
    for k in range(300 if full else 16):
        body = bytearray(base)
        body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        yield f"{kind}-flip-{k}", bytes(body)
    for k in range(200 if full else 8):
        body = bytearray(base)
        for _ in range(rng.randint(2, 6)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        yield f"{kind}-random-edits-{k}", bytes(body)


def check_model_case(folder: Path, kind: str, case: str, body: bytes, save_model: bool) -> str:
    """Run one model file through ``tempcal fit MODEL --inputs DATA`` in-process; returns what happened."""
    clear(folder)
    path, inputs = folder / f"case.{kind}", folder / "inputs.safetensors"
    path.write_bytes(body)
    g = torch.Generator().manual_seed(0)
    write_inputs(inputs, torch.randn(MODEL_ROWS, 4, generator=g), torch.randint(0, 3, (MODEL_ROWS,), generator=g))
    before = snapshot(folder)
    written = folder / (f"calibrated.{kind}" if save_model else "logits.safetensors")
    argv = ["fit", str(path), "--inputs", str(inputs), "--json", str(folder / "out.json"), "--quiet",
            "--save-model" if save_model else "--save-logits", str(written)]
    code, out, err, seconds = run_inprocess(argv, CASE_SECONDS)
    assert "Traceback" not in out + err, (case, err)
    assert seconds < CASE_SECONDS, (case, seconds)
    assert code in (0, 2), (case, code, err)
    if code == 2:
        line = assert_one_error_line(err, warnings=True)
        assert str(path) in line, (case, line)
        assert snapshot(folder) == before, case  # nothing written, nothing left behind
        return "refused"
    temperature = json.loads((folder / "out.json").read_text())["temperature"]
    assert math.isfinite(temperature) and temperature > 0, case
    if save_model:  # the calibrated model reads back, checked, with the fitted T
        from tempcal.models.base import load_model

        assert load_model(written, "cpu").temperature == temperature, case
    else:
        assert read_header(written).tensors["logits"].shape[0] == MODEL_ROWS, case
    assert temporaries(folder) == [], case
    return "written"


@pytest.mark.parametrize("kind", ["pt2", "onnx"])
@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fast", "full"])
def test_damaged_model_files(tmp_path, kind, full):
    """Truncated and corrupted models: exit 2 with one line naming the file and nothing written, or (a flip in bytes
    no reader checks, or in an ONNX weight) a fit; never a traceback, another status or a hang."""
    if kind == "onnx":
        pytest.importorskip("onnxruntime")
    base = model_base(kind, tmp_path)
    folder = tmp_path / "case"
    folder.mkdir()
    outcomes: Counter[str] = Counter()
    with command_built_once():
        for index, (case, body) in enumerate(model_corpus(kind, base, full)):
            try:
                outcomes[check_model_case(folder, kind, case, body, save_model=index % 8 == 3)] += 1
            except AssertionError as exc:
                raise AssertionError(f"case {case}: {exc}") from exc
    assert outcomes["refused"] > 15 and set(outcomes) <= {"refused", "written"}, outcomes
    print(f"\n{kind}: {sum(outcomes.values())} cases: {dict(outcomes)}")


def _reaching_the_runtime(kind: str, base: bytes, folder: Path, deepest: str) -> bytes:
    """A damaged model that passes tempcal's own checks and is refused by the runtime: for ONNX the first such case
    of the corpus; for .pt2 (where the checks leave the corpus no such case) a program whose JSON is valid, its
    checksum right, and its schema wrong."""
    if kind == "pt2":
        from model_builders import rewrite_zip

        (folder / "base.pt2").write_bytes(base)
        damaged = rewrite_zip(folder / "base.pt2", folder / "damaged.pt2",
                              replace={"models/model.json": b'{"graph_module": {"graph": 1}}'})
        return damaged.read_bytes()
    with command_built_once():
        for case, body in model_corpus(kind, base, full=True):
            if check_model_case(folder, kind, case, body, save_model=False) == "refused":
                _, _, err, _ = run_inprocess(["fit", str(folder / f"case.{kind}"), "--inputs",
                                              str(folder / "inputs.safetensors")], CASE_SECONDS)
                if deepest in err:
                    return body
    raise AssertionError(f"no {kind} case reaches the runtime")


@pytest.mark.parametrize(("kind", "deepest"), [("pt2", "not a loadable exported program"),
                                               ("onnx", "not a runnable ONNX model")])
def test_damaged_model_in_a_real_process(tmp_path, kind, deepest):
    """Where users see it: a damaged model that gets as far as the runtime (whose native code may log to the
    process's standard error directly, past Python) still ends in exactly one line on standard error."""
    if kind == "onnx":
        pytest.importorskip("onnxruntime")
    base = model_base(kind, tmp_path)
    folder = tmp_path / "case"
    folder.mkdir()
    body = _reaching_the_runtime(kind, base, folder, deepest)
    clear(folder)
    path, inputs = folder / f"case.{kind}", folder / "inputs.safetensors"
    path.write_bytes(body)
    write_inputs(inputs, torch.randn(MODEL_ROWS, 4), torch.randint(0, 3, (MODEL_ROWS,)))
    result = run_process(tempcal_command("fit", str(path), "--inputs", str(inputs), "--save-logits",
                                         str(folder / "logits.safetensors")))
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert_one_error_line(result.stderr, str(path), deepest)
    assert sorted(p.name for p in folder.iterdir()) == ["case." + kind, "inputs.safetensors"]

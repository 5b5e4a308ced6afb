"""Reading inspect_ai logs in bounded pieces: the members of an ``.eval`` zip (stored, deflated or zstd; each at most
:data:`MAX_MEMBER_BYTES`), and the samples of a ``.json`` log (at most :data:`MAX_JSON_LOG_BYTES`) one at a time."""

from __future__ import annotations

import inspect
import json
import re
import struct
import zipfile
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..io.optional import require
from ..io.paths import BoundedReadError, TooLarge, read_regular
from ..io.sidecar import check_regular_file
from .lm_eval import size_text as _size

#: The largest member of an ``.eval`` log, decompressed: a sample with top-20 log-probabilities over a few
#: thousand generated tokens is a few MB; a header with a long plan less.
MAX_MEMBER_BYTES = 256 << 20
#: The largest ``.json`` log: 100 MB holds about 1,200 samples with top-20 log-probabilities.
MAX_JSON_LOG_BYTES = 1 << 30
#: The most members an ``.eval`` log may list (its samples and epochs, and a few more).
MAX_MEMBERS = 1_000_000
ZIP_ZSTD = 93
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")
_LOCAL_MAGIC = b"PK\x03\x04"
_WHITESPACE = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder()


class InspectLogError(DataError):
    """An inspect_ai log that cannot be read: the message names the file and the member, sample or place."""


class EvalArchive(AbstractContextManager):
    """An open ``.eval`` log: its members by name (the last of a repeated name wins, as for every zip reader)."""

    def __init__(self, path: Path) -> None:
        check_regular_file(path)
        self.path = path
        try:
            self.zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile as exc:
            raise InspectLogError(f"{path}: not a readable .eval log (a zip archive): {exc}") from None
        except OSError as exc:
            raise InspectLogError(f"{path}: cannot read ({exc.strerror or exc})") from None
        infos = self.zip.infolist()
        if len(infos) > MAX_MEMBERS:
            raise InspectLogError(f"{path}: lists {len(infos):,} members; an .eval log holds at most "
                                  f"{MAX_MEMBERS:,} here")
        self.members = {info.filename: info for info in infos}

    def __exit__(self, *exc: Any) -> None:
        self.zip.close()

    def sample_names(self) -> list[str]:
        return [name for name in self.members if name.startswith("samples/") and name.endswith(".json")]

    def json(self, name: str) -> Any:
        """Member ``name`` decoded as JSON."""
        try:
            return json.loads(self.read(name))
        except RecursionError:
            raise InspectLogError(f"{self.path}: member {name}: JSON nested too deeply to read") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise InspectLogError(f"{self.path}: member {name}: not valid JSON ({exc})") from None

    def read(self, name: str) -> bytes:
        """Member ``name``'s bytes, decompressed in memory; at most :data:`MAX_MEMBER_BYTES`."""
        info = self.members[name]
        where = f"{self.path}: member {name}"
        if info.file_size > MAX_MEMBER_BYTES:
            raise InspectLogError(f"{where}: {_size(info.file_size)} decompressed, over tempcal's limit of "
                                  f"{_size(MAX_MEMBER_BYTES)} on one member of an .eval log")
        try:
            if info.compress_type == ZIP_ZSTD:
                blob = self._zstd(info, where)
            else:
                with self.zip.open(info) as stream:
                    blob = stream.read(MAX_MEMBER_BYTES + 1)
        except NotImplementedError:
            raise InspectLogError(f"{where}: compression method {info.compress_type} is not one an .eval log uses "
                                  "(stored, deflated or zstd)") from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise InspectLogError(f"{where}: corrupt or truncated ({exc})") from None
        except OSError as exc:
            raise InspectLogError(f"{where}: cannot read ({exc.strerror or exc})") from None
        if len(blob) > MAX_MEMBER_BYTES:
            raise InspectLogError(f"{where}: decompresses past tempcal's limit of {_size(MAX_MEMBER_BYTES)} on one "
                                  "member of an .eval log")
        return blob

    def _zstd(self, info: zipfile.ZipInfo, where: str) -> bytes:
        """A zstd member (Python's zipfile reads none before 3.14): its raw bytes after the local header."""
        zstd = require("zstandard", "logs", needed_for=f"{where}: a zstd-compressed member")
        fp = self.zip.fp
        assert fp is not None
        fp.seek(info.header_offset)
        header = fp.read(_LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_MAGIC:
            raise InspectLogError(f"{where}: corrupt (no local file header where the directory says)")
        fields = _LOCAL_HEADER.unpack(header)
        fp.seek(info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1])
        raw = fp.read(info.compress_size)
        if len(raw) < info.compress_size:
            raise InspectLogError(f"{where}: truncated (the file ends inside the member)")
        try:
            reader = zstd.ZstdDecompressor().decompressobj()
            blob = reader.decompress(raw, MAX_MEMBER_BYTES + 1) if _takes_limit(reader) else reader.decompress(raw)
        except zstd.ZstdError as exc:
            raise InspectLogError(f"{where}: corrupt zstd data ({exc})") from None
        if len(blob) <= MAX_MEMBER_BYTES and zlib.crc32(blob) != info.CRC:
            raise InspectLogError(f"{where}: corrupt (its CRC-32 does not match)")
        return bytes(blob)


def _takes_limit(reader: Any) -> bool:
    """Whether zstandard's decompressobj takes an output limit (0.23 and later: ``max_output_size``)."""
    try:
        return len(inspect.signature(reader.decompress).parameters) > 1
    except (TypeError, ValueError):
        return False


def json_log(path: Path, on_sample: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """A ``.json`` log's top-level fields but ``samples``; each sample is given to ``on_sample`` as it is decoded."""
    text = _json_text(path)
    top: dict[str, Any] = {}
    at = _skip(text, 0)
    if text[at:at + 1] != "{":
        raise InspectLogError(f"{path}: a .json SOURCE is read as an inspect_ai log, a JSON object; this one is not "
                              "an object")
    at = _skip(text, at + 1)
    while text[at:at + 1] not in ("}", ""):
        key, at = _decode(text, at, path)
        at = _skip(text, at)
        if not isinstance(key, str) or text[at:at + 1] != ":":
            raise InspectLogError(f"{path}: not valid JSON at character {at}")
        at = _skip(text, at + 1)
        if key == "samples" and text[at:at + 1] == "[":
            at = _samples(text, at, path, on_sample)
        else:
            top[key], at = _decode(text, at, path)
        at = _skip(text, at)
        if text[at:at + 1] == ",":
            at = _skip(text, at + 1)
    if text[at:at + 1] != "}":
        raise InspectLogError(f"{path}: truncated (the JSON object is not closed)")
    return top


def _json_text(path: Path) -> str:
    try:
        return read_regular(path, MAX_JSON_LOG_BYTES).decode("utf-8")
    except TooLarge as exc:
        raise InspectLogError(f"{path}: {exc.size_text}, over tempcal's limit of {_size(MAX_JSON_LOG_BYTES)} on a "
                              ".json log (write .eval logs, inspect_ai's default, for larger runs)") from None
    except BoundedReadError as exc:
        raise InspectLogError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise InspectLogError(f"{path}: not UTF-8 text ({exc})") from None
    except OSError as exc:
        raise InspectLogError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _skip(text: str, at: int) -> int:
    return _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]  # matches the empty string too


def _decode(text: str, at: int, path: Path) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, at)
    except RecursionError:
        raise InspectLogError(f"{path}: JSON nested too deeply to read at character {at}") from None
    except ValueError as exc:
        raise InspectLogError(f"{path}: not valid JSON ({exc})") from None


def _samples(text: str, at: int, path: Path, on_sample: Callable[[dict[str, Any]], None]) -> int:
    """Each sample of the array at ``at`` given to ``on_sample``; the position past the array."""
    at = _skip(text, at + 1)
    count = 0
    while text[at:at + 1] != "]":
        if not text[at:at + 1]:
            raise InspectLogError(f"{path}: truncated (the samples array is not closed)")
        start = at
        value, at = _decode(text, at, path)
        if at - start > MAX_MEMBER_BYTES:
            raise InspectLogError(f"{path}: samples[{count}] is {_size(at - start)}, over tempcal's limit of "
                                  f"{_size(MAX_MEMBER_BYTES)} on one sample")
        if not isinstance(value, dict):
            raise InspectLogError(f"{path}: samples[{count}] is not an object")
        on_sample(value)
        count += 1
        at = _skip(text, at)
        if text[at:at + 1] == ",":
            at = _skip(text, at + 1)
        elif text[at:at + 1] != "]":
            raise InspectLogError(f"{path}: not valid JSON after samples[{count - 1}] (character {at})")
    return at + 1


__all__ = ["MAX_JSON_LOG_BYTES", "MAX_MEMBER_BYTES", "EvalArchive", "InspectLogError", "json_log"]

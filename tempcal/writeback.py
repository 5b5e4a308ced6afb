"""Writing the fitted T into a safetensors file's metadata, atomically and without touching tensor bytes.

The new file is the old data section copied byte for byte behind a new header, written
to a temporary file in the destination folder, flushed and fsynced, then renamed over
the destination: a crash at any point leaves either the old file or the complete new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

from .errors import TempcalError
from .loading import TEMPERATURE_KEY, Header, read_header

COPY_BLOCK = 1 << 20


def format_temperature(temperature: float) -> str:
    """The shortest decimal string that reads back as the same float."""
    return repr(float(temperature))


def updated_header(header: Header, metadata: dict[str, str]) -> bytes:
    """The 8-byte length plus the JSON header, padded with spaces to 8-byte alignment as safetensors does."""
    entries: dict[str, object] = {"__metadata__": metadata}
    for name, info in header.tensors.items():
        entries[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [info.begin, info.end]}
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_temperature(source: str | os.PathLike, temperature: float, output: str | os.PathLike | None = None
                      ) -> Path:
    """Write ``temperature`` under ``tempcal.temperature`` into ``source`` (or a copy at ``output``).

    Other metadata is kept and every tensor byte is copied unchanged. Returns the path written.
    """
    header = read_header(source)
    metadata = dict(header.metadata)
    metadata[TEMPERATURE_KEY] = format_temperature(temperature)
    destination = Path(output) if output is not None else Path(source)
    # Write through a symbolic link to the file it names, keeping the link.
    destination = Path(os.path.realpath(destination)) if destination.is_symlink() else destination
    atomic_write(destination, header, updated_header(header, metadata))
    return destination


def atomic_write(destination: Path, header: Header, new_header: bytes) -> None:
    """Stream ``new_header`` + the source's data section into a temporary file, then rename it into place."""
    folder = destination.parent if str(destination.parent) else Path(".")
    if destination.exists() and destination.is_dir():
        raise TempcalError(f"{destination}: is a folder")
    if not folder.is_dir():
        raise TempcalError(f"{destination}: folder {folder} does not exist")
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{destination.name}.", suffix=".tmp")
    except OSError as exc:
        raise TempcalError(f"{destination}: cannot write in {folder} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "wb") as out, open(header.path, "rb") as src:
            if os.fstat(src.fileno()).st_size != header.file_size:
                raise TempcalError(f"{header.path}: changed while tempcal was reading it; nothing written")
            out.write(new_header)
            src.seek(header.data_start)
            shutil.copyfileobj(src, out, COPY_BLOCK)
            out.flush()
            os.fsync(out.fileno())
        mode = (destination if destination.exists() else header.path).stat().st_mode & 0o7777
        os.chmod(temporary, mode)
        os.replace(temporary, destination)
    except BaseException as exc:
        _remove_quietly(temporary)
        if isinstance(exc, OSError):
            raise TempcalError(f"{destination}: write failed ({exc.strerror or exc}); the file is unchanged") from None
        raise
    _fsync_folder(folder)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

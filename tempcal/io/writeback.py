"""Writing the fitted T into a safetensors file's metadata, atomically and without touching tensor bytes.

The old data section is copied byte for byte behind a new header (:mod:`tempcal.io.atomic`). The "source
unchanged" check and the rename run under an advisory ``flock`` on the source, so of concurrent write-backs the
first to rename wins and the others refuse, nothing written (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from ..errors import TempcalError
from ..validation import TEMPERATURE_KEY, format_temperature
from .atomic import atomic_path, destination_of
from .safetensors_header import FileStamp, Header, check_unchanged, record_stamp, recorded_stamp, reread_header

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks; the unchanged-source check still runs
    fcntl = None  # type: ignore[assignment]

COPY_BLOCK = 1 << 20
#: How long a write-back waits for another one's check-and-rename on the same file.
LOCK_WAIT_SECONDS = 30.0


def write_temperature(source: str | os.PathLike, temperature: float, output: str | os.PathLike | None = None,
                      *, expected: Header | None = None, metadata: Mapping[str, str | None] | None = None) -> Path:
    """Write ``temperature`` under ``tempcal.temperature`` into ``source`` (or a copy at ``output``); the path written.

    Other metadata is kept (``metadata`` entries set too, a None value removing its key), tensor bytes copied
    unchanged. Nothing is written when ``source`` changed (size, mtime or inode) since ``expected`` was read,
    by default since this process last read (:func:`tempcal.read_header`) or wrote it.
    """
    stamp = expected.stamp if expected is not None else recorded_stamp(source)
    check_unchanged(source, stamp)  # before parsing: "it changed" says more than "it is truncated"
    header = reread_header(source)
    if stamp is not None and stamp.change_to(header.stamp) is not None:
        check_unchanged(source, stamp)
    from .sidecar import updated_metadata

    kept = updated_metadata(header.metadata, metadata)
    kept[TEMPERATURE_KEY] = format_temperature(temperature)
    # SOURCE given as a link is the user's choice: T goes into the file it names. A link at ``output`` is refused.
    destination = destination_of(source) if output is None else Path(output)
    copy_with_header(destination, header, header.encoded(kept))
    return destination


def copy_with_header(destination: Path, header: Header, new_header: bytes) -> None:
    """Write ``new_header`` + the source's data section to ``destination`` atomically, under the source's lock;
    a new file gets SOURCE's mode plus the owner's write bit (a copy of a read-only source stays writable)."""
    mode = None if os.path.lexists(destination) else header.path.stat().st_mode & 0o7777 | 0o200
    with atomic_path(destination, what="", mode=mode,
                     guard=lambda: _unchanged_under_lock(header)) as temporary, \
            open(temporary, "wb") as out, open(header.path, "rb") as src:
        check_unchanged(header.path, header.stamp, since="tempcal read it")
        out.write(new_header)
        src.seek(header.data_start)
        shutil.copyfileobj(src, out, COPY_BLOCK)
        if out.tell() != len(new_header) + header.file_size - header.data_start:
            raise TempcalError(f"{header.path}: changed while tempcal was copying it (its size changed); "
                               "nothing written, run tempcal again")
        out.flush()
        written = os.fstat(out.fileno())
    record_stamp(destination, FileStamp.of(written))


@contextlib.contextmanager
def _unchanged_under_lock(header: Header) -> Iterator[None]:
    """Hold the source's write-back lock and check it is still the version read: another tempcal
    cannot rename between this check and our rename."""
    with open(header.path, "rb") as src:
        held = _acquire(src.fileno(), header.path)
        try:
            check_unchanged(header.path, header.stamp, since="tempcal read it")
            yield
        finally:
            if held:
                with contextlib.suppress(OSError):
                    fcntl.flock(src.fileno(), fcntl.LOCK_UN)


def _acquire(fd: int, path: Path) -> bool:
    """Wait (a bounded time) for the lock; False where locks are not available."""
    if fcntl is None:
        return False
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TempcalError(f"{path}: another tempcal has held its write-back lock for over "
                                   f"{LOCK_WAIT_SECONDS:g} s; nothing written") from None
            time.sleep(0.005)
        except OSError:  # no locks on this file system (some network mounts)
            return False


__all__ = ["write_temperature"]

"""Writing the fitted T into a safetensors file's metadata, atomically and without touching tensor bytes.

The new file is the old data section copied byte for byte behind a new header, written
to a temporary file in the destination folder, flushed and fsynced, then renamed over
the destination: a crash at any point leaves either the old file or the complete new one.

- Nothing is written when the source changed since it was read (other inode, size or
  mtime), or when the destination or its folder is read-only (no write permission, or
  no write bit at all: even root does not overwrite a file someone marked read-only).
- Concurrent write-backs of one file: the "source unchanged" check and the rename run
  under an advisory ``flock`` on the source, so the first to rename wins and every other
  one finds the file changed and refuses (exit 2), nothing written. Writers into the same
  ``--output`` from different sources: the last rename wins, the file is always complete.
- A failure Python sees (an exception, a full disk) removes the temporary file. One left
  by a killed process (``.NAME.tempcal-XXXX.tmp``, hidden, next to the destination) is
  removed by the next write-back into that folder once it is a minute old and no live
  writer holds its lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

from ..errors import TempcalError
from .safetensors_header import (
    TEMPERATURE_KEY,
    FileStamp,
    Header,
    check_unchanged,
    record_stamp,
    recorded_stamp,
    reread_header,
)

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks; the unchanged-source check still runs
    fcntl = None  # type: ignore[assignment]

COPY_BLOCK = 1 << 20
#: Temporary files are named ``.NAME.tempcal-XXXXXXXX.tmp`` (NAME cut to this many characters).
TEMP_TAG, TEMP_SUFFIX, TEMP_NAME_CHARS = ".tempcal-", ".tmp", 100
#: A temporary file older than this whose lock nobody holds was left by a killed write-back.
STALE_SECONDS = 60.0
#: How long a write-back waits for another one's check-and-rename on the same file.
LOCK_WAIT_SECONDS = 30.0


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


def write_temperature(source: str | os.PathLike, temperature: float, output: str | os.PathLike | None = None,
                      *, expected: Header | None = None) -> Path:
    """Write ``temperature`` under ``tempcal.temperature`` into ``source`` (or a copy at ``output``).

    Other metadata is kept and every tensor byte is copied unchanged. Returns the path written.
    ``expected`` is the header the fitted data was read with; by default, the version of
    ``source`` whose header this process last read (:func:`tempcal.read_header`, which every
    loader calls) or wrote. If ``source`` has changed since (size, mtime or inode), nothing is
    written and a :class:`TempcalError` says so; read it again to accept the new version.
    """
    stamp = expected.stamp if expected is not None else recorded_stamp(source)
    check_unchanged(source, stamp)  # before parsing: "it changed" says more than "it is truncated"
    header = reread_header(source)
    if stamp is not None and stamp.change_to(header.stamp) is not None:
        check_unchanged(source, stamp)
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
    _refuse_read_only(destination, folder)
    _sweep_stale_temporaries(folder, destination.name)
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{destination.name[:TEMP_NAME_CHARS]}{TEMP_TAG}",
                                         suffix=TEMP_SUFFIX)
    except OSError as exc:
        raise TempcalError(f"{destination}: cannot write in {folder} ({exc.strerror or exc})") from None
    try:
        _try_lock(fd)  # tells a later sweep that this temporary file is alive
        with os.fdopen(fd, "wb") as out, open(header.path, "rb") as src:
            check_unchanged(header.path, header.stamp, since="tempcal read it")
            out.write(new_header)
            src.seek(header.data_start)
            shutil.copyfileobj(src, out, COPY_BLOCK)
            if out.tell() != len(new_header) + header.file_size - header.data_start:
                raise TempcalError(f"{header.path}: changed while tempcal was copying it (its size changed); "
                                   "nothing written, run tempcal again")
            out.flush()
            os.fsync(out.fileno())
            _keep_owner_and_mode(out.fileno(), temporary, destination, header.path)
            written = os.fstat(out.fileno())
            with _locked(src.fileno(), header.path):
                # Under the lock another tempcal cannot rename between this check and our rename.
                check_unchanged(header.path, header.stamp, since="tempcal read it")
                os.replace(temporary, destination)
    except BaseException as exc:
        _remove_quietly(temporary)
        if isinstance(exc, OSError):
            raise TempcalError(f"{destination}: write failed ({exc.strerror or exc}); the file is unchanged") from None
        raise
    _fsync_folder(folder)
    record_stamp(destination, FileStamp.of(written))


def _refuse_read_only(destination: Path, folder: Path) -> None:
    """A read-only destination or folder is a clear error before anything is written.

    Write bits are checked as well as access: root may write anything, but a file or folder
    with no write bit at all was marked read-only on purpose.
    """
    for path, what in ((destination, "file"), (folder, "folder")):
        try:
            mode = path.stat().st_mode & 0o7777
        except OSError:
            continue  # a destination that does not exist yet
        where = f"{destination}" if what == "file" else f"{destination}: folder {folder}"
        if not mode & 0o222:
            raise TempcalError(f"{where} is read-only (mode {mode:04o}); nothing written")
        if not os.access(path, os.W_OK | (os.X_OK if what == "folder" else 0)):
            raise TempcalError(f"{where} is read-only for this user (mode {mode:04o}); nothing written")


def _keep_owner_and_mode(fd: int, temporary: str, destination: Path, source: Path) -> None:
    """The new file gets the replaced file's owner (where allowed) and permission bits.

    A new ``--output`` file gets SOURCE's bits plus the owner's write bit, so that a copy of a
    read-only source is not itself refused as read-only by the next write-back.
    """
    try:
        old = destination.stat()
    except OSError:
        old = None
    if old is not None and (old.st_uid, old.st_gid) != (os.fstat(fd).st_uid, os.fstat(fd).st_gid):
        with contextlib.suppress(OSError, AttributeError):
            os.fchown(fd, old.st_uid, old.st_gid)
    mode = old.st_mode & 0o7777 if old is not None else source.stat().st_mode & 0o7777 | 0o200
    os.chmod(temporary, mode)


@contextlib.contextmanager
def _locked(fd: int, path: Path):
    """Hold an exclusive advisory lock on ``fd`` (none where the file system has no locks)."""
    held = _acquire(fd, path)
    try:
        yield
    finally:
        if held:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)


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


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _sweep_stale_temporaries(folder: Path, name: str) -> None:
    """Remove temporary files that killed write-backs into ``folder/name`` left: old, and locked by nobody."""
    prefix = f".{name[:TEMP_NAME_CHARS]}{TEMP_TAG}"
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(TEMP_SUFFIX)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_file(follow_symlinks=False) or now - st.st_mtime < STALE_SECONDS:
                continue
            fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            same = os.fstat(fd).st_ino == st.st_ino
            if same and _try_lock(fd):
                os.unlink(entry.path)
        except OSError:
            pass
        finally:
            os.close(fd)


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

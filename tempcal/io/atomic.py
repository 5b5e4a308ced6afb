"""The one way tempcal writes a file: a temporary file beside the destination, fsynced, then renamed over it.

Every output goes through :func:`atomic_path`, so a crash leaves the old file or the complete new one
(docs/reliability.md). The temporary ``.NAME.tempcal-XXXXXXXX.tmp`` is locked while written, and one left by a
killed process is swept once a minute old; ``guard`` wraps the rename (write-back checks its source under it).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

from ..errors import TempcalError
from .paths import check_target

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks
    fcntl = None  # type: ignore[assignment]

#: Temporary files are named ``.NAME.tempcal-XXXXXXXX.tmp`` (NAME cut to this many characters).
TEMP_TAG, TEMP_SUFFIX, TEMP_NAME_CHARS = ".tempcal-", ".tmp", 100
#: A temporary file older than this whose lock nobody holds was left by a killed writer.
STALE_SECONDS = 60.0


def destination_of(path: str | os.PathLike) -> Path:
    """Where writing ``path`` goes when a link is followed: the file a symbolic link names, else ``path`` itself."""
    shown = Path(path)
    return Path(os.path.realpath(shown)) if shown.is_symlink() else shown


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, what: str = "output", mode: int | None = None,
                guard: Callable[[], AbstractContextManager[object]] | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it is fsynced and renamed over ``path``.

    ``mode`` defaults to the existing file's permissions, else ``open(path, "w")``'s. A destination that fails
    :func:`~tempcal.io.paths.check_target` is refused; on any failure the destination is untouched.
    """
    label = f"{what} {path}" if what else str(path)
    destination = check_target(path, label)
    folder = destination.parent if str(destination.parent) else Path(".")
    _sweep_stale_temporaries(folder, destination.name)
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=f".{destination.name[:TEMP_NAME_CHARS]}{TEMP_TAG}",
                                    suffix=TEMP_SUFFIX)
    except OSError as exc:
        raise TempcalError(f"{label}: cannot write in {folder} ({exc.strerror or exc})") from None
    temporary = Path(name)
    try:
        _try_lock(fd)  # tells a later sweep that this temporary file is alive
        yield temporary
        with open(temporary, "rb+") as f:
            os.fsync(f.fileno())
            _keep_owner(f.fileno(), destination)
        os.chmod(temporary, _mode_for(destination) if mode is None else mode)
        with guard() if guard is not None else contextlib.nullcontext():
            check_target(destination, label)  # nothing planted there (a link, a device) while we wrote
            os.replace(temporary, destination)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise TempcalError(f"{label}: cannot write ({exc.strerror or exc}); the file is unchanged") from None
        raise
    finally:
        os.close(fd)
    _fsync_folder(folder)


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], *, what: str = "output",
                 mode: int | None = None) -> Path:
    """Write via ``write(file)`` into ``path`` atomically (see :func:`atomic_path`); returns ``path``."""
    with atomic_path(path, what=what, mode=mode) as temporary, open(temporary, "wb") as f:
        write(f)
    return Path(path)


def write_bytes_atomic(path: str | os.PathLike, blob: bytes, *, what: str = "output") -> Path:
    """Write ``blob`` into ``path`` atomically."""
    return write_atomic(path, lambda f: f.write(blob), what=what)


def write_text_atomic(path: str | os.PathLike, text: str, *, what: str = "output") -> Path:
    """Write ``text`` (UTF-8) into ``path`` atomically."""
    return write_bytes_atomic(path, text.encode("utf-8"), what=what)


def _mode_for(path: Path) -> int:
    """An existing file's permissions, else what a plain ``open(path, "w")`` would give (0o666 less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _keep_owner(fd: int, destination: Path) -> None:
    """Give the new file the replaced file's owner and group, where this process may."""
    try:
        old = destination.stat()
    except OSError:
        return
    new = os.fstat(fd)
    if (old.st_uid, old.st_gid) != (new.st_uid, new.st_gid):
        with contextlib.suppress(OSError, AttributeError):
            os.fchown(fd, old.st_uid, old.st_gid)


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _sweep_stale_temporaries(folder: Path, name: str) -> None:
    """Remove temporary files that killed writers into ``folder/name`` left: old, and locked by nobody."""
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
            if os.fstat(fd).st_ino == st.st_ino and _try_lock(fd):
                os.unlink(entry.path)
        except OSError:
            pass
        finally:
            os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable where the platform allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["atomic_path", "destination_of", "write_atomic", "write_bytes_atomic",
           "write_text_atomic"]

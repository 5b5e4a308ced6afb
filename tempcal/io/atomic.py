"""Writing outputs (JSON, Markdown, plots, scores, models, sidecars) so that a crash never leaves a half-written file.

Every writer goes through :func:`atomic_path`: a temporary file in the destination's folder,
fsynced, given ordinary permissions, then renamed over the destination; on any failure the
temporary file is removed and the destination is untouched. (Write-back into a logits file adds
locking and change checks on top: :mod:`tempcal.io.writeback`.)
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import TempcalError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, what: str = "output", mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced and renamed over ``path``.

    A symbolic link is written through. ``mode`` defaults to the existing file's permissions,
    else what a plain ``open(path, "w")`` gives (0o666 less the umask).
    """
    shown = Path(path)
    label = f"{what} {shown}" if what else str(shown)
    destination = Path(os.path.realpath(shown)) if shown.is_symlink() else shown
    if destination.is_dir():
        raise TempcalError(f"{label}: is a folder")
    folder = destination.parent if str(destination.parent) else Path(".")
    if not folder.is_dir():
        raise TempcalError(f"{label}: folder {folder} does not exist")
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=f".{destination.name}.", suffix=".tmp")
    except OSError as exc:
        raise TempcalError(f"{label}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        with open(temporary, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(temporary, _mode_for(destination) if mode is None else mode)
        os.replace(temporary, destination)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise TempcalError(f"{label}: cannot write ({exc.strerror or exc}); nothing changed") from None
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the platform allows it
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], *, what: str = "output",
                 mode: int | None = None) -> Path:
    """Write via ``write(file)`` into ``path`` atomically (see :func:`atomic_path`); returns ``path``."""
    with atomic_path(path, what=what, mode=mode) as temporary, open(temporary, "wb") as f:
        write(f)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str, *, what: str = "output") -> Path:
    """Write ``text`` (UTF-8) into ``path`` atomically."""
    return write_atomic(path, lambda f: f.write(text.encode("utf-8")), what=what)


def _mode_for(path: Path) -> int:
    """An existing file's permissions, else what a plain ``open(path, "w")`` would give (0o666 less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask

"""Writing small text outputs (JSON, Markdown) so that a crash never leaves a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import TempcalError


def write_text_atomic(path: str | os.PathLike, text: str, *, what: str = "output") -> Path:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise TempcalError(f"{what} {path}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, _mode_for(path))
        os.replace(temporary, path)
    except BaseException as exc:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise TempcalError(f"{what} {path}: cannot write ({exc.strerror or exc})") from None
        raise
    return path


def _mode_for(path: Path) -> int:
    """An existing file's permissions, else what a plain ``open(path, "w")`` would give (0o666 less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask

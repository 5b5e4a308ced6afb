"""Where and how tempcal reads and writes a file: untrusted input read whole only as a regular file of bounded size
(:func:`read_regular`), the checks every output path passes, and :func:`atomic_path`, the one way a file is written."""

from __future__ import annotations

import contextlib
import glob
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

from ..errors import TempcalError

try:
    import fcntl
except ImportError:  # not POSIX: no advisory locks
    fcntl = None  # type: ignore[assignment]

#: Temporary files are named ``.NAME.tempcal-XXXXXXXX.tmp`` (NAME cut to this many characters).
TEMP_TAG, TEMP_SUFFIX, TEMP_NAME_CHARS = ".tempcal-", ".tmp", 100
#: A temporary file older than this whose lock nobody holds was left by a killed writer.
STALE_SECONDS = 60.0


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where the T of a file without metadata is kept: ``FILE.tempcal.json`` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".tempcal.json")


# -- reading an untrusted file ---------------------------------------------------------------------
#: ``O_NONBLOCK``: a FIFO or device put where the file was checked cannot make the open wait.
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


class BoundedReadError(Exception):
    """A file or text refused by a bound; the subclasses carry the details a message names."""


class NotRegularFile(BoundedReadError):
    """The path is a folder, a FIFO, a device or a socket; ``link`` is where it links to, if it is a link."""

    def __init__(self, path: str | os.PathLike[str], mode: int) -> None:
        self.mode = mode
        self.kind = "is a named pipe (FIFO)" if stat.S_ISFIFO(mode) else f"is a {kind_of(mode)}"
        self.link = os.readlink(os.fspath(path)) if os.path.islink(path) else None
        super().__init__(f"{path}: {self.kind}")


class TooLarge(BoundedReadError):
    """More than ``limit`` bytes: ``size`` as the file's status gave it, or, when it ``grew`` while being read,
    the bytes read (one past the limit)."""

    def __init__(self, size: int, limit: int, *, grew: bool = False) -> None:
        self.size, self.limit, self.grew = size, limit, grew
        super().__init__(self.size_text)

    @property
    def size_text(self) -> str:
        """"N bytes", or that it grew past the limit as it was read."""
        return f"more than {self.limit} bytes (it grew as it was read)" if self.grew else f"{self.size} bytes"


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path``, a regular file (checked before and after a non-blocking open: a device is never read)
    of at most ``limit`` bytes (one byte past it read, to notice a growing file); else ``BoundedReadError``."""
    _check_regular(os.stat(path), path, limit)
    with os.fdopen(os.open(path, READ_FLAGS), "rb") as f:
        _check_regular(os.fstat(f.fileno()), path, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(len(data), limit, grew=True)
    return data


def _check_regular(info: os.stat_result, path: str | os.PathLike, limit: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(path, info.st_mode)
    if info.st_size > limit:
        raise TooLarge(info.st_size, limit)


# -- writing a file --------------------------------------------------------------------------------
@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, what: str = "output", mode: int | None = None,
                guard: Callable[[], AbstractContextManager[object]] | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (checked by :func:`check_target`); when the block succeeds it is
    fsynced and renamed over ``path`` (``mode``: by default the old file's), else ``path`` is untouched."""
    label = f"{what} {path}" if what else str(path)
    destination = check_target(path, label)
    folder = destination.parent
    prefix = f".{destination.name[:TEMP_NAME_CHARS]}{TEMP_TAG}"
    _sweep_stale_temporaries(folder, prefix)
    import tempfile  # here: importing it (random, hashlib) would add 4 ms to every command's start, --help's too

    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=TEMP_SUFFIX)
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


def _sweep_stale_temporaries(folder: Path, prefix: str) -> None:
    """Remove the temporary files (named ``prefix...``) that killed writers left in ``folder``: old, and unlocked."""
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


#: What ``stat`` calls a file that is not a regular file or a folder, as messages name it.
_KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "named pipe"),
          (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symbolic link"))


def kind_of(mode: int) -> str:
    """A file type in words ("character device"); "regular file" and "folder" included."""
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISDIR(mode):
        return "folder"
    return next((name for test, name in _KINDS if test(mode)), "special file")


def check_folder(path: str | os.PathLike, label: str) -> Path:
    """A file can be created at ``path``: it is not a folder and its folder exists. Returns that folder."""
    path = Path(path)
    if path.is_dir():
        raise TempcalError(f"{label}: is a folder")
    folder = path.parent
    if not folder.is_dir():
        raise TempcalError(f"{label}: folder {folder} does not exist")
    return folder


def problem_with(path: str | os.PathLike) -> str | None:
    """Why a file may not be written at ``path`` (a phrase such as "is a character device"), or None."""
    try:
        check_target(path, "")
    except TempcalError as exc:
        return str(exc).removeprefix(": ").removesuffix("; nothing written")
    return None


def check_target(path: str | os.PathLike, label: str, *, follow_link: bool = False, hint: str = "") -> Path:
    """The file to write for ``path``: refuses a link (unless ``follow_link``: then the file it names), a folder,
    anything but a regular file, a missing folder, and a read-only file or folder. ``hint`` ends a refusal."""
    path = Path(path)
    check_name_length(path, label)
    if path.is_symlink():
        kind = _kind_named(path)
        if kind is not None:
            raise TempcalError(f"{label}: is a symbolic link to {os.readlink(path)}, a {kind}, not a regular file; "
                               f"tempcal only replaces regular files{hint}; nothing written")
        if not follow_link:
            missing = "" if path.exists() else " (which does not exist)"
            raise TempcalError(f"{label}: is a symbolic link to {os.readlink(path)}{missing}; tempcal does not write "
                               f"through a link it did not make: remove the link or name the file itself{hint}; "
                               "nothing written")
        path = Path(os.path.realpath(path))
    try:
        mode = path.lstat().st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise TempcalError(f"{label}: is a {kind_of(mode)}, not a regular file; tempcal only replaces regular "
                           f"files{hint}; nothing written")
    folder = check_folder(path, label)
    refuse_read_only(path, folder, label)
    return path


def check_name_length(path: Path, label: str) -> None:
    """The file's name and path fit the file system's limits (``NAME_MAX``, usually 255 bytes; ``PATH_MAX``): checked
    first, since any other look at a name too long fails with ENAMETOOLONG."""
    folder = path.parent
    for what, text, key, default in (("name", path.name, "PC_NAME_MAX", 255), ("path", str(path), "PC_PATH_MAX", 4096)):
        try:
            limit = os.pathconf(folder, key)
        except (OSError, ValueError, AttributeError):
            limit = default
        size = len(os.fsencode(text))
        if limit > 0 and size > limit:
            raise TempcalError(f"{label}: the file {what} is {size} bytes, more than the {limit} this file system "
                               "allows; nothing written")


def _kind_named(link: Path) -> str | None:
    """What a link finally names when that is neither a regular file, a folder nor nothing (a device, a pipe)."""
    try:
        mode = link.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else kind_of(mode)


def refuse_read_only(destination: Path, folder: Path, label: str) -> None:
    """A read-only destination or folder is an error before anything is written: no write access, or no write bit
    at all (marked read-only on purpose, which root respects too)."""
    for path, kind in ((destination, "file"), (folder, "folder")):
        try:
            mode = path.stat().st_mode & 0o7777
        except OSError:
            continue  # a destination that does not exist yet
        where = f"{label}: is" if kind == "file" else f"{label}: folder {folder} is"
        if not mode & 0o222:
            raise TempcalError(f"{where} read-only (mode {mode:04o}); nothing written")
        if not os.access(path, os.W_OK | (os.X_OK if kind == "folder" else 0)):
            raise TempcalError(f"{where} read-only for this user (mode {mode:04o}); nothing written")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """``a`` and ``b`` are one file: the same resolved path, or both exist with the same device and inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except OSError:
        return False


def is_pattern(text: str) -> bool:
    """``text`` is a glob pattern: it holds ``*``, ``?`` or ``[`` and names no file as it is written (a file
    called ``run[1].safetensors`` is that file, not a pattern matching ``run1.safetensors``)."""
    return any(ch in text for ch in "*?[") and not os.path.lexists(text)


def expand(paths: Iterable[str | os.PathLike | None], *, strict: bool = False) -> list[str]:
    """Paths with glob patterns expanded in sorted order: the one expander of SOURCE and input paths. A pattern
    matching nothing is left out (opening the files says so), or with ``strict`` an error."""
    found: list[str] = []
    for text in (str(path) for path in paths if path is not None):
        matches = sorted(glob.glob(text)) if is_pattern(text) else [text]
        if strict and not matches:
            raise TempcalError(f"{text}: no file matches this pattern")
        found.extend(matches)
    return found


def check_named_once(paths: Sequence[str | os.PathLike]) -> None:
    """No file is named twice among ``paths`` (the same path, a link or a hard link to it, a glob and the path):
    its rows would count twice, and copies of one row land on both sides of a split."""
    seen: dict[object, str] = {}
    for path in paths:
        try:
            st = os.stat(path)
            key: object = (st.st_dev, st.st_ino)
        except OSError:
            key = os.path.realpath(path)  # a missing file: opening it says so
        if key in seen:
            raise TempcalError(f"{path}: is {seen[key]} again (the same file named twice); name each file once")
        seen[key] = str(path)


def check_distinct(outputs: Sequence[tuple[str, str]], inputs: Sequence[tuple[str, str]], *,
                   appends: Iterable[str] = (), folders: Sequence[tuple[str, str]] = (),
                   writable: Iterable[str] = (), updates: Sequence[tuple[str, str]] = ()) -> None:
    """Every output (``(label, path)``; ``appends`` labels those appended to) is no input and no other output, and
    no output (but those ``writable``) nor any of ``updates`` lies in a model folder of ``folders``: else one line."""
    appending, allowed = set(appends), set(writable)
    members = [(option, folder, _members(folder)) for option, folder in folders]
    for label, path in updates:
        _refuse_inside(label, path, members)
    for k, (label, path) in enumerate(outputs):
        verb = "would append to" if label in appending else "would overwrite"
        if label not in allowed:
            _refuse_inside(label, path, members)
        for what, name in inputs:
            if same_file(path, name):
                raise TempcalError(f"{label} {path}: {verb} the input file {name} ({what}); give it a path of its "
                                   "own; nothing written")
        for other, name in outputs[:k]:
            if same_file(path, name):
                raise TempcalError(f"{label} {path}: is also the {other} output {name}; give each output a path "
                                   "of its own; nothing written")


#: Files of a model folder compared with each output (a model folder holds a few dozen).
MAX_MEMBERS = 10_000


def _members(folder: str) -> list[tuple[str, os.stat_result]]:
    """The files under ``folder`` (links followed to what they name), at most :data:`MAX_MEMBERS` of them."""
    found: list[tuple[str, os.stat_result]] = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            try:
                found.append((path, os.stat(path)))
            except OSError:
                continue
            if len(found) >= MAX_MEMBERS:
                return found
    return found


def _refuse_inside(label: str, path: str, members: Sequence[tuple[str, str, list[tuple[str, os.stat_result]]]]
                   ) -> None:
    """``path`` is not inside a model folder, nor one of its files under another name (a link, a hard link)."""
    try:
        mine: os.stat_result | None = os.stat(path)
    except OSError:
        mine = None
    real = Path(os.path.realpath(path))
    for option, folder, files in members:
        clash = (str(real) if real.is_relative_to(os.path.realpath(folder)) else
                 next((name for name, st in files if mine is not None and os.path.samestat(st, mine)), None))
        if clash is not None:
            raise TempcalError(f"{label} {path}: is {clash}, inside the model folder {folder} ({option}); tempcal "
                               "never changes a model's files (it writes only MODEL/tempcal.json, and "
                               "generation_config.json when asked): give a path outside it; nothing written")


__all__ = ["BoundedReadError", "NotRegularFile", "TooLarge", "atomic_path", "check_distinct", "check_folder",
           "check_named_once", "check_target", "expand", "is_pattern", "kind_of", "problem_with", "read_regular",
           "refuse_read_only", "same_file", "sidecar_path", "write_atomic", "write_bytes_atomic", "write_text_atomic"]

"""GitHub Actions: each command's Markdown summary appended to ``$GITHUB_STEP_SUMMARY`` in one ``write`` (commands
running side by side cannot interleave); a file that is no regular writable file gets a warning, not a byte."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from ..io.paths import problem_with

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def step_summary_path() -> str | None:
    """The file ``$GITHUB_STEP_SUMMARY`` names, or None when it is unset or empty."""
    return os.environ.get(STEP_SUMMARY_ENV) or None


def append_step_summary(summary: Callable[[], str], *, gate: str | None = None) -> str | None:
    """Append ``summary()`` (and the gate's failure) to the step summary file, when one is named; None, or a
    warning saying why nothing was appended (results and exit status do not depend on it)."""
    path = step_summary_path()
    if path is None:
        return None
    text = summary().rstrip("\n") + "\n"
    if gate:
        text += f"\n**Release gate failed:** {gate}.\n"
    data = (text + "\n").encode("utf-8")
    cannot = f"${STEP_SUMMARY_ENV} {path}: cannot open it to append the summary"
    problem = problem_with(path)
    if problem is not None:
        return f"{cannot} ({problem})"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        return f"{cannot} ({exc.strerror or exc})"
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced by something else since the check
        os.close(fd)
        return f"{cannot} (not a regular file)"
    try:
        done = os.write(fd, data)  # one write: with O_APPEND the section lands whole at the end of the file
        while done < len(data):  # a short write (a full disk, a signal) continues where it stopped
            done += os.write(fd, data[done:])
    except OSError as exc:
        return f"${STEP_SUMMARY_ENV} {path}: cannot append the summary ({exc.strerror or exc})"
    finally:
        os.close(fd)
    return None


__all__ = ["STEP_SUMMARY_ENV", "append_step_summary", "step_summary_path"]

"""GitHub Actions: each command's Markdown summary appended to the job's step summary.

GitHub Actions names a file in the environment variable ``GITHUB_STEP_SUMMARY``; whatever a step
appends there is shown on the run's summary page. ``fit``, ``report`` and ``ood`` append their
model-card section (the ``--markdown`` text, without the plot link, whose picture GitHub could not
show), and a line saying so when a release gate failed. The text goes in with one ``write`` on a
file opened for appending, so commands running side by side in one step cannot interleave their
sections, and nothing already in the file is touched. The file must be a regular file, not a
symbolic link, and writable (its mode, root included); otherwise a warning says why and nothing is
appended.
"""

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
    """Append ``summary()`` (and the gate's failure, if any) to the step summary file, when one is named.

    Returns None when done or when no file is named, else a warning saying why nothing was appended
    (the command's results and exit status do not depend on a summary page).
    """
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

"""What ``tempcal apply`` prints: what was written, at which T, from how many rows."""

from __future__ import annotations

from typing import Any


def apply_lines(result: Any) -> list[str]:
    """The console's lines for an ``ApplyResult`` (the CLI adds the line naming the file written)."""
    from ..workflows.apply import WHAT

    where = "stored" if result.tau_from == "stored" else "--tau"
    lines = [f"{result.source}: {result.rows} rows, {result.num_classes} classes; {WHAT[result.as_]} at "
             f"T = {result.temperature:.6g} ({where}): '{result.key}' "
             f"{result.shape} {result.dtype}" + (", labels copied" if result.labels else "")]
    if result.group_temperatures:
        shown = list(result.group_temperatures.items())[:10]  # in the groups' order
        more = len(result.group_temperatures) - len(shown)
        groups = ", ".join(f"{name}: {t:.4g}" for name, t in shown) + (f" and {more} more" if more > 0 else "")
        lines.append(f"per group of '{result.group_key}': T = {groups}")
    return lines


def print_apply(result: Any, console: Any) -> None:
    for line in apply_lines(result):
        console.print(line, soft_wrap=True, markup=False)


__all__ = ["apply_lines", "print_apply"]

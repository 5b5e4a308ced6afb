"""What ``tempcal apply`` prints: what was written, at which T, from how many rows."""

from __future__ import annotations

from typing import Any


def print_apply(result: Any, console: Any) -> None:
    """An ``ApplyResult`` on the console (the CLI adds the line naming the file written)."""
    from ..workflows.apply import WHAT

    copied = [name for name, done in (("labels", result.labels), (f"'{result.group_key}'", result.group_copied))
              if done]
    if result.group_temperatures:  # each row at its group's T: no one T to name first
        at = f"each row's group T (stored per group of '{result.group_key}')"
    else:
        at = f"T = {result.temperature:.6g} ({'stored' if result.tau_from == 'stored' else '--tau'})"
    lines = [f"{result.source}: {result.rows} rows, {result.num_classes} classes; {WHAT[result.as_]} at {at}: "
             f"'{result.key}' {result.shape} {result.dtype}" + (f", {' and '.join(copied)} copied" if copied else "")]
    if result.group_temperatures:
        shown = list(result.group_temperatures.items())[:10]  # in the groups' order
        more = len(result.group_temperatures) - len(shown)
        groups = ", ".join(f"{name}: {t:.4g}" for name, t in shown) + (f" and {more} more" if more > 0 else "")
        lines.append(f"T per group of '{result.group_key}': {groups} (the global T = {result.temperature:.6g} "
                     "for a group with none stored)")
    for line in lines:
        console.print(line, soft_wrap=True, markup=False)


__all__ = ["print_apply"]

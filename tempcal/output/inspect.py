"""What ``tempcal inspect`` prints (the tensors, the values and labels, the stored T, the sidecar, and hints) and what
``tempcal apply`` prints (what was written, at which T, from how many rows)."""

from __future__ import annotations

from typing import Any

from ..errors import for_cli


def tensors_table(tensors: list[dict[str, Any]], several_files: bool) -> Any:
    """One row per tensor: (its file,) name, shape, dtype and the role the options give it."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    for name in (["file"] if several_files else []) + ["tensor", "shape", "dtype", "read as"]:
        table.add_column(name, overflow="fold")
    for t in tensors:
        shape = "" if t["shape"] is None else str(t["shape"])
        table.add_row(*([t["file"]] if several_files else []), t["name"], shape, t["dtype"], t["role"] or "")
    return table


def values_line(sample: dict[str, Any] | None) -> str | None:
    """The first rows' values in words."""
    if sample is None:
        return None
    if not sample["sampled_rows"]:
        return "values: none (no rows)"
    rows = sample["sampled_rows"]
    which = f"all {rows} rows" if rows == sample["total_rows"] else f"the first {rows} of {sample['total_rows']} rows"
    looks = sample["looks_like"] or "invalid (NaN or +inf)"
    low, high = sample["min"], sample["max"]
    span = "" if low is None else f", finite values from {low:.6g} to {high:.6g}"
    odd = [f"{sample[k]} {label}" for k, label in (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf"))
           if sample[k]]
    return f"values: look like {looks} ({which}{span}{'; ' + ', '.join(odd) if odd else ''})"


def labels_line(labels: dict[str, Any] | None, num_classes: int | None) -> str | None:
    if labels is None:
        return None
    if not labels["present"]:
        return f"labels: none ('{labels['key']}' absent)"
    spread = "none" if labels["min"] is None else f"{labels['min']}..{labels['max']}"
    text = f"labels '{labels['key']}': {spread}, {labels['distinct']} distinct of {num_classes} classes"
    if labels["ignored"]:
        text += f"; {labels['ignored']} rows ignored (label {labels['ignore_index']})"
    if labels["out_of_range"]:
        text += f"; {labels['out_of_range']} outside 0..{(num_classes or 0) - 1}"
    return text


def stored_lines(stored: dict[str, Any], sidecar: dict[str, Any] | None) -> list[str]:
    """The stored T, how it was fitted, and the sidecar's state."""
    where = {"metadata": "in the metadata", "sidecar": "in the sidecar", "model": "in the model"}[stored["where"]]
    t = stored.get("temperature")
    if t is not None:
        line = f"stored T = {t!r} {where}"
    elif stored.get("recorded") is not None:
        line = f"stored T = {stored['recorded']!r} {where}, ignored: {stored.get('ignored')}"
    else:
        line = f"stored T: none {where}"
    how = []
    if stored.get("probs"):
        how.append("on probabilities (--probs: later commands read log p)")
    if stored.get("lm_eval_norm"):
        how.append(f"with --lm-eval-norm {stored['lm_eval_norm']}")
    for key in ("logits_key", "labels_key"):
        if stored.get(key):
            how.append(f"--{key.replace('_', '-')} {stored[key]}")
    if how:
        line += "; fitted " + ", ".join(how)
    lines = [line]
    if stored.get("group_temperatures"):
        groups = stored["group_temperatures"]
        lines.append(f"per-group T by '{stored['group_key']}' ({len(groups)} groups): {first_groups(groups)}")
    if sidecar is not None:
        detail = f" ({sidecar['detail']})" if sidecar["detail"] else ""
        lines.append(f"sidecar {sidecar['path']}: {sidecar['state']}{detail}")
    return lines


def print_inspect(report: Any, console: Any) -> None:
    """The report on the console, every text as the command line spells options."""
    data = report.to_json()

    def say(text: str) -> None:
        console.print(text, soft_wrap=True, markup=False)

    size = f", {data['rows']} rows x {data['num_classes']} classes" if data["rows"] is not None else ""
    say(f"{data['source']}: {data['kind_name']}{size}{' (one binary logit)' if data['binary'] else ''}")
    if data["tensors"]:
        console.print(tensors_table(data["tensors"], len({t["file"] for t in data["tensors"]}) > 1))
    details = data["details"]
    for detail in details if isinstance(details, list) else []:
        if "summary" in detail:  # a kind that words its own line
            say(f"{detail['file']}: {detail['summary']}")
            continue
        counts = ", ".join(f"{v} x {k}" for k, v in detail["choice_counts"].items())
        say(f"{detail['file']}: task {detail['task']}, {detail['records']} records ({counts} choices)")
        left = {reason: n for reason, n in detail.get("rows_incomplete", {}).items() if n}
        if left:
            said = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in left.items())
            say(f"  {sum(left.values())} more left out as incomplete: {said}")
    lines = [f"format: {details['format']}" if isinstance(details, dict) and details.get("format") else None,
             details["summary"] if isinstance(details, dict) and details.get("summary") else None,
             values_line(data["values"]), labels_line(data["labels"], data["num_classes"]),
             *stored_lines(data["stored"], data["sidecar"])]
    lines += [f"problem: {for_cli(p)}" for p in report.problems]
    lines += [f"hint: {for_cli(h)}" for h in report.hints]
    for line in lines:
        if line:
            say(line)


def first_groups(temperatures: dict[str, float]) -> str:
    """The first ten groups' T, in the groups' order, and how many more there are."""
    more = len(temperatures) - 10
    shown = ", ".join(f"{name}: {t:.4g}" for name, t in list(temperatures.items())[:10])
    return shown + (f" and {more} more" if more > 0 else "")


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
        lines.append(f"T per group of '{result.group_key}': {first_groups(result.group_temperatures)} (the global T = "
                     f"{result.temperature:.6g} for a group with none stored)")
    for line in lines:
        console.print(line, soft_wrap=True, markup=False)


__all__ = ["print_apply", "print_inspect"]

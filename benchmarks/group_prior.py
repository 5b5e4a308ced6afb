"""Which ``--group-prior`` to default to: out-of-fold NLL per group at several priors.

For each prior, ``fit --folds 5 --group-by`` fits every group's T on its rows outside each fold (drawn toward
that fold's global T) and reports each group's NLL on its rows inside the fold, each at its own T_g,k: the
NLL a group would see on new rows. The same fits give the NLL at the global T (``after_global``, also out of
fold), the limit of an infinite prior. Suites:

* synthetic, homogeneous: every group miscalibrated alike (one true T), sizes 20 to 1,000 rows: any
  per-group T fits noise, so a prior can only help;
* synthetic, heterogeneous: each group's true T differs (log-normal, sigma 0.3 around the global one):
  large groups gain from their own T, small ones still risk fitting noise;
* lm-eval logs as the tests write them (``tests/lm_eval_logs.py``: tasks of 20 to 200 multiple-choice
  records, each overconfident by its own factor), grouped by ``task``.

Printed: the mean out-of-fold NLL per group size (synthetic) or per task (logs) at each prior, less the NLL at
the global T (negative: the per-group T helps). Seeds are averaged.

Run: ``python benchmarks/group_prior.py [--seeds 3] [--results benchmarks/results/group_prior.md]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _machine import machine_lines

PRIORS = (0.0, 1.0, 3.0, 10.0, 20.0, 50.0, 200.0)
SIZES = (20,) * 8 + (50,) * 4 + (200,) * 2 + (1000,)
TASKS = (("arc_easy", 200, 1.5), ("hellaswag", 120, 2.5), ("piqa", 60, 3.5), ("boolq", 40, 2.0), ("copa", 20, 4.0))


def synthetic(folder: Path, seed: int, spread: float) -> Path:
    """Groups of :data:`SIZES` rows, 4 classes, each overconfident by 2 * exp(spread * N(0, 1))."""
    g = torch.Generator().manual_seed(seed)
    zs, ys, gs = [], [], []
    for k, n in enumerate(SIZES):
        base = torch.randn(n, 4, generator=g, dtype=torch.float64) * 1.5
        ys.append(torch.multinomial(torch.softmax(base, 1), 1, generator=g)[:, 0])
        scale = 2.0 * float(torch.exp(spread * torch.randn(1, generator=g, dtype=torch.float64)))
        zs.append((base * scale).float())
        gs.append(torch.full((n,), k))
    path = folder / f"suite-{seed}-{spread}.safetensors"
    save_file({"logits": torch.cat(zs), "labels": torch.cat(ys), "group": torch.cat(gs)}, str(path))
    return path


def logs(folder: Path, seed: int) -> list[Path]:
    """One lm-eval log per task of :data:`TASKS`, written as the tests write them."""
    from lm_eval_logs import random_mc_records, write_log

    paths = []
    for j, (task, n, temperature) in enumerate(TASKS):
        records, _, _ = random_mc_records(n, seed=100 * seed + j, temperature=temperature)
        sub = folder / f"logs-{seed}"
        sub.mkdir(exist_ok=True)
        paths.append(write_log(sub / f"samples_{task}_2024-09-05T12-34-56.789012.jsonl", records))
    return paths


def gains(source, key: str, by_size: bool) -> dict[float, dict[str, float]]:
    """Per prior: mean (out-of-fold NLL at T_g - at the global T) per group size or task."""
    from tempcal.workflows.fit import fit_file

    out: dict[float, dict[str, float]] = {}
    for lam in PRIORS:
        report = fit_file(source, folds=5, group_by=key, group_prior=lam, device="cpu")
        cells: dict[str, list[float]] = defaultdict(list)
        for g in report.subsets.groups:
            label = str(g.n_eval) if by_size else g.group
            cells[label].append(g.after.nll - g.after_global.nll)
        out[lam] = {label: float(np.mean(v)) for label, v in cells.items()}
    return out


def averaged(runs: list[dict[float, dict[str, float]]]) -> dict[float, dict[str, float]]:
    return {lam: {label: float(np.mean([r[lam][label] for r in runs])) for label in runs[0][lam]} for lam in PRIORS}


def table(title: str, result: dict[float, dict[str, float]], order: list[str]) -> list[str]:
    lines = [f"### {title}", "", "| prior | " + " | ".join(order) + " |", "|---" * (len(order) + 1) + "|"]
    for lam in PRIORS:
        lines.append(f"| {lam:g} | " + " | ".join(f"{result[lam][label]:+.4f}" for label in order) + " |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=None)
    args = parser.parse_args()
    lines = [*machine_lines(), "", "Mean out-of-fold NLL per group at its own T, less the NLL at the global T "
             "(both out of fold; negative = the per-group T helps), averaged over groups of a size (rows) and "
             f"{args.seeds} seeds.", ""]
    sizes = [str(s) for s in sorted(set(SIZES))]
    with tempfile.TemporaryDirectory(prefix="tempcal-prior-") as tmp:
        folder = Path(tmp)
        for spread, name in ((0.0, "homogeneous (one true T)"), (0.3, "heterogeneous (true T per group, sigma 0.3)")):
            runs = [gains(str(synthetic(folder, s, spread)), "group", True) for s in range(args.seeds)]
            lines += table(f"synthetic, {name}", averaged(runs), sizes)
        runs = [gains([str(p) for p in logs(folder, s)], "task", False) for s in range(args.seeds)]
        lines += table("lm-eval logs as the tests write them, by task (rows: " +
                       ", ".join(f"{t} {n}" for t, n, _ in TASKS) + ")", averaged(runs), [t for t, _, _ in TASKS])
    text = "\n".join(lines)
    print(text)
    if args.results:
        command = "python benchmarks/group_prior.py " + " ".join(sys.argv[1:])
        args.results.write_text(f"# benchmarks/group_prior.py\n\nCommand: `{command.strip()}`\n\n```\n"
                                + "\n".join(lines[:3]) + "\n```\n\n" + "\n".join(lines[4:]) + "\n")


if __name__ == "__main__":
    main()

"""``tempcal ood`` speed: all five scores at 10 taus against the MSP-only run of today, in the same run.

    python benchmarks/ood_speed.py [--id 50000] [--ood 50000] [--classes 1000] [--rounds 5] [--threads N]

Data: seeded float32 logits in memory, ``--id`` in-distribution rows (a clear winning class) and
``--ood`` flatter OOD rows, ``--classes`` wide; 10 temperatures (0.5 ... 1000). Both sides are
validated once (``tempcal.Scan``, the same for every variant, timed apart). Then, per round, the
variants take turns (a busy moment on a shared machine slows them alike):

* ``today``: the scores-only pass tempcal shipped before every score was computed at once, MSP alone
  (per chunk ``d = z - max z``; per tau ``s0 = sum exp(beta d)``, ``msp = 1 / s0``: a copy of its loop),
  then its figures for the 10 rows (scikit-learn's ``roc_auc_score`` and two ``average_precision_score``
  calls, the FPR95 partition), as ``tempcal ood --score msp`` ran;
* ``all``: ``scan_scores`` with msp, energy, maxlogit, entropy and GEN (gamma 0.1, M 100) at the same
  10 taus, one read of each chunk, then ``detection_metrics`` (one sort per row) for the 50 rows;
* ``msp``: ``scan_scores`` with MSP alone, and its 10 rows (for reference).

Reported: each variant's median over the rounds of the scores pass, of the figures, and of both
(the run), in wall-clock and in process CPU time, and the ratios ``all / today``. The target is
``all / today <= 3`` for the run. On a shared machine, the CPU time with ``--threads 1`` is the
steadiest measure of the work (wall time counts waiting for a core; with several threads, CPU time
also counts OpenMP threads spinning). ``--results PATH`` writes the table as Markdown (``-``: none).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import RESULTS, load_average, machine_lines, markdown_table, text_table

import tempcal
from tempcal.core.scan import Scan
from tempcal.metrics.detection import detection_metrics, fpr_at_recall
from tempcal.scores.engine import scan_scores

TAUS = [0.5, 1.0, 1.5, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 1000.0]
ALL = ["msp", "energy", "maxlogit", "entropy", "gen"]


def make(n_id: int, n_ood: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z_id = 2 * torch.randn(n_id, classes, generator=g)
    z_id[torch.arange(n_id), torch.randint(0, classes, (n_id,), generator=g)] += 6
    return z_id, 1.5 * torch.randn(n_ood, classes, generator=g)


def today_pass(scan: Scan, betas: list[float]) -> list[np.ndarray]:
    """MSP at every beta as the scores-only pass computed it before (one read of each chunk, 1 / s0)."""
    parts: list[list[torch.Tensor]] = [[] for _ in betas]
    for at, z, _ in scan.data.chunks(scan.chunk_rows, scan.device, scan.compute_dtype):
        row_max = scan.stats.row_max[at:at + z.shape[0]]
        d = torch.sub(z, row_max[:, None], out=scan.scratch.like("d", z))
        for k, beta in enumerate(betas):
            s0 = torch.mul(d, beta, out=scan.scratch.like("e", z)).exp_().sum(1)
            parts[k].append(s0.reciprocal().to(torch.float64))
    return [torch.cat(p).numpy() for p in parts]


def today_figures(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple[float, ...]:
    """The figures of one row as scikit-learn gave them before (AUROC, AUPR-In, AUPR-Out, FPR95)."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    is_id = np.concatenate([np.ones(id_scores.size, dtype=np.int8), np.zeros(ood_scores.size, dtype=np.int8)])
    values = np.concatenate([id_scores, ood_scores])
    return (roc_auc_score(is_id, values), average_precision_score(is_id, values),
            average_precision_score(1 - is_id, -values), fpr_at_recall(id_scores, ood_scores)[0])


def run_today(scans: list[Scan], betas: list[float]) -> tuple[float, float, float, float]:
    """(pass wall, pass cpu, figures wall, figures cpu) of the MSP-only run of today."""
    wall, cpu = time.perf_counter(), time.process_time()
    scores = [today_pass(scan, betas) for scan in scans]
    pass_wall, pass_cpu = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    for k in range(len(betas)):
        today_figures(scores[0][k], scores[1][k])
    return pass_wall, pass_cpu, time.perf_counter() - wall, time.process_time() - cpu


def run_ours(scans: list[Scan], betas: list[float], names: list[str]) -> tuple[float, float, float, float]:
    """(pass wall, pass cpu, figures wall, figures cpu) of scan_scores and detection_metrics for ``names``."""
    wall, cpu = time.perf_counter(), time.process_time()
    scores = [scan_scores(scan, betas, names) for scan in scans]
    pass_wall, pass_cpu = time.perf_counter() - wall, time.process_time() - cpu
    wall, cpu = time.perf_counter(), time.process_time()
    for name in names:
        for k in range(len(betas)):
            detection_metrics(scores[0][k][name].numpy(), scores[1][k][name].numpy())
    return pass_wall, pass_cpu, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", type=int, default=50000, help="in-distribution rows")
    parser.add_argument("--ood", type=int, default=50000, help="OOD rows")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--results", default=str(RESULTS / "ood_speed.md"), help="Markdown results file, '-': none")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    z_id, z_ood = make(args.id, args.ood, args.classes)
    betas = [1.0 / tau for tau in TAUS]
    start = time.perf_counter()
    scans = [Scan(tempcal.as_logits_data(z, torch.zeros(z.shape[0], dtype=torch.int64)), device="cpu",
                  labelled=False) for z in (z_id, z_ood)]
    validate_s = time.perf_counter() - start
    variants = {"today": lambda: run_today(scans, betas), "msp": lambda: run_ours(scans, betas, ["msp"]),
                "all": lambda: run_ours(scans, betas, ALL)}
    for run in variants.values():  # warm-up: buffers, thread pool, imports
        run()
    times: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in variants}
    loads = []
    for _ in range(args.rounds):
        for name, run in variants.items():
            times[name].append(run())
        loads.append(load_average())
    describe = (f"{args.id:,} ID + {args.ood:,} OOD rows x {args.classes:,} classes, float32 ({scans[0].compute_dtype} "
                f"compute), {len(TAUS)} taus, {scans[0].chunk_rows} rows per chunk, {torch.get_num_threads()} torch "
                f"threads; median of {args.rounds} interleaved rounds (load average {min(loads):.1f}-{max(loads):.1f});"
                f" validating both sides once: {validate_s:.2f} s")
    header = ["variant", "rows", "pass wall s", "figures wall s", "run wall s", "pass cpu s", "figures cpu s",
              "run cpu s", "run wall / today", "run cpu / today"]
    median = {name: [statistics.median(t[i] for t in runs) for i in range(4)] for name, runs in times.items()}
    run_wall = {name: statistics.median(t[0] + t[2] for t in runs) for name, runs in times.items()}
    run_cpu = {name: statistics.median(t[1] + t[3] for t in runs) for name, runs in times.items()}
    rows = []
    for name in variants:
        pass_wall, pass_cpu, fig_wall, fig_cpu = median[name]
        count = len(TAUS) * (len(ALL) if name == "all" else 1)
        rows.append([name, str(count), f"{pass_wall:.2f}", f"{fig_wall:.2f}", f"{run_wall[name]:.2f}",
                     f"{pass_cpu:.2f}", f"{fig_cpu:.2f}", f"{run_cpu[name]:.2f}",
                     f"{run_wall[name] / run_wall['today']:.2f}x", f"{run_cpu[name] / run_cpu['today']:.2f}x"])
    pass_ratio = median["all"][0] / median["today"][0]
    verdict = (f"all five scores at {len(TAUS)} taus: run {run_wall['all'] / run_wall['today']:.2f}x today's MSP-only "
               f"run in wall time, {run_cpu['all'] / run_cpu['today']:.2f}x in CPU time (target <= 3x); the scores "
               f"pass alone {pass_ratio:.2f}x (wall)")
    print(describe)
    print(text_table(header, rows))
    print(verdict)
    if args.results != "-":
        lines = ["# `tempcal ood` speed: all five scores against the MSP-only run of today", "",
                 "Written by `benchmarks/ood_speed.py " + " ".join(sys.argv[1:]) + "`.", "",
                 *[f"- {line.split(' (')[0]}" for line in machine_lines()], f"- torch {torch.__version__}, tempcal "
                 f"{tempcal.__version__}", "", describe + ".", "", markdown_table(header, rows), "", verdict + ".", ""]
        Path(args.results).write_text("\n".join(lines))
        print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

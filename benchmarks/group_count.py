"""``--group-by`` against the number of groups: ``fit``, ``report`` and ``ood`` with 10,000 to 100,000 groups.

Each command runs in a fresh process (``python -m tempcal ... --json -``) on seeded logits of 4 rows a group
(10 classes), so the rows grow with the groups; the ratio of each time to the smallest count's, divided by
the ratio of the counts, is about 1 when the work is linear in the groups (and 10 at 100,000 against 10,000
when it is quadratic). ``--checkout PATH`` times another checkout of tempcal (an older one) the same way.

Run: ``python benchmarks/group_count.py [--groups 10000,40000,100000] [--checkout ../tempcal-old] [--commands ood]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROWS_PER_GROUP = 4
CLASSES = 10


def write(folder: Path, groups: int) -> tuple[Path, Path]:
    g = torch.Generator().manual_seed(groups)
    n = groups * ROWS_PER_GROUP
    z = torch.randn(n, CLASSES, generator=g) * 2
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g)[:, 0]
    source, ood = folder / f"id-{groups}.safetensors", folder / f"ood-{groups}.safetensors"
    save_file({"logits": z, "labels": y, "group": torch.arange(n) % groups}, str(source))
    save_file({"logits": torch.randn(n // 2, CLASSES, generator=g)}, str(ood))
    return source, ood


def timed(checkout: Path, argv: list[str], scratch: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    began = time.perf_counter()  # run in the scratch folder: ``-m`` puts the working folder first on the path
    done = subprocess.run([sys.executable, "-m", "tempcal", *argv, "--json", "-"], env=env, capture_output=True,
                          text=True, cwd=scratch)
    seconds = time.perf_counter() - began
    if done.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="10000,40000,100000")
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--commands", default="fit,report,ood", help="a comma-separated subset of fit,report,ood")
    args = parser.parse_args()
    counts = [int(c) for c in args.groups.split(",")]
    print(f"checkout {args.checkout}; {ROWS_PER_GROUP} rows a group, {CLASSES} classes")
    print("| command | " + " | ".join(f"{c:,} groups (s)" for c in counts) + " | time ratio / count ratio |")
    print("|---|" + "---|" * (len(counts) + 1))
    with tempfile.TemporaryDirectory() as scratch:
        files = {c: write(Path(scratch), c) for c in counts}
        commands = {"fit": lambda s, o: ["fit", str(s), "--group-by", "group", "--no-write"],
                    "report": lambda s, o: ["report", str(s), "--group-by", "group", "--tau", "1.5"],
                    "ood": lambda s, o: ["ood", str(s), "--ood", str(o), "--group-by", "group", "--tau", "1.5"]}
        for name in args.commands.split(","):
            argv = commands[name]
            seconds = [timed(args.checkout, argv(*files[c]), scratch) for c in counts]
            ratio = (seconds[-1] / seconds[0]) / (counts[-1] / counts[0])
            print(f"| {name} | " + " | ".join(f"{s:.1f}" for s in seconds) + f" | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()

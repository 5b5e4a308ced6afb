"""What the benchmark scripts share: a description of the machine, a wait for a quiet CPU, and table rendering."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load_average() -> float:
    """The 1-minute load average."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    total = sum(values)
    return total - values[3] - values[4], total  # idle and iowait are not busy


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def busy_cores(seconds: float = 2.0) -> float:
    """Cores kept busy over a short window, from /proc/stat.

    Called while this script idles between timed runs, so it measures other jobs. The
    1-minute load average lags: it still counts the previous contender for a minute after.
    """

    busy0, total0 = cpu_jiffies()
    time.sleep(seconds)
    busy1, total1 = cpu_jiffies()
    return (os.cpu_count() or 1) * (busy1 - busy0) / max(1, total1 - total0)


class QuietGate:
    """Waits before a timed run while other jobs keep more than ``max_busy`` cores busy, within a total budget."""

    def __init__(self, max_busy: float, budget_s: float, pause_s: float = 30.0):
        self.max_busy, self.budget_s, self.pause_s = max_busy, budget_s, pause_s
        self.waited_s = 0.0

    def wait(self) -> tuple[float, float]:
        """Block until quiet (or the wait budget is spent); return (1-minute load average, busy cores) then."""
        busy = busy_cores()
        while busy > self.max_busy and self.waited_s < self.budget_s:
            pause = min(self.pause_s, self.budget_s - self.waited_s)
            print(f"  (other jobs keep {busy:.1f} cores busy, load {load_average():.2f}: waiting {pause:.0f} s)",
                  flush=True)
            time.sleep(pause)
            self.waited_s += pause
            busy = busy_cores()
        return load_average(), busy


def machine_lines(python: str = sys.executable) -> list[str]:
    """Date, CPU, cores, memory, OS and the interpreter the contenders run in."""
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        memory_gib = int(f.readline().split()[1]) / 2**20
    version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True).stdout.strip()
    return [f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            f"machine: {cpu}, {os.cpu_count()} cores, {memory_gib:.0f} GiB memory, "
            f"{platform.system()} {platform.release()}",
            f"python: {version} ({Path(python).parent.parent.name}/bin/{Path(python).name})"]


def package_versions(python: str, names: list[str]) -> dict[str, str]:
    """Installed versions of ``names`` in the interpreter ``python`` ("-" when absent)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return '-'\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    import json

    out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain aligned table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured Markdown table, numbers right-aligned."""
    cells = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
    align = ["---"] + ["---:"] * (len(header) - 1)
    return "\n".join("| " + " | ".join(r) + " |" for r in [cells[0], align, *cells[1:]])

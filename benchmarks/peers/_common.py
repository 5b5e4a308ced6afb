"""Shared plumbing of the contender runners: load the cached logits, time the fit alone, report JSON lines.

Each runner is started by ``fit_vs_peers.py`` in a fresh interpreter and prints one JSON object
per line on standard output: ``loaded`` once the data is in memory, ``run`` after every timed
fit, then ``result`` (or ``skip`` with the reason when the tool cannot be imported).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Contender:
    """A tool ready to fit: ``fit(inputs)`` returns (T, passes or None); ``prepare`` builds its inputs untimed."""

    tool: str
    version: str
    fit: Callable[[Any], tuple[float, int | None]]
    prepare: Callable[[Any, Any, str], Any] = lambda logits, labels, device: (logits.to(device), labels.to(device))
    notes: list[str] = field(default_factory=list)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def rss_mb() -> float:
    """Resident memory now (MiB), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """The high-water resident memory (MiB) of this process since :func:`reset_peak_rss`.

    ``VmHWM`` from /proc/self/status, which the reset clears. ``ru_maxrss`` (the fallback) is
    not cleared by it and, on Linux, also counts the resident size the parent had when this
    interpreter was started (the kernel carries the pre-exec high-water mark over).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Reset the high-water mark (Linux >= 4.0), so the peak covers the fits but not the untimed preparation."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def import_without_package_init(module: str, bare: list[str]) -> types.ModuleType:
    """Import ``module`` from its installed files while skipping the ``__init__`` of the packages in ``bare``.

    Used when a package's ``__init__`` pulls in something unrelated to temperature scaling that
    cannot load here (torch-uncertainty and pytorch-ood import torchvision, whose PyPI wheel is
    linked against CUDA torch). The fitting code that runs is the installed, unmodified source.
    """
    for name in bare:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(f"no package {name}")
        package = types.ModuleType(name)
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules[name] = package
    return importlib.import_module(module)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def run(load: Callable[[argparse.Namespace], Contender], extra_args: Callable[[argparse.ArgumentParser], None]
        | None = None) -> None:
    """Parse the runner's arguments, load the tool (or report a skip), load the data, time ``repeats`` fits."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, type=Path, help="folder with logits.npy and labels.npy")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    if extra_args is not None:
        extra_args(parser)
    args = parser.parse_args()
    try:
        contender = load(args)
    except Exception as error:  # any import failure of a peer is a skip with its reason, not a crash
        emit("skip", reason=f"{type(error).__name__}: {error}".splitlines()[0][:300])
        return

    import numpy as np
    import torch

    logits = torch.from_numpy(np.load(args.data / "logits.npy"))
    labels = torch.from_numpy(np.load(args.data / "labels.npy"))
    inputs = contender.prepare(logits, labels, args.device)
    del logits, labels
    synchronize(args.device)
    if not reset_peak_rss():
        contender.notes.append("peak RSS includes the untimed input preparation (clear_refs not writable)")
    emit("loaded", rss_mb=rss_mb(), threads=torch.get_num_threads())
    temperature, passes, times = float("nan"), None, []
    for _ in range(args.repeats):
        synchronize(args.device)
        start = time.perf_counter()
        temperature, passes = contender.fit(inputs)
        synchronize(args.device)
        times.append(time.perf_counter() - start)
        emit("run", seconds=times[-1])
    emit("result", tool=contender.tool, version=contender.version, temperature=float(temperature),
         passes=passes, times=times, peak_rss_mb=peak_rss_mb(), notes=contender.notes)

"""Which ``tempcal`` modules a command runs: the distinct modules whose functions were called, and their count.

Runs one CLI command in this process under :func:`sys.setprofile` and lists every ``tempcal.*`` module with at least
one function called while the command ran; what runs while a module is imported (its body, its decorators) is not
counted, as it is not the command's work.
``--demo DIR`` first writes a grouped data set, ``DIR/grouped.safetensors`` (400 rows, 5 classes, an integer
``domain`` tensor of three groups), for commands such as ``fit DATA --folds 5 --group-by domain``; ``DATA`` in the
command is replaced by its path.

    python tools/trace_modules.py --demo /tmp/trace fit DATA --folds 5 --group-by domain --no-write

Each module is listed with its lines. The last lines say, per layer of ``tests/test_layers.py``, how many lines the
traced modules hold and the fewest modules of at most :data:`MODULE_LINES` lines that could hold them (a module may
not import from a layer above its own, so modules of two layers cannot merge): a floor on the count for this code.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import math
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

#: The most lines a module may hold (``structure.py``'s limit).
MODULE_LINES = 500
ROOT = Path(__file__).resolve().parent.parent


def module_lines(name: str) -> int:
    """The lines of module ``name`` (``tempcal.x.y``) in this checkout."""
    path = ROOT.joinpath(*name.split("."))
    return len((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text().splitlines())


def layer_floor(names: list[str]) -> list[tuple[int, int, int, int]]:
    """Per layer: (layer, traced modules, their lines, the fewest modules of ``MODULE_LINES`` that hold them)."""
    spec = importlib.util.spec_from_file_location("test_layers", ROOT / "tests" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    found: dict[int, list[int]] = {}
    for name in names:
        found.setdefault(layers._layer(name), []).append(module_lines(name))
    return [(layer, len(sizes), sum(sizes), math.ceil(sum(sizes) / MODULE_LINES))
            for layer, sizes in sorted(found.items())]


def write_demo(folder: Path) -> Path:
    """A miscalibrated grouped data set: logits scaled per group, so each group has its own T."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(3)
    rows, classes = 400, 5
    labels = torch.randint(0, classes, (rows,), generator=generator)
    logits = torch.randn(rows, classes, generator=generator)
    logits[torch.arange(rows), labels] += 2.0
    domain = torch.arange(rows, dtype=torch.int64) % 3 * 100
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "grouped.safetensors"
    save_file({"logits": logits * 2.0 * (1 + domain[:, None] / 200), "labels": labels, "domain": domain}, str(path))
    return path


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an import (a decorator or a table built as a module loads)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def trace(command: list[str]) -> tuple[Counter[str], int]:
    """Run ``tempcal COMMAND`` in process; the calls per ``tempcal`` module, and the exit code."""
    from tempcal.cli import app

    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not frame.f_code.co_flags & inspect.CO_OPTIMIZED:  # a module or class body
            return
        name = frame.f_globals.get("__name__", "")
        if (name == "tempcal" or name.startswith("tempcal.")) and not _importing(frame):
            calls[name] += 1

    sys.setprofile(profile)
    try:
        app(command, prog_name="tempcal", standalone_mode=False)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.setprofile(None)
    return calls, code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", type=Path, help="write a grouped data set here; DATA in the command names it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the tempcal command and its arguments")
    args = parser.parse_args(argv)
    command = list(args.command)
    if args.demo is not None:
        data = str(write_demo(args.demo))
        command = [data if word == "DATA" else word for word in command]
    import tempcal.cli  # noqa: F401  (imported before tracing: the import is not the command's work)

    calls, code = trace(command)
    print(f"exit code {code}; {len(calls)} tempcal modules ran a function:", file=sys.stderr)
    for name in sorted(calls):
        print(f"  {name} ({calls[name]} calls, {module_lines(name)} lines)", file=sys.stderr)
    floor = layer_floor(sorted(calls))
    for layer, count, lines, fewest in floor:
        print(f"  layer {layer}: {count} modules, {lines} lines: at least {fewest} modules of {MODULE_LINES} lines",
              file=sys.stderr)
    print(f"{sum(lines for _, _, lines, _ in floor)} lines; at least {sum(f for *_, f in floor)} modules by layer",
          file=sys.stderr)
    print(len(calls), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""Every benchmark script imports: a name it takes from tempcal that was moved or removed fails here, not on the
day someone runs it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_benchmark_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(script.parent))
    spec = importlib.util.spec_from_file_location(f"_benchmark_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the body runs
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:  # an optional peer or extra that is not installed here
        if (exc.name or "").split(".")[0] == "tempcal":
            raise
        pytest.skip(f"needs {exc.name}")
    finally:
        sys.modules.pop(spec.name, None)

"""The wheel holds every module, py.typed and the console script, and runs on its own with the one version.

Built from a copy of the source tree; installed on its own, it imports and runs with the version defined once in
tempcal/_version.py.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

SOURCE_VERSION = ast.literal_eval((ROOT / "tempcal" / "_version.py").read_text().split("=", 1)[1].strip())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps --no-build-isolation`` of a copy of the tree (the working tree gets no build/ folder)."""
    pytest.importorskip("setuptools")
    base = tmp_path_factory.mktemp("build")
    tree = base / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "tempcal", tree / "tempcal", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = base / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(out), str(tree)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    wheels = list(out.glob("tempcal-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_every_module_py_typed_and_the_console_script(wheel):
    assert wheel.name.startswith(f"tempcal-{SOURCE_VERSION}-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = f"tempcal-{SOURCE_VERSION}.dist-info"
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tempcal").rglob("*.py") if "__pycache__" not in p.parts}
    assert sources <= names, f"missing from the wheel: {sorted(sources - names)}"
    assert "tempcal/py.typed" in names
    assert not any(n.startswith(("tests/", "examples/", "benchmarks/")) for n in names)
    lines = [line.replace(" ", "") for line in entry_points.splitlines()]
    assert "[console_scripts]" in lines and "tempcal=tempcal.cli:run" in lines
    assert f"Version: {SOURCE_VERSION}\n" in metadata
    assert "Requires-Dist: torch>=2.3" in metadata


def test_installed_wheel_imports_and_runs_on_its_own(wheel, tmp_path):
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (target / "tempcal" / "py.typed").exists()
    code = (
        "import sys, importlib.metadata, pathlib\n"
        f"sys.path.insert(0, {str(target)!r})\n"
        "import tempcal\n"
        f"assert pathlib.Path(tempcal.__file__).is_relative_to({str(target)!r}), tempcal.__file__\n"
        "assert importlib.metadata.version('tempcal') == tempcal.__version__, importlib.metadata.version('tempcal')\n"
        "from tempcal.cli.main import main\n"
        "code = main(['--version'])\n"
        "assert 'torch' not in sys.modules, 'torch imported by --version'\n"
        "print(tempcal.__version__)\n"
        "sys.exit(code)\n"
    )
    # Run outside the repository so that the checkout cannot shadow the installed copy.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"tempcal {SOURCE_VERSION}", SOURCE_VERSION]

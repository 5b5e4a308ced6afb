"""The public ``tempcal.*`` names: lazy exports matching the type checker's imports; the docs/python.md example."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLE, ROOT

import tempcal


def type_checking_imports() -> dict[str, str]:
    """Name -> module (relative to the package) of every import under ``if TYPE_CHECKING:`` in tempcal/__init__.py."""
    tree = ast.parse(Path(tempcal.__file__).read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
              and node.test.id == "TYPE_CHECKING"]
    assert len(blocks) == 1, "expected one `if TYPE_CHECKING:` block"
    found: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            assert alias.asname is None and alias.name not in found, alias.name
            found[alias.name] = node.module
    return found


def test_type_checking_imports_name_exactly_the_lazy_exports():
    imported = type_checking_imports()
    assert sorted(imported) == sorted(tempcal._EXPORTS)
    assert imported == tempcal._EXPORTS  # each from the module the lazy import reads it from
    assert tempcal.__all__ == ["__version__", *tempcal._EXPORTS]


def test_every_export_resolves_lazily_and_import_alone_leaves_torch_out():
    code = (
        "import importlib, sys\n"
        "import tempcal\n"
        "assert 'torch' not in sys.modules, 'import tempcal imported torch'\n"
        "assert dir(tempcal) == sorted(tempcal.__all__)\n"
        "for name, module in tempcal._EXPORTS.items():\n"
        "    assert name not in vars(tempcal), f'{name} was imported eagerly'\n"
        "    value = getattr(tempcal, name)\n"
        "    assert value is getattr(importlib.import_module(f'tempcal.{module}'), name), name\n"
        "    assert vars(tempcal)[name] is value, f'{name} is looked up again on every access'\n"
        "try:\n"
        "    tempcal.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('tempcal.no_such_name resolved')\n"
        "print(len(tempcal._EXPORTS))\n"
    )
    assert int(_python(code)) == len(tempcal._EXPORTS)


def test_readme_python_snippet_runs(tmp_path):
    readme = (ROOT / "docs" / "python.md").read_text()
    snippet = readme.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / EXAMPLE.name).write_bytes(EXAMPLE.read_bytes())
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calibrated.safetensors").exists()
    assert (tmp_path / "examples" / EXAMPLE.name).read_bytes() == EXAMPLE.read_bytes()


def test_a_plain_fit_loads_no_command_line_or_conformal_code():
    """``tempcal.fit_temperature`` on logits (no folds, groups or sets): typer, the conformal package and the
    sources stay unloaded, so a script's first fit pays for the fit alone."""
    code = (
        "import sys, torch, tempcal\n"
        "z = torch.randn(300, 4)\n"
        "tempcal.fit_temperature(z, z.argmax(1), device='cpu')\n"
        "loaded = [m for m in sys.modules if m in ('typer', 'click') or m.startswith(('tempcal.conformal', "
        "'tempcal.sources', 'tempcal.cli'))]\n"
        "print(loaded)\n"
    )
    assert _python(code).strip() == "[]"


def _python(code: str) -> str:
    """What ``code`` prints when run in a fresh interpreter (which must succeed)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout

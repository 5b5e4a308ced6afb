"""The public ``tempcal.*`` names as documented: the README's Python example runs as written."""

from __future__ import annotations

import subprocess
import sys

from conftest import EXAMPLE, ROOT


def test_readme_python_snippet_runs(tmp_path):
    readme = (ROOT / "README.md").read_text()
    snippet = readme.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / EXAMPLE.name).write_bytes(EXAMPLE.read_bytes())
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calibrated.safetensors").exists()
    assert (tmp_path / "examples" / EXAMPLE.name).read_bytes() == EXAMPLE.read_bytes()

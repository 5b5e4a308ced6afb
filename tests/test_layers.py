"""No module imports from a layer above its own, counting imports inside functions and under ``TYPE_CHECKING``.

The layers, low to high: errors (and the input checks), core (and the progress line beside it), metrics and scores,
io, models, sources (and the language-model package beside them), workflows (and the scikit-learn estimator, the
conformal sets' and the subsets' packages and the commands' typed requests beside them), output (and the HTML page's
package beside it), cli. A capability package's drawing modules (the subsets' console tables and plots) sit with
output, a layer above the rest of their package. A lower layer that needs something from a higher one takes it as
an argument (or the thing moves down), so a reader can follow the package from the bottom up without meeting a name
defined further up.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tempcal"

#: Each top-level module or package of ``tempcal`` (or a module of one, where it differs) and its layer; a module may
#: import its own layer and below.
LAYERS = {
    "_version": 0, "errors": 0,
    "core": 1, "progress": 1,
    "metrics": 2, "scores": 2,
    "io": 3,
    "models": 4,
    "sources": 5, "lm": 5,
    "workflows": 6, "scaler": 6, "conformal": 6, "subsets": 6, "requests": 6,
    "output": 7, "html": 7, "subsets.console": 7, "subsets.plots": 7,
    "cli": 8, "__main__": 8, "__init__": 9,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return LAYERS["__init__"]
    return LAYERS.get(".".join(parts[1:3]), LAYERS[parts[1]])


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``tempcal`` modules ``name`` imports anywhere in its body: the module itself for ``from m import x``
    unless ``m.x`` is a module, as the import then loads that module."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def arrows_up() -> list[str]:
    modules = _modules()
    return sorted(f"{name} -> {target}" for name, path in modules.items()
                  for target in _imported(name, path, modules) if _layer(target) > _layer(name))


def test_every_top_level_module_has_a_layer():
    assert {name.split(".")[1] for name in _modules() if "." in name} <= set(LAYERS)


def test_no_import_runs_up_a_layer():
    assert arrows_up() == []


def test_the_source_kinds_do_not_reach_back_to_the_registry():
    """The registry imports ``sources/base.py`` and names the kinds' modules in ``KINDS`` (imported on first use, from
    its own layer or below); neither base nor a kind imports the registry, and base imports no kind (counting imports
    inside functions), so a new kind adds no circle."""
    from tempcal.sources.registry import KINDS

    modules = _modules()
    registry = "tempcal.sources.registry"
    below = _imported(registry, modules[registry], modules)
    kinds = {line.module for line in KINDS}
    assert "tempcal.sources.base" in below and "tempcal.lm.source" in kinds and kinds <= set(modules)
    assert all(_layer(kind) <= _layer(registry) for kind in kinds)
    for name in below | kinds:
        assert registry not in _imported(name, modules[name], modules), name
    assert not _imported("tempcal.sources.base", modules["tempcal.sources.base"], modules) & kinds

"""``--html``: the option's name and help, its check (the suffix; jinja2 and matplotlib installed) and its writer,
registered as an extra output when this module is imported (which loads neither jinja2 nor matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import TempcalError, neutral, param
from ..output.files import register

#: The option and its help (the commands declare it from these).
FLAG = "--html"
HELP = "A self-contained HTML report (figures inline, nothing fetched; matplotlib)."


def check_html_path(path: str) -> Path:
    """The page's path after checking its suffix and that jinja2 and matplotlib (the figures) are installed."""
    out = Path(path)
    if out.suffix.lower() not in (".html", ".htm"):
        raise TempcalError(f"{param('html')} {path}: the page's name must end in .html")
    import importlib.util

    for module in ("matplotlib", "jinja2"):
        if importlib.util.find_spec(module) is None:  # the html extra brings both
            raise TempcalError(f"{param('html')} needs {module}, which is not installed: pip install 'tempcal[html]'")
    return out


def write_html(path: str, command: str, result: Any, data: dict, argv: Sequence[str]) -> str:
    """Render and write the page atomically; the line saying so."""
    from ..io.paths import write_text_atomic
    from .page import page

    out = check_html_path(path)
    write_text_atomic(out, neutral(page(command, result, data, argv)), what=param("html"))  # bidi controls escaped
    return f"wrote the HTML report to {out}"


register(FLAG, check_html_path, write_html)

__all__ = ["FLAG", "HELP", "check_html_path", "write_html"]

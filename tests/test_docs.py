"""The documentation stays true: the README's commands run as written, every link resolves, and every command
and option of ``tempcal --help`` is documented in ``docs/``."""

from __future__ import annotations

import re
import shlex
import shutil
import unicodedata
from pathlib import Path

import pytest
import typer
from conftest import ROOT

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")


def prose(text: str) -> str:
    """The text outside fenced code blocks (links and headings in code are not links and headings)."""
    kept, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page (repeated headings get -1, -2 ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(page.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.+)$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links() -> list[tuple[Path, str]]:
    return [(page, target) for page in PAGES for target in LINK.findall(prose(page.read_text()))]


@pytest.mark.parametrize(("page", "target"), links(), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_every_link_resolves(page, target):
    if re.match(r"^[a-z]+:", target):
        assert target.startswith(("https://", "http://", "mailto:")), target
        return
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page
    assert dest.exists(), f"{page.name}: link to {target}: {dest} does not exist"
    if anchor:
        assert dest.suffix == ".md", target
        assert anchor in anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


def test_the_readme_stays_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(prose(readme)) if t.startswith("docs/")}
    assert {p.name for p in DOCS.glob("*.md")} <= linked


def _commands():
    """Every command of the Typer app and its click object."""
    from tempcal.cli.main import app

    group = typer.main.get_command(app)
    ctx = group.make_context("tempcal", ["--help"], resilient_parsing=True)
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def test_every_command_and_option_is_documented():
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    missing = []
    for name, command in _commands().items():
        if f"tempcal {name}" not in docs:
            missing.append(f"command {name}")
        for param in command.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt.startswith("--") and not re.search(re.escape(opt) + r"(?![\w-])", docs):
                    missing.append(f"{name} {opt}")
    assert not missing, "undocumented in docs/: " + ", ".join(missing)


def readme_commands() -> list[str]:
    """The ``$ tempcal ...`` lines of the README's console blocks, continuation lines joined, in order."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("$ "):
                command = line[2:]
                while command.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    command = command[:-1] + " " + lines[i].strip()
                commands.append(command.split("  #", 1)[0].strip())
            i += 1
    return commands


def test_the_readme_commands_run_as_written(tmp_path, cli, monkeypatch):
    """Each command of the tour, in order, in a folder holding a copy of ``examples/`` (as a fresh checkout)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    commands = readme_commands()
    assert len(commands) >= 4
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "tempcal", command
        code, _, err = cli(argv[1:])
        assert code == 0, f"{command}: exit {code}: {err}"
    assert (tmp_path / "digits_calibrated.safetensors").exists()
    assert (tmp_path / "examples" / "digits_logits.safetensors").read_bytes() == (
        ROOT / "examples" / "digits_logits.safetensors").read_bytes()

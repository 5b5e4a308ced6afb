"""The HTML report: self-contained (nothing fetched), its figures and T present, and it renders in headless Chromium
without console messages and without overflowing a phone's width."""

from __future__ import annotations

import re
import shutil
import subprocess
from html import escape
from html.parser import HTMLParser

import pytest
from conftest import EXAMPLE, EXAMPLES

pytest.importorskip("matplotlib")
pytest.importorskip("jinja2")

from tempcal.html.page import page

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium)")
NOISE = EXAMPLES / "digits_noise_logits.safetensors"
#: A phone and a desktop.
WIDTHS = (360, 1280)


class References(HTMLParser):
    """Every URL the page would fetch or link: src, href, srcset and url(...) in styles."""

    def __init__(self):
        super().__init__()
        self.urls: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "xlink:href", "data") and value:
                self.urls.append(value)


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """The pages of fit, report (a sweep) and ood (every score) on the shipped example, as each command wrote them,
    and its JSON."""
    import json

    from tempcal.cli.main import main

    folder = tmp_path_factory.mktemp("html")
    calibrated = folder / "calibrated.safetensors"
    commands = {"fit": ["fit", str(EXAMPLE), "--output", str(calibrated)],
                "report": ["report", str(calibrated), "--sweep", "0.5:10:6"],
                "ood": ["ood", str(calibrated), "--ood", str(NOISE), "--score", "all"]}
    out = {}
    for name, argv in commands.items():
        written = folder / f"{name}.html"
        assert main([*argv, "--json", str(folder / f"{name}.json"), "--html", str(written), "-q", "--no-config"]) == 0
        data = json.loads((folder / f"{name}.json").read_text())
        out[name] = (written.read_text(), data)
    return out


def test_pages_are_self_contained_and_show_t_and_their_figures(pages):
    for name, (html, data) in pages.items():
        parser = References()
        parser.feed(html)
        external = [u for u in parser.urls if not u.startswith("#")]
        assert not external, f"{name}: the page refers to {external}"
        assert "<script" not in html and "<link" not in html and "@import" not in html
        assert not re.findall(r"url\(\s*['\"]?(?!#)", html), "a url() that is not a reference inside the page"
        curves = "risk_coverage" in data.get("after", {})  # the risk-coverage figure, when the JSON has curves
        assert parser.tags.count("svg") >= 2 + curves, name
        temperature = data.get("temperature", data.get("stored_temperature"))
        assert f"T = {temperature:.6g}" in html
        assert f"tempcal {name} {data['source']}" in html  # the command that produced it


def test_values_are_escaped():
    from dataclasses import replace

    from tempcal.workflows.fit import fit_file

    report = replace(fit_file(str(EXAMPLE), device="cpu"), source="<script>alert(1)</script>.safetensors")
    data = dict(report.to_json(), warnings=["<b>careful</b>"])
    html = page("fit", report, data, ["fit", "<x>"])
    assert "<script>alert" not in html and "&lt;script&gt;" in html and "<b>careful" not in html


def _chromium(path, width: int, *, dump: bool = True) -> subprocess.CompletedProcess:
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            f"--window-size={width},1200"]
    return subprocess.run([*args, "--dump-dom", f"file://{path}"], capture_output=True, text=True, timeout=120)


@needs_browser
def test_the_console_check_sees_an_error(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom')</script></body></html>")
    assert "CONSOLE" in _chromium(bad, 800).stderr


@needs_browser
def test_pages_render_in_chromium_without_console_messages_or_overflow(pages, tmp_path):
    """Each page loads with no console message and shows T; laid out 360 and 1280 px wide it is no wider."""
    for name, (html, data) in pages.items():
        clean = tmp_path / f"{name}.html"
        clean.write_text(html)
        done = _chromium(clean, 1280)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "CONSOLE" not in done.stderr, f"{name}: {done.stderr}"
        temperature = data.get("temperature", data.get("stored_temperature"))
        assert f"T = {temperature:.6g}" in done.stdout
        # Headless windows are at least 500 px wide, so the page is laid out in frames of the widths under test;
        # a probe (in these copies only) reports each frame's laid-out width and figures to the parent.
        frames = []
        for width in WIDTHS:
            probe = ("<script>window.addEventListener('load', () => { parent.document.body.setAttribute("
                     f"'data-w{width}', [document.documentElement.scrollWidth, window.innerWidth, "
                     "document.querySelectorAll('svg').length].join(',')); });</script>")
            framed = html.replace("</body>", probe + "</body>")
            frames.append(f'<iframe width="{width}" height="900" srcdoc="{escape(framed, quote=True)}"></iframe>')
        wrapper = tmp_path / f"{name}-framed.html"
        wrapper.write_text(f"<html><body>{''.join(frames)}</body></html>")
        probed = _chromium(wrapper, 1400).stdout
        for width in WIDTHS:
            laid_out, viewport, svgs = map(int, re.search(rf'data-w{width}="([\d,]+)"', probed).group(1).split(","))
            assert viewport == width
            assert laid_out <= width, f"{name} at {width} px is {laid_out} px wide"
            assert svgs >= 2


def test_every_command_writes_its_page_and_says_so(tmp_path, cli):
    calibrated = tmp_path / "c.safetensors"
    pages = {name: str(tmp_path / f"{name}.html") for name in ("fit", "report", "ood")}
    for argv in (["fit", str(EXAMPLE), "--output", str(calibrated), "--html", pages["fit"]],
                 ["report", str(calibrated), "--tau", "fitted", "--tau", "1", "--html", pages["report"]],
                 ["ood", str(calibrated), "--ood", str(NOISE), "--tau", "fitted", "--html", pages["ood"]]):
        code, out, err = cli([*argv, "--no-config"])
        assert code == 0, err
        page_path = argv[-1]
        assert f"wrote the HTML report to {page_path}" in out
        html = (tmp_path / page_path).read_text()
        assert html.startswith("<!DOCTYPE html>") and "T = 2.35751" in html and "tempcal " + argv[0] in html


def test_a_page_in_the_configuration_file_and_a_bad_name(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(EXAMPLE, tmp_path / "val.safetensors")
    (tmp_path / "tempcal.toml").write_text('source = "val.safetensors"\n[fit]\nno-write = true\n'
                                           'html = "out/fit.html"\n')
    (tmp_path / "out").mkdir()
    code, _, err = cli(["fit", "-q"])
    assert code == 0, err
    assert "T = 2.35751" in (tmp_path / "out" / "fit.html").read_text()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, _, err = cli(["fit", "--html", "page.png"])
    assert code == 2 and err.count("\n") == 1 and "must end in .html" in err
    code, _, err = cli(["fit", "--html", "same.html", "--json", "same.html"])
    assert code == 2 and err.count("\n") == 1 and "same.html" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_failed_ood_gate_lists_each_failing_row_as_the_console_does(tmp_path, cli):
    import json

    out, page_path = tmp_path / "ood.json", tmp_path / "ood.html"
    code, _, err = cli(["ood", str(EXAMPLE), "--ood", str(NOISE), "--tau", "1", "--min-auroc", "0.99",
                        "--json", str(out), "--html", str(page_path), "-q", "--no-config"])
    assert code == 3, err
    failures = json.loads(out.read_text())["gate_failures"]
    words = re.sub(r"<[^>]+>", " ", page_path.read_text())
    assert failures and "{&#39;" not in words
    for f in failures:  # the reasons as the JSON states them, each beside its file and tau
        assert f"{escape(f['ood_file'])}, MSP, tau = {f['tau']:.6g}: {f['reasons'][0]}" in words


def test_an_infinite_conformal_threshold_is_shown_as_inf(tmp_path, cli):
    """Fewer rows than 1 / alpha: the threshold is infinite (every class in every set), null in the JSON."""
    import json

    out, page_path = tmp_path / "fit.json", tmp_path / "fit.html"
    code, _, err = cli(["fit", str(EXAMPLE), "--conformal-alpha", "0.0001", "--no-write", "--json", str(out),
                        "--html", str(page_path), "-q", "--no-config"])
    assert code == 0, err
    sets = json.loads(out.read_text())["after"]["conformal"]
    assert sets and all(c["threshold"] is None and c["coverage"] == 1 for c in sets)
    rows = re.findall(r"<tr><td>(?:T = [\d.]+)</td><td>1.00e-04</td>.*", page_path.read_text())  # 4 significant
    assert len(rows) == 2 * len(sets) and all(row.endswith("<td>inf</td></tr>") for row in rows)  # before, after


def test_the_page_registers_itself_and_loading_the_commands_loads_no_jinja2_or_matplotlib():
    import sys

    code = ("import sys, tempcal.cli.main; from tempcal.output.files import EXTRA_OUTPUTS; "
            "print(sorted(EXTRA_OUTPUTS), [m for m in ('jinja2', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['--html']", "[]"]

"""``fit --group-by KEY --conformal-alpha A``: each group's coverage under the global sets, shown lowest first on the
console and in the HTML page, and the groups short of 1 - A beyond chance marked (scipy's binomial test as the
independent reference), within 80 columns."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from scipy.stats import binomtest

from tempcal.conformal.sets import under_covered

ROW = re.compile(r"^(\S+)\s+[│|]\s+(\d+)\s+[│|]\s+([\d.]+)(\*?)\s+[│|]\s+([\d.]+)\s+[│|]\s+([\d.]+)(\*?)\s+[│|]")


def suite(path, n: int = 2400, groups: int = 8) -> None:
    """Logits with a ``domain`` per row; in domain 0 the labels are drawn at random, so the global sets under-cover
    it by far more than chance."""
    g = torch.Generator().manual_seed(5)
    z = torch.randn(n, 6, generator=g, dtype=torch.float64) * 2.5
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g)[:, 0]
    domain = torch.arange(n) % groups
    y[domain == 0] = torch.randint(0, 6, (int((domain == 0).sum()),), generator=g)
    save_file({"logits": z, "labels": y, "domain": domain}, str(path))


def short_by_scipy(coverage: float, n: int, alpha: float) -> bool:
    return binomtest(round(coverage * n), n, 1 - alpha, alternative="less").pvalue < 0.05


@pytest.mark.parametrize("coverage,n,alpha", [(0.7, 40, 0.1), (0.85, 40, 0.1), (0.8, 100, 0.1), (0.9, 10, 0.1),
                                              (0.75, 200, 0.2), (0.0, 3, 0.5), (1.0, 7, 0.05), (0.79, 300, 0.2)])
def test_the_shortfall_rule_is_scipys_one_sided_binomial_test(coverage, n, alpha):
    assert under_covered(coverage, n, alpha) == short_by_scipy(coverage, n, alpha)


@pytest.mark.parametrize("extra", [[], ["--folds", "4"]])
def test_the_console_lists_groups_lowest_coverage_first_and_marks_the_short_ones(tmp_path, cli, extra):
    path = tmp_path / "suite.safetensors"
    suite(path)
    argv = ["fit", str(path), "--group-by", "domain", "--conformal-alpha", "0.1", "--no-write", *extra]
    code, out, err = cli([*argv, "--json", "-"])
    assert code == 0, err
    groups = {g["group"]: g for g in json.loads(out)["groups"]}
    code, text, err = cli(argv)
    assert code == 0, err
    start = text.index("conformal coverage by group")
    assert ("out of fold" in text[start:].splitlines()[0]) == bool(extra)
    rows = [m.groups() for m in map(ROW.match, text[start:].splitlines()) if m]
    assert len(rows) == len(groups) == 8
    shown_min = []
    for name, n, lac, lac_mark, _, aps, aps_mark in rows:
        cells = {c["score"]: c for c in groups[name]["after_global"]["conformal"]}
        assert int(n) == groups[name]["n_eval"]
        assert (float(lac), float(aps)) == pytest.approx((cells["lac"]["coverage"], cells["aps"]["coverage"]),
                                                         abs=5e-5)
        assert bool(lac_mark) == short_by_scipy(cells["lac"]["coverage"], int(n), 0.1)
        assert bool(aps_mark) == short_by_scipy(cells["aps"]["coverage"], int(n), 0.1)
        shown_min.append(min(cells["lac"]["coverage"], cells["aps"]["coverage"]))
    assert shown_min == sorted(shown_min)
    assert rows[0][0] == "0" and rows[0][3] == "*"  # the random-label domain comes first, marked
    marked = sum(bool(r[3]) for r in rows), sum(bool(r[6]) for r in rows)
    assert f"(binomial p < 0.05): LAC {marked[0]} of 8, APS {marked[1]} of 8\n" in text
    assert max(len(line) for line in text[start:].splitlines()) <= 80


def test_the_html_page_has_the_coverage_table_with_the_short_groups_marked(tmp_path, cli):
    pytest.importorskip("jinja2")
    pytest.importorskip("matplotlib")
    path = tmp_path / "suite.safetensors"
    suite(path)
    page = tmp_path / "fit.html"
    code, _, err = cli(["fit", str(path), "--group-by", "domain", "--conformal-alpha", "0.1", "--no-write",
                        "--html", str(page)])
    assert code == 0, err
    html = page.read_text()
    assert "conformal coverage per group" in html and "LAC coverage" in html
    table = html[html.index("LAC coverage"):]
    table = table[:table.index("</table>")]
    first = re.search(r"<tr[^>]*>\s*<td[^>]*>([^<]+)</td>", table)
    assert first is not None and first.group(1).strip() == "0"
    assert np.any([m for m in re.findall(r"<tr([^>]*)>", table) if "mark" in m])

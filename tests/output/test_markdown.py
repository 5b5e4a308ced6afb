"""Model-card sections: the OOD section's tables and sentences, the plot link only beside a Markdown file."""

from __future__ import annotations

import re

import pytest
from conftest import id_ood_logits

import tempcal
from tempcal.output.markdown import fit_markdown, ood_markdown


@pytest.fixture
def ood_report(tmp_path):
    from safetensors.torch import save_file

    z_id, y, z_ood = id_ood_logits()
    save_file({"logits": z_id, "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    save_file({"logits": z_ood[:50] * 2}, str(tmp_path / "other.safetensors"))
    tempcal.write_temperature(tmp_path / "id.safetensors", 2.0)
    return tempcal.ood_file(tmp_path / "id.safetensors", [tmp_path / "ood.safetensors", tmp_path / "other.safetensors"],
                            taus=["1", "fitted", "5"], scores=["msp", "energy"], device="cpu")


def test_a_table_per_ood_file_and_score_then_the_sentences(ood_report):
    text = ood_markdown(ood_report)
    assert text.startswith("## Out-of-distribution detection\n")
    headings = re.findall(r"^### `(.+)` \((\d+) samples\), (\w+) score$", text, flags=re.M)
    assert [(f.rsplit("/", 1)[1], int(n), s) for f, n, s in headings] == [
        ("ood.safetensors", 200, "MSP"), ("ood.safetensors", 200, "energy"),
        ("other.safetensors", 50, "MSP"), ("other.safetensors", 50, "energy")]
    rows = re.findall(r"^\| ([0-9.]+)( \(.*\))? \| ([0-9.]+) \| ([0-9.]+) \|$", text, flags=re.M)
    assert len(rows) == 4 * 3
    for (tau, mark, auroc, fpr95), (_, m) in zip(rows, ood_report.results, strict=True):
        assert float(tau) == pytest.approx(m.tau, rel=1e-3)
        assert auroc == f"{m.auroc:.4f}" and fpr95 == f"{m.fpr95:.4f}"
        assert ("calibration T" in mark) == (m.tau == 2.0)
        best = max(ood_report.rows(_, m.score), key=lambda r: r.auroc).tau
        assert ("best AUROC" in mark) == (m.tau == best)
    for best in ood_report.best:
        assert best.sentence in text
    assert "calibration T = 2" in text and "![" not in text


def test_the_plot_is_linked_only_beside_a_markdown_file(ood_report, tmp_path):
    (tmp_path / "cards").mkdir()
    text = ood_markdown(ood_report, tmp_path / "cards" / "ood.md", tmp_path / "ood.png")
    assert "![In-distribution and OOD scores](../ood.png)" in text
    report = tempcal.fit_file(tmp_path / "id.safetensors", device="cpu")
    assert "![" not in fit_markdown(report) and "![" not in fit_markdown(report, None, tmp_path / "fit.png")

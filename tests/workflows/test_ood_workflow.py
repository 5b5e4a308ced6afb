"""ood_file (tempcal.workflows.ood): every score against numpy and scikit-learn, the best score and tau per OOD set,
gates, bootstrap intervals, ReAct on hidden states; OOD files without labels and with impossible classes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import OOD_CLASSES as C
from conftest import hidden_and_head, id_ood_logits
from reference import ref_fpr95, ref_msp, ref_scores, sk_figures
from safetensors.torch import save_file

from tempcal.errors import TempcalError
from tempcal.io.safetensors_header import write_temperature
from tempcal.metrics.detection import detection_intervals
from tempcal.sources.base import SourceOptions
from tempcal.sources.registry import open_source
from tempcal.workflows.ood import ood_file


def test_ood_file_without_labels_and_with_impossible_classes(tmp_path):
    z_id, y, z_ood = id_ood_logits(seed=3)
    z_ood[:, 0] = -float("inf")  # class 0 impossible for every OOD row: fine without labels
    p_ood = torch.softmax(z_ood, 1)
    save_file({"logits": z_id, "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))
    report = ood_file(tmp_path / "id.safetensors", [tmp_path / "ood.safetensors"], taus=[1.5])
    np.testing.assert_allclose(report.ood_scores[0]["msp"][0], ref_msp(z_ood.numpy(), 1.5), rtol=1e-12)
    assert open_source(tmp_path / "ood.safetensors", labels_optional=True).data.num_classes == C
    # probabilities with exact zeros give log(0) = -inf, the same thing
    save_file({"logits": p_ood}, str(tmp_path / "ood_p.safetensors"))
    assert open_source(tmp_path / "ood_p.safetensors", labels_optional=True, probs=True).data.num_samples == 200


def write(path, **tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def test_every_score_at_every_tau_against_the_reference_and_scikit_learn(tmp_path):
    z_id, y, z_ood = id_ood_logits(seed=5)
    id_path = write(tmp_path / "id.safetensors", logits=z_id, labels=y)
    ood_path = write(tmp_path / "ood.safetensors", logits=z_ood)
    taus = [0.5, 1.0, 3.0]
    report = ood_file(id_path, [ood_path], taus=taus, scores="all", gen_gamma=0.2, gen_top=5)
    assert report.scores == ["msp", "energy", "maxlogit", "entropy", "gen"]
    assert report.passes == 4  # each file: one validating scan, one scores pass
    assert [(m.score, m.tau) for _, m in report.results] == [(s, t) for s in report.scores for t in taus]
    for _, m in report.results:
        a = ref_scores(z_id.numpy(), m.tau, gamma=0.2, top=5)[m.score]
        b = ref_scores(z_ood.numpy(), m.tau, gamma=0.2, top=5)[m.score]
        sk = sk_figures(a, b)
        assert m.auroc == pytest.approx(sk["auroc"], abs=1e-9) and m.aupr_in == pytest.approx(sk["aupr_in"], abs=1e-9)
        assert m.aupr_out == pytest.approx(sk["aupr_out"], abs=1e-9) and m.fpr95 == ref_fpr95(a, b)
    maxlogit = report.rows(str(ood_path), "maxlogit")
    assert len({(m.auroc, m.fpr95) for m in maxlogit}) == 1  # its ranking never changes with tau
    assert "does not change with tau" in next(b.sentence for b in report.best if b.score == "maxlogit")


def test_best_score_and_tau_per_ood_set_beside_the_calibration_temperature(tmp_path):
    z_id, y, z_ood = id_ood_logits(seed=6)
    id_path = write(tmp_path / "id.safetensors", logits=z_id, labels=y)
    ood_path = write(tmp_path / "ood.safetensors", logits=z_ood)
    far_path = write(tmp_path / "far.safetensors", logits=0.2 * z_ood)
    write_temperature(id_path, 1.7)
    report = ood_file(id_path, [ood_path, far_path], taus=["fitted", 0.5, 4.0], scores="msp,energy,gen")
    assert len(report.best_overall) == 2 and report.summary == " ".join(b.sentence for b in report.best_overall)
    for best, name in zip(report.best_overall, (str(ood_path), str(far_path)), strict=True):
        rows = [m for f, m in report.results if f == name]
        top = max(m.auroc for m in rows)
        assert best.ood_file == name and best.auroc == top
        at_t = [m for m in rows if m.tau == 1.7]
        assert best.calibration_tau == 1.7 and best.calibration_auroc == max(m.auroc for m in at_t)
        assert best.calibration_score == max(at_t, key=lambda m: m.auroc).score
        assert name in best.sentence and "3 scores x 3 temperatures" in best.sentence and "T = 1.7" in best.sentence
    data = report.to_json()
    assert data["best_overall"][0]["score"] == report.best_overall[0].score and data["summary"] == report.summary
    assert data["gen_gamma"] == 0.1 and data["gen_top"] == 100 and data["react_threshold"] is None
    assert data["gate_passed"] is None and data["bootstrap"] is None


def test_gates_list_every_failing_row(tmp_path):
    z_id, y, z_ood = id_ood_logits(seed=7)
    id_path = write(tmp_path / "id.safetensors", logits=z_id, labels=y)
    ood_path = write(tmp_path / "ood.safetensors", logits=z_ood)
    report = ood_file(id_path, [ood_path], taus=[0.5, 2.0], scores="both", min_auroc=0.9, max_fpr95=0.3)
    want = [(m.score, m.tau) for _, m in report.results if m.auroc < 0.9 or m.fpr95 > 0.3]
    assert want and [(g.score, g.tau) for g in report.gate_failures] == want
    assert report.gate_passed is False and report.to_json()["gate_failures"][0]["reasons"]
    passing = ood_file(id_path, [ood_path], taus=[2.0], min_auroc=0.0, max_fpr95=1.0)
    assert passing.gate_passed is True and not passing.gate_failures
    for bad in (dict(min_auroc=1.5), dict(max_fpr95=-0.1), dict(min_auroc=float("nan")), dict(max_fpr95=True)):
        with pytest.raises(TempcalError):
            ood_file(id_path, [ood_path], **bad)


def test_bootstrap_intervals_without_reading_again(tmp_path):
    z_id, y, z_ood = id_ood_logits(seed=8)
    id_path = write(tmp_path / "id.safetensors", logits=z_id, labels=y)
    ood_path = write(tmp_path / "ood.safetensors", logits=z_ood)
    plain = ood_file(id_path, [ood_path], taus=[1.0, 3.0], scores="msp,gen")
    report = ood_file(id_path, [ood_path], taus=[1.0, 3.0], scores="msp,gen", bootstrap=50, seed=3)
    assert report.passes == plain.passes  # the resampling reads nothing
    rows = [m for _, m in report.results]
    want = detection_intervals([report.id_scores[m.score][[1.0, 3.0].index(m.tau)] for m in rows],
                               [report.ood_scores[0][m.score][[1.0, 3.0].index(m.tau)] for m in rows], 50, 3)
    for m, plain_row, ci in zip(rows, (m for _, m in plain.results), want, strict=True):
        assert m.auroc == plain_row.auroc and m.auroc_ci == ci["auroc"] and m.fpr95_ci == ci["fpr95"]
    data = report.to_json()
    assert data["bootstrap"] == {"resamples": 50, "seed": 3, "level": 0.95}
    assert data["results"][0]["auroc_ci"] == list(rows[0].auroc_ci)
    again = ood_file(id_path, [ood_path], taus=[1.0, 3.0], scores="msp,gen", bootstrap=50, seed=3)
    assert [m.auroc_ci for _, m in again.results] == [m.auroc_ci for m in rows]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_react_clips_hidden_states_at_the_exact_percentile_of_source(tmp_path, reads, dtype):
    """ReAct: the threshold is numpy's percentile of SOURCE's hidden-state values (streamed or resident), the OOD
    file is clipped at the same one, and every score equals the scores of the materialised clipped logits."""
    h, w, b, y = hidden_and_head(600, 16, 40, seed=4)
    h = torch.relu(2 * h).to(dtype)  # activations after a ReLU, as ReAct clips them
    h_ood = torch.relu(3 * torch.randn(300, 16, generator=torch.Generator().manual_seed(9))).to(dtype)
    hidden = write(tmp_path / "hidden.safetensors", hidden=h, labels=y)
    ood_hidden = write(tmp_path / "ood_hidden.safetensors", hidden=h_ood)
    head = write(tmp_path / "head.safetensors", weight=w.to(dtype), bias=b.to(dtype))
    report = ood_file(hidden, [ood_hidden], taus=[0.5, 2.0], scores="all", react=87.5,
                      options=SourceOptions(head=str(head)))
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    threshold = np.percentile(h.to(compute).numpy(), 87.5)
    assert report.react.threshold == threshold and report.react.percentile == 87.5
    assert report.react.passes == (2 if dtype != torch.float64 else report.react.passes) <= 4
    data = report.to_json()
    assert data["react_threshold"] == float(threshold) and data["react_percentile"] == 87.5
    rtol = 1e-9 if dtype == torch.float64 else 2e-5
    for side, states in ((report.id_scores, h), (report.ood_scores[0], h_ood)):
        z = (states.to(compute).clamp_max(float(threshold)) @ w.to(dtype).to(compute).T + b.to(dtype).to(compute))
        for k, tau in enumerate([0.5, 2.0]):
            want = ref_scores(z.double().numpy(), tau)
            for name in report.scores:
                np.testing.assert_allclose(side[name][k], want[name], rtol=rtol, atol=rtol, err_msg=name)
    unclipped = ood_file(hidden, [ood_hidden], taus=[0.5], options=SourceOptions(head=str(head)))
    assert unclipped.react is None and unclipped.to_json()["react_threshold"] is None
    assert not np.array_equal(unclipped.id_scores["msp"][0], report.id_scores["msp"][0])


def test_react_needs_a_head_and_a_percentile(tmp_path):
    z_id, y, z_ood = id_ood_logits(seed=9)
    id_path = write(tmp_path / "id.safetensors", logits=z_id, labels=y)
    ood_path = write(tmp_path / "ood.safetensors", logits=z_ood)
    with pytest.raises(TempcalError, match="head"):
        ood_file(id_path, [ood_path], react=90)
    for bad in (0, -5, 100.5, float("nan"), True):
        with pytest.raises(TempcalError, match="react"):
            SourceOptions(head="head.safetensors", react=bad)
    assert SourceOptions(head="head.safetensors", react=100).react == 100

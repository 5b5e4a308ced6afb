"""ood_file (tempcal.workflows.ood): OOD files without labels and with impossible classes, scored against numpy."""

from __future__ import annotations

import numpy as np
import torch
from conftest import OOD_CLASSES as C
from conftest import id_ood_logits
from reference import ref_msp
from safetensors.torch import save_file

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

"""A model folder (``--lm MODEL``, ``--head FOLDER``) is read-only to tempcal but for its record of T: every output
that names one of its files (by path, link or hard link) is refused before anything is read or written."""

from __future__ import annotations

import json
import os
import shutil

import lm_builders
import pytest
import torch
from lm_builders import refused
from safetensors.torch import save_file

transformers = pytest.importorskip("transformers")
prepared, setup = lm_builders.prepared, lm_builders.setup  # fixtures: a model folder and texts of its own


@pytest.mark.parametrize("command, option, name", [
    ("fit", "--save-hidden", "model.safetensors"),
    ("fit", "--json", "config.json"),
    ("fit", "--markdown", "tokenizer.json"),
    ("fit", "--output", "model.safetensors"),
    ("fit", "--plot", "figure.png"),
    ("fit", "--html", "page.html"),
    ("report", "--json", "tokenizer_config.json"),
    ("report", "--save-hidden", "new.safetensors"),
    ("ood", "--scores", "config.json"),
    ("ood", "--json", "special_tokens_map.json"),
])
def test_no_output_goes_into_the_lm_folder(tmp_path, cli, setup, command, option, name):
    folder, texts = setup
    argv = [command, "--lm", str(folder), "--text", str(texts), option, str(folder / name)]
    if command == "ood":
        argv += ["--ood-text", str(texts)]
    refused(cli, tmp_path, argv, f"{option} {folder / name}", f"inside the model folder {folder} (--lm)",
            "nothing written")


@pytest.mark.parametrize("how", ["symlink-folder", "hardlink", "dotdot"])
def test_a_model_file_named_another_way_is_refused(tmp_path, cli, setup, how):
    folder, texts = setup
    if how == "symlink-folder":
        (tmp_path / "alias").symlink_to(folder)
        target = tmp_path / "alias" / "config.json"
    elif how == "hardlink":
        target = tmp_path / "linked.json"
        os.link(folder / "config.json", target)
    else:
        target = tmp_path / "elsewhere" / ".." / "model" / "tokenizer.json"
        (tmp_path / "elsewhere").mkdir()
    refused(cli, tmp_path, ["fit", "--lm", str(folder), "--text", str(texts), "--json", str(target)],
            f"--json {target}", "inside the model folder", "(--lm)")


def test_the_record_and_generation_config_are_written(tmp_path, cli, setup):
    folder, texts = setup
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    code, _, err = cli(["fit", "--lm", str(folder), "--text", str(texts), "--write-generation-config", "--quiet"])
    assert code == 0, err
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    changed = {name for name in after if before.get(name) != after[name]}
    assert changed == {"tempcal.json", "generation_config.json"}
    stored = json.loads(after["tempcal.json"])["temperature"]
    assert json.loads(after["generation_config.json"])["temperature"] == stored


def test_head_folder_is_read_only_too(tmp_path, cli, setup):
    folder, _ = setup
    hidden = tmp_path / "hidden.safetensors"
    save_file({"hidden": torch.randn(20, 32), "labels": torch.randint(0, 200, (20,))}, str(hidden))
    for option, name in (("--output", "model.safetensors"), ("--json", "config.json")):
        refused(cli, tmp_path, ["fit", str(hidden), "--head", str(folder), option, str(folder / name)],
                f"{option} {folder / name}", "(--head)")
    inside = folder / "hidden.safetensors"
    shutil.copy(hidden, inside)
    refused(cli, tmp_path, ["fit", str(inside), "--head", str(folder)], "writing T back into", "(--head)")
    code, _, err = cli(["fit", str(inside), "--head", str(folder), "--no-write", "--quiet"])
    assert code == 0, err

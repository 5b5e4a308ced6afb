"""KINDS: one line per kind of SOURCE, saying what it may claim without importing it; only the kinds a SOURCE may
be are imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tempcal.sources.base import SourceOptions
from tempcal.sources.registry import KINDS, kind_of

ROOT = Path(__file__).resolve().parents[2]


def test_each_line_names_its_kind():
    for line in KINDS:
        kind = line.kind()
        assert (type(kind).__module__, type(kind).__name__) == (line.module, line.cls)
        assert line.kind() is kind  # one instance: shards are compared by identity
    assert [line.option for line in KINDS if line.option] == ["lm", "head"]
    assert [line.cls for line in KINDS if line.folders] == ["InspectLogKind"]
    assert [line.cls for line in KINDS if line.missing] == ["SafetensorsKind"]  # the default, asked last
    assert KINDS[-1].missing


def test_an_option_selects_its_kind_whatever_the_name(tmp_path):
    path = tmp_path / "hidden.npz"
    assert kind_of([path], SourceOptions(head="head.safetensors")).name == "head"
    assert kind_of([path], SourceOptions(lm="model")).name == "lm"
    assert kind_of([path]).name == "npz"


@pytest.mark.parametrize(("name", "module"), [("x.safetensors", "tempcal.sources.safetensors"),
                                              ("x.npz", "tempcal.sources.numpy")])
def test_opening_a_file_imports_only_its_own_kind(tmp_path, name, module):
    """In a fresh interpreter, so that other tests' imports do not count."""
    logits, labels = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])
    path = tmp_path / name
    if name.endswith(".npz"):
        np.savez(path, logits=logits.numpy(), labels=labels.numpy())
    else:
        save_file({"logits": logits, "labels": labels}, str(path))
    code = ("import json, sys\nfrom tempcal.sources.registry import KINDS, open_source\n"
            f"opened = open_source({str(path)!r})\n"
            "print(json.dumps([opened.kind.name, sorted({line.module for line in KINDS} & set(sys.modules))]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    kind, imported = json.loads(run.stdout)
    assert kind == name.split(".")[1] and imported == [module]

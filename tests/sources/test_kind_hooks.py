"""Each SOURCE kind owns what differs about it: no code outside the kind modules asks a kind for its name, and the
hooks it overrides (probability refusal, groups, keeping T) do what the old name switches did."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tempcal.sources.base import Keep, SourceOptions
from tempcal.sources.registry import KINDS, open_source
from tempcal.subsets.options import read_groups

PACKAGE = Path(__file__).resolve().parents[2] / "tempcal"
NAMES = "|".join(re.escape(line.kind().name) for line in KINDS)
#: A kind's name compared, taken aside to compare later, or looked up in a table keyed by kind names
#: (``STORED_IN.get(kind.name, ...)``), or any kind compared with a literal kind name (``report.kind == "model"``).
SWITCHES = [re.compile(r"kind\.name\s*(==|!=|\bnot\s+in\b|\bin\b)"),
            re.compile(r"=\s*[\w.]*\bkind\.name\s*$"),
            re.compile(r"(\.get\(|\[)\s*[\w.]*kind\.name\b"),
            re.compile(rf"\bkind\s*(==|!=)\s*['\"]({NAMES})['\"]")]


def kind_modules() -> set[Path]:
    """The modules that define a registered kind, and the two that every kind shares (base, registry)."""
    modules = {line.module for line in KINDS} | {"tempcal.sources.base", "tempcal.sources.registry"}
    return {PACKAGE.parent / (name.replace(".", "/") + ".py") for name in modules}


def switches(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if any(p.search(line) for p in SWITCHES)]


@pytest.mark.parametrize("line", ['if opened.kind.name == "lm-eval":', "if kind.name in STORED_IN:",
                                  'where = STORED_IN.get(kind.name, "sidecar")', 'if kind.name not in ("npz",):',
                                  'if report.kind == "model" and options.inputs is None:',
                                  "title = KIND_NAMES[opened.kind.name]", "kind = opened.kind.name"])
def test_the_search_finds_each_form_of_switch(line):
    assert switches(line) == [line]


def test_no_kind_name_switch_outside_the_kind_modules():
    allowed = kind_modules()
    assert PACKAGE / "sources" / "lm_eval.py" in allowed and PACKAGE / "workflows" / "inspect.py" not in allowed
    found = [f"{path.relative_to(PACKAGE.parent)}: {line}" for path in sorted(PACKAGE.rglob("*.py"))
             if path not in allowed for line in switches(path.read_text())]
    assert found == []


def fake(name: str = "x.bin") -> SimpleNamespace:
    return SimpleNamespace(name=name, options=SourceOptions(logits_key="scores"))


def test_probability_like_values_are_refused_as_each_kind_reads_them():
    """Logits files name --probs (their values may be read as log p); a model, a head or a language model computes
    logits, so its refusal says to use the output before the softmax."""
    by_name = {line.kind().name: line.kind() for line in KINDS}
    logits_files = {"safetensors", "npz", "npy", "pt"}
    assert set(by_name) == logits_files | {"head", "model", "lm", "lm-eval", "inspect", "lighteval", "confidence-table"}
    for name, kind in by_name.items():
        message = str(kind.probabilities_refused(fake()))
        assert message.startswith("x.bin: ")
        if name in logits_files:
            assert "'scores'" in message and "read only from logits files" not in message
        else:
            assert "read only from logits files" in message and "'scores'" not in message


@pytest.fixture
def grouped(tmp_path):
    g = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(12, 3, generator=g), torch.randint(0, 3, (12,), generator=g)
    labels[[2, 7]] = -100  # ignored rows: the groups of the counted rows only
    domain = torch.tensor([5, 1, 5, 9, 1, 1, 5, 9, 9, 1, 5, 5])
    path = tmp_path / "g.safetensors"
    save_file({"logits": logits, "labels": labels, "domain": domain}, str(path))
    np.savez(tmp_path / "g.npz", logits=logits.numpy(), labels=labels.numpy(), domain=domain.numpy())
    torch.save({"logits": logits, "labels": labels, "domain": domain}, tmp_path / "g.pt")
    return tmp_path, domain[labels != -100].numpy()


@pytest.mark.parametrize("name", ["g.safetensors", "g.npz", "g.pt"])
def test_each_kind_reads_the_groups_of_its_counted_rows(grouped, name):
    folder, counted = grouped
    groups = read_groups(open_source(folder / name), "domain")
    assert groups.names == ["1", "5", "9"] and groups.numeric
    assert [int(groups.names[i]) for i in groups.index] == counted.tolist()


def test_a_kind_without_named_tensors_says_so(grouped):
    folder, _ = grouped
    np.save(folder / "n_logits.npy", np.zeros((4, 3), dtype=np.float32))
    np.save(folder / "n_labels.npy", np.zeros(4, dtype=np.int64))
    with pytest.raises(Exception, match=r"reads a named tensor of a \.safetensors, \.npz or \.pt SOURCE .*a npy "
                                        r"SOURCE has none"):
        read_groups(open_source(folder / "n_logits.npy"), "domain")


def test_keep_writes_t_and_the_groups_where_the_kind_keeps_them(grouped):
    folder, _ = grouped
    opened = open_source(folder / "g.safetensors")
    kept = opened.keep(1.25, Keep(group_key="domain", group_temperatures={"1": 1.5, "5": 0.75},
                                  metadata={"tempcal.split": "{}"}))
    with safe_open(str(folder / "g.safetensors"), "pt") as f:
        metadata = f.metadata()
    assert metadata["tempcal.temperature"] == "1.25" and metadata["tempcal.group_key"] == "domain"
    assert json.loads(metadata["tempcal.group_temperatures"]) == {"1": 1.5, "5": 0.75}
    assert metadata["tempcal.split"] == "{}"
    assert kept.paths == [str(folder / "g.safetensors")]
    assert kept.lines == [f"wrote tempcal.temperature = 1.25 into {folder / 'g.safetensors'}",
                          f"wrote the temperatures of 2 groups (tempcal.group_temperatures, by domain) into "
                          f"{folder / 'g.safetensors'}"]
    sidecar = folder / "g.npz.tempcal.json"
    assert open_source(folder / "g.npz").keep(2.0, Keep(store=False)).paths == [] and not sidecar.exists()
    assert open_source(folder / "g.npz").keep(2.0, Keep()).paths == [str(sidecar)]
    assert json.loads(sidecar.read_text())["metadata"]["tempcal.temperature"] == "2.0"

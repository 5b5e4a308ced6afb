"""A command runs only what it uses: no language-model hook without --lm, no other kind of SOURCE than its own, and,
when no configuration file is read, no schema but the specs of the options given (the functions called, traced in a
fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
OTHER_KINDS = ("tempcal.sources.head", "tempcal.sources.model", "tempcal.sources.numpy", "tempcal.sources.torch_dict",
               "tempcal.sources.inspect_log", "tempcal.sources.confidence_table", "tempcal.sources.tables",
               "tempcal.sources.lm_eval", "tempcal.sources.lighteval", "tempcal.models.detect")


def traced(folder: Path, commands: list[list[str]]) -> list[tuple[int, list[str]]]:
    """Each command's exit code and the tempcal modules whose functions it called, run in ``folder``."""
    script = (f"import json, sys\nsys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tools')!r}]\n"
              "from trace_modules import trace\nimport tempcal.cli\nout = []\n"
              f"for command in {commands!r}:\n    calls, code = trace(command)\n    out.append([code, sorted(calls)])\n"
              "open('traced.json', 'w').write(json.dumps(out))\n")
    subprocess.run([sys.executable, "-c", script], cwd=folder, check=True, capture_output=True, timeout=300)
    return [(code, names) for code, names in json.loads((folder / "traced.json").read_text())]


@pytest.fixture
def data(tmp_path):
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (200,), generator=g)
    logits = torch.randn(200, 4, generator=g)
    logits[torch.arange(200), labels] += 1.5
    save_file({"logits": logits * 3, "labels": labels}, str(tmp_path / "val.safetensors"))
    save_file({"logits": torch.randn(50, 4, generator=g), "labels": torch.zeros(50, dtype=torch.int64)},
              str(tmp_path / "ood.safetensors"))
    return tmp_path


def test_commands_without_lm_run_no_lm_hook_and_no_other_kind_of_source(data):
    commands = [["fit", "val.safetensors", "--quiet", "--seed", "1"], ["report", "val.safetensors", "--quiet"],
                ["ood", "val.safetensors", "--ood", "ood.safetensors", "--quiet"],
                ["apply", "val.safetensors", "--output", "out.safetensors", "--quiet"]]
    for command, (code, modules) in zip(commands, traced(data, commands), strict=True):
        assert code == 0 and f"tempcal.workflows.{command[0]}" in modules
        assert [m for m in modules if m.startswith("tempcal.lm.") or m in OTHER_KINDS] == []


def test_a_configuration_file_is_read_only_when_there_is_one(monkeypatch, cli, data):
    from tempcal.cli import config

    read = []

    def spy(path, shown):
        read.append(shown)
        return read_config_bytes(path, shown)

    read_config_bytes = config.read_config_bytes
    monkeypatch.setattr(config, "read_config_bytes", spy)
    monkeypatch.chdir(data)
    assert cli(["fit", "val.safetensors", "--quiet", "--no-write"])[0] == 0
    assert read == []  # no configuration file was found
    (data / "tempcal.toml").write_text("[fit]\nseed = 3\n")
    assert cli(["fit", "val.safetensors", "--quiet", "--no-write"])[0] == 0
    assert read == ["tempcal.toml"]


def test_without_a_configuration_file_no_schema_is_derived(data):
    ((code, modules),) = traced(data, [["fit", "val.safetensors", "--quiet", "--no-write"]])
    assert code == 0 and "tempcal.cli.config" in modules and "tempcal.cli.config_schema" not in modules


def test_values_given_are_checked_with_the_specs_of_their_options_alone(monkeypatch, cli, data):
    from tempcal.cli import config

    derived = []

    def spy(command, only=None):
        derived.append(only)
        return command_schema(command, only)

    command_schema = config.command_schema
    monkeypatch.setattr(config, "command_schema", spy)
    code, _, err = cli(["fit", str(data / "val.safetensors"), "--no-config", "--seed", "-1", "--bins", "5"])
    assert (code, derived) == (2, [{"seed", "bins"}]) and err.startswith("error: --seed -1: ")


def test_a_configuration_file_is_read_and_checked_when_there_is_one(data):
    (data / "tempcal.toml").write_text("[fit]\nseed = 3\n")
    ((code, modules),) = traced(data, [["fit", "val.safetensors", "--no-write", "--quiet"]])
    assert code == 0 and {"tempcal.cli.config", "tempcal.cli.config_schema"} <= set(modules)


def test_lm_options_without_lm_are_still_refused(cli, data):
    code, out, err = cli(["fit", str(data / "val.safetensors"), "--text", "t.txt", "--max-length", "8"])
    assert (code, out) == (2, "")
    assert err == "error: --text, --max-length apply to a language model run with --lm MODEL\n"

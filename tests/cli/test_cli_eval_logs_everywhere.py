"""Every command and option on every evaluation-log kind of SOURCE (inspect_ai logs, lighteval details, confidence
tables): fit (a split, all rows, --eval, --folds, --group-by, --conformal-alpha, --html), report, ood, apply, a
configuration file and torchrun, each giving the same figures as the same command on a safetensors file of the same
logits (the kinds' reference rows: inspect_ai's and lighteval's own parsers, a float64 ``ln(c / (1 - c))``), T
against scipy's bounded optimiser in float64, and the --eval / --ood files' own counts of rows left out."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from confidence_tables import logits_of, make_rows, write_table
from inspect_logs import FIXTURES as INSPECT_FIXTURES
from inspect_logs import expected_rows
from lighteval_details import complete, copied, matrix, reference_rows
from reference import optimal_temperature
from safetensors.numpy import load_file
from safetensors.torch import save_file

KINDS = ("inspect", "lighteval", "confidence-table")
COLUMNS = ["--confidence", "confidence", "--correct", "correct"]
#: JSON keys that name files, or say how a kind was read: they differ between a kind and its safetensors twin.
NAMING = {"source", "eval_source", "ood_files", "warnings", "written", "paths", "html", "config", "group",
          "group_temperatures", "source_kind", "rows_incomplete", "clipped", "eval_rows_incomplete", "eval_clipped",
          "ood_rows_incomplete", "ood_clipped", "confidence_column", "correct_column", "confidence_scale", "summary",
          "best", "best_overall", "device", "lm_eval_norm", "sentence"}


@dataclass
class Side:
    """One set: the kind's command-line arguments, its reference logits, labels and groups, and its safetensors
    twin; ``counted`` is what the kind's JSON counts for it (``rows_incomplete`` or ``clipped``)."""

    args: list[str]
    z: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    counted: dict = field(default_factory=dict)
    twin: Path | None = None


@dataclass
class Case:
    kind: str
    source: Side
    other: Side  # the --eval and --ood set
    options: list[str]  # how the kind is read (a confidence table's columns)


def _twin(side: Side, path: Path) -> Side:
    save_file({"logits": torch.from_numpy(np.ascontiguousarray(side.z)), "labels": torch.from_numpy(side.y),
               "task": torch.from_numpy(side.groups)}, str(path))
    side.twin = path
    return side


def _inspect(tmp_path: Path) -> Case:
    logs = tmp_path / "logs"
    shutil.copytree(INSPECT_FIXTURES, logs, ignore=shutil.ignore_patterns("reference", "*.py", "__pycache__"))
    parts = [expected_rows(f"multi/{name}") for name in ("alpha_word1.eval", "beta_word1.eval")]
    z = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    groups = np.repeat(np.arange(2), [len(p[1]) for p in parts])  # tasks alpha, beta: one log each
    source = Side([str(logs / "multi" / "*_word1.eval")], z, y, groups,
                  {"rows_incomplete": {"several_targets": 0, "no_answer": 0, "missing_choice": 0}})
    oz, oy, left = expected_rows("mc_bpe.eval")
    other = Side([str(logs / "mc_bpe.eval")], oz, oy, np.zeros(len(oy), dtype=np.int64), {"rows_incomplete": left})
    return Case("inspect", _twin(source, tmp_path / "source.safetensors"),
                _twin(other, tmp_path / "other.safetensors"), [])


def _lighteval(tmp_path: Path) -> Case:
    folder, alone = tmp_path / "details", tmp_path / "alone"
    folder.mkdir()
    alone.mkdir()
    files = [copied(task, folder) for task in ("tempcal_listed", "tempcal_mc")]  # sorted by name, as a glob is
    parts = [matrix(complete(reference_rows(task)), width=4) for task in ("tempcal_listed", "tempcal_mc")]
    z = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    groups = np.repeat(np.arange(2), [len(p[1]) for p in parts])
    listed = reference_rows("tempcal_listed")
    source = Side([str(f) for f in files], z, y, groups,
                  {"rows_incomplete": {"several_targets": len(listed) - len(complete(listed)), "logprobs_count": 0}})
    oz, oy = matrix(complete(reference_rows("tempcal_mc")))
    other = Side([str(copied("tempcal_mc", alone))], oz, oy, np.zeros(len(oy), dtype=np.int64),
                 {"rows_incomplete": {"several_targets": 0, "logprobs_count": 0}})
    assert source.counted["rows_incomplete"]["several_targets"] > 0  # the fixture leaves rows out
    return Case("lighteval", _twin(source, tmp_path / "source.safetensors"),
                _twin(other, tmp_path / "other.safetensors"), [])


def _confidence_table(tmp_path: Path) -> Case:
    sides = []
    for name, n, seed in (("answers.csv", 300, 31), ("others.csv", 200, 32)):
        rows = make_rows(n, seed=seed)
        rows["confidence"][:2] = [1.0, 0.0]  # clipped
        path = write_table(tmp_path / name, rows)
        tasks = sorted(set(rows["task"]))
        groups = np.array([tasks.index(t) for t in rows["task"]], dtype=np.int64)
        sides.append(Side([str(path)], logits_of(rows["confidence"]), rows["correct"], groups, {"clipped": 2}))
    return Case("confidence-table", _twin(sides[0], tmp_path / "source.safetensors"),
                _twin(sides[1], tmp_path / "other.safetensors"), COLUMNS)


MAKERS = {"inspect": _inspect, "lighteval": _lighteval, "confidence-table": _confidence_table}


@pytest.fixture(params=KINDS)
def case(request, tmp_path) -> Case:
    return MAKERS[request.param](tmp_path)


def same_figures(kind: dict, twin: dict, path: str = "") -> int:
    """Every number both JSONs hold (but names of files and groups and the kinds' own keys) equal to 1e-9; the
    count of numbers compared, so that a test can insist that there were some."""
    if isinstance(kind, dict) and isinstance(twin, dict):
        return sum(same_figures(kind[k], twin[k], f"{path}.{k}") for k in kind.keys() & twin.keys() - NAMING)
    if isinstance(kind, list) and isinstance(twin, list):
        assert len(kind) == len(twin), path
        return sum(same_figures(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(kind, twin, strict=True)))
    if isinstance(kind, bool) or isinstance(twin, bool) or kind is None or twin is None:
        assert kind == twin, f"{path}: {kind!r} vs {twin!r}"
        return 0
    if isinstance(kind, (int, float)) and isinstance(twin, (int, float)):
        assert (math.isnan(kind) and math.isnan(twin)) or kind == pytest.approx(twin, rel=1e-9, abs=1e-12), \
            f"{path}: {kind} (the kind) vs {twin} (safetensors)"
        return 1
    return 0


def _args(case: Case, argv: list[str], twin: bool) -> list[str]:
    """``argv`` with SOURCE and OTHER replaced by the kind's files (read with its options) or their twins."""
    out: list[str] = []
    for arg in argv:
        side = {"SOURCE": case.source, "OTHER": case.other}.get(arg)
        if side is None:
            out.append(arg)
        elif twin:
            out.append(str(side.twin))
        else:
            out.extend(side.args)
    return out if twin else [*out, *case.options]


COMMANDS = {
    "fit-split": ["fit", "SOURCE", "--val-fraction", "0.5", "--seed", "3", "--no-write"],
    "fit-all": ["fit", "SOURCE", "--val-fraction", "1", "--no-write"],
    "fit-eval": ["fit", "SOURCE", "--eval", "OTHER", "--no-write"],
    "fit-folds": ["fit", "SOURCE", "--folds", "4", "--no-write"],
    "fit-group-by": ["fit", "SOURCE", "--group-by", "task", "--val-fraction", "1", "--no-write"],
    "fit-conformal-html": ["fit", "SOURCE", "--conformal-alpha", "0.2", "--val-fraction", "1", "--no-write"],
    "report": ["report", "SOURCE", "--tau", "1", "--tau", "1.7", "--conformal-alpha", "0.2"],
    "report-group-by": ["report", "SOURCE", "--tau", "1.5", "--group-by", "task"],
    "ood": ["ood", "SOURCE", "--ood", "OTHER", "--tau", "1", "--tau", "2"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_gives_the_figures_of_the_same_logits_in_safetensors(case, command, run_json, tmp_path):
    argv = COMMANDS[command]
    html = ["--html", str(tmp_path / "page.html")] if command in ("fit-conformal-html", "report", "ood") else []
    kind = run_json([*_args(case, argv, twin=False), *html])
    twin = run_json(_args(case, argv, twin=True))
    assert kind["source_kind"] == case.kind and "source_kind" not in twin
    for key, value in case.source.counted.items():
        assert kind[key] == value, key
    assert same_figures(kind, twin) >= 20
    if command == "fit-all":
        assert kind["temperature"] == pytest.approx(optimal_temperature(case.source.z, case.source.y), rel=1e-6)
    if command == "fit-eval":  # the --eval file's counts beside SOURCE's
        assert kind["n_eval"] == len(case.other.y)
        for key, value in case.other.counted.items():
            assert kind[f"eval_{key}"] == value, key
    if command == "ood":
        for key, value in case.other.counted.items():
            assert kind[f"ood_{key}"] == [value], key
    if command.endswith("group-by"):
        groups = kind["groups"] if command.startswith("fit") else kind["results"][-1]["groups"]
        assert len(groups) == len(np.unique(case.source.groups)) > 1
    if html:
        assert "<html" in (tmp_path / "page.html").read_text().lower()


def test_a_fit_writes_t_beside_the_kind_and_report_reads_it_as_the_twin_does(case, run_json):
    fitted = run_json(["fit", *_args(case, ["SOURCE"], twin=False), "--val-fraction", "1"])
    twin = run_json(["fit", str(case.source.twin), "--val-fraction", "1"])
    assert fitted["temperature"] == pytest.approx(twin["temperature"], rel=1e-9)
    report = run_json(["report", *case.source.args])  # no options: a confidence table's are in its sidecar
    same = run_json(["report", str(case.source.twin)])
    assert report["results"][0]["stored"] and report["results"][0]["tau"] == fitted["temperature"]
    assert same_figures(report, same) >= 10


def test_inspect_describes_each_kind(case, run_json):
    described = run_json(["inspect", *_args(case, ["SOURCE"], twin=False)])
    assert described["kind"] == case.kind and described["source_kind"] == case.kind
    assert described["rows"] == len(case.source.y) and described["problems"] == []
    assert described["num_classes"] == (2 if case.kind == "confidence-table" else case.source.z.shape[1])


def test_apply_writes_the_calibrated_probabilities_of_the_same_logits(case, run_json, tmp_path):
    t = 1.7
    binary = case.kind == "confidence-table"
    out = tmp_path / ("calibrated.csv" if binary else "calibrated.safetensors")
    run_json(["apply", *_args(case, ["SOURCE"], twin=False), "--tau", str(t), "-o", str(out)])
    twin_out = tmp_path / "twin.safetensors"
    run_json(["apply", str(case.source.twin), "--tau", str(t), "-o", str(twin_out)])
    z = case.source.z
    if binary:
        import csv

        with open(out, newline="") as f:
            got = np.array([float(r["calibrated_confidence"]) for r in csv.DictReader(f)])
        expected = 1 / (1 + np.exp(-z / t))
    else:
        got = load_file(str(out))["probs"]
        shifted = z / t - np.max(z / t, axis=1, keepdims=True)
        expected = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    twin = load_file(str(twin_out))["probs"]
    if binary and twin.ndim == 2:  # one binary logit: the twin writes both classes' probabilities
        twin = twin[:, 1]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got, twin, rtol=1e-6, atol=1e-9)


#: What a configuration file sets for each kind, and the same on the command line.
CONFIGURED = {
    "inspect": ('group-by = "task"\nval-fraction = 1.0\n', ["--group-by", "task", "--val-fraction", "1"]),
    "lighteval": ('lm-eval-norm = "chars"\ngroup-by = "task"\nval-fraction = 1.0\n',
                  ["--lm-eval-norm", "chars", "--group-by", "task", "--val-fraction", "1"]),
    "confidence-table": ('confidence = "confidence"\ncorrect = "correct"\ngroup-by = "task"\nfolds = 3\n',
                         [*COLUMNS, "--group-by", "task", "--folds", "3"]),
}


def test_a_configuration_file_gives_the_command_lines_figures(case, run_json, tmp_path, monkeypatch):
    table, flags = CONFIGURED[case.kind]
    sources = ", ".join(f'"{Path(a).as_posix()}"' for a in case.source.args)
    (tmp_path / "plain").mkdir()
    monkeypatch.chdir(tmp_path / "plain")
    given = run_json(["fit", *case.source.args, *flags, "--no-write"])
    assert given["config"] is None
    (tmp_path / "tempcal.toml").write_text(f"source = [{sources}]\n[fit]\nno-write = true\n{table}")
    monkeypatch.chdir(tmp_path)
    configured = run_json(["fit"])
    assert configured["config"] == str(tmp_path / "tempcal.toml")
    assert len(configured.pop("config_keys")) == len(flags) // 2 + 2  # the options, no-write and source
    assert configured["source_kind"] == case.kind
    assert configured["group_key"] == given["group_key"] == "task"
    assert same_figures(configured, given) >= 20
    assert configured["groups"] == given["groups"]


#: Under torchrun: a split, groups and conformal sets (each rank reduces its share of the rows).
DISTRIBUTED = ["fit", "SOURCE", "--val-fraction", "0.6", "--seed", "4", "--group-by", "task", "--conformal-alpha",
               "0.2", "--no-write"]


def test_two_processes_with_gloo_match_one(case, tmp_path):
    from test_cli_distributed import _torchrun, assert_same_figures, one_and_two_processes

    if _torchrun() is None:
        pytest.skip("torchrun not installed")
    one, two = one_and_two_processes(tmp_path, _args(case, DISTRIBUTED, twin=False))
    assert one["source_kind"] == case.kind and one["n_fit"] + one["n_eval"] == len(case.source.y)
    assert_same_figures(one, two)
    report_one, report_two = one_and_two_processes(tmp_path, _args(case, ["report", "SOURCE", "--tau", "1.5",
                                                                          "--group-by", "task"], twin=False))
    assert_same_figures(report_one, report_two)

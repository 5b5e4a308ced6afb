"""Each command hands its options on as one typed request: every parameter reaches it under its own name, and an
option's range is checked by the one check the API uses too."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tempcal.cli import fit as fit_cli
from tempcal.cli import ood as ood_cli
from tempcal.cli import report as report_cli
from tempcal.errors import TempcalError, check_alphas, render
from tempcal.requests import FitRequest, OodRequest, Outputs, ReportRequest, Texts
from tempcal.sources.base import SourceOptions
from tempcal.workflows.ood import check_gate

#: Parameters the request names otherwise (a list of values, a file of scores), and those it does not carry.
RENAMED = {"tau": "taus", "scores_out": "scores"}
NOT_CARRIED = {"ctx", "config", "no_config"}


def _names(*classes) -> set[str]:
    return {f.name for cls in classes for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(("command", "request_class"), [
    (fit_cli.fit, FitRequest), (report_cli.report, ReportRequest), (ood_cli.ood, OodRequest),
])
def test_every_parameter_has_a_field(command, request_class):
    """A new option of the command that its request does not carry is caught here."""
    params = set(inspect.signature(command).parameters) - NOT_CARRIED
    fields = _names(request_class, SourceOptions, Outputs, Texts)
    missing = {RENAMED.get(name, name) for name in params} - fields
    assert not missing


def _captured(monkeypatch, cli, module, runner: str, argv: list[str]):
    """The request ``argv`` builds, taken where the command hands it on (nothing is read)."""
    seen = []
    monkeypatch.setattr(module, runner, lambda ctx, request: seen.append(request))
    code, _, err = cli([*argv, "--no-config"])
    assert code == 0, err
    (request,) = seen
    return request


def test_fit_request_holds_the_given_values(monkeypatch, cli, tmp_path):
    source = str(tmp_path / "val.safetensors")
    request = _captured(monkeypatch, cli, fit_cli, "_fit", [
        "fit", source, "--seed", "3", "--bins", "7", "--objective", "ECE", "--no-write", "--logits-key", "z",
        "--lm-eval-norm", "chars", "--conformal-alpha", "0.1", "--conformal-alpha", "0.2", "--json", "-", "-q"])
    assert request.source == [source] and (request.seed, request.bins, request.objective) == (3, 7, "ece")
    assert request.conformal_alpha == [0.1, 0.2] and request.val_fraction == 0.5 and request.folds is None
    assert request.reading.logits_key == "z" and request.reading.lm_eval_norm == "chars"
    assert request.outputs.no_write and request.outputs.json_out == "-" and not request.outputs.progress


def test_ood_request_holds_the_given_values(monkeypatch, cli, tmp_path):
    request = _captured(monkeypatch, cli, ood_cli, "_ood", [
        "ood", "a.safetensors", "--ood", "b.safetensors", "--ood", "c.safetensors", "--tau", "2", "--tau", "fitted",
        "--scores", str(tmp_path / "s.safetensors"), "--min-auroc", "0.7", "--gen-top", "5"])
    assert request.ood_files == ["b.safetensors", "c.safetensors"] and request.taus == ["2", "fitted"]
    assert request.outputs.scores == str(tmp_path / "s.safetensors") and request.outputs.progress
    assert (request.min_auroc, request.gen_top, request.score) == (0.7, 5, "msp")


@pytest.mark.parametrize(("argv", "api"), [
    (["ood", "--min-auroc", "1.5"], lambda: check_gate(1.5, "min_auroc")),
    (["ood", "--max-fpr95", "-0.25"], lambda: check_gate(-0.25, "max_fpr95")),
    (["fit", "--conformal-alpha", "1"], lambda: check_alphas([1.0])),
    (["report", "--conformal-alpha", "0"], lambda: check_alphas([0.0])),
])
def test_the_api_and_the_command_line_refuse_alike(tmp_path, cli, argv, api):
    """The same value out of range reads the same from both, but for how the option is named."""
    code, out, err = cli([argv[0], str(tmp_path / "missing.safetensors"), *argv[1:], "--no-config"])
    with pytest.raises(TempcalError) as raised:
        api()
    assert code == 2 and out == ""
    assert err == f"error: {render(str(raised.value.args[0]), flags=True)}\n"


@pytest.mark.parametrize(("given", "in_file", "folds", "split", "eval_file"), [
    (["--folds", "3"], "val-fraction = 0.3\n", 3, None, None),  # the command line's folds win over the file's split
    (["--val-fraction", "0.3"], "folds = 3\n", None, 0.3, None),  # ... and its split over the file's folds
    (["--folds", "3"], 'eval = "e.safetensors"\n', 3, None, None),
    (["--eval", "e.safetensors"], "folds = 3\n", None, None, "e.safetensors"),
    (["--val-fraction", "0.3"], "", None, 0.3, None),
    ([], "", None, None, None),  # the default split
])
def test_folds_against_a_split_across_the_file_and_the_command_line(monkeypatch, cli, tmp_path, given, in_file,
                                                                    folds, split, eval_file):
    seen = []

    def settled(ctx, request):
        seen.append(request)
        raise TempcalError("settled")  # where the fit command has settled its cross-fitting: nothing is read

    monkeypatch.setattr(fit_cli.opt, "command_source", settled)
    config = tmp_path / "tempcal.toml"
    config.write_text("[fit]\n" + in_file)
    (tmp_path / "e.safetensors").touch()  # the file's paths must exist when it is read
    assert cli(["fit", "val.safetensors", *given, "--config", str(config)]) == (2, "", "error: settled\n")
    (request,) = seen
    assert (request.folds, request.split) == (folds, split)
    assert request.eval_file == eval_file


@pytest.mark.parametrize(("given", "in_file", "where"), [
    (["--folds", "3", "--val-fraction", "0.3"], "", ""),
    (["--folds", "3", "--eval", "e.safetensors"], "", ""),
    ([], "folds = 3\nval-fraction = 0.3\n", " (both in the configuration file)"),
])
def test_folds_with_a_split_from_the_same_place_are_refused(cli, tmp_path, given, in_file, where):
    config = tmp_path / "tempcal.toml"
    config.write_text("[fit]\n" + in_file)
    code, out, err = cli(["fit", str(tmp_path / "val.safetensors"), *given, "--config", str(config)])
    assert code == 2 and out == ""
    assert err.startswith("error: --folds K fits and reports on every row of SOURCE, out of fold; ")
    assert f"give one or the other{where}" in err and err.count("\n") == 1

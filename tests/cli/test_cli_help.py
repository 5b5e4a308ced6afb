"""Help that fits a terminal: ``COMMAND --help`` is short and shows the common options by panel, ``tempcal help
COMMAND`` shows every option, ``tempcal help TOPIC`` a short text; at 80 columns nothing is cut, only wrapped."""

from __future__ import annotations

import re

import pytest
import typer
from conftest import ROOT, assert_one_error_line

from tempcal.cli import app
from tempcal.cli.help_format import COMMON, OTHER_PANEL, TOPICS, panel_of
from tempcal.cli.help_topics import ALIASES, TOPIC_TEXTS

COMMANDS = ("fit", "report", "ood")
BORDERS = re.compile(r"[│╭╮╰╯─]")


def _commands() -> dict:
    group = typer.main.get_command(app)
    ctx = group.make_context("tempcal", ["--help"], resilient_parsing=True)
    return {name: group.get_command(ctx, name) for name in COMMANDS}


def _flags(param) -> list[str]:
    return [opt for opt in [*param.opts, *param.secondary_opts] if opt.startswith("--")]


def _words(text: str) -> set[str]:
    """The whitespace-separated words of help output, panel borders removed."""
    return set(BORDERS.sub(" ", text).split())


def _prose(text: str) -> str:
    """Help output as one line: borders removed, wrapped lines joined."""
    return " ".join(BORDERS.sub(" ", text).split())


@pytest.fixture
def help_at(cli, monkeypatch):
    """``help_at(argv, columns)``: the standard output of a help command run at that terminal width."""

    def run(argv: list[str], columns: int = 80) -> str:
        monkeypatch.setenv("COLUMNS", str(columns))
        code, out, err = cli(argv)
        assert code == 0 and err == "", err
        return out

    return run


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_is_short_and_shows_the_common_options(help_at, command):
    out = help_at([command, "--help"])
    lines = out.splitlines()
    assert len(lines) <= 65, len(lines)
    assert max(map(len, lines)) <= 80
    assert "…" not in out and "<bool>" not in out and "<str>" not in out
    flags = {flag for param in _commands()[command].params for flag in _flags(param)}
    common = [flag for flag in COMMON[command] if flag in flags]
    assert len(common) >= 10
    words = _words(out)
    for flag in common:
        assert flag in words, flag
    assert f"tempcal help {command}" in _prose(out)
    # options left to ``tempcal help COMMAND``, not shown here
    assert "--head-weight-key" in flags and "--head-weight-key" not in words


@pytest.mark.parametrize(("command", "headline"), [
    ("fit", ("--folds", "--group-by", "--conformal-alpha", "--lm", "--text")),
    ("report", ("--group-by", "--conformal-alpha", "--eval-rows", "--sweep")),
    ("ood", ("--group-by",)),
])
def test_command_help_shows_the_headline_options(help_at, command, headline):
    """The options the last releases were about are shown where a user looks first, not only by tempcal help."""
    words = _words(help_at([command, "--help"]))
    for flag in headline:
        assert flag in words, flag


@pytest.mark.parametrize("command", COMMANDS)
def test_source_is_not_both_required_and_given_by_the_configuration(help_at, command):
    out = help_at([command, "--help"])
    assert "required" not in out.lower()
    assert "Default: the configuration's 'source'." in _prose(out)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_command_lists_every_option(help_at, command):
    """Every long flag of the click command (the negative forms too) is in ``tempcal help COMMAND``."""
    out = help_at(["help", command])
    words = _words(out)
    params = _commands()[command].params
    assert len(params) >= 30
    missing = [flag for param in params for flag in _flags(param) if flag not in words]
    assert not missing, missing
    assert "SOURCE..." in words and "-h," in words


@pytest.mark.parametrize("columns", [80, 60, 132])
@pytest.mark.parametrize("command", COMMANDS)
def test_help_text_wraps_and_is_never_cut(help_at, command, columns):
    """Each word of every option's help is in the output whole (Typer's table cut '$GITHUB_STEP_SUMMARY' at 80
    columns), and no line is wider than the terminal or than 100 columns."""
    out = help_at(["help", command], columns)
    assert "…" not in out and "<bool>" not in out
    assert max(map(len, out.splitlines())) <= min(columns, 100)
    words = _words(out)
    for param in _commands()[command].params:
        cut = [word for word in (param.help or "").split() if word not in words]
        assert not cut, (param.name, cut)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_a_panel(command):
    """An option declared without a panel would land in 'Other options': give it ``rich_help_panel=`` (or a
    fallback in ``help_format.FALLBACK_PANELS``)."""
    loose = [param.name for param in _commands()[command].params if panel_of(command, param) == OTHER_PANEL]
    assert not loose, loose


def test_the_app_help_lists_the_commands_and_help(help_at):
    out = help_at(["--help"])
    assert len(out.splitlines()) <= 50 and "…" not in out and "<bool>" not in out
    words = _words(out)
    assert {"fit", "report", "ood", "help", "--version", "--install-completion"} <= words
    assert "L-BFGS" not in out  # the fit is a certified few-read fit now


def test_help_without_a_topic_lists_the_commands_and_topics(help_at):
    out = help_at(["help"])
    words = _words(out)
    assert {*COMMANDS, *TOPICS} <= words
    for name in TOPICS:
        assert f"({TOPIC_TEXTS[name][1]})" in words, name  # the docs page, whole


@pytest.mark.parametrize("topic", list(TOPICS))
def test_each_topic_is_a_short_text_naming_its_docs_page(help_at, topic):
    out = help_at(["help", topic])
    lines = out.splitlines()
    assert 12 <= len(lines) <= 60, len(lines)
    assert max(map(len, lines)) <= 80 and "…" not in out
    page, _, anchor = TOPIC_TEXTS[topic][1].partition("#")
    assert page in out and (ROOT / page).is_file()
    if anchor:
        assert anchor.replace("-", " ") in (ROOT / page).read_text().lower()
    assert "Options: " in out  # the options the topic concerns, read from the commands


def test_a_topic_lists_the_options_of_its_panel_with_the_commands_that_take_them(help_at):
    out = _prose(help_at(["help", "models"]))
    for flag in ("--inputs", "--batch-size", "--output-key", "--save-logits", "--save-model", "--ood-inputs"):
        assert flag in out, flag
    assert re.search(r"--save-model PATH .*\(fit\)", out)


@pytest.mark.parametrize(("alias", "topic"), [("LM", "lm"), *ALIASES.items()])
def test_topics_answer_to_other_names_in_any_case(help_at, alias, topic):
    assert help_at(["help", alias]) == help_at(["help", topic])


def test_an_unknown_topic_is_one_line_listing_the_topics(cli):
    code, out, err = cli(["help", "nope"])
    assert code == 2 and out == ""
    line = assert_one_error_line(err, "'nope'")
    for name in (*COMMANDS, *TOPICS):
        assert name in line, name


def test_options_left_out_of_the_short_help_still_work(cli, tmp_path):
    """``--head-weight-key`` is not in ``fit --help`` but parses: the run gets as far as the missing SOURCE."""
    code, _, err = cli(["fit", str(tmp_path / "missing.safetensors"), "--head-weight-key", "w", "--no-config"])
    assert code == 2 and "No such option" not in err and "missing.safetensors" in err


def test_help_names_every_kind_of_source(help_at):
    """SOURCE's help, the formats and lm topics and --group-by name the evaluation logs and confidence tables."""
    fit = _prose(help_at(["fit", "--help"]))
    assert "evaluation log, confidence table or model" in fit and "lm-eval log or model" not in fit
    assert "an evaluation log's task (inspect_ai: or model), a confidence table's COLUMN" in fit
    formats = _prose(help_at(["help", "formats"]))
    for said in ("samples_*.jsonl", "lighteval's and inspect_ai's logs", "a confidence table (.parquet too)",
                 "--confidence COLUMN, --correct COLUMN"):
        assert said in formats, said
    lm = _prose(help_at(["help", "lm"]))
    for said in ("samples_*.jsonl[.gz]", "lighteval details_*.parquet", "inspect_ai .eval/.json",
                 "--logprobs --top-logprobs 20", "--group-by task (inspect_ai: or model)"):
        assert said in lm, said

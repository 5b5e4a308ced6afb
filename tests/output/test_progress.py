"""The progress line (tempcal.progress): silent for short runs, when disabled and off a terminal."""

from __future__ import annotations

import io
import sys
import threading
import time

import pytest
from rich.console import Console

from tempcal.progress import Progress


def _terminal() -> tuple[Console, io.StringIO]:
    """A console that is a terminal (as a person's standard error is), writing into a buffer."""
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=100, color_system=None), buffer


def _wait_until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_run_past_the_delay_shows_its_latest_step_and_erases_it_at_the_end(capsys):
    console, buffer = _terminal()
    with Progress("fitting T", enabled=console, delay=0.05) as progress:
        progress.ece_pass(3, 12)
        assert _wait_until(lambda: progress.shown)
        assert _wait_until(lambda: "ECE search: pass 3, 12 intervals open" in buffer.getvalue())
        progress.ece_pass(4, 0)
        assert _wait_until(lambda: "ECE search: done in 4 passes" in buffer.getvalue())
    assert not progress.shown
    text = buffer.getvalue()
    assert "fitting T" in text and " s" in text
    assert text.endswith("\x1b[2K")  # the last frame is erased (transient): a kept bar ends "\x1b[?25h"
    assert capsys.readouterr().out == ""  # never standard output


def test_a_short_run_shows_nothing():
    console, buffer = _terminal()
    with Progress("fitting T", enabled=console, delay=0.5) as progress:
        for k in range(1, 6):
            progress.ece_pass(k, 10 - k)
    time.sleep(0.7)  # past the delay: the timer was cancelled when the work ended
    assert buffer.getvalue() == "" and not progress.shown


def test_disabled_shows_nothing_and_starts_no_thread():
    """``enabled=False`` is what ``--quiet`` and ``--json -`` pass."""
    threads = threading.active_count()
    for enabled in (False, None):
        with Progress("fitting T", enabled=enabled, delay=0.0) as progress:  # type: ignore[arg-type]
            assert threading.active_count() == threads
            progress.update("pass 1")
            time.sleep(0.05)
            assert not progress.shown


def test_off_a_terminal_nothing_is_drawn(capfd):
    """A CI log, a file or a pipe as standard error: no bar frames in it."""
    buffer = io.StringIO()
    with Progress("fitting T", enabled=Console(file=buffer), delay=0.0) as progress:
        progress.update("pass 1")
        time.sleep(0.1)
        assert not progress.shown
    assert buffer.getvalue() == ""
    with Progress("fitting T", enabled=True, delay=0.0) as progress:  # pytest's captured stderr: not a terminal
        assert not sys.stderr.isatty()
        progress.update("pass 1")
        time.sleep(0.1)
        assert not progress.shown
    assert capfd.readouterr() == ("", "")


def test_only_rank_0_draws(monkeypatch):
    """Under torchrun every rank runs the fit on one shared terminal: one line, from rank 0."""
    import tempcal.progress as progress_module

    monkeypatch.setattr(progress_module, "rank", lambda: 1)
    console, buffer = _terminal()
    with Progress("fitting T", enabled=console, delay=0.0) as progress:
        time.sleep(0.1)
        assert not progress.shown
    assert buffer.getvalue() == ""


def test_the_line_can_appear_during_a_slow_first_step():
    """The timer draws the line even if no update comes after the delay (one long pass)."""
    console, buffer = _terminal()
    with Progress("fitting T", enabled=console, delay=0.05) as progress:
        assert _wait_until(lambda: progress.shown)
        assert _wait_until(lambda: "fitting T" in buffer.getvalue())
        progress.update("ECE search: pass 1")
        assert _wait_until(lambda: "ECE search: pass 1" in buffer.getvalue())


def test_an_error_inside_still_erases_the_line():
    console, buffer = _terminal()
    try:
        with Progress("fitting T", enabled=console, delay=0.0) as progress:
            assert _wait_until(lambda: progress.shown)
            raise ValueError("bad row")
    except ValueError:
        pass
    assert not progress.shown and buffer.getvalue().endswith("\x1b[2K")


def test_a_bar_with_a_total_is_the_same_line_and_draws_on_rank_0_only(monkeypatch):
    """The language model's bars (``DelayedBar``) are this progress line with a total: its rules hold for them."""
    import tempcal.progress as progress_module
    from tempcal.lm.hidden import DelayedBar

    console, buffer = _terminal()
    with DelayedBar("running model on texts.txt", 1000, "tokens", enabled=console, delay=0.0) as bar:
        assert isinstance(bar, Progress) and _wait_until(lambda: bar.shown)
        bar.advance(400)
        assert _wait_until(lambda: "400/1,000 tokens" in buffer.getvalue())
    assert not bar.shown and buffer.getvalue().endswith("\x1b[2K")
    monkeypatch.setattr(progress_module, "rank", lambda: 1)
    console, buffer = _terminal()
    with DelayedBar("running model on texts.txt", 10, "tokens", enabled=console, delay=0.0) as bar:
        time.sleep(0.1)
        assert not bar.shown
    assert buffer.getvalue() == ""


@pytest.mark.parametrize("flags, enabled", [(["--json", "REPORT"], True), (["--quiet"], False),
                                            (["--json", "-"], False)])
def test_fit_objective_ece_passes_its_progress_line_each_pass(tmp_path, monkeypatch, capsys, flags, enabled):
    """The command line makes the line (the workflow imports no output module) and the ECE search reports to it."""
    from conftest import EXAMPLE

    from tempcal.cli.main import main

    made: list[tuple[str, object]] = []
    passes: list[tuple[int, int]] = []
    original = Progress.__init__

    def recording(self, description, **kwargs):
        made.append((description, kwargs.get("enabled")))
        original(self, description, **kwargs)

    monkeypatch.setattr(Progress, "__init__", recording)
    monkeypatch.setattr(Progress, "ece_pass", lambda self, k, left: passes.append((k, left)))
    flags = [str(tmp_path / "r.json") if flag == "REPORT" else flag for flag in flags]
    assert main(["fit", str(EXAMPLE), "--objective", "ece", "--val-fraction", "1.0", "--no-write", *flags]) == 0
    assert made == [("fitting T", enabled)]
    assert passes and passes[-1][1] == 0 and [k for k, _ in passes] == sorted({k for k, _ in passes})
    capsys.readouterr()


def test_the_workflows_import_no_output_module():
    """Layering: workflows compute, the command line shows; ``import tempcal.workflows.fit`` loads no tempcal.output."""
    import subprocess

    code = "import sys, tempcal.workflows.fit; print(sorted(m for m in sys.modules if m.startswith('tempcal.output')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _log() -> tuple[Console, io.StringIO]:
    """A console that is not a terminal (a CI log, a pipe), writing into a buffer."""
    buffer = io.StringIO()
    return Console(file=buffer, width=100), buffer


def test_off_a_terminal_a_long_run_prints_a_plain_line_at_most_every_10_s():
    clock, (console, log) = FakeClock(), _log()
    start = clock.now
    with Progress("running gpt2 on texts.txt", enabled=console, total=20_000, unit="tokens", clock=clock,
                  tick=3600) as bar:
        clock.now = start + 5
        bar.advance(1_000)
        clock.now = start + 9.9
        bar.plain_tick()
        assert log.getvalue() == ""  # nothing in the first 10 s
        clock.now = start + 10
        bar.advance(3_000)  # 4,000 in 10 s: 400 tokens/s, 16,000 left: 40 s
        assert log.getvalue() == "running gpt2 on texts.txt: 4,000/20,000 tokens (20%), 400 tokens/s, 40 s left; " \
                                  "10 s so far\n"
        clock.now = start + 19.9
        bar.advance(4_000)
        bar.plain_tick()
        assert log.getvalue().count("\n") == 1  # at most one line per 10 s
        clock.now = start + 20
        bar.plain_tick()  # no step reported meanwhile: the clock alone brings the line
        clock.now = start + 95
        bar.advance(2_000)
    lines = log.getvalue().splitlines()
    assert lines[1] == "running gpt2 on texts.txt: 8,000/20,000 tokens (40%), 400 tokens/s, 30 s left; 20 s so far"
    # 10,000 in 95 s: 105 tokens/s; 10,000 left: 95 s
    assert lines[2] == ("running gpt2 on texts.txt: 10,000/20,000 tokens (50%), 105 tokens/s, 1 min 35 s left; "
                        "1 min 35 s so far")
    assert len(lines) == 3
    clock.now = start + 200
    bar.plain_tick()  # the work has ended: nothing more
    assert len(log.getvalue().splitlines()) == 3 and not bar.shown


def test_off_a_terminal_a_line_without_a_total_says_the_latest_step():
    clock, (console, log) = FakeClock(), _log()
    start = clock.now
    with Progress("fitting T", enabled=console, clock=clock, tick=3600) as progress:
        clock.now = start + 12
        progress.plain_tick()
        clock.now = start + 22.4
        progress.ece_pass(3, 12)
    assert log.getvalue().splitlines() == ["fitting T; 12 s so far",
                                           "fitting T: ECE search: pass 3, 12 intervals open; 22 s so far"]


@pytest.mark.parametrize("how", ["quiet", "rank 1", "terminal", "short"])
def test_no_plain_line_when_quiet_on_other_ranks_on_a_terminal_or_in_a_short_run(monkeypatch, how):
    import tempcal.progress as progress_module

    clock, (console, log) = FakeClock(), _log()
    if how == "rank 1":
        monkeypatch.setattr(progress_module, "rank", lambda: 1)
    if how == "terminal":
        console, log = _terminal()
    enabled = False if how == "quiet" else console
    start = clock.now
    with Progress("running model", enabled=enabled, total=100, unit="rows", clock=clock, tick=3600,
                  delay=3600) as bar:
        for k in range(1, 10):
            clock.now = start + (k if how == "short" else 15 * k)
            bar.advance(10)
            bar.plain_tick()
    assert "so far" not in log.getvalue()
    assert log.getvalue() == ""  # the terminal's bar waits for its delay; the rest print nothing


def test_off_a_terminal_the_clock_is_read_by_a_thread_during_a_slow_step(monkeypatch):
    """One long step with no report (a model's first batch): the line still comes, from the ticking thread."""
    import tempcal.progress as progress_module

    monkeypatch.setattr(progress_module, "PLAIN_EVERY", 0.05)
    console, log = _log()
    with Progress("running model", enabled=console, total=10, unit="rows", tick=0.01):
        assert _wait_until(lambda: "running model: 0/10 rows (0%), no rows done yet;" in log.getvalue())
    threads = {t.name for t in threading.enumerate()}
    assert _wait_until(lambda: "tempcal-progress" not in {t.name for t in threading.enumerate()}), threads


@pytest.mark.parametrize("quiet", [False, True])
def test_a_piped_command_prints_plain_progress_lines_and_none_under_quiet(tmp_path, monkeypatch, capsys, quiet):
    """``fit`` and a model run as a CI log sees them (PLAIN_EVERY cut to 0 s so a short run shows its lines)."""
    from conftest import EXAMPLE

    import tempcal.progress as progress_module
    from tempcal.cli.main import main

    monkeypatch.setattr(progress_module, "PLAIN_EVERY", 0.0)
    flags = ["-q"] if quiet else []
    assert main(["fit", str(EXAMPLE), "--objective", "ece", "--no-write", *flags]) == 0
    err = capsys.readouterr().err
    if quiet:
        assert err == ""
    else:
        assert "\x1b" not in err  # plain text: no bar frames, no cursor codes
        assert any(line.startswith("fitting T: ECE search: pass ") and line.endswith(" so far")
                   for line in err.splitlines()), err


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")  # the digits fixture scripts its model
def test_a_model_run_off_a_terminal_prints_plain_lines(digits, monkeypatch, capsys):
    from conftest import run_model_source

    import tempcal.progress as progress_module

    monkeypatch.setattr(progress_module, "PLAIN_EVERY", 0.0)
    run_model_source(digits["model"], digits["inputs"], device="cpu", batch_size=500, progress=True)
    lines = capsys.readouterr().err.splitlines()
    rows = len(digits["y"])
    assert lines[-1].startswith("running mlp.pt") and f"{rows:,}/{rows:,} rows (100%)" in lines[-1], lines

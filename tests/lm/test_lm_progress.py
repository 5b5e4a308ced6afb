"""tempcal.lm.hidden's progress bars: drawn on a terminal only, after their delay, never when disabled; erased."""

from __future__ import annotations

import io
import time

from rich.console import Console

from tempcal.lm.hidden import DelayedBar, PassCounter


def terminal() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=100), buffer


def test_a_long_step_shows_its_bar_and_erases_it():
    console, buffer = terminal()
    with DelayedBar("running model on texts.txt", 1000, "tokens", enabled=console, delay=0.0) as bar:
        time.sleep(0.3)
        assert bar.shown
        bar.advance(400)
        time.sleep(0.3)
    assert "running model on texts.txt" in buffer.getvalue() and "400/1,000 tokens" in buffer.getvalue()
    assert not bar.shown


def test_a_short_step_a_disabled_bar_and_a_log_show_nothing():
    console, buffer = terminal()
    with DelayedBar("short", 10, "tokens", enabled=console, delay=5.0) as bar:
        bar.advance(10)
    assert buffer.getvalue() == ""
    with DelayedBar("quiet", 10, "tokens", enabled=False, delay=0.0) as bar:
        time.sleep(0.1)
        assert not bar.shown
    log = io.StringIO()
    with DelayedBar("log", 10, "tokens", enabled=Console(file=log), delay=0.0) as bar:
        time.sleep(0.1)
    assert log.getvalue() == ""


def test_each_pass_gets_its_own_numbered_bar():
    counter = PassCounter("model head", False)
    assert [counter.bar(5).description for _ in range(2)] == ["model head: pass 1 over the rows",
                                                               "model head: pass 2 over the rows"]

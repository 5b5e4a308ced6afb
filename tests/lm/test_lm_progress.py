"""tempcal.lm.hidden's progress bars: drawn on a terminal only, after their delay, never when disabled; erased."""

from __future__ import annotations

import io
import itertools
import time
from types import SimpleNamespace

import torch
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


def test_the_forward_bar_counts_the_tokens_of_the_texts_that_run():
    """A one-token text has no row (it predicts nothing) and is never run: the bar's total leaves it out, as the
    batches do, so the bar ends at 100%."""
    from tempcal.lm.forward import Tokenized, plan_batches, texts_holding

    ids = [torch.arange(4), torch.arange(1), torch.arange(3), torch.arange(1), torch.arange(2)]
    rows = [max(len(t) - 1, 0) for t in ids]
    starts = torch.tensor([0, *itertools.accumulate(rows)])
    tokenized = Tokenized(ids, starts, torch.zeros(int(starts[-1]), dtype=torch.int64))
    for lo, hi in ((0, 6), (0, 3), (3, 6), (2, 4), (5, 6)):
        batched = sorted(i for batch in plan_batches(tokenized, lo, hi, 2, 1 << 20) for i in batch)
        expected = [i for i in range(len(ids)) if any(lo <= r < hi for r in range(starts[i], starts[i + 1]))]
        assert texts_holding(tokenized, lo, hi) == batched == expected, (lo, hi)


def test_the_forward_bar_ends_at_the_tokens_the_pass_runs(tmp_path, monkeypatch):
    """The bar's total is what the forward pass will report, one-token texts (never run) left out."""
    from tempcal.lm import forward, hidden, source
    from tempcal.lm.forward import Tokenized, plan_batches

    ids = [torch.arange(4), torch.arange(1), torch.arange(3), torch.arange(1), torch.arange(2)]
    starts = torch.tensor([0, *itertools.accumulate(max(len(t) - 1, 0) for t in ids)])
    tokenized = Tokenized(ids, starts, torch.zeros(int(starts[-1]), dtype=torch.int64))
    seen: dict[str, int] = {"total": -1, "advanced": 0}

    def fake_forward(lm, tokenized, store, *, lo, hi, batch_size, batch_tokens, progress=None):
        for batch in plan_batches(tokenized, lo, hi, batch_size, 1 << 20):
            progress(sum(len(tokenized.ids[i]) for i in batch))
        return None

    class Recording(hidden.DelayedBar):
        def __init__(self, description, total, unit, **kwargs):
            seen["total"] = total
            super().__init__(description, total, unit, **kwargs)

        def advance(self, n):
            seen["advanced"] += n
            super().advance(n)

    monkeypatch.setattr(forward, "run_forward", fake_forward)
    monkeypatch.setattr(hidden, "DelayedBar", Recording)
    lm = SimpleNamespace(head=SimpleNamespace(width=4), dtype=torch.float32, folder=tmp_path)
    options = SimpleNamespace(progress=False, batch_size=2, batch_tokens=None, spill_dir=None)
    source._forward(lm, tokenized, options, 0, int(starts[-1]), tmp_path / "texts.txt")
    assert seen["total"] == seen["advanced"] == 4 + 3 + 2

"""How a file is read when a T is stored with it: an option named on the command line wins over the stored reading
even at its default value, the note (``note:``, not ``warning:``) says what was taken and what was overridden, and
the figures equal the same command on a copy without a stored T, the options written out; the clipping warning of a
confidence table says the values on its scale."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from confidence_tables import logits_of, make_rows, write_table
from reference import ece_loop, nll_at, optimal_temperature


def _same_figures(mine: dict, written_out: dict) -> None:
    """Every figure of the two reports' rows at the same temperatures (the JSON's numbers and their names)."""
    assert [r["tau"] for r in mine["results"]] == [r["tau"] for r in written_out["results"]]
    for a, b in zip(mine["results"], written_out["results"], strict=True):
        assert {k: v for k, v in a.items() if isinstance(v, float)} == \
            {k: v for k, v in b.items() if isinstance(v, float)}


def _note_lines(err: str, text: str) -> list[str]:
    return [line for line in err.splitlines() if text in line]


def test_percent_table_clipping_says_0_or_100(tmp_path, run_json, cli):
    """3 confidences of exactly 0 or 100 on --confidence-scale 100: the warning names the values as written and the
    range on that scale; T equals scipy's on the clipped logits and the same table written as probabilities."""
    rows = make_rows(300, seed=31)
    rows["confidence"][[0, 1, 2]] = [1.0, 0.0, 1.0]
    percent = write_table(tmp_path / "pct.csv", rows, scale=100)
    columns = ["--confidence", "confidence", "--correct", "correct"]
    code, _, err = cli(["fit", str(percent), *columns, "--confidence-scale", "100", "--no-write"])
    assert code == 0, err
    (line,) = _note_lines(err, "clipped")
    assert line == (f"warning: {percent}: 3 confidences of exactly 0 or 100 clipped to [0.0001, 100 - 0.0001] "
                    "(their logits would be infinite)")
    fitted = run_json(["fit", str(percent), *columns, "--confidence-scale", "100", "--val-fraction", "1",
                       "--no-write"])
    plain = run_json(["fit", str(write_table(tmp_path / "p.csv", rows)), *columns, "--val-fraction", "1",
                      "--no-write"])
    assert fitted["clipped"] == plain["clipped"] == 3
    (said,) = [w for w in plain["warnings"] if "clipped" in w]
    assert "of exactly 0 or 1 clipped to [1e-06, 1 - 1e-06]" in said
    expected = optimal_temperature(logits_of(rows["confidence"]), rows["correct"])
    assert fitted["temperature"] == pytest.approx(expected, rel=1e-6)
    assert fitted["temperature"] == pytest.approx(plain["temperature"], rel=1e-9)


@pytest.fixture
def fitted_at_100(tmp_path, cli):
    """A table of probabilities (columns 'c' and 'k') fitted by mistake with --confidence-scale 100, and a copy of it
    made before the fit (no sidecar)."""
    rows = make_rows(250, seed=32)
    rows["c"], rows["k"] = rows.pop("confidence"), rows.pop("correct")
    path = write_table(tmp_path / "answers.csv", rows)
    copy = tmp_path / "copy" / "answers.csv"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    code, _, err = cli(["fit", str(path), "--confidence", "c", "--correct", "k", "--confidence-scale", "100", "-q"])
    assert code == 0, err
    return path, copy, rows


def test_an_explicit_default_scale_overrides_the_stored_one(fitted_at_100, run_json, cli):
    path, copy, rows = fitted_at_100
    mine = run_json(["report", str(path), "--confidence-scale", "1", "--tau", "1.5"])
    assert (mine["confidence_column"], mine["correct_column"], mine["confidence_scale"]) == ("c", "k", 1)
    (note,) = [w for w in mine["warnings"] if "stored T was fitted" in w]
    assert note == (f"{path}: read as the stored T was fitted: confidence column 'c', correct column 'k'; as given "
                    "instead of as the stored T was fitted: confidence scale 1 (fitted with 100)")
    written_out = run_json(["report", str(copy), "--confidence", "c", "--correct", "k", "--confidence-scale", "1",
                            "--tau", "1.5"])
    _same_figures(mine, written_out)
    (row,) = mine["results"]
    z, y = logits_of(rows["c"]), rows["k"]
    assert row["nll"] == pytest.approx(nll_at(z, y, 1.5), rel=1e-9)
    assert row["ece"] == pytest.approx(ece_loop(z, y, 1.5)[0], abs=1e-9)
    # Without the option the stored scale is taken: every confidence is read as a hundredth of its value.
    stored = run_json(["report", str(path), "--tau", "1.5"])
    assert stored["confidence_scale"] == 100
    assert stored["results"][0]["nll"] == pytest.approx(nll_at(logits_of(rows["c"] / 100), y, 1.5), rel=1e-9)


def test_the_stored_reading_note_is_a_note(fitted_at_100, cli):
    """Informational: ``note:`` on standard error (not ``warning:``), and nothing under --quiet."""
    path, _, _ = fitted_at_100
    code, _, err = cli(["report", str(path), "--confidence-scale", "1", "--tau", "1.5"])
    assert code == 0, err
    (line,) = _note_lines(err, "stored T was fitted")
    assert line.startswith(f"note: {path}: read as the stored T was fitted: ") and "--confidence-scale" not in line
    assert not _note_lines(err, "warning:")
    code, _, err = cli(["report", str(path), "--tau", "1.5"])
    assert code == 0 and _note_lines(err, "stored T was fitted")[0].startswith("note: ")
    code, _, err = cli(["report", str(path), "--tau", "1.5", "-q"])
    assert code == 0 and not _note_lines(err, "stored T was fitted")


def test_an_explicit_default_key_overrides_the_stored_one(tmp_path, run_json):
    """An .npz fitted with --logits-key other: --logits-key logits (the default, written out) reads 'logits'."""
    rng = np.random.default_rng(33)
    labels = rng.integers(0, 4, 300)
    logits, other = rng.normal(size=(300, 4)) * 3, rng.normal(size=(300, 4))
    logits[np.arange(300), labels] += 2
    other[np.arange(300), labels] += 1.5
    path = tmp_path / "run.npz"
    np.savez(path, logits=logits, other=other, labels=labels)
    copy = tmp_path / "copy.npz"
    shutil.copyfile(path, copy)
    fitted = run_json(["fit", str(path), "--logits-key", "other", "--val-fraction", "1"])
    assert fitted["temperature"] == pytest.approx(optimal_temperature(other, labels), rel=1e-6)
    mine = run_json(["report", str(path), "--logits-key", "logits", "--tau", "2"])
    (note,) = [w for w in mine["warnings"] if "stored T was fitted" in w]
    assert note == f"{path}: as given instead of as the stored T was fitted: logits 'logits' (fitted with 'other')"
    _same_figures(mine, run_json(["report", str(copy), "--tau", "2"]))
    assert mine["results"][0]["nll"] == pytest.approx(nll_at(logits, labels, 2.0), rel=1e-9)
    taken = run_json(["report", str(path), "--tau", "2"])
    (note,) = [w for w in taken["warnings"] if "stored T was fitted" in w]
    assert note == f"{path}: read as the stored T was fitted: logits 'other'"
    assert taken["results"][0]["nll"] == pytest.approx(nll_at(other, labels, 2.0), rel=1e-9)
    # The option given with the stored value: nothing is overridden, nothing to say.
    same = run_json(["report", str(path), "--logits-key", "other", "--tau", "2"])
    assert not [w for w in same["warnings"] if "stored T was fitted" in w]
    _same_figures(same, taken)

"""Every case of the seeded corpus (tests/core/fit_corpus.py): T within 1e-6 of the float64 optimum in at most 3
reads of the data, the validating scan included. Cases over ``HEAVY_LOGITS`` logits are marked slow
(``python -m pytest -m slow tests/core/test_fit_corpus.py`` runs them)."""

from __future__ import annotations

import pytest
import torch
from fit_corpus import corpus, heavy, reference

import tempcal
from tempcal.core.data import as_logits_data

CASES = corpus()
#: The fit against the root of the exact float64 dNLL/dbeta (finer than scipy's search on NLL values).
ROOT_TOL = 1e-6
PARAMS = [pytest.param(name, marks=pytest.mark.slow) if heavy(name) else name for name in CASES]


class _References(dict):
    """Each case's references, looked up (or computed and cached) the first time a test asks."""

    def __missing__(self, name: str) -> dict:
        self[name] = reference(name, *CASES[name]())
        return self[name]


@pytest.fixture(scope="module")
def refs():
    return _References()


def check(result, ref) -> None:
    """At most 3 reads, certified, and T within 1e-6 of the float64 references (or at the right bound)."""
    assert result.passes <= 3, result
    assert result.converged, result
    if ref["degenerate"]:
        assert result.bound is not None
        return
    assert result.bound is None and result.method == "certified"
    assert abs(result.temperature / ref["polished"] - 1) < ROOT_TOL, (result.temperature, ref)
    # On the flattest NLLs scipy's value-based search is itself ~1e-6 from the root (huge-T-n20000: 1.5e-6);
    # that much of its own error is allowed on top of 1e-6.
    scipy_error = abs(ref["scipy"] / ref["polished"] - 1)
    assert abs(result.temperature / ref["scipy"] - 1) < 1e-6 + scipy_error, (result.temperature, ref)


@pytest.mark.parametrize("name", PARAMS)
def test_corpus_case_within_1e6_of_the_float64_optimum_in_at_most_three_reads(name, refs):
    logits, labels = CASES[name]()
    check(tempcal.fit_temperature(logits, labels, device="cpu"), reference(name, logits, labels))


def test_the_default_run_covers_every_family_and_the_sampled_grid():
    fast = [name for name in CASES if not heavy(name)]
    assert 100 < len(fast) < len(CASES)
    for family in ("gauss", "margin", "binary", "neginf", "mask", "tiny-T", "huge-T", "beyond-T-max",
                   "float64-input", "digits"):
        assert any(name.startswith(family) for name in fast), family
    assert "margin-n5000-c100-m2.0-noise0.5" in fast  # float32 compute with a sampled grid


@pytest.mark.parametrize("order", ["by-label", "errors-last", "reversed"])
def test_row_order_does_not_cost_reads(order, refs):
    for name in ("gauss-n10000-c10-s1.0-sig3.0", "margin-n5000-c100-m2.0-noise0.5"):
        z, y = CASES[name]()
        if order == "by-label":
            index = torch.argsort(y, stable=True)
        elif order == "errors-last":
            index = torch.argsort((z.argmax(1) != y).int(), stable=True)
        else:
            index = torch.arange(len(y) - 1, -1, -1)
        check(tempcal.fit_temperature(z[index], y[index], device="cpu"), refs[name])


@pytest.mark.parametrize("chunk_rows", [7, 333])
def test_small_chunks_change_nothing_but_rounding(chunk_rows, refs):
    name = "margin-n1000-c100-m2.0-noise0.5"
    z, y = CASES[name]()
    check(tempcal.fit_temperature(z, y, device="cpu", chunk_rows=chunk_rows), refs[name])


@pytest.mark.parametrize("name", ["margin-n1000-c100-m2.0-noise0.5", "gauss-n200-c1000-s1.0-sig3.0", "digits"])
def test_float32_passes_on_small_inputs_stay_within_tolerance(name, refs):
    z, y = CASES[name]()
    scan = tempcal.Scan(as_logits_data(z, y), device="cpu", dtype=torch.float32, fit_rows="all")
    check(tempcal.fit_temperature(scan), refs[name])


def test_a_split_starts_from_its_own_rows(refs):
    """A scan told the fitting rows of a split prepares their start: the fit on them takes at most 3 reads."""
    z, y = CASES["margin-n5000-c100-m2.0-noise0.5"]()
    rows = torch.from_numpy(tempcal.stratified_split(y.numpy(), 0.5, 0)[0])
    scan = tempcal.Scan(as_logits_data(z, y), device="cpu", fit_rows=rows)
    result = tempcal.fit_temperature(scan.select(rows))
    assert result.passes <= 3 and result.converged and result.method == "certified"
    reference = tempcal.fit_temperature(z[rows], y[rows], device="cpu")
    assert abs(result.temperature / reference.temperature - 1) < 1e-6

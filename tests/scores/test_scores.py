"""Every OOD score (tempcal.scores) against an independent float64 numpy reference, on random and adversarial logits.

``reference.ref_scores`` is written from the contract's definitions, row-wise over all classes, and shares no code
with the package; ``exact`` (below) checks that reference itself in 60-digit arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import id_ood_logits
from reference import ref_energy, ref_msp, ref_scores
from sklearn.metrics import roc_auc_score

from tempcal.core.data import as_logits_data
from tempcal.core.scan import Scan
from tempcal.errors import TempcalError
from tempcal.scores import REGISTRY, get_score, score_label, score_names
from tempcal.scores.engine import ScorePass
from tempcal.scores.gen import Gen
from tempcal.workflows.ood import score_samples

ALL = tuple(REGISTRY)
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TAUS = [1e-3, 0.05, 0.5, 1.0, 3.0, 100.0, 1e6]
EXTREME_TAUS = [1e-300, 1e-40, 1e-20, 1e20, 1e40, 1e300]


def exact(z: np.ndarray, tau: float, gamma: float = 0.1, top: int = 100) -> dict[str, np.ndarray]:
    """The same definitions in 60-digit arithmetic (mpmath), rounded once to float64: checks the checker."""
    mp = pytest.importorskip("mpmath").mp
    mp.dps = 60
    out: dict[str, list[float]] = {name: [] for name in ALL}
    for row in np.asarray(z, dtype=np.float64):
        x = [mp.mpf(float(v)) / mp.mpf(tau) if np.isfinite(v) else None for v in row]
        best = int(np.argmax(row))
        # 60 digits cannot hold 1 + 1e-1700: keep the sum over the other classes apart, as log1p's argument.
        rest = mp.fsum(mp.exp(v - x[best]) for c, v in enumerate(x) if v is not None and c != best)
        log_s0 = mp.log1p(rest)
        p = [mp.exp(v - x[best] - log_s0) if v is not None else mp.mpf(0) for v in x]
        log_p = [v - x[best] - log_s0 if v is not None else None for v in x]
        one_minus = [rest / (1 + rest) if c == best else 1 - q for c, q in enumerate(p)]
        order = sorted(range(len(p)), key=lambda c: -p[c])[: min(top, len(p))]
        out["msp"].append(float(p[best]))
        out["energy"].append(float(mp.mpf(float(row[best])) + mp.mpf(tau) * log_s0))
        out["maxlogit"].append(float(mp.mpf(float(row[best])) / mp.mpf(tau)))
        out["entropy"].append(float(mp.fsum(q * lq for q, lq in zip(p, log_p, strict=True) if q > 0)))
        out["gen"].append(float(-mp.fsum(p[c] ** gamma * one_minus[c] ** gamma for c in order)))
    return {name: np.array(values) for name, values in out.items()}


def ours(z: torch.Tensor, taus, names=ALL, gamma=0.1, top=100, chunk_rows=None) -> dict[str, np.ndarray]:
    """Float64 ``[T, N]`` scores from the scores-only pass, chunk by chunk."""
    options = {"gen_gamma": gamma, "gen_top": top}
    scorer = ScorePass([get_score(name, options) for name in names], [1.0 / t for t in taus])
    chunks = [z] if chunk_rows is None else list(torch.split(z, chunk_rows))
    return {k: v.numpy() for k, v in stream(scorer, chunks).items()}


def stream(scorer: ScorePass, chunks) -> dict[str, torch.Tensor]:
    """Each score's ``[T, N]`` values over the chunks, read one after another."""
    parts = [scorer.chunk(z) for z in chunks]
    return {name: torch.cat([part[name] for part in parts], dim=1) for name in parts[0]}


def as64(z: torch.Tensor) -> np.ndarray:
    return z.to(torch.float64).numpy()


def check_close(got: dict, z64: np.ndarray, taus, rtol: float, gamma=0.1, top=100) -> None:
    classes = z64.shape[-1] if z64.ndim == 2 else 2
    for t, tau in enumerate(taus):
        want = ref_scores(z64, tau, gamma, top)
        for name, values in got.items():
            w, g = want[name], values[t]
            assert not np.isnan(g).any(), (name, tau)
            # energy = z_max + tau log(...): relative to its larger part when the two nearly cancel
            scale = abs(w).max() + tau * math.log(max(2, classes)) if name == "energy" else 0.0
            np.testing.assert_allclose(g, w, rtol=rtol, atol=max(rtol * scale, 1e-300), err_msg=f"{name} at tau={tau}")


def random_logits(seed: int, n: int, classes: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, classes, generator=g, dtype=torch.float64) * scale
    z += torch.randn(n, 1, generator=g, dtype=torch.float64) * 5  # rows at different offsets
    return z


def adversarial_logits(dtype: torch.dtype) -> torch.Tensor:
    """Rows that break naive code: ties, saturation, huge gaps, impossible classes, one-hot rows."""
    inf = math.inf
    big = {torch.float16: 6e4, torch.float64: 1e308}.get(dtype, 1e30)
    rows = [
        [0.0, 0.0, 0.0, 0.0, 0.0],  # uniform
        [3.0, 3.0, 1.0, 0.0, -1.0],  # tied maximum
        [3.0, 3.0, 3.0, 3.0, 2.0],  # four-way tie
        [5.0, 1.0, 1.0, 1.0, 1.0],  # tied second
        [30.0, 0.0, -1.0, -2.0, -3.0],  # saturated at tau 1 (r ~ 1e-13)
        [60.0, 1.0, 0.5, 0.0, -0.5],  # r ~ 1e-26: float32 1/s0 and 1 - p are exactly 1 and 0
        [200.0, 0.0, 0.0, 0.0, 0.0],  # exp(-200) underflows float32
        [big, -big, 0.0, 1.0, 2.0],  # huge gaps
        [1.0, -inf, -inf, -inf, -inf],  # one possible class (one-hot)
        [1.0, 0.5, -inf, -inf, -inf],  # two possible classes
        [-inf, 2.0, -inf, 2.0, -inf],  # tied maximum among impossible classes
        [-7.0, -7.0 - 1e-3, -8.0, -inf, -9.0],  # tiny gap
        [-big, -big, -big, -big, -big + 1],  # far from zero
    ]
    return torch.tensor(rows, dtype=torch.float64).to(dtype)


# -- values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("classes, scale", [(3, 1.0), (10, 3.0), (150, 2.0), (40, 30.0)])
def test_random_float64_matches_reference(classes, scale):
    z = random_logits(classes, 300, classes, scale)
    check_close(ours(z, TAUS, chunk_rows=64), as64(z), TAUS, rtol=1e-10)


@pytest.mark.parametrize("dtype", DTYPES[:3])
@pytest.mark.parametrize("classes, scale", [(10, 3.0), (150, 2.0)])
def test_random_low_precision_matches_reference(dtype, classes, scale):
    """float16/bfloat16/float32 inputs are computed in float32: values to float32 accuracy."""
    z = random_logits(7 + classes, 300, classes, scale).to(dtype)
    check_close(ours(z, TAUS, chunk_rows=100), as64(z), TAUS, rtol=3e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_rows_match_reference(dtype):
    z = adversarial_logits(dtype)
    rtol = 1e-10 if dtype == torch.float64 else 3e-5
    taus = TAUS + EXTREME_TAUS
    check_close(ours(z, taus), as64(z), taus, rtol=rtol)


def test_reference_and_ours_against_60_digit_arithmetic():
    """Adversarial float64 rows: both float64 implementations within a few ulps of the exact values."""
    z = adversarial_logits(torch.float64)
    taus = [1e-3, 0.05, 1.0, 100.0, 1e-20, 1e20, 1e-300, 1e300]
    got = ours(z, taus)
    for t, tau in enumerate(taus):
        want, ref = exact(as64(z), tau), ref_scores(as64(z), tau)
        for name in ALL:
            np.testing.assert_allclose(got[name][t], want[name], rtol=1e-12, atol=1e-300, err_msg=f"ours {name} {tau}")
            np.testing.assert_allclose(ref[name], want[name], rtol=1e-12, atol=1e-300, err_msg=f"ref {name} {tau}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_logit_is_classes_zero_and_z(dtype):
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(200, generator=g, dtype=torch.float64) * 8).to(dtype)
    z[:4] = torch.tensor([0.0, 40.0, -40.0, 200.0 if dtype != torch.float16 else 6e4]).to(dtype)
    single, column = ours(z, TAUS), ours(z[:, None], TAUS)
    pair = ours(torch.stack([torch.zeros_like(z), z], 1), TAUS)
    for name in ALL:
        np.testing.assert_array_equal(single[name], column[name])
        np.testing.assert_array_equal(single[name], pair[name])
    rtol = 1e-10 if dtype == torch.float64 else 3e-5
    check_close(single, as64(z), TAUS, rtol=rtol)
    s = 1 / (1 + np.exp(-as64(z)))  # and the sigmoid view of the same thing
    np.testing.assert_allclose(single["msp"][TAUS.index(1.0)], np.maximum(s, 1 - s), rtol=rtol)


def test_no_nan_anywhere_at_saturation():
    z = adversarial_logits(torch.float32)
    for values in ours(z, TAUS + EXTREME_TAUS).values():
        assert not np.isnan(values).any()


# -- GEN's parameters -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma", [0.01, 0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("top", [1, 2, 5, 100])
def test_gen_gamma_and_top(gamma, top):
    z = random_logits(11, 120, 12, 3.0)
    z[:3] = torch.tensor([[20.0] + [0.0] * 11, [5.0] * 12, [9.0, 9.0] + [-math.inf] * 10], dtype=torch.float64)
    taus = [0.3, 1.0, 7.0, 1e3]
    got = ours(z, taus, names=["gen"], gamma=gamma, top=top)
    check_close(got, as64(z), taus, rtol=1e-10, gamma=gamma, top=top)


def test_gen_top_m_below_classes_in_float32():
    z = random_logits(12, 400, 300, 2.0).to(torch.float32)
    got = ours(z, TAUS, names=["gen"], top=100, chunk_rows=128)
    check_close(got, as64(z), TAUS, rtol=3e-5, top=100)


def test_gen_parameters_are_checked():
    for bad in (dict(gamma=0.0), dict(gamma=-1.0), dict(gamma=math.nan), dict(gamma=math.inf), dict(top=0),
                dict(top=2.5), dict(top=math.inf), dict(top=True)):
        with pytest.raises(TempcalError):
            Gen(**bad)  # type: ignore[arg-type]
    assert repr(get_score("gen", {"gen_gamma": 0.5, "gen_top": 7})) == "Gen(gamma=0.5, top=7)"
    assert get_score("msp", {"gen_gamma": 0.5}) is get_score("msp")  # other scores ignore GEN's options


# -- rankings where float32 saturates, and where temperatures flatten every row ----------------------------------
def saturated(dtype: torch.dtype, seed: int = 5) -> tuple[torch.Tensor, np.ndarray]:
    """ID and OOD rows that are all confident at tau = 1: ``r = sum_{c != max} e^{z_c - z_max}`` in
    [1e-9, 3e-8] (ID lower), so a float32 ``max softmax`` is exactly 1 for every row and ``1 - p_max``
    is 0, while float64 separates them (``1 - msp`` is >= 1e-9, ~10^7 float64 steps below 1)."""
    g = torch.Generator().manual_seed(seed)
    n, classes = 250, 20
    z = torch.randn(2 * n, classes, generator=g, dtype=torch.float64)
    u = torch.rand(2 * n, generator=g, dtype=torch.float64)
    log_r = torch.cat([math.log(1e-9) + u[:n] * math.log(10.0), math.log(3e-9) + u[n:] * math.log(10.0)])
    z[:, 0] = torch.logsumexp(z[:, 1:], 1) - log_r
    return z.to(dtype), np.r_[np.ones(n), np.zeros(n)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_auroc_equals_float64_reference_at_saturation(dtype):
    z, labels = saturated(dtype)
    taus = [1.0, 0.7, 0.02]
    got = ours(z, taus, chunk_rows=128)
    for t, tau in enumerate(taus):
        want = ref_scores(as64(z), tau)
        # msp at tau < 1: r < 1e-12, where float64 msp itself sits on a grid of 1.1e-16 steps below 1 and two
        # correct float64 codes differ by one step (libm rounding): the ranking is at float64's resolution there.
        for name in ALL if tau == 1.0 else [n for n in ALL if n != "msp"]:
            assert abs(roc_auc_score(labels, got[name][t]) - roc_auc_score(labels, want[name])) <= 1e-12, (name, tau)
    naive = torch.softmax(z.to(torch.float32), 1).max(1).values.double().numpy()  # what plain float32 code gives
    assert len(np.unique(naive)) < 5 and len(np.unique(got["msp"][0])) == len(labels)
    assert abs(roc_auc_score(labels, naive) - roc_auc_score(labels, ref_scores(as64(z), 1.0)["msp"])) > 0.1


def test_float32_underflow_does_not_tie_entropy_and_gen():
    """tau = 0.01 with margins of a few units: every non-max exp(beta d) underflows float32 (beta m > 104),
    but float64 entropy and GEN still separate the rows; ours must too, and rank as the reference does."""
    z, labels = saturated(torch.float32)
    z = z / 10  # margins 1.7-3.2, beta m = 170-320 at tau 0.01
    got = ours(z, [0.01])
    want = ref_scores(as64(z), 0.01)
    for name in ("entropy", "gen"):
        assert len(np.unique(want[name])) == len(labels)
        assert abs(roc_auc_score(labels, got[name][0]) - roc_auc_score(labels, want[name])) <= 1e-12


@pytest.mark.parametrize("classes", [100, 1000])
def test_float32_keeps_the_ranking_at_flat_temperatures(classes):
    """At tau >> the logits' spread every row is nearly uniform, and entropy and GEN differ between rows only in
    second order (~1e-6 relative): summing the softmax in float32 would rank them by rounding noise. The sums are
    accumulated in float64, and GEN's terms are taken relative to the second maximum's there."""
    z_id, _, z_ood = id_ood_logits(n_id=600, n_ood=400, c=classes, seed=8)
    z = torch.cat([z_id, z_ood]).to(torch.float32)
    labels = np.r_[np.ones(600), np.zeros(400)]
    taus = [100.0, 1000.0, 1e4]
    got = ours(z, taus, chunk_rows=256)
    for t, tau in enumerate(taus):
        want = ref_scores(as64(z), tau)
        for name in ALL:
            assert abs(roc_auc_score(labels, got[name][t]) - roc_auc_score(labels, want[name])) < 2e-5, (name, tau)


# -- the pass itself -------------------------------------------------------------------------------------------
def test_one_read_per_chunk_and_sharing_changes_nothing():
    z = random_logits(21, 500, 30, 3.0).to(torch.float32)
    reads = []

    def chunks():
        for i, part in enumerate(torch.split(z, 128)):
            reads.append(i)
            yield part

    betas = [1.0 / t for t in TAUS]
    together = stream(ScorePass([get_score(n) for n in ALL], betas), chunks())
    assert reads == [0, 1, 2, 3]
    for name in ALL:
        alone = stream(ScorePass([get_score(name)], betas), torch.split(z, 128))[name]
        assert torch.equal(alone, together[name])
        assert together[name].dtype == torch.float64 and together[name].shape == (len(TAUS), 500)


def test_chunking_does_not_change_values():
    z = random_logits(22, 300, 17, 3.0).to(torch.float32)
    whole, pieces = ours(z, TAUS), ours(z, TAUS, chunk_rows=7)
    for name in ALL:
        np.testing.assert_allclose(pieces[name], whole[name], rtol=1e-12, atol=0)


def test_row_max_and_neginf_flag_from_the_caller():
    z = adversarial_logits(torch.float32)
    scorer = ScorePass([get_score(n) for n in ALL], [1.0 / t for t in TAUS])
    given = scorer.chunk(z, row_max=z.amax(1), has_neginf=True)
    found = scorer.chunk(z)
    for name in ALL:
        assert torch.equal(given[name], found[name])


def test_both_ways_of_finding_the_top_logits_agree():
    """One torch thread: numpy partition on CPU; more: torch.topk. Same values either way."""
    z = random_logits(23, 300, 400, 2.0).to(torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ours(z, TAUS, names=["gen"], chunk_rows=100)["gen"]
        torch.set_num_threads(2)
        two = ours(z, TAUS, names=["gen"], chunk_rows=100)["gen"]
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(one, two, rtol=1e-6, atol=0)


def test_the_scan_scores_every_name_at_every_tau_in_one_pass():
    """Scan.scores (as workflows.ood.score_samples calls it): one pass, every score, impossible classes, float64."""
    z_id, y, _ = id_ood_logits(n_id=200, c=9, seed=1)
    z = (z_id * 50).double()  # large magnitudes
    z[3, 2] = -float("inf")  # an impossible class
    taus = [0.3, 1.0, 7.5, 1000.0]
    scan = Scan(as_logits_data(z, y))
    before = scan.passes
    got = score_samples(scan, taus, ALL, {"gen_gamma": 0.3, "gen_top": 4})
    assert scan.passes == before + 1
    for k, tau in enumerate(taus):
        want = ref_scores(z.numpy(), tau, gamma=0.3, top=4)
        np.testing.assert_allclose(got["msp"][k], ref_msp(z.numpy(), tau), rtol=1e-12, atol=0)
        np.testing.assert_allclose(got["energy"][k], ref_energy(z.numpy(), tau), rtol=1e-12, atol=0)
        for name in ALL:
            np.testing.assert_allclose(got[name][k], want[name], rtol=1e-10, atol=1e-300, err_msg=name)
            assert got[name][k].dtype == np.float64


def test_names_and_labels():
    assert score_names("all") == list(ALL)
    assert score_names("both") == ["msp", "energy"]
    assert score_names(" MSP, gen ,msp") == ["msp", "gen"]
    assert score_names("gen,both") == ["gen", "msp", "energy"]
    assert score_names(["maxlogit", "msp,entropy"]) == ["maxlogit", "msp", "entropy"]
    for bad in ("", "msp,,gen", "odin", []):
        with pytest.raises(TempcalError, match="score"):
            score_names(bad)
    assert [score_label(n) for n in ALL] == ["MSP", "energy", "MaxLogit", "entropy", "GEN"]
    with pytest.raises(TempcalError, match="tau"):
        ScorePass([get_score("msp")], [0.0])
    with pytest.raises(TempcalError, match="tau"):
        ScorePass([get_score("msp")], [1e320])  # tau = 1e-320: 1 / tau overflows

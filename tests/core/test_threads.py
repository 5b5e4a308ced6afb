"""The thread count tempcal sets up, and the block pool its passes share their row blocks through."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time

import numpy as np
import pytest
import torch

import tempcal
from tempcal.conformal import passes
from tempcal.core import data as core_data
from tempcal.core import parallel
from tempcal.core.data import as_logits_data
from tempcal.core.ece_fit import bin_sums
from tempcal.core.scan import ALL_ROWS, Scan
from tempcal.errors import TempcalError
from tempcal.models.head import OutputHead
from tempcal.scores.engine import scan_scores
from tempcal.subsets.cells import CellLayout, cell_calibration, cell_objective
from tempcal.subsets.ece_fits import cell_ece_pass
from tempcal.workflows.apply import _scaled_chunks


@contextlib.contextmanager
def torch_threads(count: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def test_cgroup_quota_v2_and_v1(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert parallel.cgroup_cpu_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert parallel.cgroup_cpu_quota(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert parallel.cgroup_cpu_quota(tmp_path) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    assert parallel.cgroup_cpu_quota(tmp_path) == 0.5
    assert parallel.cgroup_cpu_quota(tmp_path / "missing") is None


def test_usable_cpus_follows_affinity_and_quota(monkeypatch):
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(parallel, "cgroup_cpu_quota", lambda: None)
    assert parallel.usable_cpus() == 4
    monkeypatch.setattr(parallel, "cgroup_cpu_quota", lambda: 2.5)
    assert parallel.usable_cpus() == 2
    monkeypatch.setattr(parallel, "cgroup_cpu_quota", lambda: 0.5)
    assert parallel.usable_cpus() == 1


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5"])
def test_bad_tempcal_threads_is_refused(monkeypatch, text):
    monkeypatch.setenv("TEMPCAL_THREADS", text)
    with pytest.raises(TempcalError, match="TEMPCAL_THREADS"):
        parallel.requested_threads()


def test_configure_threads_sets_the_requested_count_once(monkeypatch):
    monkeypatch.setattr(parallel, "_configured", False)
    monkeypatch.setenv("TEMPCAL_THREADS", "1")
    with torch_threads(2):
        assert parallel.configure_threads() == 1
        torch.set_num_threads(2)  # the user's later choice stands
        assert parallel.configure_threads() == 2


def test_configure_threads_lowers_only_torchs_default(monkeypatch):
    monkeypatch.delenv("TEMPCAL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(parallel, "usable_cpus", lambda: 1)
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 3)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(parallel, "_physical_cores", lambda: 3)
    with torch_threads(3):  # what torch picks on three cores: lowered to the one usable
        monkeypatch.setattr(parallel, "_configured", False)
        assert parallel.configure_threads() == 1
    with torch_threads(2):  # a count the user chose: kept
        monkeypatch.setattr(parallel, "_configured", False)
        assert parallel.configure_threads() == 2


def test_map_blocks_keeps_order_runs_single_threaded_and_restores():
    with torch_threads(2):
        seen = parallel.map_blocks(lambda i, worker: (i, worker, torch.get_num_threads()), 40, 2)
        assert [s[0] for s in seen] == list(range(40))
        assert {s[2] for s in seen} == {1}
        assert {s[1] for s in seen} <= {0, 1}
        assert torch.get_num_threads() == 2


def test_a_pass_closed_on_a_helper_thread_leaves_the_helpers_single_threaded():
    """A pass's generator left suspended (a consumer that raised) and closed on a helper thread (by the garbage
    collector, say): the helper's blocks still run torch single-threaded, as a pass's bits need (a helper at two
    threads once made the OOD scores differ in their last bits from one thread's)."""
    z, y = torch.randn(3000, 120), torch.randint(0, 120, (3000,))
    with torch_threads(2):
        scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
        held = [scan.block_pass(lambda block, scratch: block.z.sum())]
        next(held[0])  # suspended inside the pass, torch single-threaded on this thread
        closed_on: list[int] = []

        def close_on_helper(i: int, worker: int) -> int:
            if worker == 1 and held:
                held.clear()  # the last reference: the generator is closed here
                closed_on.append(torch.get_num_threads())
            time.sleep(0.002)  # long enough for the helper to take blocks
            return i

        for _ in range(20):
            parallel.map_blocks(close_on_helper, 8, 2)
            if not held:
                break
        assert not held and closed_on == [1], "the helper thread never took a block"
        seen = parallel.map_blocks(lambda i, worker: (worker, torch.get_num_threads()), 64, 2)
        assert {count for _, count in seen} == {1}, seen


def test_a_pass_closed_on_another_thread_gives_the_owner_its_threads_back():
    """A pass's generator left suspended (its consumer raised) and closed on another thread: the thread that ran it
    is owed its torch thread count, and has it back as soon as it enters tempcal again (a scan, a fit)."""
    z, y = torch.randn(3000, 120), torch.randint(0, 120, (3000,))
    with torch_threads(2):
        scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
        held = scan.block_pass(lambda block, scratch: block.z.sum())
        next(held)
        assert torch.get_num_threads() == 1  # the pass's row-order work runs single-threaded
        closer = threading.Thread(target=held.close)
        closer.start()
        closer.join()
        assert torch.get_num_threads() == 1  # not restored from the other thread
        tempcal.fit_temperature(z, y, device="cpu")
        assert torch.get_num_threads() == 2


def test_map_blocks_raises_the_first_error():
    def fn(i, worker):
        if i == 7:
            raise ValueError("block 7")
        return i

    with torch_threads(2), pytest.raises(ValueError, match="block 7"):
        parallel.map_blocks(fn, 20, 2)
    with torch_threads(2):
        assert parallel.map_blocks(lambda i, w: i * i, 5, 2) == [0, 1, 4, 9, 16]  # the pool still works


def _scan_figures(z, y, count):
    with torch_threads(count):
        scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
        objective = scan.objective(0.7)
        (sums, kept), = scan.calibration([0.7], 15, keep=("confidence",))
        return scan, objective, sums, kept


def test_block_passes_add_up_as_one_thread_does():
    """Blocks are the one-thread chunks and their sums are added in row order: the figures are the same bits."""
    g = torch.Generator().manual_seed(3)
    z = 3 * torch.randn(3000, 120, generator=g)
    y = torch.randint(0, 120, (3000,), generator=g)
    one_scan, one, one_sums, one_kept = _scan_figures(z, y, 1)
    two_scan, two, two_sums, two_kept = _scan_figures(z, y, 2)
    assert one == two
    assert one_scan.fit_start == two_scan.fit_start
    assert (one_sums.nll, one_sums.brier, one_sums.entropy) == (two_sums.nll, two_sums.brier, two_sums.entropy)
    assert torch.equal(one_kept["confidence"], two_kept["confidence"])
    assert torch.equal(one_sums.bin_confidence, two_sums.bin_confidence)
    # and against a float64 reference of the mean NLL
    reference = float(torch.nn.functional.cross_entropy(0.7 * z.double(), y))
    assert two.nll == pytest.approx(reference, rel=1e-6)


def test_head_logits_on_several_threads_match_float64():
    g = torch.Generator().manual_seed(5)
    head = OutputHead(torch.randn(300, 64, generator=g).to(torch.bfloat16), torch.randn(300, generator=g), 0.5, 30.0)
    h = torch.randn(40, 64, generator=g)
    reference = 30.0 * torch.tanh(0.5 * (h.double() @ head.weight.double().T + head.bias.double()) / 30.0)
    for count in (1, 2):
        with torch_threads(2):
            out = head.logits(h, torch.empty(40, 300), threads=count)
        assert torch.allclose(out.double(), reference, rtol=1e-5, atol=1e-5)


def _rest_figures(z, y, count):
    """Each pass that shares its blocks among threads besides the objective and calibration, on ``count`` threads."""
    with torch_threads(count):
        scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
        cells = torch.arange(z.shape[0]) % 5
        betas = torch.tensor([[0.7] * 5, [0.5, 0.6, 0.7, 0.8, 0.9]], dtype=torch.float64)
        return {"per_sample": scan.per_sample(0.7), "classwise": scan.classwise(0.7, 15),
                "scores": scan_scores(scan, [1.0, 0.7], ("msp", "energy", "gen"), {"gen_top": 10}),
                "cell_objective": cell_objective(scan, betas, cells),
                "cell_calibration": cell_calibration(scan, betas, cells, cells % 3, 3, 15)}


def _same(a, b):
    """Equal to the bit: tensors, and the tensors inside lists, dicts and dataclasses."""
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, w) for x, w in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def _first_difference(a, b, where="") -> str:
    """Where two figures first differ (the path to a tensor, its first differing indices and values)."""
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"{where}: {a.shape} {a.dtype} against {b.shape} {b.dtype}"
        index = (a != b).nonzero()[:5]
        return f"{where}: at {index.tolist()} {a[tuple(index.T)].tolist()} against {b[tuple(index.T)].tolist()}"
    if isinstance(a, dict):
        return next((_first_difference(a[k], b[k], f"{where}[{k!r}]") for k in a if not _same(a[k], b[k])), "")
    if isinstance(a, list | tuple):
        return next((_first_difference(x, w, f"{where}[{i}]") for i, (x, w) in enumerate(zip(a, b, strict=True))
                     if not _same(x, w)), "")
    if dataclasses.is_dataclass(a):
        return next((_first_difference(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
                     for f in dataclasses.fields(a) if not _same(getattr(a, f.name), getattr(b, f.name))), "")
    return f"{where}: {a!r} against {b!r}"


def test_per_row_and_cell_passes_on_two_threads_equal_one_thread():
    """per_sample, classwise, the OOD scores and the cell passes: the same bits on one thread and on two."""
    g = torch.Generator().manual_seed(7)
    z = 3 * torch.randn(3000, 120, generator=g)
    y = torch.randint(0, 120, (3000,), generator=g)
    one, two = _rest_figures(z, y, 1), _rest_figures(z, y, 2)
    for name in one:
        assert _same(one[name], two[name]), f"{name}: {_first_difference(one[name], two[name])}"
    # and against float64 references computed here
    p = torch.softmax(0.7 * z.double(), 1)
    assert torch.allclose(two["per_sample"]["confidence"], p.amax(1), rtol=1e-6)
    assert torch.allclose(two["per_sample"]["nll"], -p.gather(1, y[:, None])[:, 0].log(), rtol=1e-5)
    assert torch.allclose(two["scores"][1]["msp"], p.amax(1), rtol=1e-6)
    assert torch.allclose(two["scores"][0]["energy"], torch.logsumexp(z.double(), 1), rtol=1e-6)
    assert float(two["classwise"].count.sum()) == 3000 * 120
    assert torch.allclose(two["classwise"].probability.sum(1), p.sum(0), rtol=1e-5)
    nll = torch.nn.functional.cross_entropy(0.7 * z.double(), y, reduction="none")
    cells = torch.arange(3000) % 5
    assert two["cell_objective"][0, :, 0].tolist() == [600.0] * 5  # rows per cell
    by_cell = torch.zeros(5, dtype=torch.float64).index_add_(0, cells, nll)
    assert torch.allclose(two["cell_objective"][0, :, 1], by_cell, rtol=1e-6)
    assert torch.allclose(two["cell_calibration"].sums[0, :, 0].sum(), nll.sum(), rtol=1e-6)


class _Recorder:
    """A visitor that keeps each row's float64 max softmax per temperature and the torch threads it ran on."""

    def __init__(self, rows: int, temperatures: int):
        self.confidence = torch.zeros(temperatures, rows, dtype=torch.float64)
        self.threads: set[int] = set()

    def add(self, betas, d, labels, start):
        self.threads.add(torch.get_num_threads())
        for k, beta in enumerate(betas):
            self.confidence[k, start:start + d.shape[0]] = torch.softmax(beta * d.double(), 1).amax(1)


def test_visitor_passes_run_on_the_pass_threads_with_the_one_thread_figures():
    """A visitor's blocks are shared among the pass's threads, torch single-threaded on each (no barrier to wait
    at), and the figures are those of one thread."""
    g = torch.Generator().manual_seed(11)
    z = 3 * torch.randn(3000, 120, generator=g)
    y = torch.randint(0, 120, (3000,), generator=g)
    seen = {}
    for count in (1, 2):
        with torch_threads(count):
            scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
            visited, calibrated = _Recorder(3000, 2), _Recorder(3000, 2)
            scan.visit([1.0, 0.7], visited)
            (sums, _), _ = scan.calibration([1.0, 0.7], 15, visitor=calibrated)
            assert visited.threads == calibrated.threads == {1}
            assert torch.get_num_threads() == count  # restored
            seen[count] = (visited.confidence, calibrated.confidence, sums.nll)
    assert all(torch.equal(a, b) for a, b in zip(seen[1][:2], seen[2][:2], strict=True))
    assert seen[1][2] == seen[2][2]
    reference = torch.softmax(0.7 * z.double(), 1).amax(1)
    assert torch.allclose(seen[2][0][1], reference, rtol=1e-6)


def test_conformal_visitors_on_two_threads_give_the_one_thread_sums(monkeypatch):
    """The sets' scores and sums ride on the pass's threads: every block is visited once, by more than one thread on
    two, and the scores and counts are the bits of one thread (per group, over judged rows, out of fold)."""
    g = torch.Generator().manual_seed(17)
    z = 2 * torch.randn(2000, 60, generator=g)
    y = torch.randint(0, 60, (2000,), generator=g)
    groups, folds, judged = torch.arange(2000) % 3, torch.arange(2000) % 4, torch.arange(2000) % 5 != 0
    q = {"lac": [0.5, 0.9], "aps": [0.8, 0.95]}
    found = {}
    for count in (1, 2):
        seen: set[int] = set()
        add = passes.SetSums.add

        def recorded(self, *args, add=add, seen=seen):
            seen.add(threading.get_ident())
            return add(self, *args)
        monkeypatch.setattr(passes.SetSums, "add", recorded)
        with torch_threads(count):
            scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=61)
            scores = passes.ScoreRows(2, 2000, scan.device)
            sets = passes.SetSums([q, q], scan.device, groups=groups, num_groups=3, judged=judged)
            fold_sets = passes.FoldSetSums([[1.0] * 4, [0.5, 0.6, 0.7, 0.8]], [[q] * 4, [q] * 4], folds, scan.device)
            scan.visit([1.0, 0.6], scores)
            scan.visit([1.0, 0.6], sets)
            scan.visit([1.0, 1.0], fold_sets)
        assert len(seen) == count
        found[count] = scores.scores, sets.reduced(), fold_sets.reduced()
    (scores_1, sets_1, folds_1), (scores_2, sets_2, folds_2) = found[1], found[2]
    assert torch.equal(scores_1, scores_2)
    for k in range(2):
        assert all(torch.equal(sets_1[k][score], sets_2[k][score]) for score in q)
    assert all(torch.equal(folds_1[score], folds_2[score]) for score in q)
    assert 0 < sets_2[0]["lac"][:, :, 0].sum() < 2 * 1600  # some of the 1,600 judged rows covered, not all


def test_cell_objective_on_kept_rows_on_two_threads_equals_one_thread(monkeypatch):
    """When the validating scan kept every fitting row, the cell objective evaluates them without a read, in
    blocks of ``chunk_rows`` shared among threads: the same bits on one thread and on two."""
    monkeypatch.setattr(parallel, "MIN_BLOCK_ELEMENTS", 1)  # small enough data for the first chunk to hold it all
    g = torch.Generator().manual_seed(13)
    z = 3 * torch.randn(500, 40, generator=g)
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]  # labels that follow the logits
    cells = torch.arange(500) % 5
    betas = torch.tensor([[0.7] * 5, [0.5, 0.6, 0.7, 0.8, 0.9]], dtype=torch.float64)
    out = {}
    for count in (1, 2):
        with torch_threads(count):
            scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=500, fit_rows=ALL_ROWS)
            assert scan.fit_start.rows is not None
            scan.chunk_rows, passes = 37, scan.passes
            out[count] = cell_objective(scan, betas, cells, scan.fit_start.rows)
            assert scan.passes == passes  # no read
    assert torch.equal(out[1], out[2])
    nll = torch.nn.functional.cross_entropy(0.7 * z.double(), y, reduction="none")
    by_cell = torch.zeros(5, dtype=torch.float64).index_add_(0, cells, nll)
    assert torch.allclose(out[2][0, :, 1], by_cell, rtol=1e-6)


def _search_tie_and_apply_figures(z, y, count):
    """The ECE search's pass, the tie check and apply's output pass on ``count`` threads."""
    with torch_threads(count):
        scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
        rows = torch.linspace(0.5, 2.0, z.shape[0], dtype=torch.float64)
        return {"bin_sums": bin_sums(scan, [0.3, 0.7, 1.9], 15), "top_ties": scan.top_ties(0.7),
                "probs": torch.cat(list(_scaled_chunks(scan, "probs", 2.0, False))),
                "log-probs per row": torch.cat(list(_scaled_chunks(scan, "log-probs", rows, False)))}


def test_ece_search_tie_check_and_apply_on_two_threads_equal_one_thread():
    """The ECE search's bin sums, Scan.top_ties and apply's output: the same bits on one thread and on two, and
    the figures of plain loops here."""
    g = torch.Generator().manual_seed(17)
    z = torch.randint(-4, 5, (3000, 120), generator=g).float()  # whole numbers: rows with a tied largest logit
    y = torch.randint(0, 120, (3000,), generator=g)
    one, two = _search_tie_and_apply_figures(z, y, 1), _search_tie_and_apply_figures(z, y, 2)
    for name in one:
        assert _same(one[name], two[name]), name
    tied, flat, nll = two["top_ties"]
    top = z.amax(1, keepdim=True)
    assert tied == int(((z == top).sum(1) > 1).sum()) > 0 and flat == 0
    assert nll == pytest.approx(float(torch.nn.functional.cross_entropy(0.7 * z.double(), y)), rel=1e-6)
    zd = z.double().numpy()
    for k, beta in enumerate((0.3, 0.7, 1.9)):  # a numpy loop over rows: each confidence into its equal-width bin
        p = np.exp(beta * (zd - zd.max(1, keepdims=True)))
        confidence = 1 / p.sum(1)
        correct = zd.argmax(1) == y.numpy()
        expected = np.zeros((3, 15))
        for c, hit in zip(confidence, correct, strict=True):
            b = min(int(c * 15), 14)
            expected[:, b] += (1, c, hit)
        np.testing.assert_array_equal(two["bin_sums"][k][[0, 2]].numpy(), expected[[0, 2]])  # counts, hits
        np.testing.assert_allclose(two["bin_sums"][k][1].numpy(), expected[1], rtol=1e-6)  # float32 confidences
    assert torch.allclose(two["probs"].double(), torch.softmax(z.double() / 2, 1), atol=1e-7)
    rows = torch.linspace(0.5, 2.0, 3000, dtype=torch.float64)
    assert torch.allclose(two["log-probs per row"].double(), torch.log_softmax(z.double() / rows[:, None], 1),
                          atol=1e-5)


@pytest.fixture
def maps(monkeypatch) -> list[int]:
    """The item count of every map of the block pool, in order, while the test runs."""
    counts: list[int] = []
    original = parallel.BlockPool.map

    def counted(self, fn, count, workers):
        counts.append(count)
        return original(self, fn, count, workers)

    monkeypatch.setattr(parallel.BlockPool, "map", counted)
    return counts


def test_a_pass_over_logits_in_memory_is_one_map_with_the_bits_of_shorter_reads(monkeypatch, maps):
    """Logits held in memory are read at once, so the threads meet once per pass; logits that need a conversion
    too (each thread converts its own blocks); reads cut shorter (HELD_READ_ROWS) give the same bits."""
    g = torch.Generator().manual_seed(19)
    z = 3 * torch.randn(3000, 120, generator=g)
    y = torch.randint(0, 120, (3000,), generator=g)
    figures = {}
    with torch_threads(2):
        for name, logits, held in (("one read", z, None), ("float64", z.double(), None), ("short reads", z, 97 * 3)):
            if held is not None:
                monkeypatch.setattr(core_data, "HELD_READ_ROWS", held)
            scan = Scan(as_logits_data(logits, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS,
                        dtype=torch.float32)
            maps.clear()
            figures[name] = (scan.objective(0.7), scan.top_ties(0.7))
            figures[name + " maps"] = list(maps)
    assert figures["one read maps"] == [31, 31]  # 3000 rows in blocks of 97: one map per pass
    assert figures["short reads maps"] == [3] * 10 + [1] + [3] * 10 + [1]
    assert figures["float64 maps"] == [31, 31]  # converted block by block on the threads
    assert figures["one read"] == figures["short reads"] == figures["float64"]


def test_cell_ece_pass_on_two_threads_equals_one_thread_and_a_numpy_loop():
    """The subset ECE searches' pass: its blocks' confidences on the pass's threads, added into the cells in row
    order: the same bits on one thread and on two, and each cell's bin sums those of a plain loop over rows."""
    g = torch.Generator().manual_seed(19)
    z = 3 * torch.randn(3000, 120, generator=g)
    y = torch.randint(0, 120, (3000,), generator=g)
    cells = torch.arange(3000) % 6
    betas = [0.4, 1.0, 1.7]
    out = {}
    for count in (1, 2):
        with torch_threads(count):
            scan = Scan(as_logits_data(z, y), device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
            passes = scan.passes
            terms = cell_ece_pass(scan, betas, [1], 15, CellLayout(cells, 2, 3))
            assert scan.passes == passes + 1
            out[count] = (terms.per_cell, terms.per_bin)
    assert _same(out[1], out[2])
    per_cell, per_bin = out[2]
    zd = z.double().numpy()
    correct = zd.argmax(1) == y.numpy()
    for k, beta in enumerate(betas):
        confidence = 1 / np.exp(beta * (zd - zd.max(1, keepdims=True))).sum(1)
        expected = np.zeros((3, 6, 15))
        for c, hit, cell in zip(confidence, correct, cells.tolist(), strict=True):
            b = min(int(c * 15), 14)
            expected[:, cell, b] += (1, c, hit)
        got = per_cell[k].view(3, 6, 15).numpy()
        np.testing.assert_array_equal(got[[0, 2]], expected[[0, 2]])  # counts, hits
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)  # float32 confidences
        if k == 1:  # the global search's own sums: every cell's
            np.testing.assert_array_equal(per_bin[0][[0, 2]].numpy(), expected[[0, 2]].sum(1))
    assert _same(per_bin[0], bin_sums(Scan(as_logits_data(z, y), device="cpu", chunk_rows=97,
                                           fit_rows=ALL_ROWS), [1.0], 15)[0])


def test_a_pass_streamed_from_a_file_reads_ahead_with_the_bits_of_one_thread(tmp_path, monkeypatch, maps):
    """Logits read from a file a chunk at a time: on two threads each map also takes the next read (one item more
    than its blocks), and every figure is the bits of one thread and of the same logits in memory."""
    from safetensors.torch import save_file

    from tempcal import open_source

    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")  # read from the file a chunk at a time
    g = torch.Generator().manual_seed(29)
    z = 3 * torch.randn(3000, 120, generator=g)
    y = torch.randint(0, 120, (3000,), generator=g)
    save_file({"logits": z, "labels": y}, str(tmp_path / "logits.safetensors"))
    figures = {}
    for name, count in (("one thread", 1), ("two threads", 2), ("memory", 2)):
        data = as_logits_data(z, y) if name == "memory" else open_source(tmp_path / "logits.safetensors").data
        with torch_threads(count):
            maps.clear()
            scan = Scan(data, device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
            figures[name] = (scan.stats, scan.fit_start, scan.objective(0.7), scan.top_ties(0.7),
                             bin_sums(scan, [0.5, 1.3], 15), scan.per_sample(0.7))
            figures[name + " maps"] = list(maps)
    assert _same(figures["one thread"], figures["two threads"]) and _same(figures["memory"], figures["two threads"])
    reads = 3000 // (97 * 8) + 1  # eight blocks of 97 rows per read on two threads
    assert figures["two threads maps"][:reads] == [9, 9, 9, 1 + (3000 - 3 * 97 * 8 + 96) // 97]
    assert figures["memory maps"][0] == 31  # held in memory: one map, nothing to read ahead
    reference = float(torch.nn.functional.cross_entropy(0.7 * z.double(), y))
    assert figures["two threads"][2].nll == pytest.approx(reference, rel=1e-6)


def test_rows_selected_from_a_resident_file_are_taken_by_the_threads(tmp_path, maps):
    """Rows selected from a file kept in memory (a split, a fold): each thread gathers its own blocks, so a pass
    is one map of its blocks (the validating scan and passes keeping much per row: the usual reads), and every
    figure is the bits of one thread and of the same rows copied into memory first."""
    from safetensors.torch import save_file

    from tempcal import open_source

    g = torch.Generator().manual_seed(31)
    z = 3 * torch.randn(3000, 120, generator=g)
    y = torch.randint(0, 120, (3000,), generator=g)
    save_file({"logits": z, "labels": y}, str(tmp_path / "logits.safetensors"))
    rows = torch.randperm(3000, generator=g)[:2000].sort().values
    figures = {}
    for name, count in (("one thread", 1), ("two threads", 2), ("copied", 2)):
        data = open_source(tmp_path / "logits.safetensors").data
        assert data.resident is not None
        data = as_logits_data(z[rows], y[rows]) if name == "copied" else data.select(rows)
        with torch_threads(count):
            scan = Scan(data, device="cpu", chunk_rows=97, fit_rows=ALL_ROWS)
            maps.clear()
            figures[name] = (scan.stats, scan.fit_start, scan.objective(0.7), bin_sums(scan, [0.5, 1.3], 15),
                             scan.per_sample(0.7), scan_scores(scan, [1.0, 0.5]))
            figures[name + " maps"] = list(maps)
    assert _same(figures["one thread"], figures["two threads"]) and _same(figures["copied"], figures["two threads"])
    assert figures["two threads maps"][:2] == [21, 21]  # 2000 rows in blocks of 97: one map per pass
    reference = float(torch.nn.functional.cross_entropy(0.7 * z[rows].double(), y[rows]))
    assert figures["two threads"][2].nll == pytest.approx(reference, rel=1e-6)


def test_scratch_views_follow_shapes_and_stay_bounded() -> None:
    from tempcal.core.parallel import MAX_VIEWS, Scratch

    scratch = Scratch()
    first = scratch.get("d", (4, 3), torch.float32, torch.device("cpu"))
    assert scratch.get("d", (4, 3), torch.float32, torch.device("cpu")) is first  # a repeat is the same view
    for rows in range(1, 3 * MAX_VIEWS):
        view = scratch.get("d", (rows, 3), torch.float32, torch.device("cpu"))
        assert view.shape == (rows, 3)
        view.fill_(rows)  # the buffer grows: a view handed out before never aliases a stale one
        assert torch.all(scratch.get("d", (rows, 3), torch.float32, torch.device("cpu")) == rows)
    assert len(scratch._views) <= MAX_VIEWS

"""Passes over the rows of several gloo processes (tempcal.core.parallel) give the one-process figures.

Three processes share 7 rows so that rank 0 holds none: the per-sample pass is gathered in rank order, the
classwise and ECE-search sums are all-reduced, and every rank ends with the one-process figures.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from conftest import miscalibrated

from tempcal.core.data import as_logits_data
from tempcal.core.ece_fit import bin_sums
from tempcal.core.scan import Scan

SHARES = [(0, 0), (0, 3), (3, 7)]  # rank 0 holds no rows
BETAS = [2.0, 1.0, 0.4]


def _figures(scan: Scan) -> dict[str, torch.Tensor]:
    per_sample = scan.per_sample(0.7)
    classwise = scan.classwise(0.7, 5)
    per_bin = bin_sums(scan, BETAS, 5)
    return {**{f"per_sample.{k}": v.cpu() for k, v in per_sample.items()}, "classwise": classwise.count,
            "classwise_hits": classwise.hits, "classwise_p": classwise.probability, "per_bin": per_bin,
            "n": torch.tensor(scan.num_samples)}


def _rank(rank: int, init: str, logits: torch.Tensor, labels: torch.Tensor, out: str) -> None:
    import torch.distributed as dist

    from tempcal.core.parallel import all_gather_rows

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=len(SHARES))
    try:
        start, stop = SHARES[rank]
        scan = Scan(as_logits_data(logits[start:stop], labels[start:stop]), device="cpu")
        figures = _figures(scan)
        figures["gathered"] = all_gather_rows(torch.arange(start, stop).repeat(2, 1).T.contiguous())
        torch.save(figures, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # an empty rank's figures: tests/cli/test_cli_distributed.py's test_a_rank_without_rows_...
def test_three_ranks_one_of_them_empty_give_the_one_process_figures(tmp_path):
    logits, labels = miscalibrated(7, 4, 2.0, seed=3, dtype=torch.float64)
    mp.spawn(_rank, args=(f"file://{tmp_path / 'store'}", logits, labels, str(tmp_path / "out")), nprocs=len(SHARES))
    one = _figures(Scan(as_logits_data(logits, labels), device="cpu"))
    for rank in range(len(SHARES)):
        mine = torch.load(tmp_path / f"out.{rank}")
        assert torch.equal(mine.pop("gathered"), torch.arange(7).repeat(2, 1).T)  # rows in rank order
        assert set(mine) == set(one)
        for name, value in one.items():
            if value.dtype == torch.bool or name in ("n", "classwise"):
                assert torch.equal(mine[name], value), name
            else:
                torch.testing.assert_close(mine[name], value, rtol=1e-12, atol=1e-15, msg=name)


@pytest.mark.parametrize("rows", [0, 5])
def test_all_gather_rows_is_the_identity_in_one_process(rows):
    from tempcal.core.parallel import all_gather_rows

    t = torch.arange(rows * 3.0).view(rows, 3)
    assert all_gather_rows(t) is t

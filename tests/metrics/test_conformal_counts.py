"""The conformal sets' fast counts: the logits' order sorted once and reused at every temperature, and the set sizes
by binary search over the sorted probabilities, give exactly (bit for bit) the sets that sorting the
probabilities at each temperature and comparing every class gives, on rows with ties, masked classes and
thresholds equal to a score."""

from __future__ import annotations

import pytest
import torch

from tempcal.conformal.passes import probabilities
from tempcal.conformal.sets import descending, logit_order, row_scores, row_sets


def by_every_class(probs: torch.Tensor, labels: torch.Tensor, q: dict[str, torch.Tensor]) -> dict:
    """The sets class by class: LAC ``1 - p_c <= q``; APS the classes in decreasing p up to the first whose running
    sum reaches q (a sort at this temperature)."""
    ordered = torch.sort(probs, dim=1, descending=True, stable=True).values
    running = ordered.cumsum(1)
    y = labels[:, None]
    p_y = probs.gather(1, y)
    index = torch.arange(probs.shape[1])[None]
    position = (probs > p_y).sum(1) + ((probs == p_y) & (index < y)).sum(1)
    lac = ((1.0 - probs)[None] <= q["lac"][:, :, None])
    aps_size = ((running[None] < q["aps"][:, :, None]).sum(2) + 1).clamp(max=probs.shape[1])
    return {"lac": (lac.gather(2, y[None].expand(q["lac"].shape[0], -1, -1))[..., 0], lac.sum(2).double()),
            "aps": (position[None] < aps_size, aps_size.double())}


def rows(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(600, 40, generator=g) * 4
    z[:100, :5] = z[:100, :1]  # ties at the top
    z[100:200] = torch.round(z[100:200])  # many ties
    z[200:250, 30:] = -torch.inf  # masked classes
    z[250:260] = 0.0  # every class tied
    y = torch.randint(0, 40, (600,), generator=g)
    y[200:250] %= 30
    return z - z.max(1, keepdim=True).values, y


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("beta", [0.05, 0.4, 1.0, 3.0, 40.0])
def test_the_fast_sets_equal_the_sets_class_by_class(seed, beta):
    d, y = rows(seed)
    probs = probabilities(d, beta)
    ordered = descending(probs, logit_order(d))
    assert torch.equal(ordered, torch.sort(probs, dim=1, descending=True, stable=True).values)
    scores = row_scores(probs, y)
    # thresholds equal to some rows' own scores (ties with a score), and the usual quantiles
    q = {name: torch.cat([values[:7], torch.quantile(values, torch.tensor([0.5, 0.9], dtype=torch.float64)),
                          torch.tensor([0.0, 1.0, torch.inf], dtype=torch.float64)])[:, None]
         for name, values in scores.items()}
    fast, slow = row_sets(probs, y, q, ordered), by_every_class(probs, y, q)
    for name in ("lac", "aps"):
        assert torch.equal(fast[name][0], slow[name][0]) and torch.equal(fast[name][1], slow[name][1])


def test_per_row_thresholds_and_temperatures_equal_the_sets_class_by_class():
    d, y = rows(2)
    beta = torch.linspace(0.1, 5, d.shape[0], dtype=torch.float64)[:, None]  # a temperature per row (folds)
    probs = probabilities(d, beta)
    q = {name: values[None].roll(3, 1) for name, values in row_scores(probs, y).items()}  # a threshold per row
    fast, slow = row_sets(probs, y, q, descending(probs, logit_order(d))), by_every_class(probs, y, q)
    for name in ("lac", "aps"):
        assert torch.equal(fast[name][0], slow[name][0]) and torch.equal(fast[name][1], slow[name][1])


def test_a_broken_order_falls_back_to_a_sort():
    probs = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], dtype=torch.float64)
    wrong = torch.tensor([[0, 1, 2], [0, 1, 2]], dtype=torch.int32)  # not the first row's order
    assert torch.equal(descending(probs, wrong), torch.sort(probs, dim=1, descending=True).values)

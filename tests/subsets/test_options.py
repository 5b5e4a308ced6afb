"""The subsets package's own checks (``--folds``, ``--group-prior``, ``--folds`` against a split) and the hook by
which core's ``fit_temperature`` reaches it without importing it."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from tempcal.errors import TempcalError
from tempcal.requests import FitRequest, Outputs
from tempcal.sources.base import SourceOptions
from tempcal.subsets.options import DEFAULT_GROUP_PRIOR, MAX_GROUP_PRIOR, check_folds, check_prior, settle_folds


@pytest.mark.parametrize("k", [2, 7, np.int64(3)])
def test_a_whole_k_of_two_or_more_is_taken(k):
    assert check_folds(k) == int(k) and type(check_folds(k)) is int
    assert check_folds(k, rows=int(k)) == int(k)  # K = N: leave-one-out


@pytest.mark.parametrize(("k", "rows", "expected"), [
    (1, None, "expected a whole number K with 2 <= K"),
    (2.5, None, "expected a whole number K with 2 <= K"),
    (True, None, "expected a whole number K with 2 <= K"),
    ("3", None, "expected a whole number K with 2 <= K"),
    (51, 50, "expected a whole number K with 2 <= K <= 50 (the rows that count)"),
])
def test_every_other_k_is_refused_with_its_range(k, rows, expected):
    with pytest.raises(TempcalError, match="folds") as caught:
        check_folds(k, rows)
    assert expected in str(caught.value)


def test_the_prior_defaults_and_refuses_what_is_out_of_range():
    assert check_prior(None) == DEFAULT_GROUP_PRIOR and check_prior(0) == 0.0 and check_prior(MAX_GROUP_PRIOR) == 1e15
    for bad in (-1, float("nan"), float("inf"), 10**400, True, "5", 2e15):
        with pytest.raises(TempcalError, match="group_prior"):
            check_prior(bad)


def _request(**fields) -> FitRequest:
    return replace(FitRequest(source=["x.safetensors"], reading=SourceOptions(), outputs=Outputs()), **fields)


def test_folds_and_a_split_from_the_same_place_are_refused_and_the_command_line_wins_across():
    both = _request(folds=5, val_fraction=0.3)
    with pytest.raises(TempcalError, match="--val-fraction"):
        settle_folds(both, lambda name: "command line" if name in ("folds", "val_fraction") else None)
    with pytest.raises(TempcalError, match="configuration file"):
        settle_folds(both, lambda name: "file" if name in ("folds", "val_fraction") else None)
    folds_in_file = settle_folds(both, {"folds": "file", "val_fraction": "command line"}.get)
    assert folds_in_file.folds is None and folds_in_file.split == 0.3
    split_in_file = settle_folds(both, {"folds": "command line", "val_fraction": "file"}.get)
    assert split_in_file.folds == 5 and split_in_file.split is None
    evaluated = settle_folds(_request(folds=5, eval_file="e.safetensors"), {"folds": "command line",
                                                                            "eval_file": "file"}.get)
    assert evaluated.folds == 5 and evaluated.eval_file is None
    with pytest.raises(TempcalError, match="--group-by"):
        settle_folds(_request(group_prior=3.0), lambda name: None)


HOOK = """
import torch
from tempcal.core.fitting import fit_temperature
from tempcal.errors import TempcalError
z = torch.randn(60, 3, generator=torch.Generator().manual_seed(0)) * 3
y = torch.arange(60) % 3
groups = torch.arange(60) % 2
try:
    fit_temperature(z, y, groups=groups, device="cpu")
except TempcalError as exc:
    print("refused:", exc)
import tempcal
import tempcal.subsets.fits
assert tempcal.fit_temperature is fit_temperature
print(sorted(fit_temperature(z, y, groups=groups, device="cpu").group_temperatures))
"""


def test_core_reaches_the_subset_fit_only_through_the_hook_the_package_registers():
    done = subprocess.run([sys.executable, "-c", HOOK], capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused:") and "tempcal.subsets" in lines[0]
    assert lines[1] == "[0, 1]"

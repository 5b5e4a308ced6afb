"""A TorchScript model with its inputs as SOURCE (tempcal.sources.model), opened the way every SOURCE is."""

from __future__ import annotations

import pytest

from tempcal.errors import TempcalError
from tempcal.sources.registry import open_source

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def test_open_model_source_feeds_the_fit_workflow(digits):
    opened = open_source(digits["model"], inputs=str(digits["inputs"]), device="cpu", progress=False)
    assert opened.name == f"{digits['model']} on {digits['inputs']}" and opened.stored_temperature is None
    assert opened.paths == []  # nothing to write T back into
    assert opened.data.num_samples == len(digits["y"]) and opened.data.num_classes == 10
    with pytest.raises(TempcalError, match=r"mlp\.pt: a TorchScript model SOURCE needs its inputs: inputs"):
        open_source(digits["model"])

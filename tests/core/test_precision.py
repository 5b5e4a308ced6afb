"""TF32 off while tempcal runs a model or a head (tempcal.core.precision), whichever settings a program used before.

Each scenario runs in a fresh interpreter: torch's precision settings are process-wide, and the old
``allow_tf32`` flags and the per-backend ``fp32_precision`` settings of torch >= 2.9 interact.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from tempcal.core import precision
from tempcal.errors import TempcalError

_PROBE = textwrap.dedent("""
    import json, sys, warnings
    import torch
    from tempcal.core.precision import no_tf32
    warnings.simplefilter("ignore")
    b = torch.backends
    READINGS = {
        "global": lambda: b.fp32_precision, "matmul": lambda: b.cuda.matmul.fp32_precision,
        "cudnn": lambda: b.cudnn.fp32_precision, "conv": lambda: b.cudnn.conv.fp32_precision,
        "rnn": lambda: b.cudnn.rnn.fp32_precision, "matmul_allow": lambda: b.cuda.matmul.allow_tf32,
        "cudnn_allow": lambda: b.cudnn.allow_tf32, "matmul_precision": torch.get_float32_matmul_precision,
    }
    def state():
        out = {}
        for name, read in READINGS.items():
            try:
                out[name] = read()
            except RuntimeError:
                out[name] = "refused"
        return out
    exec(sys.argv[1])
    before = state()
    with no_tf32():
        inside = state()
        torch.randn(4, 4) @ torch.randn(4, 4)
        torch.nn.LSTM(3, 3)(torch.randn(2, 1, 3))
    print(json.dumps({"before": before, "inside": inside, "after": state()}))
""")

SCENARIOS = {
    "torch's defaults": "pass",
    "old flags on": "b.cuda.matmul.allow_tf32 = True; b.cudnn.allow_tf32 = True",
    "matmul precision high": "torch.set_float32_matmul_precision('high')",
    "new settings tf32": "b.cuda.matmul.fp32_precision = 'tf32'; b.cudnn.conv.fp32_precision = 'tf32'",
    "global tf32": "b.fp32_precision = 'tf32'",
}


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9")
@pytest.mark.parametrize("setup", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_full_float32_inside_and_every_setting_restored_after(setup, monkeypatch):
    monkeypatch.delenv(precision.ALLOW_TF32_ENV, raising=False)
    done = subprocess.run([sys.executable, "-c", _PROBE, setup], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    inside = seen["inside"]
    assert (inside["matmul"], inside["conv"], inside["rnn"]) == ("ieee", "ieee", "ieee")
    assert inside["matmul_allow"] is False and inside["cudnn_allow"] is False
    assert seen["after"] == seen["before"]
    if setup != "pass":
        assert seen["before"] != inside  # the scenario really had TF32 on somewhere


def test_the_environment_opt_in_keeps_torchs_settings(monkeypatch):
    monkeypatch.setenv(precision.ALLOW_TF32_ENV, "1")
    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        with precision.no_tf32():
            assert torch.backends.cudnn.allow_tf32 is True
    finally:
        torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize(("text", "allowed"), [("", False), ("0", False), ("off", False), ("1", True),
                                               ("TRUE", True), (" yes ", True)])
def test_the_opt_in_reads_the_usual_spellings(monkeypatch, text, allowed):
    monkeypatch.setenv(precision.ALLOW_TF32_ENV, text)
    assert precision.tf32_allowed() is allowed


def test_a_bad_opt_in_value_is_bad_input_naming_the_variable(monkeypatch):
    monkeypatch.setenv(precision.ALLOW_TF32_ENV, "maybe")
    with pytest.raises(TempcalError, match="TEMPCAL_ALLOW_TF32='maybe': expected 1"), precision.no_tf32():
        pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matmuls_and_convolutions_are_full_float32_inside(monkeypatch):
    monkeypatch.delenv(precision.ALLOW_TF32_ENV, raising=False)
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(256, 1024, generator=g), torch.randn(1024, 512, generator=g)
    x, k = torch.randn(4, 16, 32, 32, generator=g), torch.randn(16, 16, 3, 3, generator=g)
    torch.backends.cuda.matmul.allow_tf32 = True  # what many training scripts set
    try:
        with precision.no_tf32():
            product = (a.cuda() @ w.cuda()).cpu().double()
            conv = torch.nn.functional.conv2d(x.cuda(), k.cuda()).cpu().double()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.testing.assert_close(product, a.double() @ w.double(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(conv, torch.nn.functional.conv2d(x.double(), k.double()), rtol=1e-5, atol=1e-4)

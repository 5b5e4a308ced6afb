"""ODIN scores (tempcal.models.odin) against a hand-written autograd version of the paper, and in ood reports."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_inputs
from scipy.special import softmax
from sklearn.metrics import roc_auc_score

from tempcal.errors import TempcalError
from tempcal.models.odin import odin_scores
from tempcal.models.save import save_calibrated_model
from tempcal.workflows.ood import ood_file

# torch 2.13 deprecates TorchScript; the contract reads it, so these tests script and load models on purpose.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")


def ref_odin(module: torch.nn.Module, x: torch.Tensor, tau: float, eps: float) -> np.ndarray:
    """ODIN as Liang et al. (2018) write it, with plain autograd on the Python module."""
    x = x.clone().requires_grad_(True)
    log_s = torch.log_softmax(module(x).double() / tau, dim=1).max(dim=1).values
    log_s.sum().backward()
    x_tilde = x.detach() - eps * torch.sign(-x.grad)
    with torch.no_grad():
        z = module(x_tilde).double().numpy()
    return softmax(z / tau, axis=1).max(axis=1)


@pytest.mark.parametrize(("tau", "eps"), [(1.0, 0.0), (1.0, 0.05), (1000.0, 0.01), (2.0, 0.2)])
def test_odin_matches_a_hand_written_autograd_version(digits, tau, eps):
    x = digits["x"][:300]
    ours = odin_scores(digits["model"], x, tau=tau, eps=eps, batch_size=128, device="cpu").numpy()
    reference = ref_odin(digits["mlp"], x, tau, eps)
    assert ours.dtype == np.float64 and ours.shape == (300,)
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-9)
    if eps == 0:  # no perturbation: the plain max softmax at tau
        with torch.no_grad():
            z = digits["mlp"](x).double().numpy()
        np.testing.assert_allclose(ours, softmax(z / tau, axis=1).max(axis=1), rtol=1e-6)


def test_odin_perturbation_raises_the_in_distribution_max_softmax(digits):
    x = digits["x"]
    plain = odin_scores(digits["model"], x, tau=1.0, eps=0.0, device="cpu")
    up = odin_scores(digits["model"], x, tau=1.0, eps=0.05, device="cpu")
    assert float((up - plain).mean()) > 0
    assert float((up >= plain - 1e-12).double().mean()) > 0.95
    # The opposite step (the sign flipped by hand) lowers it: the sign is the paper's, not its negation.
    down = ref_odin(digits["mlp"], x, 1.0, -0.05)
    assert float(np.mean(down - plain.numpy())) < 0


def test_odin_on_a_calibrated_model_scores_the_original(digits, tmp_path):
    calibrated = tmp_path / "calibrated.pt"
    save_calibrated_model(digits["model"], 2.0, calibrated)
    x = digits["x"][:100]
    on_calibrated = odin_scores(calibrated, x, tau=2.0, eps=0.01, device="cpu")
    np.testing.assert_allclose(on_calibrated.numpy(), ref_odin(digits["mlp"], x, 2.0, 0.01), rtol=1e-5)
    with pytest.raises(TempcalError, match=r"ODIN perturbs the inputs, so they must be floating point"):
        odin_scores(digits["model"], torch.zeros(4, 64, dtype=torch.int64), tau=1.0, eps=0.01, device="cpu")
    with pytest.raises(TempcalError, match=r"odin_eps -0\.1: expected a number >= 0"):
        odin_scores(digits["model"], x, tau=1.0, eps=-0.1, device="cpu")


def test_odin_ood_report_matches_scikit_learn(digits, tmp_path):
    noise = torch.randn(200, 64, generator=torch.Generator().manual_seed(3))
    ood_path = write_inputs(tmp_path / "noise.safetensors", noise)
    id_path = write_inputs(tmp_path / "id.safetensors", digits["x"][:300], digits["y"][:300])
    report = ood_file(digits["model"], [ood_path], odin_eps=0.02, taus=[1.0, 1000.0], device="cpu",
                      inputs=str(id_path), progress=False)
    assert report.taus == [1.0, 1000.0] and report.num_classes == 10 and not report.binary
    assert report.n_id == 300 and report.n_ood == [200]
    for (path, row), tau in zip(report.results, [1.0, 1000.0], strict=True):
        a, b = ref_odin(digits["mlp"], digits["x"][:300], tau, 0.02), ref_odin(digits["mlp"], noise, tau, 0.02)
        truth = np.r_[np.ones(len(a)), np.zeros(len(b))]
        assert path == str(ood_path) and row.score == "msp" and row.tau == tau
        assert row.auroc == pytest.approx(roc_auc_score(truth, np.r_[a, b]), abs=1e-6)
    assert report.to_json()["results"][0]["auroc"] == report.results[0][1].auroc
    with pytest.raises(TempcalError, match=r"tau fitted: .*mlp\.pt on .*id\.safetensors has no stored temperature"):
        ood_file(digits["model"], [ood_path], odin_eps=0.02, taus=["fitted"], device="cpu", inputs=str(id_path))


# -- recurrent models: cuDNN refuses an RNN's backward in eval mode ------------------------------------------
class _Recurrent(torch.nn.Module):
    """A small LSTM classifier over inputs [N, 6, 4] (sequences of 6 steps of 4 features)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(4, 8, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class _RefusesLikeCudnn(torch.autograd.Function):
    """The identity, whose backward fails as cuDNN's RNN backward does in eval mode while cuDNN is enabled."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if torch.backends.cudnn.enabled:
            raise RuntimeError("cudnn RNN backward can only be called in training mode")
        return grad


def _recurrent_inputs(n: int = 50) -> torch.Tensor:
    return torch.randn(n, 6, 4, generator=torch.Generator().manual_seed(1))


def test_odin_retries_without_cudnn_when_cudnn_refuses_an_eval_mode_rnn_backward():
    from tempcal.models.base import LoadedModel

    module = _Recurrent().eval()
    calls = []

    def net(x):
        calls.append(torch.backends.cudnn.enabled)
        return module(_RefusesLikeCudnn.apply(x))

    model = LoadedModel("recurrent.pt2", "export", net, None, torch.device("cpu"))  # type: ignore[arg-type]
    x = _recurrent_inputs()
    before = torch.backends.cudnn.enabled
    ours = odin_scores(model, x, tau=2.0, eps=0.02, batch_size=20, device="cpu").numpy()
    np.testing.assert_allclose(ours, ref_odin(module, x, 2.0, 0.02), rtol=1e-6, atol=1e-12)
    assert torch.backends.cudnn.enabled == before
    # batch 0: refused (cuDNN on), taken again without cuDNN, perturbed forward; later batches go without cuDNN first
    assert calls[:3] == [before, False, before] and calls[3::2] == [False, False]


def test_odin_passes_other_errors_through_unchanged():
    from tempcal.models.base import LoadedModel

    def net(x):
        raise RuntimeError("shapes cannot be multiplied")

    model = LoadedModel("broken.pt2", "export", net, None, torch.device("cpu"))  # type: ignore[arg-type]
    with pytest.raises(TempcalError, match=r"ODIN failed on batch 0 .*shapes cannot be multiplied"):
        odin_scores(model, _recurrent_inputs(4), tau=1.0, eps=0.01, device="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_odin_on_an_lstm_runs_on_cuda_as_on_the_cpu():
    from tempcal.models.base import LoadedModel

    module = _Recurrent().eval()
    x = _recurrent_inputs(200)
    model = LoadedModel("lstm.pt2", "export", module.cuda(), None, torch.device("cuda"))  # type: ignore[arg-type]
    on_cuda = odin_scores(model, x, tau=1.5, eps=0.001, batch_size=64, device="cuda").numpy()
    # float32 kernels differ between devices; a near-zero gradient may flip sign, moving one input by 2 eps
    np.testing.assert_allclose(on_cuda, ref_odin(_Recurrent().eval(), x, 1.5, 0.001), rtol=0, atol=1e-4)

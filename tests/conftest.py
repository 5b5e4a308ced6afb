"""The builders every test module shares: logits with a known miscalibration, files written by the libraries that own
their formats, small TorchScript models, and ``tempcal`` run in-process.

Plain functions and constants are imported by name (``from conftest import miscalibrated``): pytest puts this
folder on ``sys.path`` when it loads this file (its default "prepend" import mode, which ``from reference import``
relies on too), and this is the only ``conftest.py`` in the tree, so the name cannot be ambiguous; keep it the only
one. They are plain functions because parametrize lists, hypothesis strategies and module constants call them at
collection time. What needs pytest's machinery (captured output, temporary folders, the environment) is a fixture:
``cli``, ``run_json``, ``reads``, ``source``, ``data_file``, ``ood_files``, ``digits``, ``small``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from safetensors.torch import save_file

import tempcal
from tempcal.cli.main import main
from tempcal.errors import for_cli
from tempcal.sources.registry import open_source, read_stored_temperature

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXAMPLE = EXAMPLES / "digits_logits.safetensors"
#: Classes of :func:`id_ood_logits`.
OOD_CLASSES = 6
#: Unpickling :class:`Evil` creates this file (in the working folder unless given a path).
MARKER = "unpickled.marker"
#: Skips a test without a GPU.
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
#: ``cpu``, and ``cuda`` (skipped without a GPU): ``@pytest.mark.parametrize("device", DEVICES)``.
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def pytest_configure(config):
    """Under pytest-xdist (``-n``), each worker computes on its share of the cores: torch's default of one thread per
    core in every worker oversubscribes them, and its threads spin waiting for each other (the suite took 2.5x as
    long on two cores). The processes the tests start (``python -m tempcal``, torchrun) inherit the same share.
    An ``OMP_NUM_THREADS`` set by the caller is kept."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


# -- logits and labels ---------------------------------------------------------------------------------------


def miscalibrated(n: int, c: int, scale: float, *, seed: int = 0, dtype=torch.float32):
    """Labels drawn from softmax(z); the logits handed out are scale * z, so T* is near ``scale``."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, dtype=torch.float64, generator=g) * 2
    y = torch.multinomial(torch.softmax(z, 1), 1, generator=g)[:, 0]
    return (z * scale).to(dtype), y


def miscalibrated_binary(n: int, scale: float, *, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, dtype=torch.float64, generator=g) * 2
    y = torch.bernoulli(torch.sigmoid(z), generator=g).long()
    return (z * scale).float(), y


def overconfident(n: int = 400, c: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Overconfident float32 logits (3x the scale the labels were drawn at) and their labels."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(n, c, generator=g)
    labels = torch.multinomial(torch.softmax(logits / 3, 1), 1, generator=g)[:, 0]
    return logits, labels


def overconfident_binary(n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One overconfident binary logit per sample ([N], 3x the scale the labels were drawn at) and its label."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(n, generator=g)
    labels = torch.bernoulli(torch.sigmoid(logits / 3), generator=g).long()
    return logits, labels


def numpy_logits(n: int = 600, c: int = 5, scale: float = 3.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Overconfident float32 logits (``scale`` times the scale the labels were drawn at) and int64 labels, drawn
    with numpy alone."""
    rng = np.random.default_rng(seed)
    base = 2 * rng.normal(size=(n, c))
    p = np.exp(base - base.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    labels = np.minimum((rng.random((n, 1)) > p.cumsum(1)).sum(1), c - 1)
    return (scale * base).astype(np.float32), labels.astype(np.int64)


def id_ood_logits(n_id: int = 300, n_ood: int = 200, c: int = OOD_CLASSES, seed: int = 0):
    """ID logits with a clear winning class, OOD logits flatter: separable but overlapping."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, c, (n_id,), generator=g)
    z_id = 2 * torch.randn(n_id, c, generator=g)
    z_id[torch.arange(n_id), labels] += 3
    z_ood = 1.5 * torch.randn(n_ood, c, generator=g)
    return z_id, labels, z_ood


@st.composite
def logits_and_labels(draw):
    """A hypothesis strategy: float64 logits [2..60, 2..6] at scales 0.01..30 and uniform labels."""
    n = draw(st.integers(2, 60))
    c = draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.floats(0.01, 30))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g, dtype=torch.float64) * scale
    labels = torch.randint(0, c, (n,), generator=g)
    return logits, labels


def hidden_and_head(n: int, d: int, v: int, *, seed: int = 0, scale: float = 3.0):
    """Hidden states [n, d], an output head (weight [v, d], bias [v]) and labels drawn from softmax(z / scale)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(v, d, generator=g) / d**0.5 * 2
    b = torch.randn(v, generator=g) * 0.3
    h = torch.randn(n, d, generator=g)
    y = torch.multinomial(torch.softmax((h @ w.T + b) / scale, 1), 1, generator=g)[:, 0]
    return h, w, b, y


def scan_of(logits, labels, **kwargs) -> tempcal.Scan:
    return tempcal.Scan(tempcal.as_logits_data(logits, labels), device="cpu", **kwargs)


def logits_of(data) -> torch.Tensor:
    """The logits a source holds, in their stored dtype (safetensors files are read as chunked sources)."""
    if hasattr(data, "logits"):
        return data.logits
    rows = data.resident.load()
    return (rows if data.rows is None else rows[data.rows]).squeeze(1) if data.binary else (
        rows if data.rows is None else rows[data.rows])


# -- files ---------------------------------------------------------------------------------------------------


def raw_safetensors(header: dict | str | bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    """8-byte little-endian header length + header + data; ``header`` may be any text, ``length`` may lie."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode("utf-8")
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def no_duplicates(pairs):
    """A ``json.loads`` object hook that fails on a key given twice (a safetensors header must not repeat one)."""
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in the header: {keys}"
    return dict(pairs)


def write_logits(kind: str, folder: Path, logits, labels, *, logits_key="logits", labels_key="labels") -> Path:
    """Write logits and labels in ``kind`` with the library that owns the format (never tempcal)."""
    if kind == "npz":
        path = folder / "data.npz"
        np.savez(path, **{logits_key: logits, labels_key: labels})
    elif kind == "npy":
        path = folder / f"val_{logits_key}.npy"
        np.save(path, logits)
        np.save(folder / f"val_{labels_key}.npy", labels)
    elif kind in ("pt", "pt-legacy"):
        path = folder / "data.pt"
        torch.save({logits_key: torch.as_tensor(logits), labels_key: torch.as_tensor(labels), "note": "val split"},
                   path, _use_new_zipfile_serialization=kind == "pt")
    else:
        path = folder / "data.safetensors"
        save_file({logits_key: torch.as_tensor(logits).contiguous(), labels_key: torch.as_tensor(labels)}, str(path))
    return path


def write_shards(folder: Path, sizes, *, c=12, dtype=torch.float64, seed=0):
    """:func:`miscalibrated` logits cut into shards ``part-00.safetensors``, ... of the given sizes."""
    logits, labels = miscalibrated(sum(sizes), c, 2.3, seed=seed, dtype=dtype)
    paths, start = [], 0
    for k, size in enumerate(sizes):
        path = folder / f"part-{k:02d}.safetensors"
        save_file({"logits": logits[start:start + size].contiguous(), "labels": labels[start:start + size].clone()},
                  str(path))
        paths.append(path)
        start += size
    return paths, logits, labels


def write_inputs(path: Path, x: torch.Tensor, y: torch.Tensor | None = None, **more) -> Path:
    """An inputs file for a model SOURCE: ``inputs``, optional ``labels`` and any other tensors."""
    tensors = {"inputs": x, **more}
    if y is not None:
        tensors["labels"] = y
    save_file(tensors, str(path))
    return path


class Evil:
    """Unpickling this creates ``marker`` (:data:`MARKER` by default): proof that a loader executed a pickle."""

    def __init__(self, marker: str | os.PathLike = MARKER) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and folder (None) under ``folder``, hidden ones included."""
    found: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            found[os.path.relpath(os.path.join(root, d), folder)] = None
        for f in files:
            full = os.path.join(root, f)
            found[os.path.relpath(full, folder)] = Path(full).read_bytes()
    return found


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def sha256(path: Path) -> str:
    """SHA-256 of a (possibly large) file, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def fail_after_partial_copy(exc: BaseException):
    """A ``shutil.copyfileobj`` that copies 100 bytes, then raises ``exc``."""

    def copyfileobj(src, dst, length=0):
        dst.write(src.read(100))
        dst.flush()
        raise exc

    return copyfileobj


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch):
    """Under GitHub Actions the commands would append to the job's summary: the tests that want one set their own."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(params=["resident", "streamed"])
def reads(request, monkeypatch) -> str:
    """Inputs up to 256 MiB are read once and kept, larger ones read a chunk at a time on every pass: test both."""
    if request.param == "streamed":
        monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")
    return request.param


@pytest.fixture
def source(tmp_path) -> Path:
    """``logits.safetensors``: :func:`overconfident` logits and labels, a float16 ``features`` tensor and metadata."""
    logits, labels = overconfident()
    path = tmp_path / "logits.safetensors"
    tensors = {"logits": logits, "labels": labels, "features": torch.arange(24, dtype=torch.float16).reshape(4, 6)}
    save_file(tensors, str(path), metadata={"model": "resnet-18", "split": "val"})
    return path


@pytest.fixture
def data_file(tmp_path):
    """``logits.safetensors`` of 1500 :func:`miscalibrated` samples, 8 classes, T* near 2.4: (path, logits, labels)."""
    logits, labels = miscalibrated(1500, 8, 2.4, seed=21)
    path = tmp_path / "logits.safetensors"
    save_file({"logits": logits, "labels": labels}, str(path))
    return path, logits, labels


@pytest.fixture
def ood_files(tmp_path):
    """``id.safetensors`` and ``ood.safetensors`` (no labels) of :func:`id_ood_logits`: (id, ood, z_id, z_ood)."""
    z_id, y, z_ood = id_ood_logits()
    save_file({"logits": z_id, "labels": y}, str(tmp_path / "id.safetensors"))
    save_file({"logits": z_ood}, str(tmp_path / "ood.safetensors"))  # no labels key
    return tmp_path / "id.safetensors", tmp_path / "ood.safetensors", z_id, z_ood


# -- models --------------------------------------------------------------------------------------------------


def script_model(module: torch.nn.Module, path: Path) -> Path:
    """``module`` in eval mode, scripted and saved as a TorchScript file."""
    torch.manual_seed(0)
    torch.jit.script(module.eval()).save(str(path))
    return path


def run_model_source(model, inputs, *, device="cpu", labels_optional=False, **options):
    """A model SOURCE run over its inputs through the public API: (logits data, the T a calibrated model holds)."""
    options.setdefault("progress", False)
    opened = open_source(model, inputs=str(inputs), device=device, labels_optional=labels_optional, **options)
    return opened.data, opened.stored_temperature


def read_model_temperature(path):
    return read_stored_temperature(path)[0]


def _digits_script():
    spec = importlib.util.spec_from_file_location("make_digits_logits", EXAMPLES / "make_digits_logits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """The digits MLP trained here (seconds, once per run), scripted and saved, with its validation inputs file."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        mlp, x_val, y_val = _digits_script().train_digits_mlp()
    finally:  # the training script sets these process-wide
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    folder = tmp_path_factory.mktemp("digits")
    model_path = folder / "mlp.pt"
    torch.jit.script(mlp).save(str(model_path))
    inputs_path = folder / "inputs.safetensors"
    save_file({"inputs": x_val, "labels": y_val}, str(inputs_path))
    return {"mlp": mlp, "x": x_val, "y": y_val, "model": model_path, "inputs": inputs_path, "folder": folder}


@pytest.fixture
def small(tmp_path):
    """Five-feature inputs (40 rows, integer labels 0..3)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 5, generator=g)
    y = torch.randint(0, 4, (40,), generator=g)
    return x, y, write_inputs(tmp_path / "small.safetensors", x, y)


# -- the command line ----------------------------------------------------------------------------------------


def one_line(exc: pytest.ExceptionInfo) -> str:
    """The error as the command line shows it (parameters named by their flags)."""
    text = for_cli(exc.value)
    assert "\n" not in text and text, text
    return text


def assert_one_error_line(err: str, *details: str, warnings: bool = False) -> str:
    """Standard error is one ``error:`` line holding ``details`` (after ``warning:`` lines, if allowed)."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    if warnings:  # a fit can warn (say, T at a bound) before its write-back is refused
        while len(lines) > 1 and lines[0].startswith("warning: "):
            lines.pop(0)
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    for detail in details:
        assert detail in lines[0], (detail, lines[0])
    return lines[0]


@pytest.fixture
def cli(capsys):
    """``cli(argv)`` runs ``tempcal.cli.main.main(argv)`` in-process: (exit status, stdout, stderr), no traceback."""

    def run(argv: list[str]) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(argv)
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err
        return code, out, err

    return run


@pytest.fixture
def run_json(cli):
    """``run_json(argv)`` runs ``tempcal ARGV --json -``, expects exit status 0 and returns the parsed JSON."""

    def run(argv: list[str]) -> dict:
        code, out, err = cli([*argv, "--json", "-"])
        assert code == 0, err
        return json.loads(out)  # stdout holds only the JSON

    return run

"""Host/device copies (tempcal.core.data): never non-blocking toward the host; pinned double buffers on CUDA.

Without a GPU the CUDA bookkeeping runs against a fake ``torch.cuda`` (streams, events) that records what was
asked of it, and device copies become host clones; the CUDA-parameterised tests at the end run the real thing.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import write_shards

import tempcal
import tempcal.core.data as transfer
from tempcal.core.data import as_logits_data

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class _Stub:
    """A tensor stand-in: where it lives, whether it is pinned, and the arguments of its ``to``."""

    def __init__(self, device: str, pinned: bool = False):
        self.device, self.pinned, self.calls = torch.device(device), pinned, []

    def is_pinned(self) -> bool:
        return self.pinned

    def to(self, **kwargs):
        self.calls.append(kwargs)
        return self


@pytest.mark.parametrize(("source", "pinned", "target", "expected"), [
    ("cuda:0", False, "cpu", False),   # toward the host: the host reads it at once
    ("cuda:1", False, "cpu", False),
    ("cpu", True, "cpu", False),
    ("cpu", False, "cuda:0", False),   # pageable memory: the copy is synchronous anyway
    ("cpu", True, "cuda:1", True),     # pinned memory toward a GPU: the only asynchronous case
])
def test_the_copy_helper_is_non_blocking_only_from_pinned_memory_toward_cuda(source, pinned, target, expected):
    stub = _Stub(source, pinned)
    transfer.to_device(stub, target, torch.float32)  # type: ignore[arg-type]
    assert stub.calls == [{"device": torch.device(target), "dtype": torch.float32, "non_blocking": expected}]


def test_in_memory_chunks_toward_the_cpu_never_copy_non_blocking(monkeypatch):
    """The issue's case (CUDA logits fitted on the CPU) goes through the helper: every copy toward the CPU blocks."""
    decisions = []
    real = transfer.is_async_copy

    def spy(source, device):
        decision = real(source, device)
        decisions.append((device.type, decision))
        return decision

    monkeypatch.setattr(transfer, "is_async_copy", spy)
    g = torch.Generator().manual_seed(3)
    data = as_logits_data(torch.randn(300, 4, generator=g), torch.randint(0, 4, (300,), generator=g))
    chunks = list(data.chunks(128, torch.device("cpu"), torch.float64))
    assert [c[1].shape[0] for c in chunks] == [128, 128, 44]
    assert len(decisions) == 6 and all(kind == "cpu" and not decision for kind, decision in decisions)


# -- PinnedStager against a fake torch.cuda ------------------------------------------------------------------
class _FakeCuda:
    """Records streams (with their device), events and which event the host waited for."""

    def __init__(self):
        self.log: list[tuple] = []
        self.current: object = "default"

    def install(self, monkeypatch) -> None:
        fake = self

        class Stream:
            def __init__(self, device=None, priority=0):
                self.device = device
                fake.log.append(("stream", device))

            def wait_stream(self, other):
                fake.log.append(("wait_stream", self.device, other.device))

        class Event:
            count = 0

            def __init__(self):
                Event.count += 1
                self.id = Event.count

            def record(self, stream):
                fake.log.append(("record", self.id, fake.current is stream))

            def synchronize(self):
                fake.log.append(("synchronize", self.id))

        @contextlib.contextmanager
        def stream(s):
            before, fake.current = fake.current, s
            yield
            fake.current = before

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        def current_stream(device=None):
            current = Stream.__new__(Stream)
            current.device = ("current stream of", device)
            return current

        monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
        monkeypatch.setattr(transfer, "_pinned", lambda count, dtype: torch.empty(count, dtype=dtype))
        monkeypatch.setattr(transfer, "_used_on", lambda tensor, stream: fake.log.append(("used_on",)))

        def copy(host, device):
            fake.log.append(("copy", host.data_ptr(), device, fake.current is not None and fake.current != "default"))
            return host.clone()

        monkeypatch.setattr(transfer, "_async_copy", copy)


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = _FakeCuda()
    fake.install(monkeypatch)
    return fake


def test_the_side_stream_is_created_on_the_target_device(fake_cuda):
    transfer.PinnedStager(torch.device("cuda:1"), 64, 8)
    assert fake_cuda.log == [("stream", torch.device("cuda:1"))]


def test_a_slot_is_refilled_only_after_its_own_copy_completed(fake_cuda):
    stager = transfer.PinnedStager(torch.device("cuda:1"), 4 * 8, 8)
    slots = []
    for k in range(5):
        raw, labels = stager.buffers(8, 4)
        slots.append(raw.data_ptr())
        raw.view(torch.float32).fill_(k)
        labels.fill_(k)
        z, y = stager.send(raw.view(torch.float32).view(8, 1), labels, torch.float64)
        assert z.dtype == torch.float64 and bool((z == k).all()) and bool((y == k).all())
    assert slots[0] == slots[2] == slots[4] != slots[1] == slots[3]  # two pinned buffers, alternating
    waits = [entry[1] for entry in fake_cuda.log if entry[0] == "synchronize"]
    assert waits == [1, 2, 3]  # chunk 2 waits for chunk 0's copy (event 1), chunk 3 for chunk 1's, ...
    copies = [entry for entry in fake_cuda.log if entry[0] == "copy"]
    assert len(copies) == 10 and all(entry[2] == torch.device("cuda:1") and entry[3] for entry in copies)
    records = [entry for entry in fake_cuda.log if entry[0] == "record"]
    assert len(records) == 5 and all(on_side for _, _, on_side in records)  # events on the side stream
    assert [e for e in fake_cuda.log if e[0] == "wait_stream"] == [
        ("wait_stream", ("current stream of", torch.device("cuda:1")), torch.device("cuda:1"))] * 5


def test_labels_travel_through_the_pinned_slots(fake_cuda):
    stager = transfer.PinnedStager(torch.device("cuda:0"), 16, 4)
    raw, labels = stager.buffers(4, 4)
    stager.send(raw.view(torch.float32).view(4, 1), labels, torch.float32)
    sources = [entry[1] for entry in fake_cuda.log if entry[0] == "copy"]
    assert sources == [raw.data_ptr(), stager.labels[0].data_ptr()]


@pytest.mark.parametrize("reads", ["resident", "streamed"])
@pytest.mark.parametrize("selected", [False, True])
def test_staged_chunks_hold_the_same_rows_as_cpu_chunks(tmp_path, monkeypatch, fake_cuda, reads, selected):
    """The CUDA path's host side (whole blocks read into pinned slots, selections gathered into them) on the CPU."""
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", str(1 << 30 if reads == "resident" else 0))
    paths, _logits, labels = write_shards(tmp_path, [300, 1, 250], dtype=torch.float32)
    data = tempcal.open_source(paths).data
    if selected:
        data = data.select(torch.arange(2, len(labels), 3))
    cpu = list(data.chunks(64, torch.device("cpu"), torch.float64))
    staged = list(data.chunks(64, torch.device("cuda:1"), torch.float64))
    assert [c[0] for c in staged] == [c[0] for c in cpu]
    for (_, z_cpu, y_cpu), (_, z, y) in zip(cpu, staged, strict=True):
        assert torch.equal(z, z_cpu) and torch.equal(y, y_cpu.to(torch.int64))
    assert ("stream", torch.device("cuda:1")) in fake_cuda.log


# -- the real thing -------------------------------------------------------------------------------------------
@needs_cuda
def test_cuda_logits_fitted_on_the_cpu_give_the_cpu_temperature():
    g = torch.Generator().manual_seed(5)
    logits, labels = 2.5 * torch.randn(20000, 10, generator=g), torch.randint(0, 10, (20000,), generator=g)
    on_cpu = tempcal.fit_temperature(logits, labels, device="cpu").temperature
    for _ in range(3):
        from_cuda = tempcal.fit_temperature(logits.cuda(), labels.cuda(), device="cpu").temperature
        assert from_cuda == on_cpu


@needs_cuda
@pytest.mark.parametrize("selected", [False, True])
def test_staged_chunks_on_every_cuda_device_equal_the_file(tmp_path, selected):
    paths, logits, labels = write_shards(tmp_path, [700, 1, 555], dtype=torch.float32)
    data = tempcal.open_source(paths).data
    rows = torch.arange(len(labels))
    if selected:
        rows = torch.arange(1, len(labels), 4)
        data = data.select(rows)
    for index in range(torch.cuda.device_count()):
        device = torch.device(f"cuda:{index}")
        parts = list(data.chunks(97, device, torch.float32))
        assert all(z.device == device and y.device == device for _, z, y in parts)
        assert torch.equal(torch.cat([z.cpu() for _, z, _ in parts]), logits[rows])
        assert torch.equal(torch.cat([y.cpu() for _, _, y in parts]), labels[rows].to(torch.int64))


def test_the_gpu_benchmark_skips_cleanly_without_cuda_and_dry_runs_its_stages_on_the_cpu(tmp_path, monkeypatch):
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    if not torch.cuda.is_available():
        done = subprocess.run([sys.executable, str(bench / "gpu_stream.py")], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "gpu_stream: skipped (no CUDA device)"
    monkeypatch.syspath_prepend(str(bench))
    monkeypatch.setenv("TEMPCAL_RESIDENT_BYTES", "0")
    import gpu_stream
    from memory_scaling import write_logits_file

    from tempcal.core.data import default_chunk_rows

    write_logits_file(tmp_path / "l.safetensors", 700, 50)
    figures = gpu_stream.stage_times(tmp_path / "l.safetensors", 1, torch.device("cpu"))
    assert set(figures) == {"read", "copy", "compute", "pass", "chunk_rows"}
    assert figures["chunk_rows"] == default_chunk_rows(50, torch.device("cpu"), 700)
    serial, ideal, hidden = gpu_stream.overlap({"read": 1.0, "copy": 2.0, "compute": 3.0, "pass": 4.5})
    assert (serial, ideal, hidden) == (6.0, 3.0, 0.5)  # 1.5 s of the 3 s that could be hidden were

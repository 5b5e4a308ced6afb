"""Where a pass's work runs: the device, the CPU threads that share each read's row blocks (with the chunk buffers they
reuse) and the torch.distributed ranks, whose float64 sums are all-reduced: every figure is the one-process figure."""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from ..errors import TempcalError, param

# -- the device --------------------------------------------------------------------------------------------------------

def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` means CUDA when available, else CPU; ``cuda`` without CUDA is a usage error."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise TempcalError(f"{param('device')} {name}: expected auto, cpu, cuda or cuda:N")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise TempcalError(f"{param('device')} {name}: CUDA is not available on this machine (use cpu or auto)")
        if index and int(index) >= torch.cuda.device_count():
            raise TempcalError(f"{param('device')} {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


# -- ranks: torch.distributed ------------------------------------------------------------------------------------------
# torchrun (any env:// rendezvous; gloo on CPU, NCCL on CUDA): each rank reduces its rows, every decision is taken on
# all-reduced sums, so every rank reaches the same T; only rank 0 prints and writes.

def active() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


#: Whether this module started the process group (and so destroys it in :func:`shutdown`).
_started = False


def init_from_environment(device: str) -> str:
    """Join the process group of torchrun's environment (if any; gloo on CPU, NCCL on CUDA); returns the device to
    use, :func:`rank_device`'s choice, made current first so that NCCL binds this rank to it."""
    global _started
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return device
    chosen = rank_device(device)
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
        _started = True
    return str(chosen)


def rank_device(device: str) -> torch.device:
    """This torchrun process's device for ``--device device``: ``cuda:N`` as given unless every process on the node
    would share it; ``cuda`` and ``auto`` take GPU ``LOCAL_RANK``, or the one GPU a process sees."""
    chosen = resolve_device(device)
    if chosen.type != "cuda":
        return chosen
    local, count = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if chosen.index is not None:
        if per_node > 1 and count > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
            raise TempcalError(f"{param('device')} {device}: the {per_node} processes torchrun started on this node "
                               f"would all use {chosen}; use {param('device')} cuda (process LOCAL_RANK takes "
                               "cuda:LOCAL_RANK) or give each process its GPU with CUDA_VISIBLE_DEVICES")
        return chosen
    if local < count:
        return torch.device("cuda", local)
    if count == 1:
        return torch.device("cuda", 0)  # one GPU per process (CUDA_VISIBLE_DEVICES set per rank)
    raise TempcalError(f"{param('device')} {device}: this process has LOCAL_RANK {local} but sees {count} CUDA "
                       f"devices; start at most {count} processes per node, or give each one GPU with "
                       "CUDA_VISIBLE_DEVICES")


def shutdown() -> None:
    """Destroy the process group :func:`init_from_environment` started (a no-op otherwise)."""
    global _started
    if _started and dist.is_initialized():
        dist.destroy_process_group()
    _started = False


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In place across ranks (a no-op in a single process)."""
    if active():
        dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return tensor


def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's tensor along its first dimension (which may differ, and be 0) in rank order: the
    one-process tensor of every row."""
    if not active():
        return tensor
    size = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    if max(counts) == 0:
        return tensor
    padded = torch.zeros((max(counts), *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[: tensor.shape[0]] = tensor
    parts = [torch.zeros_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    return torch.cat([p[:count] for p, count in zip(parts, counts, strict=True)])


def share(count: int) -> tuple[int, int]:
    """This rank's contiguous share ``[start, stop)`` of ``count`` rows."""
    r, w = rank(), world_size()
    return count * r // w, count * (r + 1) // w


# -- threads: the blocks of a read -------------------------------------------------------------------------------------
# torch's intra-op threads meet at a barrier after every operation, and a core another process keeps busy parks one
# of them for a scheduler slice at each: 7-16 times the one-thread time. So each thread here (the caller and helpers)
# runs torch single-threaded and takes the next row block of a read when free; the results come back in row order,
# so the sums add up as one thread's would. The count is torch's (``torch.set_num_threads`` decides), set once by
# :func:`configure_threads` from ``TEMPCAL_THREADS`` or the cores this process may use.

R = TypeVar("R")
T = TypeVar("T")
_END = object()
#: Below this many logits per block, a block's arithmetic is too short to be worth handing to another thread.
MIN_BLOCK_ELEMENTS = 1 << 15
#: Blocks per thread in one read, so that a thread held up by another process leaves work to the others.
BLOCKS_PER_THREAD = 4

_configured = False
#: Thread id -> the torch thread count a :func:`single_threaded` block closed on another thread owes it.
_owed: dict[int, int] = {}


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity, lowered to its control group's CPU quota."""
    count = _affinity() or os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        count = min(count, max(1, math.floor(quota)))
    return max(1, count)


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """Cores' worth of CPU time the control group allows (cgroup v2 ``cpu.max``, v1 CFS quota); None: no limit."""
    candidates: list[tuple[Path, Path | None]] = [(root / "cpu.max", None)]
    candidates += [(root / sub / "cpu.cfs_quota_us", root / sub / "cpu.cfs_period_us")
                   for sub in ("cpu", "cpu,cpuacct")]
    for quota_file, period_file in candidates:
        try:
            if period_file is None:
                quota_text, _, period_text = quota_file.read_text().strip().partition(" ")
            else:
                quota_text, period_text = quota_file.read_text().strip(), period_file.read_text().strip()
        except OSError:
            continue
        if quota_text in ("max", "-1", ""):
            return None
        try:
            quota, period = int(quota_text), int(period_text or "100000")
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None
    return None


def requested_threads() -> int | None:
    """``TEMPCAL_THREADS`` as a positive count; None when unset; a usage error when it is not one."""
    text = os.environ.get("TEMPCAL_THREADS", "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise TempcalError(f"TEMPCAL_THREADS={text!r}: expected a whole number of threads, at least 1")
    return value


def configure_threads() -> int:
    """Set torch's thread count once per process: ``TEMPCAL_THREADS``, else at most the usable cores, leaving a count
    the user chose (``torch.set_num_threads``, ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``) as it is; the count in force."""
    global _configured
    requested = requested_threads()  # checked on every call: a bad value is refused, not ignored
    current = settle_threads()
    if _configured:
        return current
    _configured = True
    if requested is not None:
        torch.set_num_threads(requested)
    elif _is_torch_default(current) and current > usable_cpus():
        torch.set_num_threads(usable_cpus())
    return torch.get_num_threads()


def _is_torch_default(count: int) -> bool:
    """Whether ``count`` looks like torch's own choice rather than the user's (torch picks a core count)."""
    chosen = os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
    return not chosen and count in {os.cpu_count(), _affinity(), _physical_cores()}


def _affinity() -> int | None:
    """The count of cores this process may run on (None where the platform cannot say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _physical_cores() -> int | None:
    """Distinct (package, core) pairs in /proc/cpuinfo (what MKL, and so torch, counts); None when unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    pairs, package = set(), ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            package = value.strip()
        elif key.strip() == "core id":
            pairs.add((package, value.strip()))
    return len(pairs) or None


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """torch single-threaded on the calling thread for the block, restored afterwards on that thread only. A pass's
    generator left suspended and closed by the garbage collector on another thread must not set that thread's
    count: the restore is then owed, and the owner settles it when it next enters tempcal (:func:`settle_threads`)."""
    count = settle_threads()
    if count == 1:
        yield
        return
    owner = threading.get_ident()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        if threading.get_ident() == owner:
            torch.set_num_threads(count)
        else:
            _owed[owner] = count


def settle_threads() -> int:
    """Give the calling thread back a count owed to it (see :func:`single_threaded`); the count in force."""
    owed = _owed.pop(threading.get_ident(), None)
    if owed is not None:
        torch.set_num_threads(owed)
    return torch.get_num_threads()


class _Job:
    """One map: ``fn(i, worker)`` for i < count, each taken by whichever thread is free next."""

    def __init__(self, fn: Callable[[int, int], object], count: int):
        self.fn, self.count = fn, count
        self.results: list[object] = [None] * count
        self.next = 0
        self.in_flight = 0
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)

    def work(self, worker: int) -> None:
        while True:
            with self.lock:
                if self.next >= self.count or self.error is not None:
                    return
                i = self.next
                self.next += 1
                self.in_flight += 1
            error = None
            try:
                self.results[i] = self.fn(i, worker)
            except BaseException as raised:  # handed to the caller, which raises it
                error = raised
            with self.lock:
                self.in_flight -= 1
                self.error = self.error or error
                self.done.notify_all()

    def wait(self) -> None:
        """Until every item taken is finished (the caller has run out of items to take)."""
        with self.lock:
            while self.in_flight:
                self.done.wait()


class BlockPool:
    """Helper threads, each running torch single-threaded, that share a map's items with the caller."""

    def __init__(self) -> None:
        self._helpers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._job: _Job | None = None
        self._generation = 0
        self._wanted = 0
        self._busy = threading.Lock()  # one map at a time; a nested or concurrent map runs serially

    def map(self, fn: Callable[[int, int], R], count: int, threads: int) -> list[R]:
        """``[fn(i, worker) for i in range(count)]`` on up to ``threads`` threads (``worker`` < ``threads``
        names the thread, for per-thread buffers). torch runs single-threaded inside ``fn``."""
        threads = min(threads, count)
        if threads <= 1 or not self._busy.acquire(blocking=False):
            with single_threaded():
                return [fn(i, 0) for i in range(count)]
        try:
            self._start(threads - 1)
            job = _Job(fn, count)
            with self._lock:
                self._job, self._generation = job, self._generation + 1
                self._wanted = threads - 1
                self._wake.notify_all()
            with single_threaded():
                job.work(0)
            job.wait()
            with self._lock:
                self._job = None
            if job.error is not None:
                raise job.error
            return job.results  # type: ignore[return-value]
        finally:
            self._busy.release()

    def _start(self, helpers: int) -> None:
        while len(self._helpers) < helpers:
            count = torch.get_num_threads()
            ready = threading.Event()
            thread = threading.Thread(target=self._run, args=(len(self._helpers) + 1, ready),
                                      name=f"tempcal-block-{len(self._helpers) + 1}", daemon=True)
            thread.start()
            ready.wait()
            torch.set_num_threads(count)  # the helper's set_num_threads(1) also changed torch's process default
            self._helpers.append(thread)

    def _run(self, worker: int, ready: threading.Event) -> None:
        torch.set_num_threads(1)
        ready.set()
        seen = 0
        while True:
            with self._lock:
                while self._generation == seen:
                    self._wake.wait()
                seen, job, wanted = self._generation, self._job, self._wanted
            if job is not None and worker <= wanted:
                if torch.get_num_threads() != 1:  # set by code that ran on this thread since (a finalizer)
                    torch.set_num_threads(1)
                job.work(worker)


_pool = BlockPool()


def pass_threads(device: torch.device, elements: int) -> int:
    """Threads for a pass over ``elements`` logits on ``device``: torch's count on the CPU, 1 on an accelerator
    or for too little work."""
    if device.type != "cpu":
        return 1
    return max(1, min(torch.get_num_threads(), elements // MIN_BLOCK_ELEMENTS))


def map_blocks(fn: Callable[[int, int], R], count: int, threads: int) -> list[R]:
    """``[fn(i, worker) for i in range(count)]`` shared among ``threads`` threads, results in order."""
    return _pool.map(fn, count, threads)


def mapped_reads(reads: Iterable[T], plan: Callable[[T], tuple[Callable[[int, int], R], int]], threads: int,
                 ahead: bool = False) -> Iterator[tuple[T, list[R]]]:
    """``(read, results)`` per read: ``plan(read)`` is its block function and block count, mapped on ``threads``.
    ``ahead``: each read is a tensor of its own, so one thread takes the next read (a file's fresh pages) while the
    others run this read's blocks, rather than the caller alone between two maps; two reads are held at most."""
    it = iter(reads)
    current = next(it, _END)
    while current is not _END:
        fn, count = plan(current)  # type: ignore[arg-type]
        if not ahead or threads <= 1:
            yield current, map_blocks(fn, count, threads)  # type: ignore[misc]
            current = next(it, _END)
            continue
        following: list[object] = []

        def run(i: int, worker: int, fn: Callable[[int, int], R] = fn, following: list[object] = following
                ) -> R | None:
            if i == 0:
                following.append(next(it, _END))
                return None
            return fn(i - 1, worker)

        results = map_blocks(run, count + 1, threads)
        yield current, results[1:]  # type: ignore[misc]
        current = following[0]


def block_bounds(rows: int, block_rows: int) -> Sequence[tuple[int, int]]:
    """``(start, stop)`` of each block of ``block_rows`` rows among ``rows``."""
    return [(a, min(a + block_rows, rows)) for a in range(0, rows, block_rows)]


#: At most this many views a :class:`Scratch` remembers.
MAX_VIEWS = 64
#: CPU bytes of finished scans' buffers kept for the next scan of the process (see :meth:`Scratch.borrow`).
SPARE_BYTES = 64 << 20
_spare: list[Scratch] = []
_spare_lock = threading.Lock()


class Scratch:
    """Chunk-sized buffers reused by every pass: fresh megabyte temporaries per chunk cost page faults
    that take as long as the arithmetic."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._views: dict[tuple, torch.Tensor] = {}  # the views handed out, so a repeat costs one lookup

    @classmethod
    def borrow(cls) -> Scratch:
        """A finished scan's buffers when one was given back (a fit in a loop faults its pages in once), else new."""
        with _spare_lock:
            return _spare.pop() if _spare else cls()

    @staticmethod
    def give_back(scratches: Iterable[Scratch]) -> None:
        """Keep a finished scan's CPU buffers for the next :meth:`borrow`, up to :data:`SPARE_BYTES` in all."""
        with _spare_lock:
            kept = sum(s.nbytes() for s in _spare)
            for scratch in scratches:
                size = scratch.nbytes()
                if all(b.device.type == "cpu" for b in scratch._buffers.values()) and kept + size <= SPARE_BYTES:
                    _spare.append(scratch)
                    kept += size

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def like(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Buffer ``name`` shaped like ``t`` (contents undefined), grown when ``t`` is larger."""
        return self.get(name, t.shape, t.dtype, t.device)

    def get(self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Buffer ``name`` of ``shape`` in ``dtype`` on ``device`` (contents undefined), grown when too small."""
        key = (name, tuple(shape), dtype, device)
        view = self._views.get(key)
        if view is not None:
            return view
        numel = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            buffer = self._buffers[name] = torch.empty(numel, dtype=dtype, device=device)
            self._views = {k: v for k, v in self._views.items() if k[0] != name}  # views of the old buffer
        if len(self._views) >= MAX_VIEWS:  # many shapes (a long-lived process, data of every size): start afresh
            self._views.clear()
        view = self._views[key] = buffer[:numel].view(tuple(shape))
        return view


__all__ = ["BlockPool", "Scratch", "active", "all_gather_rows", "all_reduce", "block_bounds", "cgroup_cpu_quota",
           "configure_threads", "init_from_environment", "map_blocks", "mapped_reads", "pass_threads", "rank",
           "rank_device", "requested_threads", "resolve_device", "settle_threads", "share", "shutdown",
           "single_threaded", "usable_cpus", "world_size"]

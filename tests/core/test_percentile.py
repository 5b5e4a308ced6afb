"""streaming_percentile (tempcal.core.percentile, ReAct's threshold) equals numpy.percentile bit for bit, with bounded
memory and counted passes, also when processes only exchange summed counts."""

from __future__ import annotations

import functools
import math
import threading

import numpy as np
import pytest
import torch

from tempcal.core.percentile import float_keys, key_value, numpy_lerp, numpy_linear_positions, streaming_percentile

PS = [0.0, 1e-9, 0.1, 1.0, 25.0, 33.3, 50.0, 66.6, 90.0, 99.0, 99.9, 99.9999, 100.0]
INF = math.inf


def chunked(values: torch.Tensor, size: int):
    flat = values.reshape(-1)
    return lambda: (flat[i:i + size] for i in range(0, flat.numel(), size))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def expected(values: torch.Tensor, p: float) -> np.floating:
    array = values.reshape(-1).to(compute_dtype(values.dtype)).numpy()
    with np.errstate(invalid="ignore"):
        return np.percentile(array, p)


def same(got: float, want: np.floating) -> bool:
    """Bit-equal up to the sign of zero (numpy's partition order decides which zero it returns)."""
    return (math.isnan(got) and np.isnan(want)) or got == want


def check(values: torch.Tensor, ps=PS, sizes=(1 << 20,), **kwargs) -> list[int]:
    passes = []
    for size in sizes:
        for p in ps:
            result = streaming_percentile(chunked(values, size), p, **kwargs)
            want = expected(values, p)
            assert same(result.value, want), (p, size, result, want)
            assert result.count == values.numel() and result.dtype == compute_dtype(values.dtype)
            passes.append(result.passes)
    return passes


def rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- values --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_random_values_every_dtype(dtype):
    values = (torch.randn(5000, generator=rng(1), dtype=torch.float64) * 100).to(dtype)
    passes = check(values, sizes=(977, 1 << 20))
    assert set(passes) <= ({2} if dtype != torch.float64 else {2, 3, 4})


def test_chunks_of_one_value():
    values = torch.randn(300, generator=rng(2)) * 5
    check(values, ps=[0.0, 37.5, 50.0, 99.0, 100.0], sizes=(1,))


def test_heavily_tied_values():
    values = torch.randint(-3, 4, (20000,), generator=rng(3)).to(torch.float32) * 0.5
    check(values, sizes=(1000,))


def test_post_relu_hidden_states():
    """What ReAct clips: activations after a ReLU, half of them exactly 0, in half precision."""
    values = torch.relu(torch.randn(400, 128, generator=rng(13)) * 2).to(torch.float16)
    check(values, ps=[10.0, 50.0, 90.0, 99.0, 100.0], sizes=(128 * 37,))


@pytest.mark.parametrize("value", [0.0, -0.0, 1.5, -2.25, 1e-45, INF, -INF])
def test_all_equal(value):
    check(torch.full((1000,), value, dtype=torch.float32), sizes=(64,))
    check(torch.full((10,), value, dtype=torch.float64), sizes=(3,))


def test_one_value():
    for value in (3.0, -0.0, -INF, INF):
        check(torch.tensor([value]), sizes=(1,))


def test_signed_zeros_and_subnormals():
    values = torch.tensor([-0.0, 0.0, 1e-45, -1e-45, 1.2e-38, -1.2e-38, 0.0, -0.0, 3.0, -3.0] * 7)
    check(values, sizes=(4,))
    check(values.double() * 1e-280, sizes=(5,))


def test_infinities_follow_numpy():
    """numpy's lerp gives NaN whenever an infinite order statistic takes part; the result must match it."""
    base = torch.randn(1000, generator=rng(4), dtype=torch.float64)
    for values in (torch.cat([base, torch.tensor([INF] * 3)]), torch.cat([torch.tensor([-INF] * 5), base]),
                   torch.tensor([-INF, INF]), torch.tensor([-INF, -INF, 1.0, INF, INF])):
        check(values, sizes=(7, 1 << 20))
        check(values.float(), sizes=(7,))


def test_adversarial_bit_patterns():
    """Extremes of the float range, neighbours one ulp apart, values straddling digit boundaries of the keys."""
    f32 = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, np.finfo(np.float32).tiny,
                    -np.finfo(np.float32).tiny, 1.0, np.nextafter(np.float32(1), np.float32(2)),
                    np.nextafter(np.float32(1), np.float32(0)), 65536.0, 65535.99, -65536.0], dtype=np.float32)
    check(torch.from_numpy(np.tile(f32, 11)), sizes=(3, 1000))
    f64 = np.array([np.finfo(np.float64).max, -np.finfo(np.float64).max, 5e-324, -5e-324, 1.0,
                    np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), 2.0 ** 48, -(2.0 ** 32), 2.0 ** -1022])
    check(torch.from_numpy(np.tile(f64, 13)), sizes=(3, 1000))


def test_float64_refines_when_a_bucket_is_too_large_to_collect():
    """Values sharing their top 16 key bits: with no room to collect, float64 needs all 4 histogram passes."""
    values = 1.0 + torch.rand(20000, generator=rng(5), dtype=torch.float64) * 1e-6
    passes = check(values, ps=[10.0, 50.0, 99.0], sizes=(4096,), max_candidates=100)
    assert set(passes) == {4}
    passes = check(values, ps=[10.0, 50.0, 99.0], sizes=(4096,))  # enough room: collect after pass 1
    assert set(passes) == {2}


def test_memory_stays_bounded_by_the_cap():
    """No pass collects more than max_candidates keys per open rank."""
    values = torch.randn(50000, generator=rng(6), dtype=torch.float64)
    largest = []
    original = torch.cat

    def spy(parts, *args, **kwargs):
        out = original(parts, *args, **kwargs)
        if out.dtype == torch.int64:
            largest.append(out.numel())
        return out

    torch.cat = spy
    try:
        check(values, ps=[50.0], sizes=(5000,), max_candidates=64)
    finally:
        torch.cat = original
    assert largest and max(largest) <= 64


def test_numpy_arrays_and_other_shapes():
    values = np.random.default_rng(7).normal(size=(40, 25)).astype(np.float32)
    result = streaming_percentile(lambda: (values[i:i + 8] for i in range(0, 40, 8)), 90)
    assert result.value == np.percentile(values, 90)


def test_dtype_can_be_raised_to_float64():
    values = (torch.randn(3000, generator=rng(8)) * 7).to(torch.bfloat16)
    for p in (13.7, 50.0, 97.5):
        result = streaming_percentile(chunked(values, 500), p, dtype=torch.float64)
        assert result.dtype == torch.float64
        assert result.value == np.percentile(values.double().numpy(), p)


# -- refusals ------------------------------------------------------------------------------------
def test_nan_is_refused():
    values = torch.tensor([1.0, math.nan, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        streaming_percentile(chunked(values, 2), 50)


@pytest.mark.parametrize("p", [-1e-9, 100.0000001, math.nan])
def test_bad_percentile(p):
    with pytest.raises(ValueError):
        streaming_percentile(chunked(torch.ones(3), 2), p)


def test_empty_and_wrong_dtypes():
    with pytest.raises(ValueError, match="no values"):
        streaming_percentile(lambda: iter(()), 50)
    with pytest.raises(TypeError):
        streaming_percentile(chunked(torch.arange(10), 3), 50)
    with pytest.raises(TypeError):
        streaming_percentile(lambda: iter([torch.ones(2), torch.ones(2, dtype=torch.float64)]), 50)


# -- pieces --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keys_preserve_order_and_invert(dtype):
    info = torch.finfo(dtype)
    values = torch.tensor([-INF, -info.max, -1.0, -info.tiny, -0.0, 0.0, info.tiny, 1.0, info.max, INF], dtype=dtype)
    keys = float_keys(values)
    unsigned = [int(k) % (1 << (32 if dtype == torch.float32 else 64)) for k in keys]
    assert unsigned == sorted(unsigned) and unsigned[4] == unsigned[5]
    assert len(set(unsigned)) == len(unsigned) - 1
    for v, k in zip(values.tolist(), unsigned, strict=True):
        assert key_value(k, dtype) == v


def test_positions_mirror_numpy():
    """On the values 0..n-1 the order statistics are their indices: numpy's result must be our lerp of them."""
    for n in (1, 2, 3, 10, 1001):
        for dtype in (np.float32, np.float64):
            values = np.arange(n, dtype=dtype)
            for p in PS:
                lower, upper, gamma = numpy_linear_positions(n, p)
                assert 0 <= lower <= upper <= n - 1 and upper - lower <= 1
                assert numpy_lerp(dtype(lower), dtype(upper), gamma) == np.percentile(values, p), (n, p)
    lower, upper, _ = numpy_linear_positions(10**12 + 7, 50.0)
    assert (lower, upper) == (5 * 10**11 + 3, 5 * 10**11 + 4)


# -- per rank: counts are sums ----------------------------------------------------------------------
def run_ranks(shares: list, p: float, **kwargs) -> list:
    """streaming_percentile on each share in its own thread ("rank"); the ranks exchange only the sum of
    their count vectors, as torch.distributed.all_reduce would give them."""
    barrier = threading.Barrier(len(shares), timeout=60)
    slots: list = [None] * len(shares)
    results: list = [None] * len(shares)

    def all_reduce(rank: int, counts: torch.Tensor) -> None:
        slots[rank] = counts.clone()
        barrier.wait()
        total = sum(slots)
        barrier.wait()
        counts.copy_(total)

    def work(rank: int) -> None:
        reduce = functools.partial(all_reduce, rank)
        results[rank] = streaming_percentile(shares[rank], p, all_reduce=reduce, **kwargs)

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(len(shares))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_ranks_summing_their_counts_agree_on_the_exact_percentile():
    values = torch.randn(9000, generator=rng(9), dtype=torch.float64) * 3
    values[:500] = 1.25  # ties across ranks
    shares = [chunked(part, 700) for part in (values[:1000], values[1000:6000], values[6000:])]
    for p in (0.0, 12.5, 50.0, 99.9, 100.0):
        results = run_ranks(shares, p)
        want = np.percentile(values.numpy(), p)
        assert all(r is not None and r.value == want and r.count == values.numel() for r in results), p
        assert len({r.passes for r in results}) == 1 and results[0].passes <= 4


def test_a_rank_without_values_still_takes_part():
    values = torch.randn(1000, generator=rng(10))
    results = run_ranks([chunked(values, 100), lambda: iter(())], 75.0, dtype=torch.float32)
    want = np.percentile(values.numpy(), 75.0)
    assert results[0].value == want and results[1].value == want


def test_small_and_large_chunks_mixed(monkeypatch):
    """Chunks below, at and above the batching size, in one stream."""
    import tempcal.core.percentile as percentile

    monkeypatch.setattr(percentile, "BATCH_VALUES", 64)
    values = torch.randn(3000, generator=rng(11)) * 2

    def factory():
        start, sizes = 0, [1, 63, 64, 65, 500, 7]
        while start < values.numel():
            size = sizes[start % len(sizes)]
            yield values[start:start + size]
            start += size

    for p in (0.0, 50.0, 99.0, 100.0):
        assert streaming_percentile(factory, p).value == np.percentile(values.numpy(), p)


def _distributed_worker(rank: int, world: int, path: str, queue) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    values = torch.randn(4000, generator=rng(12), dtype=torch.float64)
    share = values[rank::world]
    result = streaming_percentile(lambda: iter(torch.split(share, 300)), 37.0, all_reduce=dist.all_reduce)
    queue.put((rank, result.value, result.passes))
    dist.destroy_process_group()


@pytest.mark.slow
def test_torch_distributed_all_reduce(tmp_path):
    """The count vector goes straight into torch.distributed.all_reduce (gloo, two processes)."""
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()  # spawn: fork after torch has started threads can hang
    mp.start_processes(_distributed_worker, args=(2, str(tmp_path / "store"), queue), nprocs=2,
                       start_method="spawn", join=True)
    got = sorted(queue.get() for _ in range(2))
    want = np.percentile(torch.randn(4000, generator=rng(12), dtype=torch.float64).numpy(), 37.0)
    assert [v for _, v, _ in got] == [want, want] and got[0][2] == got[1][2]

"""MemoryPageStore: digest-checked puts, LRU eviction by bytes, thread safety."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import xxhash

import hurray_wire as hw
from hurray_wire.errors import ArgumentTypeError, PageDigestError, PageStoreError
from hurray_wire.integrity import MemoryPageStore, PageStore, page_digests, store_pages


def rec(n: int, size: int = 100) -> tuple[int, bytes]:
    data = bytes([n % 256]) * size
    return xxhash.xxh3_64_intdigest(data), data


def test_put_get_contains_digests() -> None:
    store = MemoryPageStore(1000)
    assert isinstance(store, PageStore)
    d1, b1 = rec(1)
    d2, b2 = rec(2)
    store.put(d2, b2)
    store.put(d1, bytearray(b1))
    store.put(np.uint64(d1), memoryview(b1))  # again: no double count
    assert store.get(d1) == b1 and store.get(np.uint64(d2)) == b2
    assert d1 in store and np.uint64(d2) in store and 5 not in store and "x" not in store
    assert store.digests().tolist() == sorted([d1, d2])
    assert store.digests().dtype == np.uint64
    assert len(store) == 2 and store.nbytes == 200
    assert store.get(12345) is None


def test_store_owns_its_copy() -> None:
    store = MemoryPageStore(1000)
    d, b = rec(7)
    buf = bytearray(b)
    store.put(d, buf)
    buf[0] ^= 1
    assert store.get(d) == b


def test_stale_or_wrong_bytes_are_refused() -> None:
    store = MemoryPageStore(1000)
    d, b = rec(1)
    with pytest.raises(PageDigestError, match="do not match") as info:
        store.put(d, b[:-1] + b"\x02")
    assert info.value.field == "digest"
    assert f"0x{d:016X}" in str(info.value)
    assert d not in store and store.nbytes == 0


def test_lru_eviction_order_and_byte_bound() -> None:
    store = MemoryPageStore(350)
    pages = [rec(i) for i in range(4)]
    for d, b in pages[:3]:
        store.put(d, b)
    assert store.get(pages[0][0]) is not None  # 0 is now most recent: order 1, 2, 0
    assert store.lru_order() == [pages[1][0], pages[2][0], pages[0][0]]
    store.put(*pages[3])  # 400 > 350: evicts 1
    assert store.lru_order() == [pages[2][0], pages[0][0], pages[3][0]]
    assert store.nbytes == 300 <= store.max_bytes
    big_d, big = rec(9, 300)
    store.put(big_d, big)  # evicts 2, 0, 3 (needs 300 of 350)
    assert store.lru_order() == [big_d] and store.nbytes == 300


def test_page_larger_than_the_store_is_refused() -> None:
    store = MemoryPageStore(99)
    d, b = rec(1)
    with pytest.raises(PageStoreError, match="larger") as info:
        store.put(d, b)
    assert info.value.found == 100
    assert len(store) == 0
    zero = MemoryPageStore(0)
    zero.put(xxhash.xxh3_64_intdigest(b""), b"")  # an empty record fits any bound
    assert len(zero) == 1


@pytest.mark.parametrize("bad", [-1, 2**64, 1.0, True, "1", None])
def test_bad_digest_arguments(bad: object) -> None:
    store = MemoryPageStore(10)
    with pytest.raises(ArgumentTypeError, match="digest"):
        store.put(bad, b"")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="digest"):
        store.get(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_bad_max_bytes(bad: object) -> None:
    with pytest.raises(ArgumentTypeError, match="max_bytes"):
        MemoryPageStore(bad)  # type: ignore[arg-type]


def test_put_refuses_non_bytes() -> None:
    with pytest.raises(ArgumentTypeError, match="page_bytes"):
        MemoryPageStore(10).put(0, "text")


def test_store_pages_of_a_tensor() -> None:
    pool = np.arange(5 * 4 * 2 * 8, dtype=np.float16).reshape(5, 4, 2, 8)
    t = hw.BlockPagedTensor.from_arrays(pool, [0, 1, 0], [0, 2, 3])
    store = MemoryPageStore(10_000)
    got = store_pages(store, t)
    digests = page_digests(t)
    assert got.tolist() == digests[[0, 1]].tolist()
    assert store.get(int(digests[1])) == pool[1].tobytes()
    assert store_pages(store, t, [4]).tolist() == [int(digests[4])]
    with pytest.raises(ArgumentTypeError, match="pages"):
        store_pages(store, t, [5])
    with pytest.raises(ArgumentTypeError, match="store"):
        store_pages({}, t)  # type: ignore[arg-type]


def test_eight_threads_then_consistent() -> None:
    store = MemoryPageStore(64 * 100)
    pages = [rec(i) for i in range(200)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        barrier.wait()
        try:
            for _ in range(2000):
                d, b = pages[int(rng.integers(0, len(pages)))]
                if rng.random() < 0.5:
                    store.put(d, b)
                else:
                    got = store.get(d)
                    assert got is None or got == b
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    order = store.lru_order()
    assert len(order) == len(set(order)) == len(store) <= 64
    assert store.nbytes == 100 * len(store) <= store.max_bytes
    by_digest = dict(pages)
    for d in order:
        assert store.get(d) == by_digest[d]
    assert store.digests().tolist() == sorted(order)

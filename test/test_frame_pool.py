"""engine/frame_pool.py on the CPU (ordinary memory: page-locked memory needs CUDA; the GPU test
in test_fused.py uploads from it): copies are exact, an array goes back to the pool when its
last reference goes and is handed out again for its shape, never while referenced, and the pool
stops growing at its limit."""

from __future__ import annotations

import gc
import threading

import numpy as np

from flashrt_ros.engine.frame_pool import FramePool


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_copies_are_exact_and_arrays_come_back_for_their_shape():
    pool = FramePool(pinned=False)
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    a = pool.copy(frame)
    assert a is not frame and np.array_equal(a, frame) and address(a) != address(frame)
    b = pool.copy(frame[:, ::-1])  # a strided view is copied as it reads
    assert np.array_equal(b, frame[:, ::-1]) and address(b) != address(a)  # `a` is held: not handed out
    first = address(a)
    del a
    gc.collect()
    assert pool.free_count((6, 8, 3)) == 1
    c = pool.copy(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
    assert address(c) == first and pool.free_count((6, 8, 3)) == 0
    other = pool.copy(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8))  # another shape: its own array
    assert other.shape == (4, 4, 3) and pool.held_bytes == 2 * (6 * 8 * 3) + 4 * 4 * 3  # c re-used a's


def test_a_view_keeps_its_array_out_of_the_pool():
    pool = FramePool(pinned=False)
    a = pool.copy(np.zeros((4, 4, 3), dtype=np.uint8))
    crop = a[1:3]
    del a
    gc.collect()
    assert pool.free_count((4, 4, 3)) == 0  # the crop still reads it
    del crop
    gc.collect()
    assert pool.free_count((4, 4, 3)) == 1


def test_the_pool_stops_growing_at_its_limit_and_skips_other_dtypes():
    frame = np.ones((10, 10, 3), dtype=np.uint8)
    pool = FramePool(pinned=False, max_bytes=2 * frame.nbytes)
    kept = [pool.copy(frame), pool.copy(frame)]
    beyond = pool.copy(frame)
    assert beyond is frame and pool.held_bytes == 2 * frame.nbytes and all(k is not frame for k in kept)
    floats = np.ones((2, 2, 3), dtype=np.float32)
    assert pool.copy(floats) is floats


def test_threads_copying_at_once_each_get_their_own_frame():
    pool = FramePool(pinned=False)
    results: dict[int, list[bool]] = {}

    def camera(i: int) -> None:
        ok = []
        for k in range(200):
            frame = np.full((8, 8, 3), (i * 31 + k) % 256, dtype=np.uint8)
            got = pool.copy(frame)
            ok.append(bool(np.array_equal(got, frame)))
        results[i] = ok

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(all(v) and len(v) == 200 for v in results.values())

"""engine/frame_pool.py on the CPU (ordinary memory: page-locked memory needs CUDA; the GPU
tests in test_fused.py upload from it, and the last one here checks it is page-locked): copies
are exact, an array goes back to the pool when its last reference goes and is handed out again
for its shape, never while referenced, and the pool stops growing at its limit."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

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


def test_strided_views_are_copied_as_they_read():
    """rgba8, bgra8 and mono8 as image_convert views them (plane by plane: copy_frame)."""
    pool = FramePool(pinned=False)
    rgba = np.random.default_rng(1).integers(0, 256, (6, 8, 4), dtype=np.uint8)
    for view in (rgba[..., :3], rgba[..., 2::-1], np.broadcast_to(rgba[..., :1], (6, 8, 3))):
        assert np.array_equal(pool.copy(view), view)


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


def test_the_pool_stops_growing_at_its_limit():
    frame = np.ones((10, 10, 3), dtype=np.uint8)
    pool = FramePool(pinned=False, max_bytes=2 * frame.nbytes)
    kept = [pool.copy(frame), pool.copy(frame)]
    beyond = pool.copy(frame)
    assert beyond is frame and pool.held_bytes == 2 * frame.nbytes and all(k is not frame for k in kept)


def test_a_frame_not_uint8_comes_back_as_it_is_from_a_pool_with_room():
    pool = FramePool(pinned=False)
    floats = np.ones((2, 2, 3), dtype=np.float32)
    assert pool.copy(floats) is floats and pool.held_bytes == 0


def test_a_refused_allocation_gives_its_bytes_back_to_the_count(monkeypatch):
    """Page-locked memory refused (the system's limit): the frame as it is, and the pool's count
    unchanged, or refusals would fill it with arrays it never made and it would pool no more."""
    import torch

    frame = np.ones((10, 10, 3), dtype=np.uint8)
    pool = FramePool(pinned=False, max_bytes=2 * frame.nbytes)
    empty = torch.empty

    def refused(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory (page-locked)")

    monkeypatch.setattr(torch, "empty", refused)
    for _ in range(3):
        assert pool.copy(frame) is frame and pool.held_bytes == 0
    monkeypatch.setattr(torch, "empty", empty)
    pooled = pool.copy(frame)
    assert pooled is not frame and pool.held_bytes == frame.nbytes


def test_only_as_many_free_arrays_go_as_the_new_shape_needs():
    small, big = np.ones((10, 10, 3), dtype=np.uint8), np.ones((20, 10, 3), dtype=np.uint8)
    pool = FramePool(pinned=False, max_bytes=5 * small.nbytes)
    held = pool.copy(small)
    spare = [pool.copy(small) for _ in range(3)]
    del spare
    gc.collect()
    assert pool.free_count(small.shape) == 3 and pool.held_bytes == 4 * small.nbytes
    new = pool.copy(big)  # 2 small arrays' bytes, 1 of them left under the limit: one goes
    assert np.array_equal(new, big) and np.array_equal(held, small)
    assert pool.free_count(small.shape) == 2 and pool.held_bytes == 5 * small.nbytes


def test_a_strided_frame_of_two_dimensions_is_copied():
    from flashrt_ros.engine.frame_pool import copy_frame

    frame = np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::-1]
    out = np.empty((3, 4), dtype=np.uint8)
    copy_frame(out, frame)
    assert np.array_equal(out, frame)


@pytest.mark.gpu
def test_pooled_arrays_are_page_locked_on_a_gpu_machine():
    """What the pool is for: an upload from page-locked memory runs as an async copy."""
    frame = np.ones((48, 64, 3), dtype=np.uint8)
    pool = FramePool()
    a = pool.copy(frame)
    del a
    gc.collect()
    (buf,) = pool._free[frame.shape]
    assert buf.is_pinned()


def test_a_full_pool_lets_free_arrays_of_other_shapes_go_for_a_new_shape():
    """A camera that changed its resolution: its old arrays, once free, make room for the new size
    instead of the pool refusing every new frame; arrays still referenced are never let go."""
    small, big = np.ones((10, 10, 3), dtype=np.uint8), np.ones((20, 10, 3), dtype=np.uint8)
    pool = FramePool(pinned=False, max_bytes=3 * small.nbytes)
    held = pool.copy(small)
    old = [pool.copy(small), pool.copy(small)]
    del old
    gc.collect()
    assert pool.free_count((10, 10, 3)) == 2 and pool.held_bytes == 3 * small.nbytes
    new = pool.copy(big)  # needs 2 small arrays' bytes: both free ones go, the held one stays
    assert new is not big and np.array_equal(new, big)
    assert pool.free_count((10, 10, 3)) == 0 and pool.held_bytes == small.nbytes + big.nbytes
    assert np.array_equal(held, small)
    beyond = pool.copy(big)  # nothing free left to let go: the frame as it is
    assert beyond is big and pool.held_bytes == small.nbytes + big.nbytes
    del held
    gc.collect()
    beyond = pool.copy(np.ones((30, 10, 3), dtype=np.uint8))  # the free small one would not make room: kept
    assert beyond.shape == (30, 10, 3) and pool.free_count((10, 10, 3)) == 1


def test_threads_copying_at_once_never_share_a_live_array():
    """Camera threads copy at once, each keeping its last few frames alive (a held sample, a
    decision): no two live arrays share memory, and each holds its own frame."""
    pool = FramePool(pinned=False)
    results: dict[int, list[bool]] = {}
    live: dict[int, list[np.ndarray]] = {}

    def camera(i: int) -> None:
        ok, kept = [], []
        for k in range(200):
            kept = [*kept[-2:], pool.copy(np.full((8, 8, 3), (i * 31 + k) % 256, dtype=np.uint8))]
            values = [(i * 31 + k - len(kept) + 1 + j) % 256 for j in range(len(kept))]  # each kept frame's
            ok.append(all(bool((a == v).all()) for a, v in zip(kept, values, strict=True)))
        results[i], live[i] = ok, kept

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(all(v) and len(v) == 200 for v in results.values())
    addresses = [address(a) for kept in live.values() for a in kept]
    assert len(set(addresses)) == len(addresses) == 12


def test_an_array_can_come_back_on_the_thread_that_holds_the_pools_lock():
    """A garbage collection that starts inside `copy` (which holds the lock) may run a pool array's
    finalizer on that thread: giving it back must not wait for the lock (it deadlocked)."""
    import torch

    pool = FramePool(pinned=False)
    spare = torch.empty((4, 4, 3), dtype=torch.uint8)  # not a live array's: that one comes back at its end
    done = threading.Event()

    def collect_inside_the_lock() -> None:
        with pool._lock:
            pool._give_back((4, 4, 3), spare)
        done.set()

    threading.Thread(target=collect_inside_the_lock, daemon=True).start()
    assert done.wait(5.0), "the give-back waited for a lock its own thread held"
    assert pool.free_count((4, 4, 3)) == 1

"""Camera frames in page-locked host memory, so that the decision uploads them with a queued copy.

Uploaded from ordinary (pageable) memory, three 480x640 frames held the decision's thread for
~0.5-0.6 ms on an H100 host while the driver staged them (`bench/decide_host.py`); from
page-locked memory the copy is queued and the thread goes on. The node copies each converted
frame into an array from this pool as it arrives, on the camera's own thread, off the decision's
path (DESIGN.md: "camera msgs --(copy stream, pinned)--> img/<cam>").

An array goes back to the pool when the last reference to it goes (the held sample was replaced
and no decision holds it), and is then handed out again for a frame of its shape. A decision
keeps its frames referenced until their copies are done (`FusedPi0.set_frames`). The pool holds
at most `max_bytes`. A frame that does not fit first lets free arrays of other shapes go (a camera
that changed its resolution leaves arrays no frame will use again); past that, `copy` returns the
frame as it is (pageable: slower, still right). (An array let go returns its page-locked memory
to PyTorch's host cache, which keeps it for later pinned tensors: not to the system.)
"""

from __future__ import annotations

import threading
import weakref
from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

MAX_BYTES = 256 * 2**20  # ~290 RGB frames of 640x480: far above what 3-4 cameras keep alive at once


class FramePool:
    """See the module docstring. `pinned=False` (tests on a CPU) hands out ordinary memory."""

    def __init__(self, pinned: bool = True, max_bytes: int = MAX_BYTES):
        self.pinned = pinned
        self.max_bytes = max_bytes
        self.held_bytes = 0  # made so far (free or handed out)
        self._free: dict[tuple[int, ...], list[torch.Tensor]] = defaultdict(list)
        # camera threads copy at once; re-entrant: a garbage collection that starts inside `copy`
        # may run an array's finalizer (_give_back) on the thread that holds the lock
        self._lock = threading.RLock()

    def copy(self, frame: np.ndarray) -> np.ndarray:
        """A uint8 frame copied into a pool array of its shape, or the frame itself when the pool
        is full (or the frame not uint8)."""
        if frame.dtype != np.uint8:
            return frame
        shape = tuple(frame.shape)
        with self._lock:
            free = self._free[shape]
            buf = free.pop() if free else None
            if buf is None:
                if self.held_bytes + frame.nbytes > self.max_bytes:
                    self._let_go_of_other_shapes(shape, self.held_bytes + frame.nbytes - self.max_bytes)
                if self.held_bytes + frame.nbytes > self.max_bytes:
                    return frame
                self.held_bytes += frame.nbytes
        if buf is None:
            import torch  # here, not at the top: image_convert (and so synthetic_sensors) uses copy_frame

            try:
                buf = torch.empty(shape, dtype=torch.uint8, pin_memory=self.pinned)
            except RuntimeError:  # page-locked memory refused (the system's limit): the frame as it is
                with self._lock:
                    self.held_bytes -= frame.nbytes
                return frame
        out = buf.numpy()
        copy_frame(out, frame)
        weakref.finalize(out, self._give_back, shape, buf).atexit = False
        return out

    def free_count(self, shape: tuple[int, ...]) -> int:
        with self._lock:
            return len(self._free[tuple(shape)])

    def _let_go_of_other_shapes(self, shape: tuple[int, ...], need: int) -> None:
        """Free arrays of shapes other than `shape` go until `need` bytes are released; none goes
        when all of them would not release that much (the frame is not pooled anyway). Called
        under the lock."""
        others = [k for k in self._free if k != shape]
        if sum(buf.numel() for k in others for buf in self._free[k]) < need:
            return
        for other in others:
            free = self._free[other]
            while free and need > 0:
                nbytes = free.pop().numel()
                self.held_bytes -= nbytes
                need -= nbytes
            if not free:
                del self._free[other]
            if need <= 0:
                return

    def _give_back(self, shape: tuple[int, ...], buf: torch.Tensor) -> None:
        with self._lock:
            self._free[shape].append(buf)


def copy_frame(out: np.ndarray, frame: np.ndarray) -> None:
    """`frame` into `out` (same shape, uint8). A strided HxWxC view (rgba8's first three channels,
    bgr8 reversed, grey broadcast) goes plane by plane: numpy's strided copy with a 3- or 4-byte
    inner loop is ~5x slower (640x480: ~2.3 ms against ~0.45)."""
    if frame.flags.c_contiguous or frame.ndim != 3:
        np.copyto(out, frame, casting="no")
        return
    for c in range(frame.shape[2]):
        out[..., c] = frame[..., c]

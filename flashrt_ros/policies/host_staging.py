"""Page-locked host buffers for a decision's copies between the host and the GPU.

A copy from ordinary (pageable) host memory holds the calling thread until the driver has staged
the bytes, and a copy to it is a full stop; both allocate. Measured on an H100 host
(`bench/decide_host.py`, pi0.5 with three 480x640 cameras): the frames' three uploads took
~0.6 ms of the decision's host time, the inputs' four small copies ~0.25 ms and the chunk's
read-back ~0.3 ms, while the GPU waited. From page-locked buffers made once, the same copies are
queued and the thread goes on.

A queued copy reads its buffer when the GPU gets to it, so a buffer must not be written again
before that: each group of buffers keeps the event recorded after its last copies, and the next
`get` waits for it (normally long done: every decision ends with a wait for its chunk). On a
CPU (no CUDA) the buffers are plain tensors and the copies synchronous.
"""

from __future__ import annotations

import torch
from torch import Tensor


class PinnedBuffers:
    """A group of named host buffers that copies are queued from (or into), and their guard."""

    def __init__(self, device: torch.device):
        self.pinned = device.type == "cuda"
        self._buffers: dict[str, Tensor] = {}
        self._copied = torch.cuda.Event() if self.pinned else None
        self._pending = False

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """Buffer `name` of this shape and dtype (made on first use, and again if either changes),
        once the copies queued from the group's buffers before are done."""
        self.wait()
        buf = self._buffers.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape) or buf.dtype != dtype:
            buf = torch.empty(shape, dtype=dtype, pin_memory=self.pinned)
            self._buffers[name] = buf
        return buf

    def copy(self, dst: Tensor, src: Tensor) -> None:
        """dst <- src, queued when one side is a page-locked buffer and the other on the GPU."""
        dst.copy_(src, non_blocking=self.pinned)

    def issued(self) -> None:
        """After queueing the copies of one use: the next `get` waits for them."""
        if self.pinned:
            self._copied.record()
            self._pending = True

    def wait(self) -> None:
        """Until the copies queued so far are done (a host wait on the GPU's progress)."""
        if self._pending:
            self._copied.synchronize()
            self._pending = False

"""Page-locked host buffers for a decision's copies between the host and the GPU.

A copy from ordinary (pageable) host memory holds the calling thread until the driver has staged
the bytes, and a copy to it is a full stop; both allocate. From page-locked buffers made once, a
copy is queued and the thread goes on. Measured on the H100 host (`bench/decide_host.py`, pi0.5,
three 480x640 cameras), where each torch call of a decision cost 20-50 us of host time: the
chunk's read-back went from ~0.45 to ~0.14 ms. (Frames are not copied through these: copying
them into page-locked memory on the decision's thread was no faster than the driver's own
staging. The node puts them in page-locked memory as they arrive: engine/frame_pool.py.)

A queued copy reads its buffer when the GPU gets to it, so a buffer must not be written again
before that: each group of buffers keeps the event recorded after its last copies, and the next
write waits for it (normally long done: every decision ends with a wait for its chunk). On a
CPU (no CUDA) the buffers are plain tensors and the copies synchronous.
"""

from __future__ import annotations

import torch
from torch import Tensor


class CopyGuard:
    """The event recorded after copies were queued from (or into) host memory, and the wait for
    it before that memory is written or handed out again. No-op on a CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self._pending = False

    def issued(self) -> None:
        """After queueing copies: the next `wait` waits for them."""
        if self._copied is not None:
            self._copied.record(torch.cuda.current_stream(self.device))
            self._pending = True

    def wait(self) -> None:
        """Until the copies queued so far are done (a host wait on the GPU's progress)."""
        if self._pending:
            self._copied.synchronize()
            self._pending = False


class PinnedBuffers:
    """A group of named host buffers that copies are queued from (or into), and their guard."""

    def __init__(self, device: torch.device):
        self.pinned = device.type == "cuda"
        self._buffers: dict[str, Tensor] = {}
        self.guard = CopyGuard(device)

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """Buffer `name` of this shape and dtype (made on first use, and again if either changes),
        once the copies queued from the group's buffers before are done."""
        self.guard.wait()
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
        self.guard.issued()

    def wait(self) -> None:
        self.guard.wait()


class PackedInputs:
    """A decision's small inputs (prompt tokens, their mask, the state) in one device byte buffer,
    with one page-locked host twin: one queued copy brings them all. The device tensors are views
    of that buffer (made before any graph capture, which keeps their addresses); the host side is
    filled through numpy views, which cost less per call than torch's. Measured on the H100 host,
    where each torch call of a decision cost 20-50 us of host time: four separate copies took
    ~0.3 ms (bench/decide_host.py)."""

    ALIGN = 8  # every field starts at a multiple of the widest element (int64)

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device):
        self.pinned = device.type == "cuda"
        layout, total = {}, 0
        for name, (shape, dtype) in fields.items():
            nbytes = int(torch.empty(shape, dtype=dtype, device="meta").nbytes)
            layout[name] = (total, nbytes, shape, dtype)
            total += -(-nbytes // self.ALIGN) * self.ALIGN
        self._device_raw = torch.zeros(total, dtype=torch.uint8, device=device)
        self._host_raw = torch.zeros(total, dtype=torch.uint8, pin_memory=self.pinned)
        host_bytes = self._host_raw.numpy()
        self.device: dict[str, Tensor] = {}
        self._host: dict[str, object] = {}
        for name, (offset, nbytes, shape, dtype) in layout.items():
            self.device[name] = self._device_raw[offset : offset + nbytes].view(dtype).view(shape)
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            self._host[name] = host_bytes[offset : offset + nbytes].view(np_dtype).reshape(shape)
        self._guard = CopyGuard(device)

    def host(self) -> dict[str, object]:
        """The host side's numpy views to fill, once the last upload has read them."""
        self._guard.wait()
        return self._host

    def upload(self) -> None:
        """All fields to the device in one copy (queued from page-locked memory)."""
        self._device_raw.copy_(self._host_raw, non_blocking=self.pinned)
        self._guard.issued()

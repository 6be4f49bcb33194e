"""``sensor_msgs/Image`` and ``CompressedImage`` -> HxWx3 uint8 RGB, without cv_bridge.

The policy takes RGB uint8 frames. cv_bridge is not installable next to pip ROS wheels
(and pulls OpenCV), so the few encodings robot cameras publish are converted here with
numpy alone (JPEG with simplejpeg, PNG with Pillow). The functions only read attributes, so they work on
real rclpy messages and on plain objects in tests.

Conversion rules (the policy sees what these say, so they are part of the contract):

- ``rgb8`` is passed through; ``bgr8``/``8UC3`` and ``bgra8``/``8UC4`` are reordered
  (``8UCn`` follows OpenCV, which stores colour as BGR/BGRA, as cv_bridge does); alpha is
  dropped, not composited.
- ``mono8``/``8UC1`` are replicated to three channels.
- ``mono16`` and ``16UC1`` keep the high byte (``>> 8``), so full-scale 16-bit maps to
  full-scale 8-bit. For depth in millimetres that means ~0.26 m per grey level; a policy
  that wants metric depth must get it through another path, not this RGB one.
- ``32FC1`` maps [0, 1] to 0..255 (rounded to nearest), clipping outside; NaN -> 0,
  +inf -> 255, -inf -> 0 (REP 117: NaN is "no reading", +inf "nothing in range", -inf "too
  close"). A frame of NaN alone is refused (``non_finite_image``): no reading anywhere. Publishers
  of float depth in metres should normalise first.
- ``is_bigendian`` is honoured for the 16- and 32-bit encodings; ``step`` (row stride,
  may include padding) is honoured for all of them.

Messages are refused, never guessed at, with an :class:`InputError` whose reason is
``bad_encoding``, ``bad_size`` (zero size, ``step < width*bytes_per_pixel``, data longer
than ``step*height``, not the expected size or the size the camera has been sending, or - a
compressed frame of no expected size - more than :data:`MAX_DECODED_PIXELS`) or
``truncated_data``. Sizes are checked from the header, before any pixel is read or decoded.

Copies: for ``rgb8`` and ``rgba8`` the result is a *view* of ``msg.data`` (zero copy;
read-only when the data is ``bytes``, possibly non-contiguous when rows are padded or
alpha is skipped); every other encoding returns a new contiguous array. Pass ``out`` (e.g.
a pinned staging buffer) to have the pixels written there in one pass with no allocation.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from flashrt_ros.engine.frame_pool import copy_frame
from flashrt_ros.ros.input_error import (
    BAD_ENCODING,
    BAD_SIZE,
    DECODE_FAILED,
    NON_FINITE_IMAGE,
    TRUNCATED_DATA,
    InputError,
)

__all__ = [
    "SUPPORTED_ENCODINGS",
    "SUPPORTED_COMPRESSED_FORMATS",
    "image_to_rgb",
    "compressed_to_rgb",
    "check_frame_size",
    "MAX_DECODED_PIXELS",
]

MAX_DECODED_PIXELS = 7680 * 4320
"""The most pixels a compressed frame of no expected size may claim (8K, ~33 Mpx: above any
robot camera). Its header is read before decoding, and a decode costs memory and CPU in
proportion to the size it claims: a 631-byte JPEG claiming 30000x30000 took 3 s and 2.6 GB."""


def _gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    """HxW uint8 -> HxWx3 broadcast view (stride 0; materialised by ``_finish``)."""
    return np.broadcast_to(gray[..., None], (*gray.shape, 3))


def _float_to_u8(x: np.ndarray) -> np.ndarray:
    """[0, 1] -> 0..255 rounded; NaN -> 0, out of range clipped."""
    x = np.clip(np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
    return (x * np.float32(255.0) + np.float32(0.5)).astype(np.uint8)


@dataclass(frozen=True)
class _Layout:
    """How one encoding lays out a pixel, and how its HxWxC view becomes RGB."""

    channels: int
    dtype: str  # numpy dtype without byte order, e.g. "u1", "u2", "f4"
    to_rgb: Callable[[np.ndarray], np.ndarray]

    @property
    def bytes_per_pixel(self) -> int:
        return self.channels * np.dtype(self.dtype).itemsize


_RGB = _Layout(3, "u1", lambda v: v)
_BGR = _Layout(3, "u1", lambda v: v[..., ::-1])
_RGBA = _Layout(4, "u1", lambda v: v[..., :3])
_BGRA = _Layout(4, "u1", lambda v: v[..., 2::-1])
_MONO8 = _Layout(1, "u1", lambda v: _gray_to_rgb(v[..., 0]))
_MONO16 = _Layout(1, "u2", lambda v: _gray_to_rgb((v[..., 0] >> 8).astype(np.uint8)))
_FLOAT = _Layout(1, "f4", lambda v: _gray_to_rgb(_float_to_u8(v[..., 0])))

_LAYOUTS: dict[str, _Layout] = {
    "rgb8": _RGB,
    "bgr8": _BGR,
    "8UC3": _BGR,
    "rgba8": _RGBA,
    "bgra8": _BGRA,
    "8UC4": _BGRA,
    "mono8": _MONO8,
    "8UC1": _MONO8,
    "mono16": _MONO16,
    "16UC1": _MONO16,
    "32FC1": _FLOAT,
}

SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_LAYOUTS)
"""``sensor_msgs/Image.encoding`` values :func:`image_to_rgb` converts."""

SUPPORTED_COMPRESSED_FORMATS: tuple[str, ...] = ("jpeg", "png")
"""Codecs :func:`compressed_to_rgb` decodes (``format`` must name one, or be empty)."""


def image_to_rgb(
    msg: Any,
    *,
    expected_hw: tuple[int, int] | None = None,
    held_hw: tuple[int, int] | None = None,
    source: str = "image",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Convert a ``sensor_msgs/Image``-like message to an HxWx3 uint8 RGB array.

    ``expected_hw`` (from config) refuses frames of another size before touching the
    data; ``out`` implies it. ``held_hw`` (the size this camera has been sending, see
    :func:`check_frame_size`) does the same, with that rule's message. ``source`` (the topic)
    goes into error messages. Raises :class:`InputError` for anything that is not a
    well-formed supported image.
    """
    encoding = str(msg.encoding)
    layout = _layout(encoding, source)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    _check_geometry(height, width, step, layout, encoding, source)
    _check_expected((height, width), _expected_hw(expected_hw, out), source)
    check_frame_size((height, width), held_hw, None, source)
    buf = _byte_buffer(msg.data)
    _check_length(buf.size, step * height, step, height, source)
    rows = buf[: step * height].reshape(height, step)[:, : width * layout.bytes_per_pixel]
    if layout.dtype != "u1":
        rows = rows.view(np.dtype(layout.dtype).newbyteorder(">" if msg.is_bigendian else "<"))
    pixels = rows.reshape(height, width, layout.channels)
    if layout.dtype == "f4" and np.isnan(pixels).all():
        raise InputError(
            NON_FINITE_IMAGE,
            source,
            f"{encoding} frame of {height}x{width} is NaN everywhere (no reading at any pixel); "
            "expected values in [0, 1], NaN only where there is no reading",
        )
    return _finish(layout.to_rgb(pixels), out)


def compressed_to_rgb(
    msg: Any,
    *,
    expected_hw: tuple[int, int] | None = None,
    held_hw: tuple[int, int] | None = None,
    source: str = "compressed_image",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Decode a ``sensor_msgs/CompressedImage``-like message (JPEG or PNG) to RGB uint8.

    ``format`` follows image_transport (``"jpeg"``, ``"png"``, ``"rgb8; jpeg compressed
    bgr8"``); it only has to name JPEG or PNG (or be empty): the codec is detected from
    the data, and the payload is a standard file, so the ``bgr8`` in the label does not
    swap colours. Grey and palette images become RGB, alpha is dropped, 16-bit PNGs keep
    the high byte (as ``mono16``). ``compressedDepth`` and other codecs -> ``bad_encoding``;
    data the decoder rejects -> ``decode_failed``; wrong size -> ``bad_size`` (checked
    from the header, before decoding: ``expected_hw`` and ``held_hw`` as for
    :func:`image_to_rgb`, and with no ``expected_hw``, at most :data:`MAX_DECODED_PIXELS`).

    JPEG is decoded strictly (libjpeg-turbo through simplejpeg): libjpeg *warns* about
    corrupt entropy-coded data and goes on, and Pillow then returns garbage pixels without
    an error; here any such warning refuses the frame. PNG goes to Pillow, after every chunk's
    CRC is checked (Pillow's decode checks none of the pixel data's), and its rows counted against its
    header (Pillow decodes a PNG holding only its first rows, the rest black).
    """
    _check_compressed_format(str(msg.format), source)
    expected = _expected_hw(expected_hw, out)
    data = _bytes_like(msg.data)
    _check_signature(data, str(msg.format), source)
    if not _is_jpeg(data):
        _check_png_whole(data, source)
    check_size = partial(_check_header_size, expected=expected, held_hw=held_hw, source=source)
    try:
        rgb = _decode_jpeg(data, check_size) if _is_jpeg(data) else _decode_png(data, check_size)
    except InputError:
        raise
    except Exception as exc:  # the decoders raise OSError, SyntaxError, ValueError, ... per codec
        raise InputError(
            DECODE_FAILED,
            source,
            f"could not decode {len(msg.data)} bytes labelled format={msg.format!r} "
            f"as JPEG or PNG: {type(exc).__name__}: {exc}",
        ) from exc
    return _finish(rgb, out)


def _check_signature(data: Any, label: str, source: str) -> None:
    """Empty data, or data that is neither: said as such (Pillow's "cannot identify image file
    <_io.BytesIO object at 0x...>" named neither what came nor what was expected)."""
    head = bytes(memoryview(data)[:8])
    if not head:
        empty = f"compressed image (format={label!r}) has no data; expected a JPEG or PNG"
        raise InputError(TRUNCATED_DATA, source, empty)
    if not _is_jpeg(data) and head != _PNG_SIGNATURE:
        raise InputError(
            DECODE_FAILED,
            source,
            f"data (format={label!r}) starts with {head.hex(' ')}, neither a JPEG (ff d8) nor a PNG signature "
            f"({_PNG_SIGNATURE.hex(' ')})",
        )


def _check_png_whole(data: Any, source: str) -> None:
    """Every chunk of a PNG is there up to its IEND, walked by the lengths the chunks give: data cut
    short is said as such, with where it ends (read by Pillow, it was "cannot identify image file
    <_io.BytesIO object at 0x...>", or a frame size taken from bytes that are not there)."""
    view, whole = memoryview(data), len(_PNG_SIGNATURE)
    for pos, kind, end in _png_chunks(view):
        if end > len(view):
            name = kind.decode("latin-1") if kind.isalpha() else kind.hex(" ")
            raise InputError(
                TRUNCATED_DATA,
                source,
                f"PNG of {len(view)} bytes ends inside its {name} chunk at byte {pos}, which needs {end} bytes; "
                "expected a whole PNG (cut short in transport or by its encoder?)",
            )
        if kind == b"IEND":
            return
        whole = end
    raise InputError(
        TRUNCATED_DATA,
        source,
        f"PNG of {len(view)} bytes ends after {whole} bytes of whole chunks, without its IEND chunk; "
        "expected a whole PNG (cut short in transport or by its encoder?)",
    )


def _is_jpeg(data: Any) -> bool:
    return bytes(memoryview(data)[:2]) == b"\xff\xd8"  # SOI marker


def _decode_jpeg(data: Any, check_size: Callable[[tuple[int, int]], None]) -> np.ndarray:
    """Size from the header (refused before decoding), then a strict decode: simplejpeg's
    ``strict=True`` raises on libjpeg's recoverable errors ("Corrupt JPEG data: ...")."""
    import simplejpeg  # local: only nodes with compressed inputs need it (a dependency of them)

    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    check_size((height, width))
    return simplejpeg.decode_jpeg(data, colorspace="RGB", strict=True)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _decode_png(data: Any, check_size: Callable[[tuple[int, int]], None]) -> np.ndarray:
    """Size from the IHDR chunk, read here before Pillow sees the data: Pillow's own guard (a
    DecompressionBombError only above ~179 Mpx) would otherwise answer first, as decode_failed."""
    from PIL import Image  # local: only nodes with compressed inputs need Pillow

    head = bytes(memoryview(data)[:24])  # the signature and every chunk's length were checked
    if head[12:16] == b"IHDR" and len(head) == 24:  # else Pillow says what is wrong
        check_size((int.from_bytes(head[20:24], "big"), int.from_bytes(head[16:20], "big")))
    with Image.open(io.BytesIO(data), formats=("PNG",)) as whole:
        check_size((whole.height, whole.width))
        # every chunk's CRC: decoding checks none of the pixel data's (IDAT), and stops inflating
        # once it has every row, so a flipped bit there decodes to other pixels without an error
        whole.verify()
    parts = _png_parts(bytes(data))
    _check_png_header(parts)
    _check_png_rows(parts)
    with Image.open(io.BytesIO(data), formats=("PNG",)) as img:  # verify() leaves its image unusable
        if img.mode == "P":  # Pillow decodes an index past the palette as black, without an error
            top = int(np.asarray(img).max(initial=0))
            if top >= parts.palette_bytes // 3:
                raise ValueError(f"PNG pixel index {top} is outside its {parts.palette_bytes // 3}-entry palette")
        return _pil_to_rgb(img)


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}  # colour type -> depths


class _PngParts(NamedTuple):
    width: int
    height: int
    depth: int
    colour: int
    methods: tuple[int, int, int]  # compression, filter, interlace
    palette_bytes: int  # of a PLTE before the image data (-1: none there)
    idat: bytes  # the IDAT chunks' data joined


def _check_png_header(parts: _PngParts) -> None:
    """What Pillow decodes without an error though the format forbids it: a palette image with no
    palette before its data (all black), methods it does not define, depths its colour type has
    not. (A palette longer than the depth indexes is allowed: libpng drops the rest.)"""
    compression, filtering, interlace = parts.methods
    if compression or filtering or interlace > 1:
        raise ValueError(
            f"PNG compression / filter / interlace methods {compression} / {filtering} / {interlace}; "
            "expected 0 / 0 / 0 or 1"
        )
    if parts.depth not in _PNG_DEPTHS.get(parts.colour, ()):
        raise ValueError(f"PNG colour type {parts.colour} with bit depth {parts.depth} is not a PNG format")
    if parts.palette_bytes > 0 and parts.palette_bytes % 3:
        raise ValueError(f"PNG's PLTE chunk of {parts.palette_bytes} bytes is not a whole number of 3-byte RGB entries")
    if parts.colour == 3 and parts.palette_bytes <= 0:
        raise ValueError("palette PNG has no palette before its image data; expected a PLTE chunk before IDAT")


def _check_png_rows(parts: _PngParts) -> None:
    """Every row the header promises is in the image data, and its compressed stream ends: an
    encoder cut short can write a well-formed file (every CRC right, the stream closed) that holds
    only the first rows, which Pillow decodes with the rest black, without an error."""
    width, height, depth, colour, (_, _, interlace), _, idat = parts
    bits = depth * _PNG_CHANNELS.get(colour, 0)
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    expected = 0
    for x0, y0, dx, dy in passes:
        cols, rows = -(-max(width - x0, 0) // dx), -(-max(height - y0, 0) // dy)
        if cols and rows:
            expected += rows * (1 + -(-cols * bits // 8))  # a filter byte, then the row's bytes
    inflate, got, rest = zlib.decompressobj(), 0, idat
    while rest and got <= expected:  # in pieces: the rows are counted, not kept
        got += len(inflate.decompress(rest, 1 << 20))
        rest = inflate.unconsumed_tail
    if not inflate.eof or got != expected:
        hint = (
            "an encoder cut short?"
            if got < expected
            else "more row data than its header says"
            if got > expected
            else "its compressed stream is not closed"
        )
        raise ValueError(
            f"PNG image data holds {got} bytes of rows{'' if inflate.eof else ' and its stream does not end'}; "
            f"its {width}x{height} header needs {expected} ({hint})"
        )


def _png_chunks(view: memoryview) -> Iterator[tuple[int, bytes, int]]:
    """(start, type, end) of each chunk by the lengths the chunks give (length, type, data, CRC),
    up to IEND or the data's end; an end past the data's is the caller's to judge."""
    pos = len(_PNG_SIGNATURE)
    while pos + 8 <= len(view):
        kind, end = bytes(view[pos + 4 : pos + 8]), pos + 12 + int.from_bytes(view[pos : pos + 4], "big")
        yield pos, kind, end
        if kind == b"IEND":
            return
        pos = end


def _png_parts(data: bytes) -> _PngParts:
    """The header, the palette's size and the image data of a PNG whose chunks Pillow's verify()
    has read."""
    idat, header, palette = [], b"", -1
    for pos, kind, end in _png_chunks(memoryview(data)):
        body = data[pos + 8 : end - 4]
        if kind == b"IHDR":
            header = body
        elif kind == b"PLTE" and not idat:  # one after the image data is not its palette
            palette = len(body)
        elif kind == b"IDAT":
            idat.append(body)
    if len(header) < 13:
        raise ValueError("PNG has no IHDR chunk of 13 bytes")
    width, height = int.from_bytes(header[0:4], "big"), int.from_bytes(header[4:8], "big")
    methods = (header[10], header[11], header[12])
    return _PngParts(width, height, header[8], header[9], methods, palette, b"".join(idat))


# --- validation -------------------------------------------------------------------


def _layout(encoding: str, source: str) -> _Layout:
    layout = _LAYOUTS.get(encoding) or _LAYOUTS.get(encoding.lower())
    if layout is None:
        raise InputError(
            BAD_ENCODING,
            source,
            f"encoding {encoding!r} is not supported; expected one of {', '.join(SUPPORTED_ENCODINGS)}",
        )
    return layout


def _check_geometry(height: int, width: int, step: int, layout: _Layout, encoding: str, source: str) -> None:
    _check_not_empty((height, width), source)
    min_step = width * layout.bytes_per_pixel
    if step < min_step:
        raise InputError(
            BAD_SIZE,
            source,
            f"step {step} is smaller than width*bytes_per_pixel = {width}*{layout.bytes_per_pixel} "
            f"= {min_step} for {encoding}",
        )


def _check_not_empty(hw: tuple[int, int], source: str) -> None:
    if min(hw) <= 0:
        raise InputError(BAD_SIZE, source, f"image is {hw[0]}x{hw[1]} (HxW); expected both > 0")


def _expected_hw(expected_hw: tuple[int, int] | None, out: np.ndarray | None) -> tuple[int, int] | None:
    if out is None:
        return None if expected_hw is None else (int(expected_hw[0]), int(expected_hw[1]))
    if out.dtype != np.uint8 or out.ndim != 3 or out.shape[2] != 3:
        raise ValueError(f"out must be an HxWx3 uint8 array, got {out.dtype} {out.shape}")
    if expected_hw is not None and tuple(expected_hw) != out.shape[:2]:
        raise ValueError(f"expected_hw {tuple(expected_hw)} disagrees with out.shape {out.shape}")
    return (out.shape[0], out.shape[1])


def _check_header_size(
    got_hw: tuple[int, int], *, expected: tuple[int, int] | None, held_hw: tuple[int, int] | None, source: str
) -> None:
    """A compressed frame's size as its header says, judged before the decoder allocates it."""
    _check_not_empty(got_hw, source)  # Pillow's answer: "cannot identify image file"
    _check_expected(got_hw, expected, source)
    check_frame_size(got_hw, held_hw, None, source)
    h, w = got_hw
    if expected is None and h * w > MAX_DECODED_PIXELS:
        raise InputError(
            BAD_SIZE,
            source,
            f"image is {h}x{w} (HxW), {h * w / 1e6:.1f} Mpx; expected at most {MAX_DECODED_PIXELS / 1e6:.1f} Mpx "
            "(7680x4320, 8K), the largest frame the node takes (image_height x image_width cannot be set above it)",
        )


def _check_expected(got_hw: tuple[int, int], expected_hw: tuple[int, int] | None, source: str) -> None:
    if expected_hw is not None and got_hw != expected_hw:
        raise InputError(
            BAD_SIZE,
            source,
            f"image is {got_hw[0]}x{got_hw[1]} (HxW); expected {expected_hw[0]}x{expected_hw[1]} from config "
            "(image_height x image_width, one size for every camera: 0 / 0 for cameras of different sizes)",
        )


def check_frame_size(
    got_hw: tuple[int, int], held_hw: tuple[int, int] | None, problem: str | None, source: str
) -> None:
    """A converted frame a decision can use: no `problem` for the policy (`Policy.frame_problem`,
    e.g. too thin to resize into its input), and the size this topic has sent so far (when no
    size is configured, a camera that changes resolution mid-run is a fault, not a new normal)."""
    h, w = got_hw
    if problem is not None:
        raise InputError(BAD_SIZE, source, f"image is {h}x{w} (HxW): {problem}; expected a camera frame")
    if held_hw is not None and got_hw != held_hw:
        raise InputError(
            BAD_SIZE,
            source,
            f"image is {h}x{w} (HxW); this topic's frames were {held_hw[0]}x{held_hw[1]} until now; expected "
            "the same size (a new one is taken after a gap longer than max_age_s in the frames' stamps, as a "
            "camera driver's restart makes, or after a ~/reset; image_height / image_width fix one)",
        )


def _check_length(got: int, expected: int, step: int, height: int, source: str) -> None:
    if got < expected:
        raise InputError(
            TRUNCATED_DATA,
            source,
            f"data has {got} bytes; expected step*height = {step}*{height} = {expected}",
        )
    if got > expected:
        # sensor_msgs/Image says len(data) == step*height; extra bytes usually mean the
        # header lies (e.g. rgba8 data labelled rgb8), so do not silently crop.
        raise InputError(
            BAD_SIZE,
            source,
            f"data has {got} bytes, more than step*height = {step}*{height} = {expected}",
        )


def _check_compressed_format(fmt: str, source: str) -> None:
    lowered = fmt.lower()
    names_codec = any(codec in lowered for codec in ("jpeg", "jpg", "png"))
    if "compresseddepth" in lowered or (lowered.strip() and not names_codec):
        raise InputError(
            BAD_ENCODING,
            source,
            f"compressed format {fmt!r} is not supported; expected one naming "
            f"{' or '.join(SUPPORTED_COMPRESSED_FORMATS)} (not compressedDepth)",
        )


# --- buffers ----------------------------------------------------------------------


def _byte_buffer(data: Any) -> np.ndarray:
    """``msg.data`` as a flat uint8 array, sharing memory whenever the buffer allows.

    rclpy stores ``uint8[]`` as ``array('B')``; tests pass bytes or numpy. Anything
    without the buffer protocol (a list) is copied.
    """
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)  # no copy if contiguous
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError):  # no buffer protocol, or a non-contiguous memoryview
        return np.asarray(bytearray(data), dtype=np.uint8)


def _bytes_like(data: Any) -> Any:
    """Something ``io.BytesIO`` accepts without a copy where possible."""
    try:
        memoryview(data)
        return data
    except TypeError:
        return bytes(data)


def _pil_to_rgb(img: Any) -> np.ndarray:
    """Decoded Pillow image -> HxWx3 uint8 (high byte for 16-bit grey, as mono16)."""
    if img.mode.startswith("I"):  # "I;16", "I;16B", "I" (32-bit int holding 16-bit PNG)
        wide = np.asarray(img).astype(np.int64, copy=False)
        return _gray_to_rgb(np.clip(wide >> 8, 0, 255).astype(np.uint8))
    if img.mode != "RGB":
        img = img.convert("RGB")
    return np.array(img)  # writable (np.asarray's view of Pillow's bytes is not: torch warns on it)


def _finish(rgb: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Write into ``out``, or return a view if it has only positive strides, else copy.

    Negative (channel reversal) and zero (grey broadcast) strides are materialised
    because torch.from_numpy and most consumers reject them.
    """
    if out is None:
        if all(s > 0 for s in rgb.strides):
            return rgb
        out = np.empty(rgb.shape, dtype=np.uint8)
    copy_frame(out, rgb)
    return out

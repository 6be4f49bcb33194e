"""image_to_rgb / compressed_to_rgb: every encoding against a known image, and refusals."""

from __future__ import annotations

import array
import io
import struct
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from node_harness import corrupt_jpeg_scan
from PIL import Image

from flashrt_ros.ros import input_error as ie
from flashrt_ros.ros.image_convert import SUPPORTED_ENCODINGS, compressed_to_rgb, image_to_rgb
from flashrt_ros.ros.input_error import InputError

H, W = 5, 7
RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)
ALPHA = RNG.integers(0, 256, (H, W, 1), dtype=np.uint8)
GRAY8 = RNG.integers(0, 256, (H, W), dtype=np.uint8)
GRAY16 = RNG.integers(0, 65536, (H, W), dtype=np.uint16)
# 32FC1 values with their documented 8-bit result: [0,1] -> round(x*255), clip, NaN -> 0.
FLOAT_CASES = [
    (0.0, 0), (1.0, 255), (0.5, 128), (0.25, 64), (0.1, 26), (-0.5, 0), (2.0, 255),
    (np.nan, 0), (np.inf, 255), (-np.inf, 0),
]  # fmt: skip


def _float_image() -> tuple[np.ndarray, np.ndarray]:
    values = np.array([v for v, _ in FLOAT_CASES], dtype=np.float32)
    expected = np.array([e for _, e in FLOAT_CASES], dtype=np.uint8)
    idx = np.arange(H * W) % len(FLOAT_CASES)
    return values[idx].reshape(H, W), expected[idx].reshape(H, W)


def _gray3(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[..., None], 3, axis=2)


def encoded(encoding: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixels as the encoding stores them, HxWxC native dtype; RGB the converter must give)."""
    bgr = RGB[..., ::-1]
    floats, float_expected = _float_image()
    table = {
        "rgb8": (RGB, RGB),
        "bgr8": (bgr, RGB),
        "8UC3": (bgr, RGB),
        "rgba8": (np.concatenate([RGB, ALPHA], axis=2), RGB),
        "bgra8": (np.concatenate([bgr, ALPHA], axis=2), RGB),
        "8UC4": (np.concatenate([bgr, ALPHA], axis=2), RGB),
        "mono8": (GRAY8[..., None], _gray3(GRAY8)),
        "8UC1": (GRAY8[..., None], _gray3(GRAY8)),
        "mono16": (GRAY16[..., None], _gray3((GRAY16 >> 8).astype(np.uint8))),
        "16UC1": (GRAY16[..., None], _gray3((GRAY16 >> 8).astype(np.uint8))),
        "32FC1": (floats[..., None], _gray3(float_expected)),
    }
    return table[encoding]


def make_msg(encoding: str, pixels: np.ndarray, *, pad: int = 0, bigendian: bool = False, container=bytes):
    """Serialise pixels the way a driver would: rows of step bytes, junk in the padding."""
    h, w = pixels.shape[:2]
    dtype = pixels.dtype.newbyteorder(">" if bigendian else "<")
    row_bytes = np.ascontiguousarray(pixels, dtype=dtype).view(np.uint8).reshape(h, -1)
    step = row_bytes.shape[1] + pad
    rows = np.full((h, step), 0xAB, dtype=np.uint8)
    rows[:, : row_bytes.shape[1]] = row_bytes
    raw = rows.tobytes()
    data = {
        bytes: raw,
        bytearray: bytearray(raw),
        array.array: array.array("B", raw),
        memoryview: memoryview(bytearray(raw)),
        np.ndarray: np.frombuffer(raw, dtype=np.uint8).copy(),
        list: list(raw),
    }[container]
    return SimpleNamespace(
        header=SimpleNamespace(stamp=SimpleNamespace(sec=1, nanosec=0), frame_id="cam"),
        height=h, width=w, encoding=encoding, is_bigendian=int(bigendian), step=step, data=data,
    )  # fmt: skip


# --- every encoding -----------------------------------------------------------------


@pytest.mark.parametrize("encoding", SUPPORTED_ENCODINGS)
@pytest.mark.parametrize("pad", [0, 5])
def test_every_encoding_gives_the_known_rgb(encoding: str, pad: int) -> None:
    pixels, expected = encoded(encoding)
    rgb = image_to_rgb(make_msg(encoding, pixels, pad=pad))
    assert rgb.shape == (H, W, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(rgb, expected)


@pytest.mark.parametrize("encoding", ["mono16", "16UC1", "32FC1"])
@pytest.mark.parametrize("pad", [0, 3])
def test_big_endian_multibyte(encoding: str, pad: int) -> None:
    pixels, expected = encoded(encoding)
    msg = make_msg(encoding, pixels, pad=pad, bigendian=True)
    np.testing.assert_array_equal(image_to_rgb(msg), expected)


def test_a_float_frame_of_nan_alone_is_refused_one_with_readings_is_not() -> None:
    """NaN is a depth image's "no reading here" (0), but a frame of nothing else has nothing to
    see: refused, not turned into a black image the policy would act on. +/-inf are readings
    (REP 117: nothing in range, too close): a frame of them converts."""
    with pytest.raises(InputError, match=r"\[non_finite_image\] /depth: 32FC1 frame of 5x7 is NaN everywhere") as info:
        image_to_rgb(make_msg("32FC1", np.full((H, W, 1), np.nan, np.float32)), source="/depth")
    assert info.value.reason == "non_finite_image"
    for fill, grey in ((np.inf, 255), (-np.inf, 0)):
        assert (image_to_rgb(make_msg("32FC1", np.full((H, W, 1), fill, np.float32))) == grey).all()
    holes = np.full((H, W, 1), np.nan, np.float32)
    holes[1, 2] = 0.5
    rgb = image_to_rgb(make_msg("32FC1", holes))
    assert rgb[1, 2].tolist() == [128] * 3 and int(rgb.sum()) == 3 * 128


def test_big_endian_flag_matters_for_mono16() -> None:
    gray = np.full((H, W, 1), 0x1234, dtype=np.uint16)
    msg = make_msg("mono16", gray, bigendian=True)
    assert (image_to_rgb(msg) == 0x12).all()
    msg.is_bigendian = 0  # same bytes read little-endian: 0x3412
    assert (image_to_rgb(msg) == 0x34).all()


def test_is_bigendian_ignored_for_8bit() -> None:
    msg = make_msg("bgr8", RGB[..., ::-1], bigendian=True)
    np.testing.assert_array_equal(image_to_rgb(msg), RGB)


@pytest.mark.parametrize("container", [bytes, bytearray, array.array, memoryview, np.ndarray, list])
@pytest.mark.parametrize("encoding", ["rgb8", "bgra8", "mono16"])
def test_data_containers(container, encoding: str) -> None:
    pixels, expected = encoded(encoding)
    msg = make_msg(encoding, pixels, pad=2, container=container)
    np.testing.assert_array_equal(image_to_rgb(msg), expected)


def test_encoding_name_is_case_insensitive() -> None:
    np.testing.assert_array_equal(image_to_rgb(make_msg("BGR8", RGB[..., ::-1])), RGB)


# --- copies -------------------------------------------------------------------------


@pytest.mark.parametrize("pad", [0, 4])
def test_rgb8_is_zero_copy(pad: int) -> None:
    msg = make_msg("rgb8", RGB, pad=pad, container=array.array)
    rgb = image_to_rgb(msg)
    assert np.shares_memory(rgb, np.frombuffer(msg.data, dtype=np.uint8))


def test_rgba8_is_zero_copy() -> None:
    pixels, _ = encoded("rgba8")
    msg = make_msg("rgba8", pixels, container=bytearray)
    assert np.shares_memory(image_to_rgb(msg), np.frombuffer(msg.data, dtype=np.uint8))


@pytest.mark.parametrize("encoding", ["bgr8", "bgra8", "mono8", "mono16", "32FC1"])
def test_reordered_results_are_contiguous_copies(encoding: str) -> None:
    pixels, _ = encoded(encoding)
    msg = make_msg(encoding, pixels, pad=3, container=bytearray)
    rgb = image_to_rgb(msg)
    assert rgb.flags.c_contiguous and rgb.flags.writeable
    assert not np.shares_memory(rgb, np.frombuffer(msg.data, dtype=np.uint8))


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "mono8", "32FC1"])
def test_out_buffer_is_filled_in_place(encoding: str) -> None:
    pixels, expected = encoded(encoding)
    out = np.zeros((H, W, 3), dtype=np.uint8)
    result = image_to_rgb(make_msg(encoding, pixels, pad=1), out=out)
    assert result is out
    np.testing.assert_array_equal(out, expected)


def test_out_buffer_of_other_size_is_bad_size() -> None:
    with pytest.raises(InputError) as err:
        image_to_rgb(make_msg("rgb8", RGB), out=np.zeros((H + 1, W, 3), np.uint8))
    assert err.value.reason == ie.BAD_SIZE


def test_out_buffer_wrong_dtype_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="uint8") as err:
        image_to_rgb(make_msg("rgb8", RGB), out=np.zeros((H, W, 3), np.float32))
    assert not isinstance(err.value, InputError)


# --- refusals -----------------------------------------------------------------------


def _refusal(msg, **kwargs) -> InputError:
    with pytest.raises(InputError) as err:
        image_to_rgb(msg, source="/cam/wrist", **kwargs)
    assert err.value.source == "/cam/wrist" and "/cam/wrist" in str(err.value)
    return err.value


def test_unknown_encoding_lists_supported() -> None:
    msg = make_msg("rgb8", RGB)
    msg.encoding = "yuv422"
    err = _refusal(msg)
    assert err.reason == ie.BAD_ENCODING
    assert "yuv422" in str(err) and all(e in str(err) for e in SUPPORTED_ENCODINGS)


@pytest.mark.parametrize("field", ["height", "width"])
def test_zero_size(field: str) -> None:
    msg = make_msg("rgb8", RGB)
    setattr(msg, field, 0)
    err = _refusal(msg)
    assert err.reason == ie.BAD_SIZE and "0" in str(err)


def test_step_too_small() -> None:
    msg = make_msg("rgba8", encoded("rgba8")[0])
    msg.step = W * 4 - 1
    err = _refusal(msg)
    assert err.reason == ie.BAD_SIZE
    assert f"step {W * 4 - 1}" in str(err) and str(W * 4) in str(err)


def test_truncated_data_says_got_and_expected() -> None:
    msg = make_msg("bgr8", RGB[..., ::-1], pad=2)
    msg.data = msg.data[:-1]
    err = _refusal(msg)
    assert err.reason == ie.TRUNCATED_DATA
    expected = msg.step * H
    assert f"{expected - 1} bytes" in str(err) and f"= {expected}" in str(err)


def test_data_longer_than_header_says_is_refused() -> None:
    rgba, _ = encoded("rgba8")
    msg = make_msg("rgba8", rgba)
    msg.encoding, msg.step = "rgb8", W * 3  # rgba8 payload mislabelled rgb8
    err = _refusal(msg)
    assert err.reason == ie.BAD_SIZE
    assert str(H * W * 4) in str(err) and str(H * W * 3) in str(err)


def test_expected_size_from_config() -> None:
    err = _refusal(make_msg("rgb8", RGB), expected_hw=(480, 640))
    assert err.reason == ie.BAD_SIZE
    assert f"{H}x{W}" in str(err) and "480x640" in str(err)
    assert image_to_rgb(make_msg("rgb8", RGB), expected_hw=(H, W)).shape == (H, W, 3)


# --- compressed ---------------------------------------------------------------------


def _compressed(image: Image.Image, codec: str, fmt: str | None = None, **save) -> SimpleNamespace:
    buf = io.BytesIO()
    image.save(buf, format=codec, **save)
    return SimpleNamespace(header=None, format=fmt if fmt is not None else codec.lower(), data=buf.getvalue())


def _smooth_rgb(h: int = 48, w: int = 64) -> np.ndarray:
    """A gradient: JPEG reproduces it closely, so a tolerance check is meaningful."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 255 // (h + w - 2)], axis=2).astype(np.uint8)


def test_png_round_trip_is_exact() -> None:
    msg = _compressed(Image.fromarray(RGB), "PNG")
    np.testing.assert_array_equal(compressed_to_rgb(msg), RGB)


@pytest.mark.parametrize("fmt", ["jpeg", "rgb8; jpeg compressed bgr8", "bgr8; jpeg compressed bgr8", ""])
def test_jpeg_round_trip_within_tolerance(fmt: str) -> None:
    rgb = _smooth_rgb()
    out = compressed_to_rgb(_compressed(Image.fromarray(rgb), "JPEG", fmt, quality=95))
    assert out.shape == rgb.shape and out.dtype == np.uint8
    err = np.abs(out.astype(int) - rgb.astype(int))
    assert err.mean() < 2.0 and err.max() <= 16


def test_jpeg_colours_are_not_swapped() -> None:
    red = np.zeros((16, 16, 3), np.uint8)
    red[..., 0] = 255
    out = compressed_to_rgb(_compressed(Image.fromarray(red), "JPEG", "rgb8; jpeg compressed bgr8"))
    assert out[..., 0].min() > 240 and out[..., 2].max() < 15


def test_png_gray_rgba_and_16bit() -> None:
    np.testing.assert_array_equal(compressed_to_rgb(_compressed(Image.fromarray(GRAY8), "PNG")), _gray3(GRAY8))
    rgba = np.concatenate([RGB, ALPHA], axis=2)
    np.testing.assert_array_equal(compressed_to_rgb(_compressed(Image.fromarray(rgba), "PNG")), RGB)
    out = compressed_to_rgb(_compressed(Image.fromarray(GRAY16), "PNG", "16UC1; png compressed mono16"))
    np.testing.assert_array_equal(out, _gray3((GRAY16 >> 8).astype(np.uint8)))


@pytest.mark.parametrize("container", [bytes, bytearray, array.array, list])
def test_compressed_data_containers(container) -> None:
    msg = _compressed(Image.fromarray(RGB), "PNG")
    msg.data = container("B", msg.data) if container is array.array else container(msg.data)
    np.testing.assert_array_equal(compressed_to_rgb(msg), RGB)


def test_compressed_into_out_buffer() -> None:
    out = np.zeros((H, W, 3), np.uint8)
    assert compressed_to_rgb(_compressed(Image.fromarray(GRAY8), "PNG"), out=out) is out
    np.testing.assert_array_equal(out, _gray3(GRAY8))


def _compressed_refusal(msg, **kwargs) -> InputError:
    with pytest.raises(InputError) as err:
        compressed_to_rgb(msg, source="/cam/front/compressed", **kwargs)
    assert err.value.source == "/cam/front/compressed"
    return err.value


@pytest.mark.parametrize(
    ("data", "reason", "text"),
    [
        (b"", ie.TRUNCATED_DATA, "has no data"),
        (b"not an image at all", ie.DECODE_FAILED, "starts with 6e 6f 74 20 61 6e 20 69, neither a JPEG"),
        (b"\xff\xd8\xff\xe0garbage", ie.DECODE_FAILED, "could not decode 11 bytes"),
    ],
)
def test_undecodable_data(data: bytes, reason: str, text: str) -> None:
    err = _compressed_refusal(SimpleNamespace(format="jpeg", data=data))
    assert err.reason == reason and text in str(err), str(err)


def test_truncated_jpeg_fails_to_decode() -> None:
    msg = _compressed(Image.fromarray(_smooth_rgb()), "JPEG")
    msg.data = msg.data[: len(msg.data) // 2]
    assert _compressed_refusal(msg).reason == ie.DECODE_FAILED


def test_corrupt_jpeg_data_is_refused_not_decoded_to_garbage() -> None:
    msg = _compressed(Image.fromarray(_smooth_rgb()), "JPEG", quality=90)
    msg.data = corrupt_jpeg_scan(msg.data)
    with Image.open(io.BytesIO(msg.data)) as lenient:  # why a strict decoder: Pillow says nothing
        assert np.asarray(lenient.convert("RGB")).shape == (48, 64, 3)
    err = _compressed_refusal(msg)
    assert err.reason == ie.DECODE_FAILED, err
    assert f"could not decode {len(msg.data)} bytes labelled format='jpeg' as JPEG or PNG: " in str(err)
    assert "Corrupt JPEG data" in str(err), str(err)


def _png_with_a_flipped_bit_pillow_decodes() -> bytes:
    """A PNG with one bit flipped in its pixel data (IDAT) that Pillow decodes without an error to
    other pixels: Pillow checks no IDAT CRC and stops inflating once it has every row, so the
    zlib stream's own checksum goes unread. The first such flip, searched from the chunk's start."""
    data = _compressed(Image.fromarray(_smooth_rgb()), "PNG").data
    start = data.index(b"IDAT") + 4
    length = int.from_bytes(data[start - 8 : start - 4], "big")
    for i in range(start + 2, start + length):  # past the zlib header
        for bit in range(8):
            flipped = bytearray(data)
            flipped[i] ^= 1 << bit
            try:
                with Image.open(io.BytesIO(bytes(flipped))) as lenient:
                    pixels = np.asarray(lenient.convert("RGB"))
            except Exception:
                continue
            with Image.open(io.BytesIO(data)) as good:
                if not np.array_equal(pixels, np.asarray(good.convert("RGB"))):
                    return bytes(flipped)
    raise AssertionError("no flipped bit that Pillow decodes to other pixels: Pillow now checks them")


def test_corrupt_png_data_is_refused_not_decoded_to_garbage() -> None:
    msg = SimpleNamespace(header=None, format="png", data=_png_with_a_flipped_bit_pillow_decodes())
    err = _compressed_refusal(msg)
    assert err.reason == ie.DECODE_FAILED, err
    assert "IDAT" in str(err), str(err)  # the chunk whose checksum failed


def _png_of_rows(rgb: np.ndarray, rows: int, interlace: bool = False, extra: bytes = b"", closed: bool = True) -> bytes:
    """An RGB PNG whose header says rgb's size, its image data the first `rows` rows only (a
    closed zlib stream, every CRC right): what an encoder cut short can write."""
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    h, w, _ = rgb.shape
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, int(interlace)])
    if interlace:  # Adam7: seven passes of sub-images, each row with its filter byte
        subs = [rgb[y0:rows:dy, x0::dx] for x0, y0, dx, dy in _ADAM7]
        raw = b"".join(b"\x00" + row.tobytes() for sub in subs if sub.shape[1] for row in sub)
    else:
        raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(rows))  # filter 0 (none) per row
    raw += extra
    z = zlib.compressobj()
    idat = z.compress(raw) + z.flush(zlib.Z_FINISH if closed else zlib.Z_SYNC_FLUSH)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def test_a_png_with_rows_missing_is_refused_not_decoded_half_black() -> None:
    """Pillow decodes a well-formed PNG that holds only its first rows, the rest black, without an
    error; the rows' bytes are counted against the header's size."""
    rgb = _smooth_rgb()
    for interlace in (False, True):  # the hand-made PNGs are PNGs (Adam7's passes counted too)
        whole = SimpleNamespace(header=None, format="png", data=_png_of_rows(rgb, 48, interlace))
        np.testing.assert_array_equal(compressed_to_rgb(whole), rgb)
    odd = _smooth_rgb(13, 21)  # passes of part-filled rows and columns
    odd_png = SimpleNamespace(header=None, format="png", data=_png_of_rows(odd, 13, interlace=True))
    np.testing.assert_array_equal(compressed_to_rgb(odd_png), odd)
    half = _png_of_rows(rgb, 24)
    with Image.open(io.BytesIO(half)) as lenient:  # why: Pillow says nothing
        assert (np.asarray(lenient.convert("RGB"))[24:] == 0).all()
    err = _compressed_refusal(SimpleNamespace(header=None, format="png", data=half))
    assert err.reason == ie.DECODE_FAILED, err
    assert "PNG image data holds 4632 bytes of rows; its 64x48 header needs 9264 (an encoder cut short?)" in str(err)
    more = _png_of_rows(rgb, 48, extra=bytes(7))
    err = _compressed_refusal(SimpleNamespace(header=None, format="png", data=more))
    assert "holds 9271 bytes of rows; its 64x48 header needs 9264 (more row data than its header says)" in str(err)
    open_stream = _png_of_rows(rgb, 48, closed=False)  # every row there, the zlib stream not ended
    err = _compressed_refusal(SimpleNamespace(header=None, format="png", data=open_stream))
    assert "and its stream does not end; its 64x48 header needs 9264 (its compressed stream is not closed)" in str(err)


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "RGBA", "I;16", "LA"])
def test_pngs_of_every_pixel_layout_pass_the_row_count(mode: str) -> None:
    """Bits per pixel from 1 (a row's last byte part-filled) to 32, palettes and grey + alpha
    included: each decodes to Pillow's own pixels (a wrong samples-per-pixel refused them all)."""
    image = Image.fromarray(_smooth_rgb(13, 21)).convert("L" if mode in ("1", "I;16") else mode)
    image = image.convert(mode) if mode in ("1", "I;16") else image
    msg = _compressed(image, "PNG")
    np.testing.assert_array_equal(compressed_to_rgb(msg), _pillow_rgb(msg.data))


def _pillow_rgb(png: bytes) -> np.ndarray:
    """What the node should make of a PNG: Pillow's RGB, except 16-bit grey, whose high byte it
    keeps (as mono16; Pillow's convert clips it)."""
    with Image.open(io.BytesIO(png)) as pillow:
        if pillow.mode.startswith("I"):
            high = (np.asarray(pillow).astype(np.uint32) >> 8).astype(np.uint8)
            return np.repeat(high[..., None], 3, axis=2)
        return np.asarray(pillow.convert("RGB"))


@pytest.mark.parametrize(("color_type", "channels"), [(2, 3), (6, 4), (4, 2), (0, 1)])
@pytest.mark.parametrize("interlace", [False, True])
def test_16_bit_pngs_pass_the_row_count(color_type: int, channels: int, interlace: bool) -> None:
    """16 bits a sample (RGB, RGBA, grey + alpha, grey), which Pillow does not write: made by hand,
    decoded to Pillow's own pixels."""
    import zlib

    h, w = 9, 11
    samples = np.random.default_rng(color_type).integers(0, 2**16, (h, w, channels), dtype=np.uint16)
    pixels = samples.astype(">u2")
    if interlace:
        subs = [pixels[y0::dy, x0::dx] for x0, y0, dx, dy in _ADAM7]
        raw = b"".join(b"\x00" + row.tobytes() for sub in subs if sub.shape[1] for row in sub)
    else:
        raw = b"".join(b"\x00" + row.tobytes() for row in pixels)
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([16, color_type, 0, 0, int(interlace)])
    msg = _png_of(ihdr, (b"IDAT", zlib.compress(raw)))
    np.testing.assert_array_equal(compressed_to_rgb(msg), _pillow_rgb(msg.data))
    if color_type == 0:  # the high byte of each sample, as written
        np.testing.assert_array_equal(compressed_to_rgb(msg)[..., 0], (samples[..., 0] >> 8).astype(np.uint8))


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
"""The PNG standard's seven passes (x0, y0, dx, dy), written out here apart from image_convert's."""


def test_interlaced_pngs_of_every_small_size_pass_the_row_count() -> None:
    """Adam7's passes are empty for images 1 to 4 pixels across or down: every size up to 17 x 9,
    against a pass table written out independently (64 x 48 and 13 x 21 passed with wrong ones)."""
    for h in range(1, 10):
        for w in range(1, 18):
            rgb = _smooth_rgb(h, w)
            msg = SimpleNamespace(header=None, format="png", data=_png_of_rows(rgb, h, interlace=True))
            np.testing.assert_array_equal(compressed_to_rgb(msg), rgb, err_msg=f"{h}x{w}")


def _png_of(ihdr: bytes, *chunks: tuple[bytes, bytes]) -> SimpleNamespace:
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + b"".join(chunk(k, b) for k, b in chunks) + chunk(b"IEND", b"")
    return SimpleNamespace(header=None, format="png", data=data)


def test_palette_pngs_pillow_decodes_black_are_refused() -> None:
    """Every CRC right and every row there, Pillow decodes these without an error: indices past
    the palette as black, no palette (or one after the image data) all black. A palette longer
    than the depth can index is allowed (libpng drops the rest)."""
    import zlib

    indices = np.arange(16, dtype=np.uint8).reshape(4, 4)
    idat = (b"IDAT", zlib.compress(b"".join(b"\x00" + row.tobytes() for row in indices)))
    ihdr = (4).to_bytes(4, "big") * 2 + bytes([8, 3, 0, 0, 0])
    palette = (b"PLTE", bytes(range(10, 58)))  # 16 entries
    past_by_one = (b"IDAT", zlib.compress(b"".join(b"\x00" + bytes([0, 1, 2, 1]) for _ in range(4))))  # index 2 of 2
    good = compressed_to_rgb(_png_of(ihdr, palette, idat))
    np.testing.assert_array_equal(good.reshape(-1, 3)[:2], [[10, 11, 12], [13, 14, 15]])
    for chunks, text in (
        (((b"PLTE", palette[1][:6]), idat), "PNG pixel index 15 is outside its 2-entry palette"),
        (((b"PLTE", palette[1][:6]), past_by_one), "PNG pixel index 2 is outside its 2-entry palette"),
        ((idat,), "palette PNG has no palette before its image data; expected a PLTE chunk before IDAT"),
        ((idat, palette), "palette PNG has no palette before its image data"),
    ):
        err = _compressed_refusal(_png_of(ihdr, *chunks))
        assert err.reason == ie.DECODE_FAILED and text in str(err), str(err)
    two_bit = (4).to_bytes(4, "big") * 2 + bytes([2, 3, 0, 0, 0])  # 4 pixels of 2 bits a row: one byte
    rows = (b"IDAT", zlib.compress(b"".join(b"\x00" + bytes([0b00011011]) for _ in range(4))))
    long_palette = (b"PLTE", bytes(range(256)) * 3)  # 256 entries for 2-bit indices
    out = compressed_to_rgb(_png_of(two_bit, long_palette, rows))
    np.testing.assert_array_equal(out[0], [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]])
    odd = (4).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 2])  # interlace method 2: none such
    err = _compressed_refusal(_png_of(odd, idat))
    assert "PNG compression / filter / interlace methods 0 / 0 / 2; expected 0 / 0 / 0 or 1" in str(err), str(err)


def test_empty_unknown_and_zero_sized_compressed_data_are_named() -> None:
    """Pillow's "cannot identify image file <_io.BytesIO object at 0x...>" for all three."""
    err = _compressed_refusal(SimpleNamespace(header=None, format="jpeg", data=b""))
    empty = "compressed image (format='jpeg') has no data; expected a JPEG or PNG"
    assert (err.reason, err.detail) == (ie.TRUNCATED_DATA, empty)
    err = _compressed_refusal(SimpleNamespace(header=None, format="jpeg", data=b"GIF89a\x01\x00"))
    assert err.reason == ie.DECODE_FAILED and "starts with 47 49 46 38 39 61 01 00, neither a JPEG (ff d8)" in str(err)
    zero = (0).to_bytes(4, "big") + (4).to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    err = _compressed_refusal(_png_of(zero, (b"IDAT", b"")))
    assert (err.reason, err.detail) == (ie.BAD_SIZE, "image is 4x0 (HxW); expected both > 0"), err


def test_a_png_cut_short_is_truncated_data_with_where_it_ends() -> None:
    """Cut inside its IHDR, the frame size was read from bytes that were not there (bad_size,
    "0x640"); cut after it, Pillow's "cannot identify image file <_io.BytesIO object at 0x...>"."""
    whole = _compressed(Image.fromarray(np.zeros((480, 640, 3), np.uint8)), "PNG").data
    for cut, text in (
        (8, "PNG of 8 bytes ends after 8 bytes of whole chunks, without its IEND chunk"),
        (23, "PNG of 23 bytes ends inside its IHDR chunk at byte 8, which needs 33 bytes"),
        (40, "PNG of 40 bytes ends after 33 bytes of whole chunks, without its IEND chunk"),
        (len(whole) - 1, f"PNG of {len(whole) - 1} bytes ends inside its IEND chunk at byte {len(whole) - 12}"),
    ):
        msg = SimpleNamespace(header=None, format="png", data=whole[:cut])
        err = _compressed_refusal(msg, held_hw=(480, 640))
        assert err.reason == ie.TRUNCATED_DATA and text in str(err), str(err)


def test_a_palette_of_part_entries_is_named_and_decoded_pngs_are_writable() -> None:
    """A PLTE of 7 bytes was "no palette before its image data"; a decoded PNG was Pillow's
    read-only bytes (torch warns when it makes a tensor of them)."""
    import zlib

    ihdr = (2).to_bytes(4, "big") * 2 + bytes([8, 3, 0, 0, 0])
    idat = (b"IDAT", zlib.compress(b"\x00\x00\x01" * 2))
    err = _compressed_refusal(_png_of(ihdr, (b"PLTE", bytes(7)), idat))
    assert "PNG's PLTE chunk of 7 bytes is not a whole number of 3-byte RGB entries" in str(err), str(err)
    assert compressed_to_rgb(_png_of(ihdr, (b"PLTE", bytes(6)), idat)).flags.writeable
    assert compressed_to_rgb(_compressed(Image.fromarray(RGB), "PNG")).flags.writeable


def test_other_codecs_are_not_decoded() -> None:
    tiff = _compressed(Image.fromarray(RGB), "TIFF")
    assert _compressed_refusal(tiff).reason == ie.BAD_ENCODING
    tiff.format = "jpeg"  # labelled as a supported codec but is a TIFF: decoder refuses it
    assert _compressed_refusal(tiff).reason == ie.DECODE_FAILED


def test_compressed_depth_is_not_supported() -> None:
    msg = SimpleNamespace(format="16UC1; compressedDepth png", data=b"\x00" * 12)
    err = _compressed_refusal(msg)
    assert err.reason == ie.BAD_ENCODING and "compressedDepth" in str(err)


def test_compressed_expected_size() -> None:
    err = _compressed_refusal(_compressed(Image.fromarray(RGB), "PNG"), expected_hw=(480, 640))
    assert err.reason == ie.BAD_SIZE and f"{H}x{W}" in str(err) and "480x640" in str(err)


def _jpeg_claiming(h: int, w: int) -> SimpleNamespace:
    """A small JPEG whose frame header (SOF0) is patched to say h x w: the scan data is far too
    short for that size, so decoding it would fail - but only after allocating h*w*3 bytes."""
    msg = _compressed(Image.fromarray(_smooth_rgb()), "JPEG")
    data = bytearray(msg.data)
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = h.to_bytes(2, "big") + w.to_bytes(2, "big")
    msg.data = bytes(data)
    return msg


def _png_claiming(h: int, w: int) -> SimpleNamespace:
    """A small PNG whose IHDR is patched (CRC kept valid) to say h x w: its pixel data is far too
    short for that size."""
    import zlib

    msg = _compressed(Image.fromarray(RGB), "PNG")
    data = bytearray(msg.data)
    data[16:24] = w.to_bytes(4, "big") + h.to_bytes(4, "big")  # IHDR: width, then height
    data[29:33] = zlib.crc32(data[12:29]).to_bytes(4, "big")
    msg.data = bytes(data)
    return msg


@pytest.mark.parametrize("claiming", [_jpeg_claiming, _png_claiming])
@pytest.mark.parametrize("hw", [(4321, 7681), (8000, 8000), (30000, 30000)])
def test_frame_above_the_pixel_bound_is_refused_from_its_header(claiming, hw) -> None:
    """No size configured: a header claiming more than 8K's pixels is refused before decoding (a
    631-byte JPEG claiming 30000x30000 cost 3 s and 2.6 GB to decode)."""
    err = _compressed_refusal(claiming(*hw))
    assert err.reason == ie.BAD_SIZE, err
    assert f"image is {hw[0]}x{hw[1]} (HxW)" in str(err)
    assert "expected at most 33.2 Mpx (7680x4320, 8K), the largest frame the node takes" in str(err)


@pytest.mark.parametrize("claiming", [_jpeg_claiming, _png_claiming])
def test_pixel_bound_lets_8k_and_configured_sizes_through(claiming) -> None:
    """8K itself is decoded (here: fails to, the data being short), and so is a configured size
    above the bound: the bound only stands in for a size nobody gave."""
    assert _compressed_refusal(claiming(4320, 7680)).reason == ie.DECODE_FAILED
    assert _compressed_refusal(claiming(4321, 7681), expected_hw=(4321, 7681)).reason == ie.DECODE_FAILED


@pytest.mark.parametrize("claiming", [_jpeg_claiming, _png_claiming])
def test_held_size_refuses_other_sizes_from_the_header(claiming) -> None:
    """The size a camera has been sending (the node's held size) is checked from the header, like
    a configured one: a frame of another size is bad_size before any decoding (here the data is
    undecodable, so a decode would have said decode_failed)."""
    err = _compressed_refusal(claiming(48, 64), held_hw=(24, 32))
    assert err.reason == ie.BAD_SIZE, err
    assert "image is 48x64 (HxW); this topic's frames were 24x32 until now; expected the same size" in str(err)
    assert _compressed_refusal(claiming(24, 32), held_hw=(24, 32)).reason == ie.DECODE_FAILED


def test_held_size_for_raw_frames() -> None:
    err = _refusal(make_msg("rgb8", RGB), held_hw=(H + 1, W))
    assert err.reason == ie.BAD_SIZE and f"this topic's frames were {H + 1}x{W} until now" in str(err)
    assert image_to_rgb(make_msg("rgb8", RGB), held_hw=(H, W)).shape == (H, W, 3)


# --- real messages (marked `ros`: CI requires ROS, so these never skip there) ------------


@pytest.mark.ros
@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "mono16", "32FC1"])
def test_real_sensor_msgs_image(encoding: str) -> None:
    from sensor_msgs import msg as msgs

    pixels, expected = encoded(encoding)
    fake = make_msg(encoding, pixels, pad=2, bigendian=encoding == "mono16")
    msg = msgs.Image(
        height=fake.height, width=fake.width, encoding=encoding,
        is_bigendian=fake.is_bigendian, step=fake.step, data=fake.data,
    )  # fmt: skip
    np.testing.assert_array_equal(image_to_rgb(msg), expected)


@pytest.mark.ros
def test_real_sensor_msgs_compressed_image() -> None:
    from sensor_msgs import msg as msgs

    fake = _compressed(Image.fromarray(RGB), "PNG")
    msg = msgs.CompressedImage(format="png", data=fake.data)
    np.testing.assert_array_equal(compressed_to_rgb(msg), RGB)


def _png(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, format="PNG")
    return b.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _raw(h: int, w: int) -> SimpleNamespace:
    return SimpleNamespace(encoding="rgb8", height=h, width=w, step=3 * w, is_bigendian=0, data=bytes(3 * w * h))


def test_held_size_refuses_a_frame_of_another_width() -> None:
    """`got_hw[0] != held_hw[0]` (height only) let a camera that changed its width mid-run through."""
    with pytest.raises(InputError) as err:
        image_to_rgb(_raw(4, 6), held_hw=(4, 5), source="/cam")
    assert err.value.reason == ie.BAD_SIZE and "frames were 4x5 until now" in str(err.value)
    jpeg_like = SimpleNamespace(format="png", data=_png(np.zeros((4, 6, 3), np.uint8)))
    with pytest.raises(InputError, match="frames were 4x5 until now"):
        compressed_to_rgb(jpeg_like, held_hw=(4, 5))


def test_a_png_whose_ihdr_is_not_first_is_still_size_checked() -> None:
    """Dropping the size check after Image.open: the early IHDR read is skipped when another
    chunk precedes IHDR, and a frame of the wrong size came back decoded."""
    data = _png(np.zeros((6, 10, 3), np.uint8))
    moved = data[:8] + _chunk(b"tEXt", b"k\x00v") + data[8:]
    with pytest.raises(InputError) as err:
        compressed_to_rgb(SimpleNamespace(format="png", data=moved), expected_hw=(4, 4))
    assert err.value.reason == ie.BAD_SIZE and "image is 6x10" in str(err.value)


def test_jpg_format_label_is_accepted() -> None:
    """Dropping "jpg" from the names refused format="jpg" (a common label) as bad_encoding."""
    b = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 128, np.uint8)).save(b, format="JPEG", quality=95)
    assert compressed_to_rgb(SimpleNamespace(format="jpg", data=b.getvalue())).shape == (8, 8, 3)


@pytest.mark.parametrize("shape", [(2, 2, 4), (2, 2)])
def test_out_of_the_wrong_layout_is_a_programming_error(shape) -> None:
    """Checking only out.dtype let an HxWx4 or HxW out through to the copy."""
    with pytest.raises(ValueError, match="out must be an HxWx3 uint8 array"):
        image_to_rgb(_raw(2, 2), out=np.zeros(shape, np.uint8))


def test_expected_hw_that_disagrees_with_out_is_a_programming_error() -> None:
    """Without the check, expected_hw was silently replaced by out's shape."""
    with pytest.raises(ValueError, match=r"expected_hw \(3, 3\) disagrees with out.shape"):
        image_to_rgb(_raw(2, 2), expected_hw=(3, 3), out=np.zeros((2, 2, 3), np.uint8))

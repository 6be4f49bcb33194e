"""flashrt_ros.kernels.preprocess (uint8 HWC -> resize-with-pad -> [-1, 1] CHW) vs openpi's torch path."""

import pytest
import torch
from kernel_fixtures import DEVICE

from flashrt_ros.kernels.preprocess import preprocess_image, preprocess_image_ref, resize_with_pad_geometry

TOL = {torch.float32: dict(atol=1e-5, rtol=0), torch.bfloat16: dict(atol=8e-3, rtol=0)}


def _frame(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "H,W,S",
    [
        (37, 53, 32),  # downscale, landscape: pad top/bottom (odd remainder)
        (20, 11, 32),  # upscale, portrait: pad left/right
        (7, 300, 48),  # extreme aspect ratio
        (32, 32, 32),  # identity geometry: exact copy
    ],
)
def test_preprocess_matches_reference(H: int, W: int, S: int, dtype: torch.dtype) -> None:
    img = _frame(H, W, 3, seed=H * W)
    y = preprocess_image(img, S, dtype=dtype)
    assert y.shape == (3, S, S) and y.dtype == dtype
    torch.testing.assert_close(y.float(), preprocess_image_ref(img, S).float(), **TOL[dtype])


def test_preprocess_camera_frame_to_224() -> None:
    """A real target size from a 4:3 frame (interpreter: ~2 s)."""
    img = _frame(120, 160, 3, seed=1)
    y = preprocess_image(img, dtype=torch.float32)
    ref = preprocess_image_ref(img)
    torch.testing.assert_close(y, ref, **TOL[torch.float32])
    rh, rw, top, left = resize_with_pad_geometry(120, 160)
    assert (rh, rw, top, left) == (168, 224, 28, 0)
    assert bool((y[:, :top] == -1).all()) and bool((y[:, top + rh :] == -1).all())


def test_preprocess_strided_bgra_batch_into_pixel_buffer() -> None:
    """ROS-like input: rows padded (step > W*C), 4 channels, BGR order; output into pixels[cam]."""
    B, H, W, S = 2, 13, 17, 24
    raw = _frame(B, H, W * 4 + 5, seed=2)  # 5 bytes of row padding
    img = raw[:, :, : W * 4].view(B, H, W, 4)  # [B, H, W, BGRA], row stride W*4+5
    assert img.stride(1) == W * 4 + 5
    pixels = torch.zeros(3, B, 3, S, S, dtype=torch.bfloat16, device=DEVICE)  # [cams, B, 3, S, S]
    y = preprocess_image(img, S, out=pixels[1], bgr=True)
    assert y.data_ptr() == pixels[1].data_ptr()
    ref = preprocess_image_ref(img, S, bgr=True)
    torch.testing.assert_close(pixels[1].float(), ref, **TOL[torch.bfloat16])
    assert bool((pixels[0] == 0).all()) and bool((pixels[2] == 0).all())


def test_preprocess_rejects_non_uint8() -> None:
    with pytest.raises(ValueError):
        preprocess_image(torch.zeros(8, 8, 3, device=DEVICE), 8)


def test_preprocess_refuses_chw_frames_and_integer_outputs() -> None:
    """A CHW frame [3, 40, 60] was read as H=3, W=40 with 60 channels; a uint8 `out` truncated
    the [-1, 1] pixels to two values. Both refused, saying what was expected."""
    with pytest.raises(ValueError, match=r"with C 3 or 4 \(HWC\), got \(3, 40, 60\)"):
        preprocess_image(torch.zeros(3, 40, 60, dtype=torch.uint8, device=DEVICE), 8)
    frame = torch.zeros(40, 60, 3, dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match="out is torch.uint8; expected a floating-point buffer"):
        preprocess_image(frame, 8, out=torch.zeros(3, 8, 8, dtype=torch.uint8, device=DEVICE))
    assert preprocess_image(torch.zeros(40, 60, 4, dtype=torch.uint8, device=DEVICE), 8).shape == (3, 8, 8)  # rgba


@pytest.mark.gpu
@pytest.mark.parametrize("H,W", [(480, 640), (720, 1280), (224, 224), (1080, 1920)])
def test_preprocess_gpu_real_shapes(H: int, W: int) -> None:
    img = _frame(H, W, 3, seed=3)
    y32 = preprocess_image(img, dtype=torch.float32)
    ref = preprocess_image_ref(img)
    torch.testing.assert_close(y32, ref, **TOL[torch.float32])
    torch.testing.assert_close(preprocess_image(img).float(), ref, **TOL[torch.bfloat16])


def test_resize_geometry_refuses_empty_sizes() -> None:
    with pytest.raises(ValueError, match="image 0x0 into 224x224: every size must be at least 1"):
        resize_with_pad_geometry(0, 0)
    with pytest.raises(ValueError, match="image 480x640 into 0x224"):
        resize_with_pad_geometry(480, 640, 0, 224)

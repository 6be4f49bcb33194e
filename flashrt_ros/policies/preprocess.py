"""Camera image -> model pixels, as openpi / LeRobot prepare them (the reference path).

uint8 HxWx3 RGB (or float in [0, 1]) -> float [0, 1] -> resize-with-pad to SxS (bilinear,
no antialias, centred black padding) -> [-1, 1], CHW. An absent camera becomes an all -1
image with its mask False, so its tokens are never attended to.

The resize is LeRobot's and openpi's PyTorch port's (`resize_with_pad_torch`): bilinear without
antialiasing. openpi's JAX `resize_with_pad` antialiases when it shrinks (and rounds to uint8), and
so does PIL's BILINEAR, which openpi's example clients resize with before sending: a 480x640 frame
shrunk here differs from theirs by up to ~0.4 on the [-1, 1] scale at sharp edges. Frames already
at the model's size (224x224: resized where the training data were) pass through unchanged.

A policy's frames are uint8 only (`frame_error`): that is what the node converts every camera
encoding to and what the fused path's kernel reads, so both backends refuse the same frames.
Anything else is refused, never reinterpreted: a uint16 or 0..255 float frame read as [0, 1]
would clamp to white, and an out-of-range float at the model's size would reach the model.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def resized_hw(h: int, w: int, size: int) -> tuple[int, int]:
    """The size an h x w frame takes inside the size x size input, aspect kept (openpi's rounding)."""
    if h < 1 or w < 1:  # the ratio below would divide by zero
        raise ValueError(f"a {h}x{w} frame has no pixels; expected at least 1x1")
    ratio = max(w / size, h / size)
    return int(h / ratio), int(w / ratio)


def resize_with_pad(img: Tensor, size: int) -> Tensor:
    """img [B, C, H, W] float in [0, 1] -> [B, C, size, size], aspect kept, padding centred."""
    h, w = img.shape[-2:]
    if (h, w) == (size, size):
        return img
    rh, rw = resized_hw(h, w, size)
    out = F.interpolate(img, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, left = (size - rh) // 2, (size - rw) // 2
    return F.pad(out, (left, size - rw - left, top, size - rh - top), value=0.0)


def to_unit_float(image: np.ndarray | Tensor, what: str = "image") -> Tensor:
    """uint8 [H, W, 3] or float [H, W, 3] in [0, 1] -> float32 [1, 3, H, W].

    Any other dtype or a float outside [0, 1] (NaN included) is refused, naming `what`: read as
    [0, 1] it would clamp to white, or at the model's size skip the clamp and reach the model.
    A flipped view (`bgr[..., ::-1]`, negative strides, which torch refuses) is copied first."""
    t = torch.as_tensor(np.ascontiguousarray(image) if isinstance(image, np.ndarray) else image)
    if t.ndim != 3 or t.shape[-1] != 3:
        raise ValueError(f"{what}: expected an HxWx3 RGB image, got shape {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        return (t.float() / 255.0).permute(2, 0, 1)[None]
    if not t.is_floating_point():
        raise ValueError(f"{what}: expected uint8 (0..255) or float in [0, 1], got dtype {_dtype_name(t)}")
    t = t.float()
    if t.numel() and not (torch.isfinite(t).all() and t.min() >= 0 and t.max() <= 1):
        raise ValueError(f"{what}: expected float values in [0, 1], got {_value_range(t)} ({_dtype_name(image)})")
    return t.permute(2, 0, 1)[None]


def frame_error(image: object, size: int) -> str | None:
    """Why `image` is not a usable policy frame, or None: a numpy uint8 [H, W, 3] RGB array with
    pixels, that keeps at least one row and column resized into the size x size input."""
    if not isinstance(image, np.ndarray):
        return f"expected a numpy uint8 RGB frame [H, W, 3], got {type(image).__name__}"
    if image.ndim != 3 or image.shape[-1] != 3:
        return f"expected an RGB frame [H, W, 3], got shape {tuple(image.shape)}"
    if image.dtype != np.uint8:
        return f"expected uint8 pixels (0..255), got dtype {image.dtype} (values {_value_range(image)})"
    h, w = image.shape[:2]
    return thin_frame_error(h, w, size)


def thin_frame_error(h: int, w: int, size: int) -> str | None:
    """Why an h x w frame cannot fill the size x size input, or None: it must have pixels and keep
    at least one row and one column once resized (aspect kept)."""
    if h < 1 or w < 1:
        return f"a {h}x{w} frame has no pixels; expected at least one row and one column"
    if min(resized_hw(h, w, size)) >= 1:
        return None
    return f"resized into the model's {size}x{size} input it keeps no {'row' if h < w else 'column'}"


def _value_range(values: np.ndarray | Tensor) -> str:
    """`min..max` of the finite values, and how many are not finite: what a refusal quotes."""
    a = np.asarray(values.detach().cpu() if isinstance(values, Tensor) else values, dtype=np.float64)
    finite = a[np.isfinite(a)]
    bad = a.size - finite.size
    if not finite.size:
        return f"all {bad} NaN/inf" if bad else "none"
    return f"{finite.min():.6g}..{finite.max():.6g}" + (f" and {bad} NaN/inf of {a.size}" if bad else "")


def _dtype_name(image: np.ndarray | Tensor) -> str:
    return str(image.dtype).removeprefix("torch.")


def require_a_view(images: list) -> None:
    """At least one camera view present (None = absent): a decision needs an image."""
    if all(image is None for image in images):
        raise ValueError("all camera views are absent: at least one image is needed")


def images_to_pixels(images: list[np.ndarray | Tensor | None], size: int, device="cpu") -> tuple[Tensor, Tensor]:
    """Views (None = absent) -> pixels [1, V, 3, S, S] in [-1, 1] and masks bool [1, V]."""
    require_a_view(images)
    pixels, masks = [], []
    for image in images:
        if image is None:
            pixels.append(torch.full((1, 3, size, size), -1.0, device=device))
            masks.append(False)
            continue
        unit = resize_with_pad(to_unit_float(image, f"camera view {len(masks)}").to(device), size)
        pixels.append(unit * 2.0 - 1.0)
        masks.append(True)
    return torch.cat(pixels)[None], torch.tensor([masks], device=device)

"""Camera image -> model pixels, as openpi / LeRobot prepare them (the reference path).

uint8 HxWx3 RGB (or float in [0, 1]) -> float [0, 1] -> resize-with-pad to SxS (bilinear,
no antialias, centred black padding) -> [-1, 1], CHW. An absent camera becomes an all -1
image with its mask False, so its tokens are never attended to.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def resized_hw(h: int, w: int, size: int) -> tuple[int, int]:
    """The size an h x w frame takes inside the size x size input, aspect kept (openpi's rounding)."""
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


def to_unit_float(image: np.ndarray | Tensor) -> Tensor:
    """uint8 [H, W, 3] or float [H, W, 3] in [0, 1] -> float32 [1, 3, H, W]."""
    t = torch.as_tensor(image)
    if t.ndim != 3 or t.shape[-1] != 3:
        raise ValueError(f"expected an HxWx3 RGB image, got shape {tuple(t.shape)}")
    t = t.float() / 255.0 if t.dtype == torch.uint8 else t.float()
    return t.permute(2, 0, 1)[None]


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
        unit = resize_with_pad(to_unit_float(image).to(device), size)
        pixels.append(unit * 2.0 - 1.0)
        masks.append(True)
    return torch.cat(pixels)[None], torch.tensor([masks], device=device)

"""Camera image pre-processing in one kernel: uint8 HWC -> resize-with-pad -> [-1, 1] CHW.

pi0 / pi0.5 (openpi ``resize_with_pad_torch``, LeRobot path) take each camera frame as float32 in
[0, 1] and do, for a 224 x 224 target:

    ratio = max(W / 224, H / 224);  rh, rw = int(H / ratio), int(W / ratio)
    bilinear resize to (rh, rw), align_corners=False, no antialias   (F.interpolate semantics)
    clamp to [0, 1];  pad centred with 0 (top = (224 - rh) // 2, left = (224 - rw) // 2)
    x * 2 - 1                                                         (padding becomes -1)

Eager torch needs ~8 launches and 4 full-size temporaries per camera; here each output pixel
gathers its 4 source pixels straight from the uint8 frame (any row stride, e.g. a ROS ``step``
with padding, RGB or BGR, 3 or 4 channels) and writes the normalised value into its slot of the
model's pixel buffer. The sampling follows ATen's ``upsample_bilinear2d``: ``scale = in / out``
(fp32), ``src = max(scale * (dst + 0.5) - 0.5, 0)``, neighbour ``min(i0 + 1, in - 1)``.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ._common import check_out, is_interpreting, needs_rtne_fix, round_bf16_rtne

__all__ = ["preprocess_image", "preprocess_image_ref", "resize_with_pad_geometry"]


def resize_with_pad_geometry(height: int, width: int, out_h: int = 224, out_w: int = 224) -> tuple[int, ...]:
    """openpi's resize-with-pad geometry: ``(rh, rw, pad_top, pad_left)`` of the resized image."""
    if min(height, width, out_h, out_w) < 1:
        raise ValueError(f"image {height}x{width} into {out_h}x{out_w}: every size must be at least 1")
    ratio = max(width / out_w, height / out_h)
    rh, rw = int(height / ratio), int(width / ratio)
    if rh < 1 or rw < 1:
        raise ValueError(f"image {height}x{width} is too thin to resize into {out_h}x{out_w}")
    return rh, rw, (out_h - rh) // 2, (out_w - rw) // 2


# The frame's geometry and strides are not specialised on (Triton would otherwise compile one
# variant per camera size, encoding and row padding it meets, ~0.6 s each at a decision): one
# compile serves every camera, so the fused path compiles it before its first decision
# (`FusedPi0.capture`). The output's strides stay specialised: the model's pixel buffer fixes them.
FRAME_ARGS = ("H", "W", "rh", "rw", "pad_top", "pad_left")
FRAME_ARGS += ("stride_ib", "stride_ih", "stride_iw", "chan_base", "stride_ic")


@triton.jit(do_not_specialize=FRAME_ARGS)
def _preprocess_kernel(
    img_ptr,
    out_ptr,
    H,
    W,
    rh,
    rw,
    pad_top,
    pad_left,
    scale_h,
    scale_w,
    out_h,
    out_w,
    stride_ib,
    stride_ih,
    stride_iw,
    chan_base,
    stride_ic,
    stride_ob,
    stride_oc,
    stride_oh,
    stride_ow,
    FIX_O: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    # One program writes a [BLOCK_R rows, BLOCK_W cols] tile of all 3 channels of one image.
    oy = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    b = tl.program_id(1).to(tl.int64)
    ox = tl.arange(0, BLOCK_W)
    out_ok = (oy < out_h)[:, None] & (ox < out_w)[None, :]

    # Position inside the resized (un-padded) image; outside it the output is padding (-1).
    ry = oy - pad_top
    rx = ox - pad_left
    inside = ((ry >= 0) & (ry < rh))[:, None] & ((rx >= 0) & (rx < rw))[None, :] & out_ok

    # ATen area_pixel_compute_source_index (align_corners=False, linear): clamp below at 0.
    # ATen's compiled ``scale * (dst + 0.5) - 0.5`` is contracted to one fma (CPU and CUDA);
    # at source indices of several hundred the fp32 rounding shows, so do the same.
    sy = tl.maximum(tl.fma(scale_h, ry.to(tl.float32) + 0.5, -0.5), 0.0)  # [BLOCK_R]
    sx = tl.maximum(tl.fma(scale_w, rx.to(tl.float32) + 0.5, -0.5), 0.0)  # [BLOCK_W]
    y0 = sy.to(tl.int32)  # sy >= 0, so truncation is floor
    x0 = sx.to(tl.int32)
    ly = tl.minimum(tl.maximum(sy - y0.to(tl.float32), 0.0), 1.0)[:, None]
    lx = tl.minimum(tl.maximum(sx - x0.to(tl.float32), 0.0), 1.0)[None, :]
    # Neighbour index (ATen: +1 unless at the last row/col); clamp so masked lanes stay in bounds.
    y1 = tl.minimum(tl.where(y0 < H - 1, y0 + 1, y0), H - 1)
    x1 = tl.minimum(tl.where(x0 < W - 1, x0 + 1, x0), W - 1)
    y0 = tl.minimum(y0, H - 1)
    x0 = tl.minimum(x0, W - 1)

    base = img_ptr + b * stride_ib + chan_base
    row0 = (y0.to(tl.int64) * stride_ih)[:, None]
    row1 = (y1.to(tl.int64) * stride_ih)[:, None]
    col0 = (x0.to(tl.int64) * stride_iw)[None, :]
    col1 = (x1.to(tl.int64) * stride_iw)[None, :]
    out_tile = out_ptr + b * stride_ob + (oy.to(tl.int64) * stride_oh)[:, None] + (ox * stride_ow)[None, :]
    for c in tl.static_range(3):
        src = base + c * stride_ic
        p00 = tl.load(src + row0 + col0, mask=inside, other=0).to(tl.float32) / 255.0
        p01 = tl.load(src + row0 + col1, mask=inside, other=0).to(tl.float32) / 255.0
        p10 = tl.load(src + row1 + col0, mask=inside, other=0).to(tl.float32) / 255.0
        p11 = tl.load(src + row1 + col1, mask=inside, other=0).to(tl.float32) / 255.0
        v = (1.0 - ly) * ((1.0 - lx) * p00 + lx * p01) + ly * ((1.0 - lx) * p10 + lx * p11)
        v = tl.minimum(tl.maximum(v, 0.0), 1.0)
        v = tl.where(inside, v * 2.0 - 1.0, -1.0)
        if FIX_O:
            v = round_bf16_rtne(v)
        tl.store(out_tile + c * stride_oc, v.to(out_ptr.dtype.element_ty), mask=out_ok)


def preprocess_image(
    img: torch.Tensor,
    out_size: int | tuple[int, int] = 224,
    out: torch.Tensor | None = None,
    dtype: torch.dtype = torch.bfloat16,
    bgr: bool = False,
) -> torch.Tensor:
    """Resize-with-pad a uint8 frame (or a batch of same-size frames) into [-1, 1] CHW.

    Args:
        img: uint8 [H, W, C] or [B, H, W, C], C >= 3 (RGB; BGR with ``bgr=True``; a 4th channel
            is ignored). Any strides (row padding, crops) as long as the tensor describes them.
        out_size: target side (224) or (height, width).
        out: optional static [3, oh, ow] / [B, 3, oh, ow] buffer (any strides, e.g.
            ``pixels[cam]``); its dtype wins over ``dtype``.
        dtype: output dtype when ``out`` is None (bf16 for the model, fp32 for checks).
        bgr: the frame's channels are B, G, R (ROS ``bgr8``); output is always RGB.
    """
    if img.dtype != torch.uint8:
        raise ValueError(f"img must be uint8, got {img.dtype}")
    batched = img.dim() == 4
    if img.dim() not in (3, 4) or img.shape[-1] not in (3, 4):
        raise ValueError(f"img must be [H, W, C] or [B, H, W, C] with C 3 or 4 (HWC), got {tuple(img.shape)}")
    img4 = img if batched else img.unsqueeze(0)
    B, H, W = img4.shape[:3]
    oh, ow = (out_size, out_size) if isinstance(out_size, int) else out_size
    rh, rw, pad_top, pad_left = resize_with_pad_geometry(H, W, oh, ow)
    shape = (B, 3, oh, ow) if batched else (3, oh, ow)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=img.device)
    check_out(out, shape, img.device)
    out4 = out if batched else out.unsqueeze(0)
    # fp32 scale exactly as ATen computes it: (float)in / out.
    scale_h = float(np.float32(H) / np.float32(rh))
    scale_w = float(np.float32(W) / np.float32(rw))
    sic = img4.stride(3)
    chan_base, stride_c = (2 * sic, -sic) if bgr else (0, sic)
    block_w = triton.next_power_of_2(ow)
    # GPU: ~1K pixels per program. Interpreter: its cost is per program, so take big tiles.
    tile = 65536 if is_interpreting() else 1024
    block_r = max(1, min(triton.next_power_of_2(oh), tile // block_w))
    if B > 0:
        _preprocess_kernel[(triton.cdiv(oh, block_r), B)](
            img4,
            out4,
            H,
            W,
            rh,
            rw,
            pad_top,
            pad_left,
            scale_h,
            scale_w,
            oh,
            ow,
            img4.stride(0),
            img4.stride(1),
            img4.stride(2),
            chan_base,
            stride_c,
            out4.stride(0),
            out4.stride(1),
            out4.stride(2),
            out4.stride(3),
            FIX_O=needs_rtne_fix(out.dtype),
            BLOCK_R=block_r,
            BLOCK_W=block_w,
            num_warps=4,
        )
    return out


def preprocess_image_ref(
    img: torch.Tensor, out_size: int | tuple[int, int] = 224, dtype: torch.dtype = torch.float32, bgr: bool = False
) -> torch.Tensor:
    """openpi ``resize_with_pad_torch`` on the frame as float32 in [0, 1], then ``* 2 - 1``."""
    batched = img.dim() == 4
    x = (img if batched else img.unsqueeze(0))[..., :3]  # [B, H, W, 3] uint8
    if bgr:
        x = x.flip(-1)
    x = x.float().div(255.0).permute(0, 3, 1, 2)  # [B, 3, H, W] in [0, 1]
    oh, ow = (out_size, out_size) if isinstance(out_size, int) else out_size
    H, W = x.shape[-2:]
    ratio = max(W / ow, H / oh)
    rh, rw = int(H / ratio), int(W / ratio)
    x = torch.nn.functional.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False)  # [B,3,rh,rw]
    x = x.clamp(0.0, 1.0)
    pad_h0, rem_h = divmod(oh - rh, 2)
    pad_w0, rem_w = divmod(ow - rw, 2)
    x = torch.nn.functional.pad(x, (pad_w0, pad_w0 + rem_w, pad_h0, pad_h0 + rem_h), value=0.0)  # [B,3,oh,ow]
    x = x * 2.0 - 1.0
    return (x if batched else x[0]).to(dtype)

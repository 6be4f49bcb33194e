"""Programmatic dependent launch (`kernels/_common.py`): which launches ask for it, and that a
kernel built with it waits for the kernel before it ahead of its first global load or store."""

import pytest
import torch
from kernel_fixtures import DEVICE, run_offline

from flashrt_ros.kernels import _common

_BUILD = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashrt_ros.kernels.rms_norm import _rms_norm_kernel

ptrs = ("x_ptr", "r_ptr", "w_ptr", "y_ptr", "s_ptr")
for pdl in (True, False):
    sig = {name: "*bf16" for name in ptrs}
    sig.update(q_ptr="*fp32", D="i32", stride_x="i32", stride_r="i32", stride_y="i32", stride_s="i32", eps="fp32")
    cx = dict(HAS_RESIDUAL=True, HAS_WEIGHT=True, UNIT_OFFSET=True, FIX_Y=False, FIX_S=False, QUANT=False,
              BLOCK_D=2048, PDL=pdl)
    sig.update({name: "constexpr" for name in cx})
    c = triton.compile(ASTSource(_rms_norm_kernel, sig, constexprs=cx), target=GPUTarget("cuda", 90, 64),
                       options=dict(num_warps=8, launch_pdl=pdl))
    ptx = c.asm["ptx"]
    first_access = min(i for i in (ptx.find("ld.global"), ptx.find("st.global")) if i >= 0)
    print(json.dumps(dict(pdl=pdl, launch_pdl=c.metadata.launch_pdl, wait=ptx.find("griddepcontrol.wait"),
                          first_access=first_access)))
"""


def test_built_with_pdl_the_kernel_waits_before_touching_memory() -> None:
    """The row kernel (residual + RMSNorm, as the prefix runs it) built offline for sm_90: with
    PDL its PTX has ``griddepcontrol.wait`` ahead of every global load and store, and the launch
    flag is in its metadata; without PDL, neither."""
    built = {r["pdl"]: r for r in run_offline("-c", _BUILD)}
    assert built[True]["launch_pdl"] and 0 <= built[True]["wait"] < built[True]["first_access"]
    assert not built[False]["launch_pdl"] and built[False]["wait"] == -1


def test_pdl_only_on_a_compiled_sm90_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter and the CPU get a plain launch (no ``launch_pdl`` option at all), and so
    does every device with the module switch off (how bench/fused_ab.py times both ways)."""
    assert _common.pdl_options(torch.device("cpu")) == {"PDL": False}
    if DEVICE == "cuda":
        major = torch.cuda.get_device_capability()[0]
        want = {"PDL": True, "launch_pdl": True} if major >= 9 else {"PDL": False}
        assert _common.pdl_options(torch.device("cuda")) == want
    monkeypatch.setattr(_common, "PDL", False)
    assert _common.pdl_options(torch.device(DEVICE)) == {"PDL": False}

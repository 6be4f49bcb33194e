"""Builds one of this folder's .cu prototypes into a shared library with nvcc (sm_90a) and
loads it: the prototypes are bench code, compiled where they run."""

from __future__ import annotations

import ctypes
import subprocess
import tempfile
from pathlib import Path

NVCC = ["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC"]


def build(name: str, symbol: str, argtypes: list) -> ctypes.CDLL:
    """`<name>.cu` beside this file -> a CDLL whose `symbol` returns a C int error code."""
    src = Path(__file__).with_name(f"{name}.cu")
    so = Path(tempfile.mkdtemp()) / f"{name}.so"
    subprocess.run([*NVCC, "-cudart", "shared", "-o", str(so), str(src)], check=True)
    lib = ctypes.CDLL(str(so))
    fn = getattr(lib, symbol)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return lib

"""What the kernel tests share: the device they run on and dtype-specific tolerances.

Without a GPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET).
"""

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}

"""The kernel replacements the adopt layer offers an unmodified model, one per kind of module.

Each replacement says which modules it fits and builds a forward that runs our kernels on that
module's own parameters. Fitting is judged by class, attributes and a probe of the activation;
it is a guess that the module computes what the replacement computes. The parity gate
(`adopt.gate`) is what proves it on the user's inputs, and `accelerate` keeps a replacement only
where it passed.

The forwards are for inference. They fall back to the module's own forward where a kernel
cannot run: on a CPU without Triton's interpreter, for a dtype the kernels do not store, and
where autograd would need a gradient (the kernels have no backward).
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels._common import is_interpreting
from ..kernels.gate_up_geglu import gate_up_geglu, interleave_block, interleave_gate_up, supports_gate_up_geglu
from ..kernels.geglu import geglu
from ..kernels.gelu import bias_gelu, gelu_tanh_ref
from ..kernels.layer_norm import layer_norm
from ..kernels.rms_norm import rms_norm, rms_norm_ref

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


GATE_UP_BUFFER = "_flashrt_adopt_gate_up"
"""The non-persistent buffer `geglu_mlp` adds to a module for its concatenated weight."""


class AdoptedForward:
    """A replacement's forward for one module instance. An object rather than a closure, so that
    `copy.deepcopy` of an adopted model gives the copy forwards over the copy's own parameters,
    and `torch.save` can pickle it."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.before = module.__dict__.get("forward")  # another tool's forward on the instance, if any

    def __call__(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def own(self, x: Tensor) -> Tensor:
        """The module's own forward (or the one set on it before ours): where a kernel cannot run."""
        return self.before(x) if self.before is not None else type(self.module).forward(self.module, x)

    def extra_bytes(self) -> int:
        """Memory this forward holds beyond the module's own parameters."""
        return 0

    def release(self) -> None:
        """Remove what this forward added to the module (called once it is off for good)."""


class Replacement:
    """One kind of replacement: `fits` picks the modules, `build` makes each one's forward."""

    name = ""
    summary = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def fits(self, module: nn.Module) -> bool:
        raise NotImplementedError

    def build(self, module: nn.Module) -> AdoptedForward:
        raise NotImplementedError


def kernels_run_on(device: torch.device) -> bool:
    """Triton kernels run on a CUDA device, and on the CPU only under the interpreter."""
    return device.type == "cuda" or (device.type == "cpu" and is_interpreting())


def _kernel_input(x: Tensor, *params: Tensor | None) -> bool:
    """Whether a kernel may take this call: a device it runs on, a dtype it stores, no gradient
    asked of it (the kernels have no backward)."""
    if x.dtype not in KERNEL_DTYPES or not kernels_run_on(x.device):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(p is not None and p.requires_grad for p in params)):
        return False
    return True


def _takes_one_tensor(module: nn.Module) -> bool:
    """The module's forward takes exactly one required argument (the activations) and nothing
    else: a norm or MLP with extra inputs (a condition, a residual) computes something else."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD)


def is_tanh_gelu(act: object) -> bool:
    """Whether `act` computes GELU with the tanh approximation (HF's gelu_pytorch_tanh, gelu_new,
    nn.GELU("tanh")), checked on a probe rather than by name: names differ between versions."""
    if not callable(act):
        return False
    probe = torch.linspace(-8.0, 8.0, 161)
    try:
        with torch.no_grad():
            got = act(probe)
    except Exception:  # an activation that cannot take a CPU probe is not one we can vouch for
        return False
    return isinstance(got, Tensor) and got.shape == probe.shape and torch.allclose(got, gelu_tanh_ref(probe), atol=1e-5)


def _linear(module: object, bias: bool) -> bool:
    return isinstance(module, nn.Linear) and (module.bias is not None) == bias


def _contiguous_rows(x: Tensor) -> Tensor:
    """x with a contiguous last dim (HF SigLIP's hidden states keep the patch embedding's
    transposed layout: a copy here)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _fused_gate_up_runs_on(device: torch.device) -> bool:
    """`gate_up_geglu` runs there: sm_90+ with its shared memory (asked once per GPU), or the interpreter."""
    return _cuda_runs_gate_up(device.index or 0) if device.type == "cuda" else is_interpreting()


@functools.cache
def _cuda_runs_gate_up(index: int) -> bool:
    return supports_gate_up_geglu(torch.device("cuda", index))


def _tma_rows(rows: Tensor) -> bool:
    """Whether [T, K] rows suit a TMA descriptor: rows of a multiple of 16 bytes, 16-byte aligned."""
    return (rows.stride(0) * rows.element_size()) % 16 == 0 and rows.data_ptr() % 16 == 0


class RMSNormForward(AdoptedForward):
    def __init__(self, module: nn.Module, eps: float, unit_offset: bool):
        super().__init__(module)
        self.eps, self.unit_offset = eps, unit_offset

    def __call__(self, x: Tensor) -> Tensor:
        w = self.module.weight
        if not _kernel_input(x, w) or not w.is_contiguous() or w.device != x.device:
            return self.own(x)
        # Gemma's convention returns x's dtype, Llama's the product's (fp32 weights: fp32 out);
        # a fresh output keeps permuted leading dims out of the kernel's row view
        dtype = x.dtype if self.unit_offset else torch.promote_types(w.dtype, x.dtype)
        out = torch.empty(x.shape, dtype=dtype, device=x.device)
        return rms_norm(_contiguous_rows(x), w, self.eps, out=out, unit_offset=self.unit_offset)


class RMSNormReplacement(Replacement):
    """RMSNorm over the last dim (HF's GemmaRMSNorm, LlamaRMSNorm and their kin) -> `kernels.rms_norm`.

    Two conventions are in use: Gemma's family (and others: Qwen3-Next) scales by ``1 + w``, Llama's
    (Qwen2, Mistral, SmolLM) by ``w``. Names do not tell them apart reliably, so each module is
    probed: it fits if its own forward on random rows (with a mean, so that a LayerNorm does not
    pass for one) matches one of the two, and is then run with that one. The kernel computes in
    fp32 and rounds once, into the dtype the module returns (Llama's casts the normed row to the
    input's dtype before scaling: one bf16 rounding less here)."""

    name = "rms_norm"
    summary = "RMSNorm (1+w or w, probed) -> Triton rms_norm"

    def fits(self, module: nn.Module) -> bool:
        weight = getattr(module, "weight", None)
        return (
            type(module).__name__.endswith("RMSNorm")
            and isinstance(weight, Tensor)
            and weight.dim() == 1
            and self._eps(module) is not None
            and _takes_one_tensor(module)
            and self._unit_offset(module) is not None
        )

    @staticmethod
    def _eps(module: nn.Module) -> float | None:
        eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
        return float(eps) if isinstance(eps, (int, float)) else None

    def _unit_offset(self, module: nn.Module) -> bool | None:
        """True for ``1 + w``, False for ``w``, None if the module's output on a probe is neither."""
        w, eps = module.weight, self._eps(module)
        probe = torch.randn(4, w.shape[0], generator=torch.Generator().manual_seed(0)) + 1.0
        x = probe.to(device=w.device, dtype=w.dtype if w.dtype in KERNEL_DTYPES else torch.float32)
        try:
            with torch.no_grad():
                got = module.forward(x)
        except Exception:  # a forward that cannot take a plain row is not a plain RMSNorm
            return None
        if not isinstance(got, Tensor) or got.shape != x.shape:
            return None
        tol = 1e-5 if got.dtype == torch.float32 else 2e-2
        for unit_offset in (True, False):
            want = rms_norm_ref(x.float(), w.float(), eps, unit_offset=unit_offset)
            if torch.allclose(got.float(), want, rtol=tol, atol=tol):
                return unit_offset
        return None

    def build(self, module: nn.Module) -> AdoptedForward:
        unit_offset = self._unit_offset(module)
        if unit_offset is None:
            raise ValueError(f"{type(module).__name__} no longer computes an RMSNorm on the probe")
        return RMSNormForward(module, self._eps(module), unit_offset)


class LayerNormForward(AdoptedForward):
    def __call__(self, x: Tensor) -> Tensor:
        m = self.module
        w, b = m.weight, m.bias
        params = [p for p in (w, b) if p is not None]
        if not _kernel_input(x, w, b) or any(not p.is_contiguous() or p.device != x.device for p in params):
            return self.own(x)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        return layer_norm(_contiguous_rows(x), w, b, m.eps, out=out)


class LayerNormReplacement(Replacement):
    """`nn.LayerNorm` over the last dim (SigLIP's, and most vision encoders') -> `kernels.layer_norm`."""

    name = "layer_norm"
    summary = "nn.LayerNorm -> Triton layer_norm"

    def fits(self, module: nn.Module) -> bool:
        return type(module) is nn.LayerNorm and len(module.normalized_shape) == 1

    def build(self, module: nn.Module) -> AdoptedForward:
        return LayerNormForward(module)


class GegluForward(AdoptedForward):
    def __init__(self, module: nn.Module):
        super().__init__(module)
        gate, up = module.gate_proj, module.up_proj
        self.width = gate.out_features
        with torch.no_grad():
            w_gu = torch.cat([gate.weight, up.weight]).contiguous()  # [2F, K], gate first
        # the layout suits the fused kernel on the device adopted on (0: plain [gate; up] where it
        # cannot run there); whether it runs is decided per call, on the input's device and dtype
        self.block = interleave_block(self.width, w_gu.device)
        if self.block:
            w_gu = interleave_gate_up(w_gu, self.block)
        # a buffer, so that it follows the module's .to(); not persistent: not in its state_dict
        # (a copy of an adopted module made inside `unpatched()` holds one already: replaced)
        module.register_buffer(GATE_UP_BUFFER, w_gu, persistent=False)

    def __call__(self, x: Tensor) -> Tensor:
        m = self.module
        w_gu = m._buffers[GATE_UP_BUFFER]
        runs = _kernel_input(x, m.gate_proj.weight, m.up_proj.weight)
        if not runs or x.dtype != w_gu.dtype or x.device != w_gu.device:
            return self.own(x)
        rows = x.reshape(-1, x.shape[-1]).contiguous()  # [T, K]
        if self.block and x.dtype != torch.float16 and _fused_gate_up_runs_on(x.device) and _tma_rows(rows):
            act = gate_up_geglu(rows, w_gu, self.block)  # [T, F]
        else:
            act = geglu(F.linear(rows, w_gu), interleave=self.block)  # [T, F]
        return m.down_proj(act.reshape(*x.shape[:-1], self.width))

    def extra_bytes(self) -> int:
        w_gu = self.module._buffers.get(GATE_UP_BUFFER)
        return 0 if w_gu is None else w_gu.numel() * w_gu.element_size()

    def release(self) -> None:
        self.module._buffers.pop(GATE_UP_BUFFER, None)


class GegluMLPReplacement(Replacement):
    """Gemma's MLP, ``down(gelu_tanh(gate(x)) * up(x))`` without biases -> one gate|up GEMM whose
    epilogue applies the GeGLU (`kernels.gate_up_geglu`, sm_90+ and the interpreter), else one
    cuBLAS GEMM + `kernels.geglu`; then the module's own down projection.

    The gate and up weights are concatenated once, when the replacement is built, into a
    non-persistent buffer of the module (it follows ``.to()``; not in the state_dict): a copy
    that `accelerate` reports as extra memory and drops on revert. Weights changed after
    `accelerate` are not seen by it (adopt after loading)."""

    name = "geglu_mlp"
    summary = "Gemma MLP -> gate|up GEMM + GeGLU (Triton epilogue), copy of gate|up weights"

    def fits(self, module: nn.Module) -> bool:
        gate, up, down = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
        if not (_linear(gate, False) and _linear(up, False) and _linear(down, False)):
            return False
        shapes_agree = gate.weight.shape == up.weight.shape and down.in_features == gate.out_features
        act = getattr(module, "act_fn", None)
        return shapes_agree and _takes_one_tensor(module) and is_tanh_gelu(act)

    def build(self, module: nn.Module) -> AdoptedForward:
        return GegluForward(module)


class GeluForward(AdoptedForward):
    def __call__(self, x: Tensor) -> Tensor:
        fc1 = self.module.fc1
        w, b = fc1.weight, fc1.bias
        if not _kernel_input(x, w, b) or x.dtype != w.dtype or b.dtype != w.dtype or x.device != w.device:
            return self.own(x)
        rows = x.reshape(-1, x.shape[-1])  # [T, K]
        b = b.contiguous()
        if rows.is_cuda:
            h = torch._addmm_activation(b, rows, w.t(), use_gelu=True)
        else:  # the CPU's _addmm_activation uses the erf GELU, not SigLIP's
            h = bias_gelu(F.linear(rows, w), b)
        return self.module.fc2(h.reshape(*x.shape[:-1], fc1.out_features))


class GeluMLPReplacement(Replacement):
    """SigLIP's MLP, ``fc2(gelu_tanh(fc1(x)))`` with biases -> fc1 as one GEMM with the bias and
    GELU in its epilogue (cuBLASLt's GELU-bias epilogue on CUDA, the tanh form; `kernels.bias_gelu`
    after the GEMM on the interpreter), then the module's own fc2."""

    name = "gelu_mlp"
    summary = "SigLIP MLP -> fc1 with bias+GELU(tanh) epilogue"

    def fits(self, module: nn.Module) -> bool:
        fc1, fc2 = getattr(module, "fc1", None), getattr(module, "fc2", None)
        if not (_linear(fc1, True) and _linear(fc2, True) and fc2.in_features == fc1.out_features):
            return False
        return _takes_one_tensor(module) and is_tanh_gelu(getattr(module, "activation_fn", None))

    def build(self, module: nn.Module) -> AdoptedForward:
        return GeluForward(module)


REPLACEMENTS: tuple[Replacement, ...] = (
    RMSNormReplacement(),
    LayerNormReplacement(),
    GegluMLPReplacement(),
    GeluMLPReplacement(),
)
"""What `accelerate` tries, in this order (each on top of those kept before it)."""


def by_name(names: list[str] | tuple[str, ...]) -> tuple[Replacement, ...]:
    """The replacements called `names`, in that order; a name we do not have is an error that lists ours."""
    known = {r.name: r for r in REPLACEMENTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown replacement(s) {', '.join(map(repr, unknown))}; expected some of {', '.join(known)}")
    return tuple(known[n] for n in names)

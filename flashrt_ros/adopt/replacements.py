"""The kernel replacements the adopt layer offers an unmodified model, one per kind of module.

Each replacement says which modules look like its kind (`candidate`), why such a module does
not fit after all (`refusal`: the report says it), and builds a forward that runs our kernels on
that module's own parameters. Fitting is judged by class, attributes, the exact set of
parameters, and probes of the activation and of RMSNorm modules themselves; it is a guess that
the module computes what the replacement computes. The parity gate (`adopt.gate`) is what proves
it on the user's inputs, and `accelerate` keeps a replacement only where it passed and where its
kernels ran.

The forwards are for inference. They fall back to the module's own forward where a kernel
cannot run: on a CPU without Triton's interpreter, for a dtype the kernels do not store, where
autograd would need a derivative (the kernels have none: no gradient, no forward-mode tangent,
no torch.func transform), under autocast, for an input of another width than the module's, and
where the module's inner modules, which the kernels skip, would be looked at or act (a hook on
one, a global module hook, a dropout in training mode) or are no longer those vetted (a LoRA
adapter swapped in, a forward set on one).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import Tensor, nn

from ..kernels import _common
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
    and `torch.save` can pickle it.

    Subclasses implement `kernel`; the call runs the module's own forward where it declines, and
    counts the calls the kernels took: a replacement whose kernels never ran on the example has
    proven nothing, and the gate does not keep it."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.before = module.__dict__.get("forward")  # another tool's forward on the instance, if any
        # the forward's one argument, which a caller may also pass by name (`input`, `hidden_states`)
        self.arg_name = next(iter(inspect.signature(self.before or module.forward).parameters), None)
        self.inner = [m for m in module.modules() if m is not module]  # what the kernels skip or read
        # each module's children as vetted (references: a deepcopy or torch.load maps them to the copy's)
        self.tree = [(m, dict(m._modules)) for m in module.modules() if m._modules]
        self.enabled = True  # off (`off` / `drop`), a caller that kept this forward gets the module's own
        self.reset()

    def __call__(self, *args: object, **kwargs: object) -> object:
        if not self.enabled:  # another tool wrapped this forward and still calls it (accelerate's hooks)
            return self.own(*args, **kwargs)
        x = self._the_tensor(args, kwargs)
        out = None if x is None or self._inner_acts() else self.kernel(x)
        if out is None:
            if x is not None:
                self.declined.add((x.dtype, x.device))
            return self.own(*args, **kwargs)
        self.runs += 1
        return out

    def _the_tensor(self, args: tuple, kwargs: dict) -> Tensor | None:
        """The activations, passed as the one argument by position or by the forward's name for it;
        None for any other call (the module's own forward then says what is wrong with it)."""
        if len(args) == 1 and not kwargs:
            x = args[0]
        elif not args and len(kwargs) == 1 and self.arg_name in kwargs:
            x = kwargs[self.arg_name]
        else:
            return None
        return x if isinstance(x, Tensor) else None

    def _inner_acts(self) -> bool:
        """Whether an inner module's own call, which the kernels skip, would be seen or change the
        result: a hook on it (or a global one: an observer, a quantiser), a dropout in training.
        An MLP in training mode too: its forward may drop activations by a functional dropout
        (`F.dropout(h, p, training=self.training)`, as DETR's MLPs do), which no module shows."""
        if not self.inner:
            return False
        # an inner module replaced (a LoRA adapter on gate_proj) or given its own forward since:
        # the kernels read the weights it had, not what it computes now
        if any(m._modules != children for m, children in self.tree):  # by name and identity, in any order
            return True
        if any("forward" in m.__dict__ for m in self.inner):
            return True
        if self.module.training:
            return True
        hooks = nn.modules.module
        if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
            return True
        if any(m._forward_hooks or m._forward_pre_hooks for m in self.inner):
            return True
        # a dropout's own mode (Monte-Carlo dropout: the model in eval, its dropouts in train)
        return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0 for m in self.inner)

    def kernel(self, x: Tensor) -> Tensor | None:
        """The kernels' output for `x`; None where they cannot run on this call (device, dtype,
        layout, a gradient asked for)."""
        raise NotImplementedError

    def own(self, *args: object, **kwargs: object) -> object:
        """The module's own forward (or the one set on it before ours): where a kernel cannot run."""
        if self.before is not None:
            return self.before(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def reset(self) -> None:
        """Forget the calls counted so far: `runs` (the kernels ran) and `declined` (the
        (dtype, device) of inputs they could not take)."""
        self.runs = 0
        self.declined: set[tuple[torch.dtype, torch.device]] = set()

    def extra_bytes(self) -> int:
        """Memory this forward holds beyond the module's own parameters."""
        return 0

    def release(self) -> None:
        """Remove what this forward added to the module (called once it is off for good)."""

    def park(self) -> None:
        """Take what this forward added to the module off it while the module's own forward runs
        (`unpatched()`): a copy or `torch.save` made then must not carry it."""

    def unpark(self) -> None:
        """Put back what `park` took."""

    def refresh(self) -> None:
        """Make again whatever this forward derived from the module's weights (see GegluForward)."""


class Refused(ValueError):
    """A module that looks like a replacement's kind but does not fit it; the message says why."""


class Replacement:
    """One kind of replacement: `candidate` picks the modules that look like its kind, `refusal`
    says why such a module does not fit after all, `build` makes each fitting one's forward."""

    name = ""
    summary = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def candidate(self, module: nn.Module) -> bool:
        """Whether `module` looks like this kind (by class or attributes); cheap, no probe. A
        replacement that says only `fits` (as before `candidate` and `refusal` were split) has
        its candidates be the modules it fits."""
        if type(self).fits is not Replacement.fits:
            return self.fits(module)
        raise NotImplementedError(f"{type(self).__name__} implements neither candidate() nor fits()")

    def refusal(self, module: nn.Module) -> str | None:
        """Why a candidate does not fit (None: it fits), so that the report can say it."""
        return None

    def fits(self, module: nn.Module) -> bool:
        return self.candidate(module) and self.refusal(module) is None

    def build(self, module: nn.Module) -> AdoptedForward:
        raise NotImplementedError


def interpreter_runs() -> bool:
    """Triton's interpreter runs our kernels: TRITON_INTERPRET is set now and was set when the
    kernels were imported (`triton.jit` decides at decoration; set later, they want a GPU)."""
    return _common.INTERPRETING_AT_IMPORT and is_interpreting()


def kernels_run_on(device: torch.device) -> bool:
    """Triton kernels run on a CUDA device, and on the CPU only under the interpreter."""
    return device.type == "cuda" or (device.type == "cpu" and interpreter_runs())


def kernels_refusal(device: torch.device) -> str | None:
    """Why the kernels do not run on `device` (None: they do), with what would make them run."""
    if kernels_run_on(device):
        return None
    if device.type == "cpu" and is_interpreting():
        return (
            f"the kernels do not run on {device}: TRITON_INTERPRET=1 was set after flashrt_ros's kernels were "
            "imported (set it before they are imported)"
        )
    return (
        f"the kernels do not run on {device} (a CUDA GPU, or the CPU under TRITON_INTERPRET=1 set before "
        "flashrt_ros's kernels are imported)"
    )


def _kernel_input(x: Tensor, *params: Tensor | None) -> bool:
    """Whether a kernel may take this call: a device it runs on, a dtype it stores, no gradient
    asked of it (the kernels have no backward: nor forward-mode tangents, nor functorch's
    transforms, whose wrapped tensors they cannot read), no autocast (the module's own forward
    returns what autocast makes of it, e.g. fp32 from a LayerNorm), and rows to take (a 0-d input:
    the module's own forward says what is wrong, or computes what it computes)."""
    if x.dim() == 0 or x.dtype not in KERNEL_DTYPES or not kernels_run_on(x.device):
        return False
    tensors = [x, *(p for p in params if p is not None)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    if any(map(torch._C._functorch.is_functorch_wrapped_tensor, tensors)):
        return False
    dual_level_open = fwAD._current_level >= 0  # else no tensor carries a tangent (and unpack_dual costs)
    if dual_level_open and any(fwAD.unpack_dual(t).tangent is not None for t in tensors):
        return False
    return not torch.is_autocast_enabled(x.device.type)


def _takes_one_tensor(module: nn.Module) -> bool:
    """The module's forward takes exactly one required argument (the activations) and nothing
    else: a norm or MLP with extra inputs (a condition, a residual) computes something else."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD)


def _tensors_refusal(module: nn.Module, read: tuple[str, ...]) -> str | None:
    """Why `module` does not fit if its parameters (recursively) and persistent buffers are not
    exactly those the replacement reads: one it ignores (a bias still at zero when adopted, a
    loaded one later) would change the result unseen; one it reads must be there."""
    params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    buffers = {
        f"{prefix}.{n}" if prefix else n
        for prefix, m in module.named_modules(remove_duplicate=False)
        for n, b in m._buffers.items()
        if b is not None and n not in m._non_persistent_buffers_set
    }
    extra_params, extra_buffers = sorted(params - set(read)), sorted(buffers - set(read))
    if extra_params:
        return f"has parameters other than {', '.join(read)}: {', '.join(extra_params)}"
    if extra_buffers:
        return f"has buffers other than {', '.join(read)}: {', '.join(extra_buffers)}"
    missing = [n for n in read if n not in params | buffers]
    return f"lacks parameters {', '.join(missing)}" if missing else None


def _first_refusal(*checks: Callable[[], str | None]) -> str | None:
    """The first reason the checks give, in order (later checks may rely on earlier ones passing)."""
    for check in checks:
        why = check()
        if why is not None:
            return why
    return None


def is_tanh_gelu(act: object) -> bool:
    """Whether `act` computes GELU with the tanh approximation (HF's gelu_pytorch_tanh, gelu_new,
    nn.GELU("tanh")), checked on a probe rather than by name: names differ between versions."""
    if not callable(act):
        return False
    probe = torch.linspace(-8.0, 8.0, 161)
    forward = act.forward if isinstance(act, nn.Module) else act  # not its hooks: a foreign probe in their stats
    try:
        with torch.no_grad():
            got = forward(probe)
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
    return _cuda_runs_gate_up(device.index or 0) if device.type == "cuda" else interpreter_runs()


@functools.cache
def _cuda_runs_gate_up(index: int) -> bool:
    return supports_gate_up_geglu(torch.device("cuda", index))


def _tma_rows(rows: Tensor) -> bool:
    """Whether [T, K] rows suit a TMA descriptor: rows of a multiple of 16 bytes, 16-byte aligned."""
    return (rows.stride(0) * rows.element_size()) % 16 == 0 and rows.data_ptr() % 16 == 0


@dataclass(frozen=True)
class NormConvention:
    """What an RMSNorm module computes, as its probe showed.

    unit_offset: it scales by ``1 + w`` (Gemma's family), else by ``w`` (Llama's).
    dtype_rule: the dtype it returns for input and weight of different dtypes: "input" (x's:
        torch.nn.RMSNorm, Gemma's, Helium's), "promoted" (of x and w: Llama's), or "same" (its
        forward raised on mixed dtypes: ours runs only where they agree).
    """

    unit_offset: bool
    dtype_rule: str

    def out_dtype(self, x: torch.dtype, w: torch.dtype) -> torch.dtype | None:
        """The dtype the module returns for these; None where it takes no such mix."""
        if x == w or self.dtype_rule == "input":
            return x
        return torch.promote_types(x, w) if self.dtype_rule == "promoted" else None


MIXED_PROBE_DTYPE = {torch.float32: torch.bfloat16, torch.bfloat16: torch.float16, torch.float16: torch.bfloat16}
"""The input dtype of the mixed-dtype probe, by weight dtype: one whose promotion with the
weight's is neither (so that the output tells "input" from "promoted"); fp32 for other weights."""


class RMSNormForward(AdoptedForward):
    def __init__(self, module: nn.Module, convention: NormConvention):
        super().__init__(module)
        self.convention = convention

    def kernel(self, x: Tensor) -> Tensor | None:
        w = self.module.weight
        if not _kernel_input(x, w) or not w.is_contiguous() or w.device != x.device or x.shape[-1] != w.numel():
            return None
        dtype = self.convention.out_dtype(x.dtype, w.dtype)  # the dtype the module itself returns
        if dtype not in KERNEL_DTYPES:  # a mix its own forward rejects, or an fp64 product
            return None
        out = torch.empty(x.shape, dtype=dtype, device=x.device)  # keeps permuted leading dims out of the row view
        eps = _eps_of(self.module)  # as it is now
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            return None
        return rms_norm(_contiguous_rows(x), w, float(eps), out=out, unit_offset=self.convention.unit_offset)


def _eps_of(module: nn.Module) -> object:
    """An RMSNorm's eps as the module holds it (HF names it `eps` or `variance_epsilon`)."""
    return getattr(module, "eps", getattr(module, "variance_epsilon", None))


def _norm_eps(module: nn.Module) -> float:
    return float(_eps_of(module))


class RMSNormReplacement(Replacement):
    """RMSNorm over the last dim (HF's GemmaRMSNorm, LlamaRMSNorm, torch.nn.RMSNorm and their
    kin) -> `kernels.rms_norm`.

    Two scalings are in use: Gemma's family (and others: Qwen3-Next) scales by ``1 + w``, Llama's
    (Qwen2, Mistral, SmolLM) by ``w``; and two output dtypes where the weight's dtype is not the
    input's (LeRobot keeps norm weights in fp32 beside bf16 activations): the input's
    (torch.nn.RMSNorm, Gemma's, Helium's) or the promoted one (Llama's). Names tell neither apart
    reliably, so each module is probed (`convention`) and then run the way it computes. The
    kernel computes in fp32 and rounds once, into that dtype (Llama's casts the normed row to the
    input's dtype before scaling: one bf16 rounding less here)."""

    name = "rms_norm"
    summary = "RMSNorm (1+w or w, output dtype probed) -> Triton rms_norm"

    def candidate(self, module: nn.Module) -> bool:
        return type(module).__name__.endswith("RMSNorm")

    def refusal(self, module: nn.Module) -> str | None:
        return _first_refusal(
            lambda: self._weight_refusal(module),
            lambda: _tensors_refusal(module, ("weight",)),
            lambda: "forward takes more than one tensor" if not _takes_one_tensor(module) else None,
            lambda: self._probe_refusal(module),
        )

    @staticmethod
    def _weight_refusal(module: nn.Module) -> str | None:
        weight = getattr(module, "weight", None)
        if not (isinstance(weight, Tensor) and weight.dim() == 1 and weight.is_floating_point()):
            return "weight is not a 1-D floating-point tensor"
        if weight.is_meta:
            return "weight is on the meta device"
        eps = _eps_of(module)
        if eps is None:
            return "eps is None"
        return None if isinstance(eps, (int, float)) else f"eps is a {type(eps).__name__}, not a number"

    def _probe_refusal(self, module: nn.Module) -> str | None:
        try:
            self.convention(module)
        except Refused as why:
            return str(why)
        return None

    def convention(self, module: nn.Module) -> NormConvention:
        """How the module computes, from its own forward on random rows (with a mean, so that a
        LayerNorm does not pass for one): first in the weight's dtype (the scaling), then in
        another (the output dtype). Raises `Refused` for a module that computes neither."""
        w = module.weight
        rows = torch.randn(4, w.shape[0], generator=torch.Generator().manual_seed(0)) + 1.0
        x = rows.to(w.device, w.dtype)
        got = self._probed(module, x, "probe")
        unit_offset = self._scaling(got, x, w, _norm_eps(module))
        if unit_offset is None:
            raise Refused("probe output is neither (1+w) nor w scaling")
        if got.dtype != x.dtype:
            raise Refused(f"probe output is {got.dtype} for {x.dtype} rows and weight")
        return NormConvention(unit_offset, self._dtype_rule(module, rows, unit_offset))

    def _unit_offset(self, module: nn.Module) -> bool | None:
        """True for ``1 + w``, False for ``w``, None if the module does not fit (its convention's scaling)."""
        try:
            return self.convention(module).unit_offset
        except Refused:
            return None

    def _dtype_rule(self, module: nn.Module, rows: Tensor, unit_offset: bool) -> str:
        """The module's dtype rule: "input" or "promoted", the dtype it returns for rows of another
        dtype than its weight's; "same" if its forward raises on them."""
        w = module.weight
        x = rows.to(w.device, MIXED_PROBE_DTYPE.get(w.dtype, torch.float32))
        try:
            got = self._probed(module, x, "mixed-dtype probe")
        except Refused as why:
            if isinstance(why.__cause__, Exception):
                return "same"  # its forward takes no mix: ours runs only where the dtypes agree
            raise
        promoted = torch.promote_types(x.dtype, w.dtype)
        rule = {x.dtype: "input", promoted: "promoted"}.get(got.dtype)
        if rule is None:
            raise Refused(f"mixed-dtype probe output is {got.dtype}, neither the input's {x.dtype} nor {promoted}")
        if self._scaling(got, x, w, _norm_eps(module)) is not unit_offset:
            raise Refused("mixed-dtype probe output is not the RMSNorm of the same-dtype probe")
        return rule

    @staticmethod
    def _probed(module: nn.Module, x: Tensor, what: str) -> Tensor:
        """The module's forward on `x`, which must be a tensor of x's shape."""
        try:
            with torch.no_grad():
                got = module.forward(x)
        except Exception as exc:
            raise Refused(f"{what} raised {type(exc).__name__}") from exc
        if not isinstance(got, Tensor) or got.shape != x.shape:
            raise Refused(f"{what} output is not a tensor of the input's shape")
        return got

    @staticmethod
    def _scaling(got: Tensor, x: Tensor, w: Tensor, eps: float) -> bool | None:
        """True if `got` is x normed and scaled by ``1 + w``, False if by ``w``, None if neither."""
        exact = all(d in (torch.float32, torch.float64) for d in (got.dtype, x.dtype))  # else one 8- or 11-bit rounding
        tol = 1e-5 if exact else 2e-2
        fits = {}  # the closer of the two: large bf16 weights put w within tolerance of 1 + w
        for unit_offset in (True, False):
            with torch.no_grad():
                want = rms_norm_ref(x.float(), w.float(), eps, unit_offset=unit_offset)
            if torch.allclose(got.float(), want, rtol=tol, atol=tol):
                fits[unit_offset] = float(((got.float() - want).abs() / (want.abs() + tol)).max())
        return min(fits, key=fits.get) if fits else None

    def build(self, module: nn.Module) -> AdoptedForward:
        return RMSNormForward(module, self.convention(module))


HALF_DTYPES = (torch.bfloat16, torch.float16)
"""Rows torch's LayerNorm takes with fp32 weights (LeRobot keeps norm weights in fp32)."""


class LayerNormForward(AdoptedForward):
    def kernel(self, x: Tensor) -> Tensor | None:
        m = self.module
        w, b = m.weight, m.bias
        params = [p for p in (w, b) if p is not None]
        if not _kernel_input(x, w, b) or any(not p.is_contiguous() or p.device != x.device for p in params):
            return None
        if x.shape[-1] != m.normalized_shape[-1]:  # the module's own forward says what is wrong
            return None
        if any(p.dtype != x.dtype and not (p.dtype == torch.float32 and x.dtype in HALF_DTYPES) for p in params):
            return None  # a mix its own forward refuses (fp32 rows, bf16 weights): it says so
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        return layer_norm(_contiguous_rows(x), w, b, m.eps, out=out)


class LayerNormReplacement(Replacement):
    """`nn.LayerNorm` over the last dim (SigLIP's, and most vision encoders') -> `kernels.layer_norm`.
    Only the class itself: a subclass may compute something else with the same parameters."""

    name = "layer_norm"
    summary = "nn.LayerNorm -> Triton layer_norm"

    def candidate(self, module: nn.Module) -> bool:
        return isinstance(module, nn.LayerNorm)

    def refusal(self, module: nn.Module) -> str | None:
        if type(module) is not nn.LayerNorm:
            return f"a subclass of nn.LayerNorm ({type(module).__name__})"
        return None if len(module.normalized_shape) == 1 else "normalizes more than the last dim"

    def build(self, module: nn.Module) -> AdoptedForward:
        return LayerNormForward(module)


class GegluForward(AdoptedForward):
    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.width = module.gate_proj.out_features
        self._parked: Tensor | None = None
        self._concatenate()

    def _concatenate(self, register: bool = True) -> Tensor:
        """The gate|up copy, from the weights as they are now (on the module, or returned only)."""
        gate, up = self.module.gate_proj.weight, self.module.up_proj.weight
        with torch.no_grad():
            w_gu = torch.cat([gate, up]).contiguous()  # [2F, K], gate first
        # the layout suits the fused kernel on the device the weights are on (0: plain [gate; up]
        # where it cannot run there); whether it runs is decided per call, on the input
        self.block = interleave_block(self.width, w_gu.device)
        if self.block:
            w_gu = interleave_gate_up(w_gu, self.block)
        # a buffer, so that it follows the module's .to(); not persistent: not in its state_dict
        if register:
            self.module.register_buffer(GATE_UP_BUFFER, w_gu, persistent=False)
        self.source = self._source_now()
        return w_gu

    def _source_now(self) -> tuple:
        """What tells the weights the copy was made from: the tensors themselves (weakly held:
        functional_call's new weights can reuse the last ones' memory, and a fresh tensor's version
        is 0, so storage and version alone took a new pair for the old one), their storage and
        in-place version (an optimizer step, a load_state_dict, a .to() change them)."""
        gate, up = self.module.gate_proj.weight, self.module.up_proj.weight
        return _Same(gate), _Same(up), gate.data_ptr(), _version(gate), up.data_ptr(), _version(up)

    def __getstate__(self) -> dict:
        """Copied (deepcopy) or pickled (torch.save): without the weak references, which neither
        takes; the first call after makes the copy again."""
        return {**self.__dict__, "source": None}

    def kernel(self, x: Tensor) -> Tensor | None:
        m = self.module
        runs = _kernel_input(x, m.gate_proj.weight, m.up_proj.weight)
        if not runs or x.shape[-1] != m.gate_proj.in_features:
            return None
        w_gu = m._buffers.get(GATE_UP_BUFFER)
        # trained or loaded since, or the copy gone (another report on this module dropped its
        # own under the one name, `release`): made again
        if w_gu is None or self._source_now() != self.source:
            w_gu = self._concatenate()
        if x.dtype != w_gu.dtype or x.device != w_gu.device:
            return None
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
        self._drop_buffer()
        self._parked = None

    def park(self) -> None:
        self._parked = self._drop_buffer()

    def _drop_buffer(self) -> Tensor | None:
        """The copy off the module, its name out of the non-persistent set too (as before adopt)."""
        self.module._non_persistent_buffers_set.discard(GATE_UP_BUFFER)
        return self.module._buffers.pop(GATE_UP_BUFFER, None)

    def unpark(self) -> None:
        # a .to() in between left the parked copy behind: the next call sees the weights' new storage
        if self._parked is not None and GATE_UP_BUFFER not in self.module._buffers:
            self.module.register_buffer(GATE_UP_BUFFER, self._parked, persistent=False)
        self._parked = None

    def refresh(self) -> None:
        if self._parked is not None:  # inside `unpatched()`: the new copy stays off the module too
            self._parked = self._concatenate(register=False)
        else:
            self._concatenate()


class _Same:
    """Equal to another only while both hold the same live tensor (a weak reference: the copy
    must not keep a functional_call's weights alive)."""

    __slots__ = ("ref",)

    def __init__(self, t: Tensor):
        self.ref = weakref.ref(t)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and self.ref() is not None and self.ref() is other.ref()

    __hash__ = None  # compared, never hashed


def _version(t: Tensor) -> int:
    """The tensor's in-place version; -1 for one made under torch.inference_mode (it keeps none:
    only its storage then tells a change)."""
    return -1 if t.is_inference() else t._version


class GegluMLPReplacement(Replacement):
    """Gemma's MLP, ``down(gelu_tanh(gate(x)) * up(x))`` without biases -> one gate|up GEMM whose
    epilogue applies the GeGLU (`kernels.gate_up_geglu`, sm_90+ and the interpreter), else one
    cuBLAS GEMM + `kernels.geglu`; then the module's own down projection.

    The gate and up weights are concatenated when the replacement is built, into a
    non-persistent buffer of the module (it follows ``.to()``; not in the state_dict): a copy
    that `accelerate` reports as extra memory and drops on revert. Weights changed since (trained,
    loaded, moved) are concatenated again at the next call the kernels take (a Python call: a CUDA
    graph captured before keeps reading the copy it was captured with)."""

    name = "geglu_mlp"
    summary = "Gemma MLP -> gate|up GEMM + GeGLU (Triton epilogue), copy of gate|up weights"
    PARAMETERS = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")

    def candidate(self, module: nn.Module) -> bool:
        return all(getattr(module, n, None) is not None for n in ("gate_proj", "up_proj", "down_proj"))

    def refusal(self, module: nn.Module) -> str | None:
        return _first_refusal(
            lambda: self._linears_refusal(module),
            lambda: "act_fn is not tanh-GELU" if not is_tanh_gelu(getattr(module, "act_fn", None)) else None,
            lambda: _tensors_refusal(module, self.PARAMETERS),
            lambda: "forward takes more than one tensor" if not _takes_one_tensor(module) else None,
        )

    @staticmethod
    def _linears_refusal(module: nn.Module) -> str | None:
        gate, up, down = module.gate_proj, module.up_proj, module.down_proj
        if not all(isinstance(m, nn.Linear) for m in (gate, up, down)):
            return "gate_proj / up_proj / down_proj are not all nn.Linear"
        if not (_linear(gate, False) and _linear(up, False) and _linear(down, False)):
            return "linears have biases"
        if gate.weight.shape != up.weight.shape or down.in_features != gate.out_features:
            return "gate_proj / up_proj / down_proj shapes disagree"
        return None

    def build(self, module: nn.Module) -> AdoptedForward:
        return GegluForward(module)


class GeluForward(AdoptedForward):
    def kernel(self, x: Tensor) -> Tensor | None:
        fc1 = self.module.fc1
        w, b = fc1.weight, fc1.bias
        if not _kernel_input(x, w, b) or x.dtype != w.dtype or b.dtype != w.dtype or x.device != w.device:
            return None
        if x.shape[-1] != fc1.in_features:
            return None
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
    PARAMETERS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")

    def candidate(self, module: nn.Module) -> bool:
        return getattr(module, "fc1", None) is not None and getattr(module, "fc2", None) is not None

    def refusal(self, module: nn.Module) -> str | None:
        return _first_refusal(
            lambda: self._linears_refusal(module),
            lambda: None if is_tanh_gelu(getattr(module, "activation_fn", None)) else "activation_fn is not tanh-GELU",
            lambda: _tensors_refusal(module, self.PARAMETERS),
            lambda: "forward takes more than one tensor" if not _takes_one_tensor(module) else None,
        )

    @staticmethod
    def _linears_refusal(module: nn.Module) -> str | None:
        fc1, fc2 = module.fc1, module.fc2
        if not (isinstance(fc1, nn.Linear) and isinstance(fc2, nn.Linear)):
            return "fc1 / fc2 are not both nn.Linear"
        if not (_linear(fc1, True) and _linear(fc2, True)):
            return "linears lack biases"
        return None if fc2.in_features == fc1.out_features else "fc1 / fc2 shapes disagree"

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

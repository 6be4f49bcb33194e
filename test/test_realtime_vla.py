"""The realtime-vla baseline's weight conversion, on the CPU.

Its kernels need CUDA (and its code is not in this repository), so here the converted weights
go through a plain-torch transcription of what its kernels compute (`pi05_infer.py`,
`pi0_infer.py`: RMSNorm without weight then x @ W, interleaved RoPE from its cos / sin table,
adaRMS from `style = cond @ W + b`, the patch embedding over HWC images) and must give our
model's q / k / v, MLP inputs, adaRMS outputs and patch embeddings. A wrong fold, pairing or
transpose fails here; the GPU run of its real code reports its chunk's parity.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from policy_fixtures import tiny_model

from flashrt_ros.bench.realtime_vla import check_shapes, convert, load_backend, revision, rope_pairs, time_embeddings
from flashrt_ros.cli import main
from flashrt_ros.policies.config import PolicyConfig
from flashrt_ros.policies.gemma import rope_cos_sin
from flashrt_ros.policies.pi0 import Pi0Model

TOL = dict(atol=2e-5, rtol=1e-4)


def _their_rope_table(positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """[T, head_dim]: cos and sin of each pair side by side, as `Pi05Inference` builds it."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    phase = positions.float()[:, None] * inv
    return torch.stack([phase.cos(), phase.sin()], dim=-1).reshape(len(positions), head_dim)


def _their_qkv_rope(xn: torch.Tensor, w: torch.Tensor, table: torch.Tensor, heads: int, hd: int) -> torch.Tensor:
    """`matmul_rope_qkv`: xn @ W, then each (even, odd) column pair of q and k rotated."""
    y = xn @ w
    roped = (heads + 1) * hd
    cos, sin = table[:, 0::2].repeat(1, heads + 1), table[:, 1::2].repeat(1, heads + 1)
    x0, x1 = y[:, 0:roped:2], y[:, 1:roped:2]
    out = y.clone()
    out[:, 0:roped:2] = x0 * cos - x1 * sin
    out[:, 1:roped:2] = x1 * cos + x0 * sin
    return out


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _interleaved(t: torch.Tensor) -> torch.Tensor:
    """Ours [1, heads, T, hd] (rotate_half halves) -> [T, heads * hd] with the halves' columns paired."""
    t = t[0].transpose(0, 1)
    hd = t.shape[-1]
    return torch.stack([t[..., : hd // 2], t[..., hd // 2 :]], dim=-1).reshape(t.shape[0], -1)


@pytest.fixture(scope="module")
def model() -> Pi0Model:
    return tiny_model("pi05", seed=3)


@pytest.fixture(scope="module")
def weights(model: Pi0Model) -> dict[str, torch.Tensor]:
    embeds = model.prefix_lm.embed(torch.arange(model.cfg.prompt_len)[None] % 7)[0]
    return convert(model, embeds, torch.float32)


def test_rope_pairs_interleaves_each_heads_halves() -> None:
    w = torch.arange(2 * 8, dtype=torch.float32).reshape(1, 16)  # 2 heads of 8: halves (0..3, 4..7)
    assert rope_pairs(w, 8).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]]


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_prefix_qkv_and_mlp_inputs_match_ours(model, weights, layer_idx) -> None:
    """Its prefix layer: RMSNorm without a weight (ours folded into the kernels) -> q, k roped in
    pairs, v; and the MLP's gate / up inputs from the folded post-attention norm."""
    cfg, lm = model.cfg, model.prefix_lm
    layer, hd, heads = lm.layers[layer_idx], lm.spec.head_dim, lm.spec.num_heads
    t = 9
    x = torch.randn(1, t, lm.spec.width, generator=torch.Generator().manual_seed(layer_idx))
    pos = torch.arange(3, 3 + t)
    cos, sin = rope_cos_sin(pos[None], hd, cfg.rope_base, torch.float32)
    with torch.no_grad():
        q, k, v = layer.self_attn.qkv(layer.norm_in(x, None)[0], cos, sin)
        gate = layer.mlp.gate_proj(layer.post_attention_layernorm(x)[0])[0]
        up = layer.mlp.up_proj(layer.post_attention_layernorm(x)[0])[0]
    xn = _rms(x[0], cfg.rms_norm_eps)
    theirs = _their_qkv_rope(xn, weights["encoder_attn_qkv_w"][layer_idx], _their_rope_table(pos, hd, cfg.rope_base),
                             heads, hd)  # fmt: skip
    torch.testing.assert_close(theirs[:, : heads * hd], _interleaved(q), **TOL)
    torch.testing.assert_close(theirs[:, heads * hd : (heads + 1) * hd], _interleaved(k), **TOL)
    torch.testing.assert_close(theirs[:, (heads + 1) * hd :], v[0, 0], **TOL)
    torch.testing.assert_close(xn @ weights["encoder_ffn_gate_w"][layer_idx], gate, **TOL)
    torch.testing.assert_close(xn @ weights["encoder_ffn_up_w"][layer_idx], up, **TOL)


def test_expert_adarms_and_qkv_match_ours(model, weights) -> None:
    """Its decoder layer: style = cond @ W + b split (scale, shift, gate), x * rms * (1 + scale) +
    shift, then q / k / v as in the prefix (no fold)."""
    cfg, ex = model.cfg, model.expert
    layer, hd, heads = ex.layers[1], ex.spec.head_dim, ex.spec.num_heads
    t = 6
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, t, ex.spec.width, generator=g)
    cond = torch.randn(1, ex.spec.width, generator=g)
    pos = torch.arange(40, 40 + t)
    cos, sin = rope_cos_sin(pos[None], hd, cfg.rope_base, torch.float32)
    with torch.no_grad():
        xn_ours, gate_ours = layer.norm_in(x, cond)
        q, k, v = layer.self_attn.qkv(xn_ours, cos, sin)
    style = cond[0] @ weights["decoder_pre_attn_norm_mod_w"][1] + weights["decoder_pre_attn_norm_mod_b"][1]
    scale, shift, gate = style.chunk(3)
    xn = _rms(x[0], cfg.rms_norm_eps) * (1 + scale) + shift
    torch.testing.assert_close(xn, xn_ours[0], **TOL)
    torch.testing.assert_close(gate.expand(t, -1), gate_ours[0].expand(t, -1), **TOL)
    theirs = _their_qkv_rope(xn, weights["decoder_attn_qkv_w"][1], _their_rope_table(pos, hd, cfg.rope_base), heads, hd)
    torch.testing.assert_close(theirs[:, : heads * hd], _interleaved(q), **TOL)
    torch.testing.assert_close(theirs[:, heads * hd : (heads + 1) * hd], _interleaved(k), **TOL)
    torch.testing.assert_close(theirs[:, (heads + 1) * hd :], v[0, 0], **TOL)


def test_vision_patch_embedding_and_qkv_match_ours(model, weights) -> None:
    """Its patch embedding reads HWC images against a [p, p, 3, width] kernel; its vision QKV is
    one x @ W + b over q | k | v."""
    spec, vis = model.cfg.vision, model.vision
    s, p = spec.image_size, spec.patch_size
    grid = s // p
    pixels = torch.rand(1, 3, s, s, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.no_grad():
        ours = vis.embeddings(pixels)[0]
        attn = vis.encoder.layers[1].self_attn
        qkv = torch.cat([attn.q_proj(ours), attn.k_proj(ours), attn.v_proj(ours)], dim=-1)
    hwc = pixels[0].permute(1, 2, 0)
    patches = hwc.reshape(grid, p, grid, p, 3).permute(0, 2, 1, 3, 4).reshape(grid * grid, p, p, 3)
    theirs = torch.einsum("nhwi,hwic->nc", patches, weights["vision_patch_embedding_w"])
    theirs = theirs + weights["vision_patch_embedding_b"] + weights["vision_position_embedding"]
    torch.testing.assert_close(theirs, ours, **TOL)
    torch.testing.assert_close(ours @ weights["vision_attn_qkv_w"][1] + weights["vision_attn_qkv_b"][1], qkv, **TOL)


def _linears(model: Pi0Model) -> list[tuple[str, int | None, torch.nn.Linear]]:
    """Its plain [in, out] kernels (and `<name>_b` biases where it has them) and our Linear each
    one is: several are square, so a missing transpose would pass every shape check."""
    vis, lm, ex = model.vision.encoder.layers, model.prefix_lm.layers, model.expert.layers
    rows = [
        ("encoder_multi_modal_projector", None, model.vision_proj),
        ("vision_attn_o", 1, vis[1].self_attn.out_proj),
        ("vision_ffn_up", 0, vis[0].mlp.fc1),
        ("vision_ffn_down", 1, vis[1].mlp.fc2),
        ("encoder_attn_o", 1, lm[1].self_attn.o_proj),
        ("encoder_ffn_down", 0, lm[0].mlp.down_proj),
        ("decoder_attn_o", 0, ex[0].self_attn.o_proj),
        ("decoder_ffn_down", 1, ex[1].mlp.down_proj),
    ]
    if model.cfg.kind == "pi05":
        rows += [
            ("decoder_time_mlp_in", None, model.time_mlp_in),
            ("decoder_time_mlp_out", None, model.time_mlp_out),
            ("decoder_action_in_proj", None, model.action_in_proj),
            ("decoder_action_out_proj", None, model.action_out_proj),
            ("decoder_final_norm_mod", None, model.expert.norm.dense),
            ("decoder_pre_ffn_norm_mod", 1, ex[1].post_attention_layernorm.dense),
        ]
    else:
        rows += [("decoder_action_mlp", None, model.action_time_mlp_out)]
    return rows


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_every_plain_kernel_is_our_linear_transposed(kind, model, weights, pi0) -> None:
    m, w = (model, weights) if kind == "pi05" else pi0
    g = torch.Generator().manual_seed(13)
    for name, layer, linear in _linears(m):
        kernel = w[f"{name}_w"]
        bias = w.get(f"{name}_b")
        if layer is not None:
            kernel, bias = kernel[layer], None if bias is None else bias[layer]
        x = torch.randn(3, linear.in_features, generator=g)
        with torch.no_grad():
            ours = linear(x)
        theirs = x @ kernel + (0 if bias is None else bias)
        torch.testing.assert_close(theirs, ours, **TOL, msg=lambda e, n=name: f"{n}: {e}")
    vis = m.vision.encoder.layers
    torch.testing.assert_close(w["vision_pre_ffn_norm_b"][1], vis[1].layer_norm2.bias.detach())
    torch.testing.assert_close(w["vision_final_norm_w"], m.vision.post_layernorm.weight.detach())


def test_pi05_time_condition_and_action_output_match_ours(model, weights) -> None:
    """Its pi0.5 build: cond = silu(silu(emb @ W_in + b) @ W_out + b) per step; the output
    rms(h) * (1 + scale) + shift from the final modulation, @ action_out + b (its build then
    scales those two by -1 / steps: the Euler step)."""
    cfg = model.cfg
    emb = weights["decoder_time_embeds"]
    silu = torch.nn.functional.silu
    cond = silu(silu(emb @ weights["decoder_time_mlp_in_w"] + weights["decoder_time_mlp_in_b"])
                @ weights["decoder_time_mlp_out_w"] + weights["decoder_time_mlp_out_b"])  # fmt: skip
    t = 1.0 - torch.arange(cfg.num_steps, dtype=torch.float32) / cfg.num_steps
    with torch.no_grad():
        ours = model.time_condition(t)
    torch.testing.assert_close(cond, ours, **TOL)
    h = torch.randn(1, cfg.horizon, cfg.expert.width, generator=torch.Generator().manual_seed(17))
    with torch.no_grad():
        out = model.action_out_proj(model.expert.final_norm(h, ours[2:3]))
    style = ours[2] @ weights["decoder_final_norm_mod_w"] + weights["decoder_final_norm_mod_b"]
    scale, shift, _ = style.chunk(3)
    xn = _rms(h[0], cfg.rms_norm_eps) * (1 + scale) + shift
    theirs = xn @ weights["decoder_action_out_proj_w"] + weights["decoder_action_out_proj_b"]
    torch.testing.assert_close(theirs, out[0], **TOL)


def test_time_embeddings_are_its_adarms_condition_inputs(model) -> None:
    """`prepare_adarms_cond`: t = 1, 1 - 1/N, ...; [sin | cos] over log-spaced periods."""
    cfg = model.cfg
    emb = time_embeddings(model)
    assert emb.shape == (cfg.num_steps, cfg.expert.width)
    fraction = torch.linspace(0.0, 1.0, cfg.expert.width // 2, dtype=torch.float64)
    period = cfg.min_period * (cfg.max_period / cfg.min_period) ** fraction
    for step in range(cfg.num_steps):
        angle = (1.0 - step / cfg.num_steps) * 2 * math.pi / period
        torch.testing.assert_close(emb[step].double(), torch.cat([angle.sin(), angle.cos()]), atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def pi0() -> tuple[Pi0Model, dict[str, torch.Tensor]]:
    model = tiny_model("pi0", seed=4)
    embeds = model.prefix_lm.embed(torch.arange(model.cfg.prompt_len)[None] % 5)[0]
    return model, convert(model, embeds, torch.float32)


def test_pi0_expert_layer_folds_its_norms(pi0) -> None:
    """pi0's expert norms are plain RMSNorms: folded like the prefix LM's."""
    model, weights = pi0
    cfg, ex = model.cfg, model.expert
    layer, hd, heads = ex.layers[1], ex.spec.head_dim, ex.spec.num_heads
    t = 5
    x = torch.randn(1, t, ex.spec.width, generator=torch.Generator().manual_seed(7))
    pos = torch.arange(20, 20 + t)
    cos, sin = rope_cos_sin(pos[None], hd, cfg.rope_base, torch.float32)
    with torch.no_grad():
        q, k, v = layer.self_attn.qkv(layer.norm_in(x, None)[0], cos, sin)
        up = layer.mlp.up_proj(layer.post_attention_layernorm(x)[0])[0]
    xn = _rms(x[0], cfg.rms_norm_eps)
    theirs = _their_qkv_rope(xn, weights["decoder_attn_qkv_w"][1], _their_rope_table(pos, hd, cfg.rope_base), heads, hd)
    torch.testing.assert_close(theirs[:, : heads * hd], _interleaved(q), **TOL)
    torch.testing.assert_close(theirs[:, heads * hd : (heads + 1) * hd], _interleaved(k), **TOL)
    torch.testing.assert_close(theirs[:, (heads + 1) * hd :], v[0, 0], **TOL)
    torch.testing.assert_close(xn @ weights["decoder_ffn_up_w"][1], up, **TOL)


@pytest.mark.parametrize("step", [0, 3])
def test_pi0_suffix_and_action_output_match_ours(pi0, step) -> None:
    """Its pi0 suffix: the state token from `state_in_proj`, the action tokens from
    silu(x @ fused_in + time_biases[step]) @ action_mlp; its output rms(h) @ out + b is our
    dt * action_out_proj(final_norm(h)) (the Euler step's scale folded in)."""
    model, weights = pi0
    cfg = model.cfg
    g = torch.Generator().manual_seed(11)
    x_t = torch.randn(1, cfg.horizon, cfg.action_dim, generator=g)
    state = torch.randn(1, cfg.state_dim, generator=g)
    h = torch.randn(1, cfg.horizon, cfg.expert.width, generator=g)
    t = torch.tensor([1.0 - step / cfg.num_steps])
    with torch.no_grad():
        ours, _ = model.embed_suffix(x_t, t, state)
        out = model.action_out_proj(model.expert.final_norm(h, None)) * (-1.0 / cfg.num_steps)
    state_tok = state[0] @ weights["decoder_state_in_proj_w"] + weights["decoder_state_in_proj_b"]
    hidden = torch.nn.functional.silu(
        x_t[0] @ weights["decoder_action_fused_in_proj_w"] + weights["decoder_action_fused_time_biases"][step]
    )
    actions = hidden @ weights["decoder_action_mlp_w"] + weights["decoder_action_mlp_b"]
    torch.testing.assert_close(state_tok, ours[0, 0], **TOL)
    torch.testing.assert_close(actions, ours[0, 1:], **TOL)
    theirs = _rms(h[0], cfg.rms_norm_eps) @ weights["decoder_action_fused_out_proj_w"]
    torch.testing.assert_close(theirs + weights["decoder_action_fused_out_proj_b"], out[0], **TOL)


def test_shapes_it_cannot_run_are_refused_with_reasons() -> None:
    check_shapes(PolicyConfig.pi05(), views=3)  # the shape: 3 x 256 + 200 + 50 = 1018 keys
    with pytest.raises(ValueError, match=r"5 steps \(its build hard-codes 10\)"):
        check_shapes(PolicyConfig.pi05(num_steps=5), views=3)
    check_shapes(PolicyConfig.pi0(), views=3)  # 3 x 256 + 48 + 1 + 50 = 867 keys
    with pytest.raises(ValueError, match=r"widths / head dim \(64, 32, 16\)"):
        check_shapes(tiny_model("pi05").cfg, views=2)
    with pytest.raises(ValueError, match=r"1274 keys"):
        check_shapes(PolicyConfig.pi05().replace(prompt_len=456), views=3)


def test_shapes_it_cannot_run_stop_the_cli_before_any_mode(tmp_path, capsys) -> None:
    """--tiny or --steps 5 with realtime-vla was refused only after the other modes had run."""
    (tmp_path / "server").mkdir()
    for name in ("pi05_infer.py", "pi0_infer.py"):
        (tmp_path / "server" / name).write_text("")
    argv = ["bench", "--policy", "pi05", "--modes", "eager,realtime-vla", "--realtime-vla", str(tmp_path)]
    assert main([*argv, "--steps", "5"]) == 2
    assert (
        "--modes realtime-vla with pi05: realtime-vla cannot run this configuration: 5 steps" in capsys.readouterr().out
    )
    assert main([*argv, "--tiny"]) == 2
    assert (
        "--modes realtime-vla with pi05_tiny: realtime-vla cannot run this configuration: " in capsys.readouterr().out
    )


def test_revision_of_an_exported_checkout_inside_another_repo(tmp_path) -> None:
    """Without its own .git, git would answer with the enclosing repo's HEAD: the REVISION file
    written at export is what names it."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / ".ext" / "realtime-vla-v2"
    inner.mkdir(parents=True)
    assert revision(inner) == "unknown"
    (inner / "REVISION").write_text("a36d02a7b241de1129af2048e749de58f95ead9c\n")
    assert revision(inner) == "a36d02a7b241de1129af2048e749de58f95ead9c"


def test_revision_of_a_checkout_given_with_a_tilde(tmp_path, monkeypatch) -> None:
    """`--realtime-vla=~/rtv` (no shell expansion after "="): the mode found and ran it, but the
    result file said revision "unknown"."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "rtv").mkdir()
    (tmp_path / "rtv" / "REVISION").write_text("abc123def\n")
    assert revision(Path("~/rtv")) == "abc123def"


def test_its_modules_import_twice_without_transformers(tmp_path, monkeypatch) -> None:
    """Its modules import transformers for a path this mode does not take: a placeholder stands
    in while they import (twice: pi0.5 then pi0 in one run) and is gone afterwards."""
    server = tmp_path / "server"
    server.mkdir()
    for name in ("pi05_infer", "pi0_infer"):
        (server / f"{name}.py").write_text(f"from transformers import AutoTokenizer\nNAME = {name!r}\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert load_backend(tmp_path, "pi05_infer").NAME == "pi05_infer"
    assert load_backend(tmp_path, "pi0_infer").NAME == "pi0_infer"
    assert "transformers" not in sys.modules and str(server) not in sys.path
    for name in ("pi05_infer", "pi0_infer"):
        monkeypatch.delitem(sys.modules, name)


def test_a_missing_checkout_is_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no server/pi05_infer.py and server/pi0_infer.py"):
        load_backend(tmp_path)


def test_the_mode_without_a_checkout_stops_before_building(tmp_path, capsys) -> None:
    assert main(["bench", "--tiny", "--modes", "realtime-vla"]) == 2
    assert "mode realtime-vla needs --realtime-vla PATH" in capsys.readouterr().out
    assert main(["bench", "--tiny", "--modes", "realtime-vla", "--realtime-vla", str(tmp_path)]) == 2
    expected = f"--realtime-vla {tmp_path}: no server/pi05_infer.py and server/pi0_infer.py there"
    assert expected in capsys.readouterr().out

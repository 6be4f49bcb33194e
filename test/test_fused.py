"""The fused path (re-laid-out weights, Triton kernels, static buffers) against the reference.

On CPU the kernels run in the Triton interpreter on tiny configs; on a GPU (scripts/gpu_check.sh)
the same test runs compiled, with the stages captured as CUDA graphs.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch
from kernel_fixtures import DEVICE
from policy_fixtures import assert_parity, tiny_inputs, tiny_model

from flashrt_ros.kernels.expert_step import rope_table
from flashrt_ros.policies.fused import FusedPi0


def _run_fused(model, x, dtype, **options):
    fused = FusedPi0(model, dtype, **options)
    fused.set_pixels(x["pixels"][0].to(dtype), x["image_masks"][0].tolist())
    fused.set_inputs(x["tokens"][0], x["token_masks"][0], x["state"][0], x["noise"][0])
    fused.capture()
    return fused, fused.sample_actions().clone()


@pytest.mark.parametrize("kind,views", [("pi05", 2), ("pi0", 2), ("pi05", 1)])
def test_fused_fp32_matches_reference(kind, views):
    model = tiny_model(kind, seed=2, num_views=views).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    if views > 1:
        x["image_masks"][0, 1] = False  # an absent view
    ref = model.sample_actions(**x)[0]
    _, out = _run_fused(model, x, torch.float32)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_fused_bf16_tracks_fp32_reference(kind):
    model = tiny_model(kind, seed=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    ref = model.sample_actions(**x)[0]
    _, out = _run_fused(model, x, torch.bfloat16)
    assert_parity(out, ref, max_abs=5e-3, cos=0.9999, noise=x["noise"][0])  # ~1e-3 measured (CPU)


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_fused_fp8_prefix_mlp_tracks_fp32_reference(kind, monkeypatch):
    """prefix_mlp_fp8: the prefix LM's gate|up in e4m3 (weights held in FP8, the norm writes
    e4m3 rows): a different chunk from the bf16 run (the FP8 GEMM ran), still at the parity gate.
    The tiny LM has 2 layers, of which only layer 0 runs an MLP: FP8 from layer 0 here."""
    from flashrt_ros.kernels.fp8 import E4M3
    from flashrt_ros.policies import fused as fused_module

    monkeypatch.setattr(fused_module, "PREFIX_MLP_FP8_FROM", 0)
    monkeypatch.setattr(fused_module, "PREFIX_DOWN_FP8_FROM", None)  # gate|up only (the down: next test)
    model = tiny_model(kind, seed=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    ref = model.sample_actions(**x)[0]
    fused, out = _run_fused(model, x, torch.bfloat16, prefix_mlp_fp8=True)
    assert fused.prefix_mlp_fp8 and "from layer 0 an FP8 (e4m3, row scales)" in fused.describe()
    assert "bf16 down" in fused.describe()
    first, last = fused.prefix_layers  # the last layer never runs its MLP: left bf16
    assert first.gate_up.dtype == E4M3 and first.gate_up_scale is not None and last.gate_up_scale is None
    _, bf16 = _run_fused(model, x, torch.bfloat16)
    assert not torch.equal(out, bf16)
    assert_parity(out, ref, max_abs=5e-3, cos=0.9999, noise=x["noise"][0])


def test_fused_fp8_prefix_down_tracks_fp32_reference(monkeypatch):
    """PREFIX_DOWN_FP8_FROM: the down projection in FP8 too (its input quantised per row by
    kernels/fp8.py, then torch._scaled_mm): at the parity gate, and not the gate|up-only chunk."""
    from flashrt_ros.kernels.fp8 import E4M3
    from flashrt_ros.policies import fused as fused_module

    monkeypatch.setattr(fused_module, "PREFIX_MLP_FP8_FROM", 0)
    monkeypatch.setattr(fused_module, "PREFIX_DOWN_FP8_FROM", None)
    model = tiny_model("pi05", seed=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    ref = model.sample_actions(**x)[0]
    _, gate_up_only = _run_fused(model, x, torch.bfloat16, prefix_mlp_fp8=True)
    monkeypatch.setattr(fused_module, "PREFIX_DOWN_FP8_FROM", 0)
    fused, out = _run_fused(model, x, torch.bfloat16, prefix_mlp_fp8=True)
    assert fused.prefix_layers[0].down.dtype == E4M3 and fused.prefix_layers[0].down_scale is not None
    assert not torch.equal(out, gate_up_only)
    assert_parity(out, ref, max_abs=5e-3, cos=0.9999, noise=x["noise"][0])


def test_fused_fp8_prefix_mlp_keeps_the_first_layers_bf16(caplog):
    """The defaults on a 3-layer LM: layer 0's MLP in bf16, layer 1's two GEMMs in FP8, the last
    layer (which never runs its MLP) untouched; a 2-layer LM has no layer to run FP8: a warning."""
    from flashrt_ros.kernels.fp8 import E4M3
    from flashrt_ros.policies.config import GemmaSpec
    from flashrt_ros.policies.fused import PREFIX_MLP_FP8_FROM

    spec = lambda w: GemmaSpec(width=w, depth=3, mlp_dim=2 * w, num_heads=4, num_kv_heads=1, head_dim=16)  # noqa: E731
    model = tiny_model("pi05", seed=2, prefix=spec(64), expert=spec(32)).to(DEVICE)
    fused = FusedPi0(model, torch.bfloat16, prefix_mlp_fp8=True)
    assert PREFIX_MLP_FP8_FROM == 1
    bf16, fp8 = (torch.bfloat16,) * 2, (E4M3, E4M3)
    assert [(w.gate_up.dtype, w.down.dtype) for w in fused.prefix_layers] == [bf16, fp8, bf16]
    assert fused.prefix_layers[0].gate_up_scale is None and fused.prefix_layers[0].down_scale is None
    assert "from layer 1 an FP8 (e4m3, row scales)" in fused.describe()
    assert "FP8 down (cuBLASLt) from layer 1" in fused.describe()
    with caplog.at_level("WARNING"):
        two = FusedPi0(tiny_model("pi05", seed=2).to(DEVICE), torch.bfloat16, prefix_mlp_fp8=True)
    assert not two.prefix_mlp_fp8 and "no prefix layer from 1 runs an MLP" in caplog.text


def test_fused_fp8_down_falls_back_where_scaled_mm_fails(monkeypatch, caplog):
    """Where torch._scaled_mm (row scales) is missing or wrong, the down projection stays bf16
    with a warning; gate|up still runs FP8."""
    from flashrt_ros.policies import fused as fused_module

    def broken(*args, **kwargs):
        raise RuntimeError("not supported on this GPU")

    monkeypatch.setattr(fused_module, "PREFIX_MLP_FP8_FROM", 0)
    monkeypatch.setattr(torch, "_scaled_mm", broken)
    with caplog.at_level("WARNING"):
        fused = FusedPi0(tiny_model("pi05", seed=2).to(DEVICE), torch.bfloat16, prefix_mlp_fp8=True)
    assert "FP8 down projection unavailable here (torch._scaled_mm: not supported on this GPU)" in caplog.text
    assert fused.prefix_layers[0].gate_up_scale is not None and fused.prefix_layers[0].down_scale is None
    assert "bf16 down" in fused.describe()


def test_fused_fp8_prefix_mlp_needs_bf16():
    model = tiny_model("pi05", seed=2).to(DEVICE)
    with pytest.raises(ValueError, match="prefix_mlp_fp8 needs a bfloat16 run, got torch.float32"):
        FusedPi0(model, torch.float32, prefix_mlp_fp8=True)


def test_fused_refuses_more_than_one_kv_head():
    """Valid for the reference, but the fused K/V cache holds one head: it built, logged only
    that the step kernel was not used, and every decision failed in qkv_rope ("k_out has shape")."""
    from flashrt_ros.policies.config import GemmaSpec

    spec = lambda width: GemmaSpec(width=width, depth=2, mlp_dim=2 * width, num_heads=4, num_kv_heads=2, head_dim=16)  # noqa: E731
    model = tiny_model("pi05", prefix=spec(64), expert=spec(32)).to(DEVICE)
    model.cfg.validate()  # raises on a config it refuses
    with pytest.raises(ValueError, match="the fused path's K/V cache holds one KV head, the model has 2"):
        FusedPi0(model, torch.float32)


def test_fused_is_deterministic_and_reads_its_buffers():
    model = tiny_model("pi05", seed=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    fused, first = _run_fused(model, x, torch.float32)
    again = fused.sample_actions().clone()
    assert torch.equal(first, again)
    fused.noise.add_(1.0)  # new noise through the same (captured) buffers changes the chunk
    assert not torch.allclose(fused.sample_actions(), first)
    assert set(fused.buffers()) >= {"prefix_k", "prefix_v", "actions", "noise", "pixels", "tokens"}


@pytest.mark.gpu
def test_rebuilding_the_fused_path_leaves_no_gpu_memory_behind():
    """Captures once warmed up on a fresh stream each, and PyTorch keeps a cuBLAS workspace per
    stream for good: every build left that much GPU memory allocated after it was gone."""
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    fused, _ = _run_fused(model, x, torch.float32)  # the first build makes the warm-up stream's workspace
    shapes = sum(key[0] == "denoise" for key in fused.graphs)
    del fused
    gc.collect()
    before = torch.cuda.memory_allocated(DEVICE)
    for _ in range(3):
        fused, _ = _run_fused(model, x, torch.float32)
        del fused
        gc.collect()
    grown = (torch.cuda.memory_allocated(DEVICE) - before) / 2**20
    assert shapes > 1 and grown < 1.0, f"{grown:.1f} MiB left behind by 3 builds of {shapes} captured shapes"


@pytest.mark.gpu
def test_vision_and_language_graphs_make_the_eager_prefix():
    """The prefix stage is captured as two graphs, vision per view count and the prefix LM per
    (view count, prompt bucket), so that the host can tokenise between them: replayed one after
    the other, with host work and a sleep between, they leave the K/V and chunk that the eager
    stages give."""
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    fused, _ = _run_fused(model, x, torch.float32)
    graphs = fused.graphs
    assert {k for k in graphs if k[0] == "vision"} == {("vision", 1), ("vision", 2)}
    assert {k[:2] for k in graphs if k[0] == "language"} == {("language", 1), ("language", 2)}
    for present in ([True, True], [False, True]):
        fused.set_pixels(x["pixels"][0], present)
        fused.prefix_emb.zero_()  # what the vision graph must write, gone
        fused.patches.zero_()
        fused.graphs = graphs
        fused.run("vision")
        time.sleep(0.05)  # the host's tokens in the pipeline: the language stage is queued later
        fused.run("language")
        fused.run("denoise")
        replayed = fused.prefix_k.clone(), fused.actions.clone()
        fused.graphs = {}
        fused.prefix_emb.zero_()
        fused.prefix()
        fused.denoise()
        torch.testing.assert_close(replayed[0], fused.prefix_k, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(replayed[1], fused.actions, rtol=1e-5, atol=1e-5)
    # new frames whose vision did not run: the language stage would read the last frames' tokens
    fused.set_pixels(x["pixels"][0], [True, True])  # the loop ended on one view
    for graphs_now in (graphs, {}):
        fused.graphs = graphs_now
        with pytest.raises(RuntimeError, match=r"current frames \(views: 2\); it last ran on earlier ones \(views: 1"):
            fused.run("language")
    fused.run("vision")
    fused.run("language")


def _host_frames(rng, shapes) -> list:
    """uint8 frames of these shapes (None: an absent view); the last one a non-contiguous crop, the
    first (of two or more) a flipped view (negative strides: BGR read as RGB)."""
    frames = [None if s is None else rng.integers(0, 256, s, dtype=np.uint8) for s in shapes]
    last = frames[-1]
    if last is not None:
        big = rng.integers(0, 256, (last.shape[0] + 4, last.shape[1] + 6, last.shape[2]), dtype=np.uint8)
        frames[-1] = big[2 : 2 + last.shape[0], 3 : 3 + last.shape[1]]
    if len(frames) > 1 and frames[0] is not None:
        frames[0] = frames[0][..., ::-1]
    return frames


def _on_device(frames) -> list:
    return [None if f is None else torch.from_numpy(np.ascontiguousarray(f)).to(DEVICE) for f in frames]


@pytest.mark.parametrize(
    "shapes",
    [[(24, 32, 3), (24, 32, 3)], [(24, 32, 3), (30, 20, 3)], [None, (24, 32, 3)], [(18, 40, 3), None]],
    ids=["one-size", "two-sizes", "absent-first", "absent-last"],
)
def test_set_frames_from_the_host_equals_set_images(shapes):
    """Host frames copied into the GPU buffers kept per run of same-size views and pre-processed in
    one launch per run give the pixels that frames already on the device give, view for view, and
    again with other frames (the buffers are re-used: nothing of the last frames stays)."""
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    staged, direct = FusedPi0(model, torch.float32), FusedPi0(model, torch.float32)
    rng = np.random.default_rng(5)
    for _ in range(2):
        frames = _host_frames(rng, shapes)
        staged.set_frames(frames)
        direct.set_images(_on_device(frames))
        assert staged.views == direct.views == sum(f is not None for f in frames)
        torch.testing.assert_close(staged.pixels, direct.pixels, rtol=0, atol=0)
        torch.testing.assert_close(staged.view_valid, direct.view_valid)


@pytest.mark.gpu
def test_host_buffers_are_not_written_under_a_queued_copy():
    """The copies from the page-locked buffers are queued: with the GPU busy, the next decision's
    inputs (and frames) must not reach the buffers before the queued copies have read them."""
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    fused, direct = FusedPi0(model, torch.float32), FusedPi0(model, torch.float32)
    x = tiny_inputs(model.cfg, batch=2)  # host tensors
    rng = np.random.default_rng(6)
    frames = [_host_frames(rng, [(24, 32, 3), (24, 32, 3)]) for _ in range(2)]
    seen = []
    for i in range(2):
        torch.cuda._sleep(100_000_000)  # the copies below queue behind ~50 ms of GPU work
        fused.set_frames(frames[i])
        fused.set_inputs(x["tokens"][i], x["token_masks"][i], x["state"][i], x["noise"][i])
        seen.append([t.clone() for t in (fused.pixels, fused.tokens, fused.state, fused.noise)])
    torch.cuda.synchronize()
    for i, (pixels, tokens, state, noise) in enumerate(seen):
        direct.set_images(_on_device(frames[i]))
        torch.testing.assert_close(pixels, direct.pixels, rtol=0, atol=0)
        torch.testing.assert_close(tokens.cpu(), x["tokens"][i], rtol=0, atol=0)
        torch.testing.assert_close(state.cpu(), x["state"][i], rtol=0, atol=0)
        torch.testing.assert_close(noise.cpu(), x["noise"][i], rtol=0, atol=0)


@pytest.mark.gpu
def test_frames_from_the_page_locked_pool_upload_right_and_stay_held_until_copied():
    """Frames the node copied into the pool are uploaded by queued copies: with the GPU busy, the
    pixels are still those frames' after the caller let go of them and the pool handed memory
    out again (set_frames keeps them referenced until the next call, when their copy is done)."""
    from flashrt_ros.engine.frame_pool import FramePool

    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    fused, direct = FusedPi0(model, torch.float32), FusedPi0(model, torch.float32)
    pool = FramePool()
    rng = np.random.default_rng(8)
    frames = [_host_frames(rng, [(24, 32, 3), (24, 32, 3)]) for _ in range(3)]
    seen = []
    for i in range(2):
        torch.cuda._sleep(100_000_000)  # the copies below queue behind ~50 ms of GPU work
        pooled = [pool.copy(f) for f in frames[i]]
        fused.set_frames(pooled)
        del pooled
        gc.collect()
        overwritten = [pool.copy(f) for f in frames[2]]  # memory the pool hands out meanwhile
        seen.append(fused.pixels.clone())
        del overwritten
    torch.cuda.synchronize()
    for i, pixels in enumerate(seen):
        direct.set_images(_on_device(frames[i]))
        torch.testing.assert_close(pixels, direct.pixels, rtol=0, atol=0)


def test_actions_to_host_waits_for_the_chunk_and_gives_the_callers_own_copy():
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    fused = FusedPi0(model, torch.float32)
    if DEVICE == "cuda":
        torch.cuda._sleep(100_000_000)  # the chunk is written ~50 ms from now: the read-back must wait
    fused.actions.fill_(1.5)
    first = fused.actions_to_host()
    fused.actions.fill_(-2.0)
    second = fused.actions_to_host()
    assert first.device.type == "cpu" and bool((first == 1.5).all()) and bool((second == -2.0).all())


def test_set_frames_refuses_frames_that_are_not_uint8():
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    fused = FusedPi0(model, torch.float32)
    with pytest.raises(ValueError, match="frames must be uint8"):
        fused.set_frames([np.zeros((24, 32, 3), dtype=np.float32), None])
    grey = np.zeros((24, 32, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"3 views given \(None for an absent one\); this path holds 2"):
        fused.set_frames([grey] * 3)
    with pytest.raises(ValueError, match="3 views given"):
        fused.set_images([torch.from_numpy(grey).to(DEVICE)] * 3)
    with pytest.raises(ValueError, match="3 views given"):  # one present: was taken, as the reference refuses
        fused.set_frames([grey, None, None])
    with pytest.raises(ValueError, match=r"frames must be HxWx3 \(RGB\) or HxWx4 \(RGBA\), got shape \(24, 32\)"):
        fused.set_frames([grey[..., 0], None])


@pytest.mark.gpu
def test_capture_compiles_the_frame_kernel_that_every_camera_uses():
    """The frame kernel runs outside the graphs; capture compiles it, and frames of other sizes,
    channel orders (a flipped BGR view), 4 channels or row padding (a crop) need no new compile
    at a decision: the kernel is not specialised on the frame's geometry or strides."""
    from flashrt_ros.kernels import preprocess

    def compiled() -> int:
        return sum(len(caches[0]) for caches in preprocess._preprocess_kernel.device_caches.values())

    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    fused, _ = _run_fused(model, tiny_inputs(model.cfg, batch=1), torch.float32)
    preprocess._preprocess_kernel.device_caches.clear()  # what earlier tests compiled
    fused.capture()
    assert compiled() == 1
    rng = np.random.default_rng(9)
    for shapes in ([(480, 640, 3), (480, 640, 3)], [(720, 1280, 4), (24, 32, 3)], [None, (37, 53, 3)]):
        fused.set_frames(_host_frames(rng, shapes))
        fused.set_images(_on_device(_host_frames(rng, shapes)))
    torch.cuda.synchronize()
    assert compiled() == 1


@pytest.mark.gpu
def test_dropping_a_nodes_pipeline_gives_its_gpu_memory_back():
    """A lifecycle node's cleanup: the state it holds (policy, fused path with its captured graphs
    and static buffers, capsules) dropped, then `release_device_memory`: nothing stays allocated
    and the allocator's cache goes back to the driver, for other processes on the robot's GPU."""
    import numpy as np

    from flashrt_ros.engine.capsule import CapsuleStore, PipelineState
    from flashrt_ros.engine.pipeline import Pipeline, release_device_memory
    from flashrt_ros.policies.policy import Observation, default_policy

    rng = np.random.default_rng(4)
    obs = Observation([rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)] * 2, rng.uniform(-1, 1, 6), "pick up")

    def node_state_used_and_dropped() -> int:
        policy = default_policy("pi05", device=DEVICE, num_views=2, action_dof=6)
        state = PipelineState(Pipeline(policy, backend="fused", release_reference=True), seed=0)
        assert state.pipeline.backend == "fused"
        store = CapsuleStore(state)
        for _ in range(2):
            state.decide(obs)
        store.snapshot("a")
        held = torch.cuda.memory_allocated(DEVICE)
        del policy, state, store
        release_device_memory()
        return held

    node_state_used_and_dropped()  # the first build leaves its streams' cuBLAS workspaces for good
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(DEVICE), torch.cuda.memory_reserved(DEVICE)
    held = node_state_used_and_dropped()
    after = torch.cuda.memory_allocated(DEVICE), torch.cuda.memory_reserved(DEVICE)
    assert held > before[0], "the pipeline held no GPU memory: nothing was measured"
    assert after[0] - before[0] < 2**20, f"{(after[0] - before[0]) / 2**20:.1f} MiB still allocated"
    # without the release the allocator would keep (reserved) what the pipeline held
    assert after[1] <= before[1] + 2**20, f"reserved {before[1] / 2**20:.1f} -> {after[1] / 2**20:.1f} MiB"


@pytest.mark.parametrize("present", [[True, False], [False, True], [True, True]])
def test_pipeline_fused_backend_matches_reference_backend(present):
    """The node's decision path: raw uint8 frames + prompt + state through both backends. The
    tiny policy barely reacts to its cameras, so the frames the fused path pre-processed are
    compared too: each present view's pixels, packed to the front, equal the reference's."""
    import numpy as np

    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies.policy import Observation, default_policy

    policy = default_policy("pi05", device=DEVICE, num_views=2, action_dof=6)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) if ok else None for ok in present]
    obs = Observation(frames, rng.uniform(-1, 1, 6), "pick up")
    noise = policy.model.noise(1, torch.Generator(device=DEVICE).manual_seed(3), DEVICE)
    ref = Pipeline(policy, backend="reference").decide(obs, noise)
    fused_pipe = Pipeline(policy, backend="fused")
    assert fused_pipe.backend == "fused"
    out = fused_pipe.decide(obs, noise)
    want = policy.prepare(obs).pixels[0, torch.tensor(present)]
    got = fused_pipe.fused.pixels[: sum(present)]
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=1e-5)
    assert out.actions.shape == ref.actions.shape == (policy.cfg.horizon, 6)
    np.testing.assert_allclose(out.actions, ref.actions, rtol=1e-5, atol=1e-5)
    assert set(out.timings_ms) == {"preprocess", "prefix", "denoise", "postprocess"}


def test_pipeline_fused_backend_applies_the_checkpoints_action_space():
    """A checkpoint with delta actions and ALOHA's conversion: the fused path's decision takes the
    converted state and gives the converted actions exactly as the reference's does, and they are
    not what the same weights give without the conversions."""
    import numpy as np

    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies.config import PolicyConfig
    from flashrt_ros.policies.policy import Observation, build_policy
    from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

    cfg = PolicyConfig.tiny("pi05", num_views=2)
    aloha = cfg.replace(delta_action_mask=(6, -1, 6, -1), aloha_adapt_to_pi=True)
    policy = build_policy(aloha, tiny_tokenizer_path(), seed=0, device=DEVICE, action_dof=14)
    plain = build_policy(cfg, tiny_tokenizer_path(), seed=0, device=DEVICE, action_dof=14)
    rng = np.random.default_rng(2)
    state = rng.uniform(-1, 1, 14)
    state[[6, 13]] = [0.3, 0.7]  # ALOHA's grippers: normalised linear positions
    obs = Observation([rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)] * 2, state, "pick up")
    noise = policy.model.noise(1, torch.Generator(device=DEVICE).manual_seed(3), DEVICE)
    ref = Pipeline(policy, backend="reference").decide(obs, noise).actions
    out = Pipeline(policy, backend="fused").decide(obs, noise).actions
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    unconverted = Pipeline(plain, backend="fused").decide(obs, noise).actions
    assert np.abs(out - unconverted).max() > 0.1


def test_pipeline_release_reference_frees_the_model_and_keeps_deciding():
    """The node's setting: once the fused path is built, the reference model's weights go (to the
    meta device) and the fused decisions do not change; on a GPU its memory is given back."""
    import numpy as np

    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies.policy import Observation, default_policy

    policy = default_policy("pi05", device=DEVICE, num_views=2, action_dof=6)
    rng = np.random.default_rng(1)
    obs = Observation([rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)] * 2, rng.uniform(-1, 1, 6), "pick up")
    noise = policy.model.noise(1, torch.Generator(device=DEVICE).manual_seed(3), DEVICE)
    ref = Pipeline(policy, backend="reference").decide(obs, noise)
    kept = Pipeline(policy, backend="fused")
    assert kept.released_gib is None and all(p.device.type != "meta" for p in policy.model.parameters())
    before = kept.decide(obs, noise).actions
    del kept
    pipe = Pipeline(policy, backend="fused", release_reference=True)
    assert all(p.device.type == "meta" for p in policy.model.parameters())
    assert pipe.released_gib is not None and (pipe.released_gib > 0) == (DEVICE == "cuda")
    for _ in range(2):
        out = pipe.decide(obs, noise).actions
        np.testing.assert_array_equal(out, before)
    np.testing.assert_allclose(out, ref.actions, rtol=1e-3, atol=1e-3)


def test_pipeline_fp8_option(caplog, monkeypatch):
    """fp8 "prefix_mlp" reaches the fused path; the reference path says it runs without it; a
    wrong value is refused with the values it takes."""
    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies.config import PolicyConfig
    from flashrt_ros.policies.policy import build_policy
    from flashrt_ros.policies.tiny_tokenizer import tiny_tokenizer_path

    cfg = PolicyConfig.tiny("pi05", num_views=1).replace(dtype="bfloat16")
    policy = build_policy(cfg, tiny_tokenizer_path(), device=DEVICE, action_dof=6)
    with pytest.raises(ValueError, match="fp8 must be none or prefix_mlp, got 'mlp'"):
        Pipeline(policy, backend="reference", fp8="mlp")
    fp32 = build_policy(PolicyConfig.tiny("pi05", num_views=1), tiny_tokenizer_path(), device=DEVICE, action_dof=6)
    with pytest.raises(ValueError, match="fp8 'prefix_mlp' needs a bfloat16 policy, got float32"):
        Pipeline(fp32, backend="auto", fp8="prefix_mlp")
    with caplog.at_level("WARNING"):
        ref = Pipeline(policy, backend="reference", fp8="prefix_mlp")
    assert ref.fused is None and "fp8 'prefix_mlp' applies to the fused path only" in caplog.text
    from flashrt_ros.policies import fused as fused_module

    monkeypatch.setattr(fused_module, "PREFIX_MLP_FP8_FROM", 0)  # the tiny LM's only MLP is layer 0's
    assert Pipeline(policy, backend="fused", fp8="prefix_mlp").fused.prefix_mlp_fp8


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_prefix_keys_and_values_are_the_references(kind):
    """Every layer's prefix K/V on its valid rows against the reference's prefill, in fp32. The
    chunk alone cannot tell: the tiny model's actions hardly depend on RoPE, and every prefix
    position one off moved its chunk by under 1e-4 (the chunk tests' tolerance)."""
    from flashrt_ros.policies.fused import VISIBLE

    model = tiny_model(kind, seed=2, num_views=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    x["image_masks"][0, 1] = False  # an absent view: the fused path packs the present ones
    fused, _ = _run_fused(model, x, torch.float32)
    with torch.no_grad():
        ref = model.prefill(*model.embed_prefix(x["pixels"], x["image_masks"], x["tokens"], x["token_masks"]))
    rows = fused.prefix_rows
    seen = fused.key_blocks[:rows] == VISIBLE  # the valid rows, in the reference's order
    # a position one off moves keys by ~0.3 here; the GPU's fp32 GEMMs may round through TF32
    tol = 1e-5 if DEVICE == "cpu" else 5e-3
    for layer, (k, v) in enumerate(zip(ref.keys, ref.values, strict=True)):
        valid = ref.valid[0]  # k, v: [B, KV heads, T, head dim]
        torch.testing.assert_close(fused.prefix_k[layer, :rows][seen], k[0, 0][valid], rtol=tol, atol=tol)
        torch.testing.assert_close(fused.prefix_v[layer, :rows][seen], v[0, 0][valid], rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_suffix_positions_follow_each_decisions_prompt(kind):
    """Two decisions on one captured object with prompts of different lengths (same bucket): the
    suffix's positions, and the step kernel's RoPE table made from them, are redone per decision
    (a stale table would rotate the second decision's queries and keys by the first's positions)."""
    model = tiny_model(kind, seed=7).to(DEVICE)
    fused = None
    for valid in (14, 9):
        x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=valid).items()}
        ref = model.sample_actions(**x)[0]
        if fused is None:
            fused, out = _run_fused(model, x, torch.float32)
        else:
            fused.set_pixels(x["pixels"][0], x["image_masks"][0].tolist())
            fused.set_inputs(x["tokens"][0], x["token_masks"][0], x["state"][0], x["noise"][0])
            out = fused.sample_actions()
        assert fused.step_plan is not None
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        # the tiny model's chunk hardly depends on the expert's RoPE (a table 5 positions off moves
        # it by ~1e-5), so check the table itself: this decision's positions, not the last one's
        images = model.cfg.num_views * model.cfg.vision.num_tokens
        want = images + valid + torch.arange(model.cfg.suffix_len, device=DEVICE)
        assert torch.equal(fused.suffix_pos, want)
        assert torch.equal(fused.suffix_rope, rope_table(want, fused.inv_freq))


@pytest.mark.parametrize("valid_tokens,bucket", [(5, 8), (8, 8), (9, 16)])
def test_prompt_buckets_pick_the_smallest_and_change_nothing(valid_tokens, bucket):
    """A short prompt runs a smaller prefix (only padding is left out): same chunk as the reference."""
    model = tiny_model("pi0", seed=4).to(DEVICE)  # tiny pi0: prompt_len 16
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=valid_tokens).items()}
    ref = model.sample_actions(**x)[0]
    fused = FusedPi0(model, torch.float32, prompt_buckets=(8,))
    assert fused.buckets == [8, 16]
    fused.set_pixels(x["pixels"][0], [True] * model.cfg.num_views)
    fused.set_inputs(x["tokens"][0], x["token_masks"][0], x["state"][0], x["noise"][0])
    assert fused.bucket == bucket
    fused.capture()
    torch.testing.assert_close(fused.sample_actions(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["pi05", "pi0"])
def test_long_suffix_uses_the_per_op_expert_and_matches(kind, caplog):
    """More than 64 suffix tokens do not fit the step kernel's tile: the expert then runs as
    separate kernels (`FusedPi0.velocity`), says so in the log, and gives the same result."""
    model = tiny_model(kind, seed=3, horizon=70).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=12).items()}
    ref = model.sample_actions(**x)[0]
    with caplog.at_level("WARNING", logger="flashrt_ros.policies.fused"):
        fused, out = _run_fused(model, x, torch.float32)
    assert fused.step_plan is None
    assert "at most 64 suffix tokens" in caplog.text
    assert "the expert as separate kernels" in fused.describe() and "guided" not in fused.describe()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    guided = FusedPi0(model, torch.float32, guided=True).describe()  # said of the step kernel alone, it was
    assert "the expert as separate kernels" in guided and "the Euler step guided (real-time chunking)" in guided


def test_step_kernel_and_per_op_expert_agree():
    """The default (one persistent launch per step) against the per-op path on the same model."""
    model = tiny_model("pi05", seed=4).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    fused, out = _run_fused(model, x, torch.float32)
    assert fused.step_plan is not None
    assert "expert step kernel" in fused.describe() and "ending with the denoise update" in fused.describe()
    fused.step_plan, fused.graphs = None, {}
    torch.testing.assert_close(fused.sample_actions(), out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("present", [[True, False], [False, True], [False, False]])
def test_present_views_are_packed_and_change_nothing(present):
    """Only present cameras run (packed to the front, graphs per view count): the chunk equals
    the reference's with the absent views masked, wherever they sit, and with no camera at all."""
    model = tiny_model("pi05", seed=5, num_views=2).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    x["image_masks"][0] = torch.tensor(present)
    ref = model.sample_actions(**x)[0]
    fused, out = _run_fused(model, x, torch.float32)
    assert fused.views == max(1, sum(present))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("views", [1, 2])
def test_vision_stage_matches_the_reference_tokens(views):
    """The patch conv as a GEMM over unfolded patches (+ bias + position as its added input):
    the vision stage's tokens equal the reference tower's, view by view."""
    model = tiny_model("pi05", seed=3, num_views=2).to(DEVICE)
    x = tiny_inputs(model.cfg, batch=1)
    fused = FusedPi0(model, torch.float32)
    fused.set_pixels(x["pixels"][0].to(DEVICE), [True] * views + [False] * (2 - views))
    with torch.no_grad():
        ref = model.embed_images(x["pixels"][:, :views].to(DEVICE))[0]
    torch.testing.assert_close(fused.vision(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["triton", "sdpa"])
def test_vision_attention_setting(monkeypatch, backend):
    """`VISION_ATTENTION` (bench/fused_ab.py's hook): the packed Triton kernel runs (with the
    launch of `VISION_ATTENTION_TILES`) or torch's SDPA does, both giving the reference tower's
    tokens, and the log line says which; invalid values are refused by name before a capture."""
    import flashrt_ros.policies.fused as fused_mod

    model = tiny_model("pi05", seed=3, num_views=2).to(DEVICE)
    x = tiny_inputs(model.cfg, batch=1)
    fused = FusedPi0(model, torch.float32)
    fused.set_pixels(x["pixels"][0].to(DEVICE), [True, True])
    with torch.no_grad():
        ref = model.embed_images(x["pixels"][:, :2].to(DEVICE))[0]
    launches = []
    real = fused_mod.packed_attention
    monkeypatch.setattr(fused_mod, "packed_attention", lambda *a, **kw: launches.append(kw) or real(*a, **kw))
    monkeypatch.setattr(fused_mod, "VISION_ATTENTION", backend)
    tiles = "64x128,w4,s2" if DEVICE == "cuda" else "16x16,w4,s1"
    monkeypatch.setattr(fused_mod, "VISION_ATTENTION_TILES", tiles)
    torch.testing.assert_close(fused.vision(), ref, rtol=1e-4, atol=1e-4)
    if backend == "triton":
        want = dict(block_m=int(tiles.split("x")[0]), block_n=int(tiles.split("x")[1].split(",")[0]))
        assert len(launches) == model.cfg.vision.depth
        assert all(kw["block_m"] == want["block_m"] and kw["block_n"] == want["block_n"] for kw in launches)
        assert "Triton packed attention at " + tiles in fused.describe()
    else:
        assert not launches and "torch SDPA" in fused.describe()
    for name, value, match in (
        (
            "VISION_ATTENTION_TILES",
            "64x128,w4,s2,k2",
            "VISION_ATTENTION_TILES '64x128,w4,s2,k2': expected BMxBN,wWARPS",
        ),
        ("VISION_ATTENTION", "cudnn", "VISION_ATTENTION 'cudnn': expected 'triton' or 'sdpa'"),
    ):
        monkeypatch.setattr(fused_mod, name, value)
        for call in (fused.vision, fused.capture):
            with pytest.raises(ValueError, match=match):
                call()


def test_prefix_attention_tiles_setting(monkeypatch):
    """`PREFIX_ATTENTION_TILES` (the hook bench/fused_ab.py A/Bs on the GPU) runs the prefix
    attention with the given launch, here split over 2 key ranges and combined: same chunk."""
    import flashrt_ros.policies.fused as fused_mod

    model = tiny_model("pi05", seed=5).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    monkeypatch.setattr(fused_mod, "PREFIX_ATTENTION", "split")  # the kernel these tiles launch
    _, default = _run_fused(model, x, torch.float32)
    tiles = "64x32,w8,s3,k2" if DEVICE == "cuda" else "16x16,w4,s1,k2"
    monkeypatch.setattr(fused_mod, "PREFIX_ATTENTION_TILES", tiles)
    launches = []
    real = fused_mod.attention
    monkeypatch.setattr(fused_mod, "attention", lambda *a, **kw: launches.append(kw) or real(*a, **kw))
    _, split = _run_fused(model, x, torch.float32)
    torch.testing.assert_close(split, default, rtol=1e-5, atol=1e-5)
    assert launches and all(kw.get("num_splits") == 2 and kw.get("num_warps") in (4, 8) for kw in launches)
    monkeypatch.setattr(fused_mod, "PREFIX_ATTENTION_TILES", "128x32,w8")
    with pytest.raises(ValueError, match="PREFIX_ATTENTION_TILES '128x32,w8': expected BMxBN"):
        _run_fused(model, x, torch.float32)


def test_prefix_attention_setting(monkeypatch):
    """`PREFIX_ATTENTION` (bench/fused_ab.py's hook): the TMA kernel (kernels/prefix_attention.py)
    and the split kernel (kernels/attention.py) give the same chunk over a prompt with padded
    tokens, the log line says which runs, and an invalid value is refused by name."""
    import flashrt_ros.policies.fused as fused_mod
    from flashrt_ros.kernels.prefix_attention import supports_prefix_attention

    model = tiny_model("pi05", seed=8).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    calls = []
    real = fused_mod.prefix_attention
    monkeypatch.setattr(fused_mod, "prefix_attention", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    chunks = {}
    for value in ("split", "tma"):
        monkeypatch.setattr(fused_mod, "PREFIX_ATTENTION", value)
        fused, chunks[value] = _run_fused(model, x, torch.float32)
        tma = value == "tma" and supports_prefix_attention(fused.device)
        assert ("attention (TMA, no key split)" in fused.describe()) == tma
        assert bool(calls) == tma
    # the prefix's last layer stops after its K/V: depth - 1 attentions per decision (on a GPU,
    # per warm-up and capture of each graph), each over the prefix's heads
    per_decision = model.cfg.prefix.depth - 1
    assert len(calls) == per_decision if DEVICE == "cpu" else len(calls) % per_decision == 0
    assert all(shape[1:] == (model.cfg.prefix.num_heads, model.cfg.prefix.head_dim) for shape in calls)
    torch.testing.assert_close(chunks["tma"], chunks["split"], rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(fused_mod, "PREFIX_ATTENTION", "flash")
    with pytest.raises(ValueError, match="PREFIX_ATTENTION 'flash': expected 'tma' or 'split'"):
        _run_fused(model, x, torch.float32)


def test_prefix_mlp_setting(monkeypatch):
    """`PREFIX_MLP` (bench/fused_ab.py's hook): the gate|up GEMM with the GeGLU epilogue
    (kernels/gate_up_geglu.py) or cuBLAS + geglu run the prefix's MLP to the same chunk, the log
    line says which, and an invalid value is refused by name before anything runs."""
    import flashrt_ros.policies.fused as fused_mod
    from flashrt_ros.kernels.gate_up_geglu import supports_gate_up_geglu

    model = tiny_model("pi05", seed=6).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    calls = []
    real = fused_mod.gate_up_geglu
    monkeypatch.setattr(fused_mod, "gate_up_geglu", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    chunks = {}
    for value in ("cublas", "triton"):
        monkeypatch.setattr(fused_mod, "PREFIX_MLP", value)
        fused, chunks[value] = _run_fused(model, x, torch.float32)
        fused_kernel = value == "triton" and fused.mlp_block > 0
        assert ("GeGLU epilogue" in fused.describe()) == fused_kernel
        assert bool(calls) == fused_kernel
    # the prefix's last layer stops after its K/V: depth - 1 fused MLPs per decision (on a GPU,
    # per warm-up and capture of each graph)
    assert fused.mlp_block > 0 or not supports_gate_up_geglu(fused.device)  # below sm_90: cuBLAS
    per_decision = model.cfg.prefix.depth - 1
    assert len(calls) == per_decision if DEVICE == "cpu" else len(calls) % per_decision == 0
    torch.testing.assert_close(chunks["triton"], chunks["cublas"], rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(fused_mod, "PREFIX_MLP", "cutlass")
    with pytest.raises(ValueError, match="PREFIX_MLP 'cutlass': expected 'triton' or 'cublas'"):
        _run_fused(model, x, torch.float32)


def test_vision_bias_in_norm_setting(monkeypatch):
    """`VISION_BIAS_IN_NORM` (bench/fused_ab.py's hook): SigLIP's O and fc2 biases added by the
    LayerNorm after each GEMM or in the GEMM's epilogue give the same chunk, and the norms receive
    the biases only when set (two per layer: after O and after fc2)."""
    import flashrt_ros.policies.fused as fused_mod

    model = tiny_model("pi05", seed=9).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    biases = []
    real = fused_mod.layer_norm
    monkeypatch.setattr(fused_mod, "layer_norm", lambda *a, **kw: biases.append(kw.get("x_bias")) or real(*a, **kw))
    chunks = {}
    for value in (False, True):
        biases.clear()
        monkeypatch.setattr(fused_mod, "VISION_BIAS_IN_NORM", value)
        fused, chunks[value] = _run_fused(model, x, torch.float32)
        given = [b for b in biases if b is not None]
        per_decision = 2 * model.cfg.vision.depth  # on a GPU: per warm-up and capture of each graph
        if value:
            assert len(given) == per_decision if DEVICE == "cpu" else len(given) % per_decision == 0 < len(given)
        else:
            assert given == []
        assert ("biases added by the LayerNorm" in fused.describe()) == value
    torch.testing.assert_close(chunks[True], chunks[False], rtol=1e-5, atol=1e-5)


def test_inputs_of_the_wrong_shape_are_refused_before_the_bucket_changes():
    """A [A] noise row would broadcast over the whole chunk; refused, naming every wrong input,
    with the decision's prompt bucket left as it was."""
    model = tiny_model("pi05", seed=2, num_views=1).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=70).items()}
    fused = FusedPi0(model, torch.float32)
    fused.set_inputs(x["tokens"][0], x["token_masks"][0], x["state"][0], x["noise"][0])
    bucket = fused.bucket
    short = torch.zeros_like(x["token_masks"][0])
    short[:3] = True
    refused = r"wrong shape: noise \(32,\) \(expected \(10, 32\)\), state \(1, 32\) \(expected a vector"
    with pytest.raises(ValueError, match=refused):
        fused.set_inputs(x["tokens"][0], short, x["state"], x["noise"][0, 0])
    assert fused.bucket == bucket


def test_denoise_on_the_cached_prefix_keeps_its_shape_after_new_inputs():
    """Multi-rate use: new inputs (one camera, a shorter prompt) are set, and a denoise runs on
    the prefix still in the cache before the prefix stage runs again. It used the new inputs'
    view count and prompt bucket against the old cache's layout (other key masks, positions and
    suffix rows): the same noise must give the same chunk as on that prefix."""
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    fused = FusedPi0(model, torch.float32, prompt_buckets=(16,))
    with pytest.raises(RuntimeError, match="run the prefix stage first"):
        fused.run("denoise")
    first = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=20).items()}
    fused.set_pixels(first["pixels"][0], [True, True])
    fused.set_inputs(first["tokens"][0], first["token_masks"][0], first["state"][0], first["noise"][0])
    fused.capture()
    chunk = fused.sample_actions().clone()
    then = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1, valid_tokens=5, seed=5).items()}
    then["image_masks"][0, 1] = False
    fused.set_pixels(then["pixels"][0], then["image_masks"][0].tolist())
    fused.set_inputs(then["tokens"][0], then["token_masks"][0], then["state"][0], first["noise"][0])
    assert (fused.views, fused.bucket, fused.cached) == (1, 16, (2, model.cfg.prompt_len))
    fused.run("denoise")
    torch.testing.assert_close(fused.actions, chunk, rtol=0, atol=0)
    fused.run("prefix")  # now the new inputs' prefix
    assert fused.cached == (1, 16)
    fused.run("denoise")
    ref = model.sample_actions(**{**then, "noise": first["noise"]})[0]
    torch.testing.assert_close(fused.actions, ref, rtol=1e-4, atol=1e-4)


def test_pixels_of_the_wrong_shape_are_refused():
    """A [V, 1, S, S] tensor would broadcast over the three channels; flags for more views than
    given failed with a bare IndexError."""
    model = tiny_model("pi05", seed=2, num_views=2).to(DEVICE)
    fused = FusedPi0(model, torch.float32)
    s = model.cfg.vision.image_size
    with pytest.raises(ValueError, match=rf"pixels \(2, 1, {s}, {s}\) with 2 valid flags; expected \[V, 3, {s}, {s}\]"):
        fused.set_pixels(torch.zeros(2, 1, s, s, device=DEVICE), [True, True])
    with pytest.raises(ValueError, match="with 3 valid flags"):
        fused.set_pixels(torch.zeros(2, 3, s, s, device=DEVICE), [True, True, True])
    with pytest.raises(ValueError, match="3 views present; this path holds 2"):
        fused.set_pixels(torch.zeros(3, 3, s, s, device=DEVICE), [True, True, True])
    assert fused.views == 2


def test_more_action_dims_than_the_step_kernel_holds_run_as_separate_kernels():
    """65 action dims: the step kernel's denoise tail holds 64, so the expert runs per op from the
    start (it used to build, then fail every decision) and still matches the reference."""
    model = tiny_model("pi05", seed=2, num_views=1, action_dim=65, state_dim=5).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    fused, out = _run_fused(model, x, torch.float32)
    assert fused.step_plan is None
    torch.testing.assert_close(out, model.sample_actions(**x)[0], rtol=1e-4, atol=1e-4)


def test_step_kernel_refuses_a_cache_that_does_not_fit():
    """Its kernel checks no bounds: a suffix past the cache or short masks are refused."""
    model = tiny_model("pi05", seed=2, num_views=1).to(DEVICE)
    x = {k: v[:1].to(DEVICE) for k, v in tiny_inputs(model.cfg, batch=1).items()}
    fused, _ = _run_fused(model, x, torch.float32)
    plan, p, s = fused.step_plan, fused.prefix_rows, fused.cfg.suffix_len
    k, v = fused.prefix_k[:, : p + s], fused.prefix_v[:, : p + s]
    args = (fused.suffix_in.clone(), fused.expert_weights, 0, k, v)
    masks = (fused.key_blocks[: p + s], fused.query_blocks, fused.suffix_rope)
    with pytest.raises(ValueError, match=rf"the suffix rows {p + 3}\.\.{p + 3 + s} do not fit a cache of {p + s} keys"):
        plan.step(*args, *masks, p + 3, 0, 1e-6)
    with pytest.raises(ValueError, match=rf"key_blocks / query_blocks must be \[{p + s}\] / \[{s}\], got \({p}"):
        plan.step(*args, fused.key_blocks[:p], *masks[1:], p, 0, 1e-6)
    with pytest.raises(ValueError, match=r"out must be contiguous float32 \[2, 10, 8\], got torch.float32 \[2, 9, 8\]"):
        rope_table(fused.suffix_pos, fused.inv_freq, out=torch.zeros(2, 9, 8, device=DEVICE))


def test_pipeline_backends_refuse_the_same_bad_inputs():
    """A noise chunk of another shape and a 4-channel frame: both backends say no, the same way."""
    import numpy as np

    from flashrt_ros.engine.pipeline import Pipeline
    from flashrt_ros.policies.policy import Observation, default_policy

    policy = default_policy("pi05", device=DEVICE, num_views=2, action_dof=6)
    rng = np.random.default_rng(0)
    good = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    rgba = Observation([good, rng.integers(0, 256, (48, 64, 4), dtype=np.uint8)], rng.uniform(-1, 1, 6), "pick up")
    row = torch.zeros(1, policy.cfg.action_dim, device=DEVICE)  # one row where a chunk belongs
    four_channels = r"camera view 1: expected an RGB frame \[H, W, 3\], got shape \(48, 64, 4\)"
    short_noise = rf"noise must be \[1, {policy.cfg.horizon}, 32\], got \(1, 32\)"  # before any copy
    for backend in ("reference", "fused"):
        pipe = Pipeline(policy, backend=backend)
        with pytest.raises(ValueError, match=four_channels):
            pipe.decide(rgba)
        with pytest.raises(ValueError, match=short_noise):
            pipe.decide(Observation([good, good], rng.uniform(-1, 1, 6), "pick up"), row)
        assert pipe.next_chunk_id == 1

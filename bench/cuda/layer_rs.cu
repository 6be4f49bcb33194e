// Prototype (bench only): step 2 of docs/step_megakernel.md, the expert's whole layer for 18 layers in
// one persistent launch, the Triton step kernel's 8 phases with a grid barrier after each:
//   norm1    close the last layer's MLP residual (h += gate2 * sum of the down's partials), adaRMS -> xn;
//   QKV      40 units of 64 weight rows (32 q units: a head's 32 RoPE pairs (d, d + 128); 4 k units
//            likewise; 4 v units of 64 dims), RoPE in the epilogue; q out, k / v into the caches;
//   attend   128 units (head, 64-key chunk): attend.cu's unit, on warps 0-3;
//   combine  the 16 chunks of each head -> attn, bf16;
//   O        16 feature tiles x 8 K-slices (one head each), fp32 partials;
//   norm2    close the attention residual (h += gate1 * sum of O's partials), adaRMS -> xn;
//   gate|up + GeGLU, down: mlp_rs.cu's staged phases.
// Every GEMM holds its weights in registers as wgmma's A operand (one register array, reused), copied
// by TMA into shared memory after the GEMM before it and taken into registers while waiting at the
// barrier in front of it (mlp_rs.cu's `staged` = 1); the activations come through shared memory as
// the B operand (N = 56 tokens) in one TMA burst after the barrier.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "attend.cuh"
#include "norm_row.cuh"
#include "rs_gemm.cuh"

namespace proto {

constexpr int WIDTH = 1024, FF = 4096, NWG = 2;
constexpr int QKV_UNITS = 40, QKV_BOXES = WIDTH / 64, QKV_JJ = WIDTH / 16 / NWG;
constexpr int O_TILES = WIDTH / 64, O_SPLITS = HEADS, O_BOXES = HD / 64, O_JJ = HD / 16 / NWG;
constexpr int GU_TILES = FF / 32, GU_BOXES = WIDTH / 64, GU_JJ = WIDTH / 16 / NWG;
constexpr int DN_TILES = WIDTH / 64, DN_SPLITS = 8, DN_BOXES = FF / DN_SPLITS / 64, DN_JJ = FF / DN_SPLITS / 16 / NWG;
constexpr int WJ = 32;  // the register array's K steps: the largest GEMM's (QKV, gate|up)
// norm1 start, its weights unstaged, QKV start, its MMA done, its epilogue done, attend, combine, O
// starts, O's MMA done, its epilogue done, norm2, gate|up, down starts, down's arrival; the grid
// arrival done (the `red.release` returned) after attend, O and the down. (Fencing only before the
// barriers whose next phase reads by TMA, and arriving from warp 7, measured no different at b7af9c7.)
constexpr int EVENTS = 17;

struct LayerSmem {
  union {
    Box a[QKV_BOXES];                               // a GEMM's activation boxes
    uint4 w[NWG * WJ * 128];                        // QKV's, O's or gate|up's weight fragments
    uint8_t att[ATTEND_SMEM];                       // attend's q, K, V tiles
  };
  uint4 dn[NWG * DN_JJ * 128];  // the down's weight fragments, a region of their own
  float red[NWG - 1][ACC][128];
  float2 rope[64][32];  // a q / k unit's (cos, sin) per token and its 32 pair dims, loaded once
  uint64_t full_qkv[QKV_BOXES], full_o[O_BOXES], full_gu[GU_BOXES], full_dn[DN_BOXES];
  uint64_t qkv_w, o_w, gu_w, dn_w;  // each GEMM's weight copy, one phase per layer
};

struct LayerArgs {
  const uint4* w_qkv;  // [layers][QKV_UNITS][NWG][QKV_JJ][128] fragments
  const uint4* w_o;    // [layers][O_TILES][O_SPLITS][NWG][O_JJ][128]
  const uint4* w_gu;   // [layers][GU_TILES][NWG][GU_JJ][128]
  const uint4* w_dn;   // [layers][DN_TILES][DN_SPLITS][NWG][DN_JJ][128]
  float* h;            // [rows, WIDTH] residual stream
  float* part_o;       // [O_SPLITS][rows][WIDTH]
  float* part_dn;      // [DN_SPLITS][rows][WIDTH]
  __nv_bfloat16* xn;   // [64, WIDTH] (rows >= `rows` stay zero, as in every [64, *] buffer)
  __nv_bfloat16* q;    // [64, WIDTH_Q] after RoPE
  __nv_bfloat16* k;    // [layers][KEYS_PAD][HD]: the prefix's keys, the suffix's written at `prefix`
  __nv_bfloat16* v;    // [layers][KEYS_PAD][HD]
  __nv_bfloat16* attn; // [64, WIDTH_Q]
  __nv_bfloat16* act;  // [64, FF] GeGLU output
  AttendPartials part;  // attend's chunk outputs and row stats
  const float* cos;    // [rows][HD / 2] RoPE at each suffix token's position
  const float* sin;
  const float* scale1;  // [layers][WIDTH] 1 + adaRMS scale, before attention
  const float* shift1;
  const float* gate1;   // the attention's gated residual
  const float* scale2;  // before the MLP
  const float* shift2;
  const float* gate2;
  unsigned int* counter;
  long long* trace;  // null or [layers][grid][EVENTS]
  int layers, rows, prefix, keys;
  float eps;
  int one_layer;  // every layer on layer 0's weights (L2-resident): the bound with no HBM wait
  // when the weight copies are issued (the pacing; each GEMM's block lands on its own mbarrier):
  int dn_at;      // the down's 64 KB into its own region at the start of 0 attend, 1 combine, 2 O,
                  // 3 norm2, or 4 after gate|up's MMAs
  int gu_split;   // gate|up's block (KB): [gu_split, 128) at the combine's start, [0, gu_split)
                  // after O's MMAs (>= 32: O's weights and boxes hold the first 32 KB until then)
  int qkv_split;  // the next layer's QKV block (KB): [qkv_split, 128) at the down's start, [0,
                  // qkv_split) after the down's MMAs (>= 56: the down's boxes)
};

// QKV's epilogue (warpgroup 0, which holds the sum): accumulator i is M-row 16 warp + lane / 4 +
// 8 ((i / 2) % 2) and token 8 (i / 4) + 2 (lane % 4) + i % 2; a q / k unit's rows r and r + 8 are the
// RoPE pair (d, d + 128), a v unit's rows are 64 consecutive dims
__device__ void qkv_epilogue(const LayerArgs& p, const float (&d)[ACC], int unit, int layer, int t,
                             const float2 (*rope)[32]) {
  const int warp = t / 32, lane = t % 32, r = lane / 4;
  const size_t kv_row0 = (static_cast<size_t>(layer) * KEYS_PAD + p.prefix) * HD;
#pragma unroll
  for (int i = 0; i < ACC; ++i) {
    if (i % 4 >= 2) continue;
    const int token = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    if (token >= p.rows) continue;
    if (unit < 36) {
      const int dim = 32 * (unit % 4) + 8 * warp + r;
      const float c = rope[token][dim % 32].x, s = rope[token][dim % 32].y;  // (loads from global
                                                                            // memory here: 5 us)
      const float x1 = d[i], x2 = d[i + 2];
      const __nv_bfloat16 o1 = __float2bfloat16(x1 * c - x2 * s), o2 = __float2bfloat16(x2 * c + x1 * s);
      __nv_bfloat16* dst = unit < 32 ? &p.q[token * WIDTH_Q + (unit / 4) * HD + dim] : &p.k[kv_row0 + token * HD + dim];
      dst[0] = o1, dst[HD / 2] = o2;
    } else {
      __nv_bfloat16* dst = &p.v[kv_row0 + token * HD + 64 * (unit - 36) + 16 * warp + r];
      dst[0] = __float2bfloat16(d[i]), dst[8] = __float2bfloat16(d[i + 2]);
    }
  }
}

__global__ void __launch_bounds__(256, 1)
    layer_rs_kernel(const __grid_constant__ CUtensorMap xn_map, const __grid_constant__ CUtensorMap attn_map,
                    const __grid_constant__ CUtensorMap act_map, const LayerArgs p) {
  extern __shared__ uint8_t smem_raw[];
  LayerSmem& sm = aligned_smem<LayerSmem>(smem_raw);
  __shared__ float warp_sums[8];
  const int tid = threadIdx.x, t = tid % 128, cta = blockIdx.x, grid = gridDim.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const bool qkv_busy = cta < QKV_UNITS, o_busy = cta < O_TILES * O_SPLITS;
  const bool gu_busy = cta < GU_TILES, dn_busy = cta < DN_TILES * DN_SPLITS;
  const int oft = cta % O_TILES, ohs = cta / O_TILES, dft = cta % DN_TILES, dks = cta / DN_TILES;
  unsigned int target = 0;
  auto mark = [&](int layer, int event) {
    if (p.trace && tid == 0) p.trace[(layer * grid + cta) * EVENTS + event] = clock64();
  };
  if (tid == 0) {
    for (int k = 0; k < QKV_BOXES; ++k) mbar_init(&sm.full_qkv[k], 1);
    for (int k = 0; k < O_BOXES; ++k) mbar_init(&sm.full_o[k], 1);
    for (int k = 0; k < GU_BOXES; ++k) mbar_init(&sm.full_gu[k], 1);
    for (int k = 0; k < DN_BOXES; ++k) mbar_init(&sm.full_dn[k], 1);
    mbar_init(&sm.qkv_w, 1), mbar_init(&sm.o_w, 1), mbar_init(&sm.gu_w, 1), mbar_init(&sm.dn_w, 1);
    mbar_init_fence();
  }
  if (cta < 36)  // a q / k unit's RoPE pairs: dims 32 (cta % 4) ..
    for (int i = tid; i < p.rows * 32; i += blockDim.x) {
      const int token = i / 32, dim = 32 * (cta % 4) + i % 32;
      sm.rope[token][i % 32] = make_float2(p.cos[token * (HD / 2) + dim], p.sin[token * (HD / 2) + dim]);
    }
  __syncthreads();
  uint32_t w[WJ][4];
  auto wl = [&](int layer) { return static_cast<size_t>(p.one_layer ? 0 : layer); };
  constexpr uint32_t QKV_BLOCK = NWG * QKV_JJ * 128, O_BLOCK = NWG * O_JJ * 128;  // uint4 per unit
  constexpr uint32_t GU_BLOCK = NWG * GU_JJ * 128, DN_BLOCK = NWG * DN_JJ * 128;
  auto qkv_of = [&](int layer) { return p.w_qkv + (wl(layer) * QKV_UNITS + cta) * QKV_BLOCK; };
  auto o_of = [&](int layer) { return p.w_o + ((wl(layer) * O_TILES + oft) * O_SPLITS + ohs) * O_BLOCK; };
  auto gu_of = [&](int layer) { return p.w_gu + (wl(layer) * GU_TILES + cta) * GU_BLOCK; };
  auto dn_of = [&](int layer) { return p.w_dn + ((wl(layer) * DN_TILES + dft) * DN_SPLITS + dks) * DN_BLOCK; };
  const uint32_t gu_cut = p.gu_split * 1024u, qkv_cut = p.qkv_split * 1024u;
  // the issuing thread: the region's last generic reads and async-proxy writes are ordered by the
  // CTA sync before the call; `fence` orders them against this thread's TMA writes
  auto fence = [] { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); };
  auto dn_copy = [&](int layer) {
    if (dn_busy) fence(), copy_chunk(sm.dn, &sm.dn_w, dn_of(layer), 0, DN_BLOCK * 16, DN_BLOCK * 16);
  };
  auto barrier_with = [&](auto work) {  // a grid barrier with `work` between arriving and waiting
    asm volatile("fence.proxy.async.global;" ::: "memory");  // this thread's stores, before TMA reads them
    __syncthreads();
    arrive_work_wait(p.counter, target, grid, work);
  };
  auto none = [] {};
  if (qkv_busy && tid == 0) copy_chunk(sm.w, &sm.qkv_w, qkv_of(0), 0, QKV_BLOCK * 16, QKV_BLOCK * 16);
  float d[ACC];
  for (int layer = 0; layer < p.layers; ++layer) {
    const size_t lw = static_cast<size_t>(layer) * WIDTH;
    const uint32_t par = layer & 1;
    const bool more = layer + 1 < p.layers;
    mark(layer, 0);
    for (int row = cta; row < p.rows; row += grid)
      norm_row<WIDTH>(p.h, p.xn, p.part_dn, DN_SPLITS, p.rows, layer > 0 ? p.gate2 + lw - WIDTH : nullptr,
                      p.scale1 + lw, p.shift1 + lw, p.eps, row, warp_sums);
    barrier_with([&] {
      unstage_fragments<QKV_JJ>(w, sm.w, &sm.qkv_w, par, wg, t, qkv_busy);
      mark(layer, 1);
    });
    mark(layer, 2);
    if (qkv_busy) {
      if (tid == 0) burst_load(sm.a, &xn_map, sm.full_qkv, QKV_BOXES, NWG, 0);
      mma_boxes<QKV_BOXES / NWG>(d, w, sm.a, sm.full_qkv, wg * (QKV_BOXES / NWG), par, [] {});
      mark(layer, 3);
      sum_warpgroups<NWG>(d, sm.red, wg, t);
      if (wg == 0) qkv_epilogue(p, d, cta, layer, t, sm.rope);
      mark(layer, 4);
    }
    barrier_with(none);
    mark(layer, 5);
    if (p.dn_at == 0 && tid == 0) dn_copy(layer);
    fence();  // TMA wrote the region, cp.async next
    for (int u = cta; u < HEADS * CHUNKS; u += grid) {
      const size_t kv0 = static_cast<size_t>(layer) * KEYS_PAD * HD;
      attend_unit(p.q, p.k + kv0, p.v + kv0, p.part, p.rows, p.keys, u / CHUNKS, u % CHUNKS, sm.att);
    }
    barrier_with([&] { mark(layer, 16); });
    mark(layer, 6);
    if (tid == 0) {  // the attend tiles are free (its last CTA sync): O's block, gate|up's late part
      fence();
      if (o_busy) copy_chunk(sm.w, &sm.o_w, o_of(layer), 0, O_BLOCK * 16, O_BLOCK * 16);
      if (gu_busy && gu_cut < GU_BLOCK * 16) copy_chunk(sm.w, &sm.gu_w, gu_of(layer), gu_cut, GU_BLOCK * 16, GU_BLOCK * 16);
      if (p.dn_at == 1) dn_copy(layer);
    }
    combine(p.part, p.attn, p.rows);
    barrier_with([&] { unstage_fragments<O_JJ>(w, sm.w, &sm.o_w, par, wg, t, o_busy); });
    mark(layer, 7);
    if (p.dn_at == 2 && tid == 0) dn_copy(layer);
    if (o_busy) {
      if (tid == 0) burst_load(sm.a, &attn_map, sm.full_o, O_BOXES, NWG, ohs * O_BOXES);
      mma_boxes<O_BOXES / NWG>(d, w, sm.a, sm.full_o, wg * (O_BOXES / NWG), par, [] {});
      mark(layer, 8);
      sum_warpgroups<NWG>(d, sm.red, wg, t);  // after it, both warpgroups' MMAs are done with the boxes
      if (tid == 128 && gu_busy) {
        fence();
        copy_chunk(sm.w, &sm.gu_w, gu_of(layer), 0, gu_cut, gu_cut < GU_BLOCK * 16 ? 0 : GU_BLOCK * 16);
      }
      if (wg == 0) partial_epilogue<WIDTH>(d, p.part_o, oft, ohs, p.rows, t);
      mark(layer, 9);
    }
    barrier_with([&] { mark(layer, 14); });
    mark(layer, 10);
    if (p.dn_at == 3 && tid == 0) dn_copy(layer);
    for (int row = cta; row < p.rows; row += grid)
      norm_row<WIDTH>(p.h, p.xn, p.part_o, O_SPLITS, p.rows, p.gate1 + lw, p.scale2 + lw, p.shift2 + lw, p.eps, row,
                      warp_sums);
    barrier_with([&] { unstage_fragments<GU_JJ>(w, sm.w, &sm.gu_w, par, wg, t, gu_busy); });
    mark(layer, 11);
    if (gu_busy) {
      if (tid == 0) burst_load(sm.a, &xn_map, sm.full_gu, GU_BOXES, NWG, 0);
      mma_boxes<GU_BOXES / NWG>(d, w, sm.a, sm.full_gu, wg * (GU_BOXES / NWG), par, [] {});
      sum_warpgroups<NWG>(d, sm.red, wg, t);
      if (p.dn_at == 4 && tid == 128) dn_copy(layer);
      if (wg == 0) geglu_epilogue<FF>(d, p.act, cta, p.rows, t);
    }
    barrier_with([&] { unstage_fragments<DN_JJ>(w, sm.dn, &sm.dn_w, par, wg, t, dn_busy); });
    mark(layer, 12);
    if (dn_busy) {
      if (tid == 0) burst_load(sm.a, &act_map, sm.full_dn, DN_BOXES, NWG, dks * DN_BOXES);
      if (tid == 0 && qkv_busy && more && qkv_cut < QKV_BLOCK * 16)  // past the down's boxes
        fence(), copy_chunk(sm.w, &sm.qkv_w, qkv_of(layer + 1), qkv_cut, QKV_BLOCK * 16, QKV_BLOCK * 16);
      mma_boxes<DN_BOXES / NWG>(d, w, sm.a, sm.full_dn, wg * (DN_BOXES / NWG), par, [] {});
      sum_warpgroups<NWG>(d, sm.red, wg, t);
      if (tid == 128 && qkv_busy && more)
        fence(), copy_chunk(sm.w, &sm.qkv_w, qkv_of(layer + 1), 0, qkv_cut, qkv_cut < QKV_BLOCK * 16 ? 0 : QKV_BLOCK * 16);
      if (wg == 0) partial_epilogue<WIDTH>(d, p.part_dn, dft, dks, p.rows, t);
    }
    mark(layer, 13);
    barrier_with([&] { mark(layer, 15); });
  }
  for (int row = cta; row < p.rows; row += grid)
    norm_row<WIDTH>(p.h, p.xn, p.part_dn, DN_SPLITS, p.rows, p.gate2 + static_cast<size_t>(p.layers - 1) * WIDTH,
                    nullptr, nullptr, p.eps, row, warp_sums);
}

}  // namespace proto

// Returns 0 or a cudaError.
extern "C" int layer_rs_launch(const proto::LayerArgs* args, int grid, cudaStream_t stream) {
  using namespace proto;
  const CUtensorMap xn_map = tile_map(args->xn, 64, WIDTH, NTOK, 64);
  const CUtensorMap attn_map = tile_map(args->attn, 64, WIDTH_Q, NTOK, 64);
  const CUtensorMap act_map = tile_map(args->act, 64, FF, NTOK, 64);
  const int smem = sizeof(LayerSmem) + 1024;
  cudaFuncSetAttribute(layer_rs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  layer_rs_kernel<<<grid, 256, smem, stream>>>(xn_map, attn_map, act_map, *args);
  return static_cast<int>(cudaGetLastError());
}

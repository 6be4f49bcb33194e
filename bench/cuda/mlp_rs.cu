// Prototype (bench only): step 1 of docs/step_megakernel.md, the expert's MLP half for 18 layers in
// one persistent launch, three phases per layer with a grid barrier after each, as the Triton
// step kernel's phases 5-7:
//   norm   close the last layer's gated residual (h += gate * sum of the down's K-split partials),
//          then adaRMS: xn = bf16(h * rsqrt(mean(h^2) + eps) * scale + shift), one row per CTA;
//   gate|up + GeGLU, 128 CTAs of 32 features (gate_up_rs.cu's phase);
//   down   16 tiles of 64 features x 8 K-slices of 512, fp32 partials.
// Both GEMMs hold their weights in registers as wgmma's A operand, loaded from global memory in
// fragment order while the phase before runs (or, `staged` = 2, staged in shared memory a whole layer
// ahead); the activations come through shared memory as the B operand (N = 56 tokens) in one TMA
// burst after the barrier.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "norm_row.cuh"
#include "rs_gemm.cuh"

namespace proto {

constexpr int WIDTH = 1024, FF = 4096, NWG = 2;
constexpr int GU_TILES = FF / 32, GU_BOXES = WIDTH / 64, GU_JJ = WIDTH / 16 / NWG;
constexpr int DN_TILES = WIDTH / 64, DN_SPLITS = 8, DN_BOXES = FF / DN_SPLITS / 64, DN_JJ = FF / DN_SPLITS / 16 / NWG;
constexpr int TRACE_EVENTS = 6;  // norm start, gate|up start, gate|up MMA done, down start, down MMA done, arrive

struct MlpSmem {
  union {
    Box a[GU_BOXES];             // gate|up's activations; the down's use the first DN_BOXES
    uint4 w[NWG * GU_JJ * 128];  // (staged) the next GEMM's weight fragments, CTA order; (ahead) gate|up's
  };
  union {                        // (ahead) the down's weight fragments, then its activations
    Box a[DN_BOXES];
    uint4 w[NWG * DN_JJ * 128];
  } dn;
  float red[NWG - 1][ACC][128];  // warpgroup 1's partial accumulators
  uint64_t full_gu[GU_BOXES];
  uint64_t full_dn[DN_BOXES];
  uint64_t w_full;
  uint64_t dn_full;
};

struct MlpArgs {
  const uint4* w_gu;  // [layers][GU_TILES][NWG][GU_JJ][128] fragments
  const uint4* w_dn;  // [layers][DN_TILES][DN_SPLITS][NWG][DN_JJ][128]
  float* h;           // [rows, WIDTH] residual stream
  float* part;        // [DN_SPLITS][rows][WIDTH] the down's partials
  __nv_bfloat16* xn;  // [64, WIDTH] normed (rows >= `rows` stay zero)
  __nv_bfloat16* act; // [64, FF] GeGLU output (rows >= `rows` stay zero)
  const float* scale; // [layers][WIDTH] 1 + adaRMS scale
  const float* shift; // [layers][WIDTH]
  const float* gate;  // [layers][WIDTH] gated residual
  unsigned int* counter;
  long long* trace;   // null or [layers][grid][TRACE_EVENTS]
  int layers, rows;
  float eps;
  int staged;     // 1: weights by one TMA copy into shared memory after the MMAs, into registers between
                  // arriving at the grid barrier and waiting on it; 2 (ahead): the same, but each GEMM's
                  // copy issued once the same GEMM of the layer before is done with its region (gate|up's
                  // and the down's in regions of their own), so each has a whole layer's other phases to
                  // land; 3 (late): as 1, but gate|up's weights into registers at the norm's barrier,
                  // not the down's; 4 (overlapped): as 2, but each copy issued by warpgroup 1 once the
                  // warpgroups' sum is done, and only warpgroup 0 (which stores the epilogue) before
                  // the grid arrival: the issuing thread stalls about as long as its bytes take, now
                  // beside the epilogue and the barrier and not before them; 5 (paced): as 4, each copy
                  // in chunks spread over the layer (gu_cut, dn_cut), so that no burst of all CTAs'
                  // copies fills the memory system in front of a barrier; 0: each thread's __ldg loads
  int one_layer;  // every layer on layer 0's weights (24 MB, L2-resident): the bound with no HBM wait
  int prefetch;   // each CTA asks L2 for its next layer's weight blocks when a layer starts
  int gu_cut[2];  // (paced) gate|up's block in KB: [0, cut0) after its MMAs, [cut0, cut1) at the
                  // down's start, the rest after the down's MMAs
  int dn_cut;     // (paced) the down's block in KB: [0, cut) after its MMAs, the rest at gate|up's start
  int slice_sync;               // (paced) no grid barrier between gate|up and the down: each down unit
                                // waits on a counter of the 16 gate|up units of its K slice
  unsigned int* slice_counter;  // [DN_SPLITS] gate|up units done, over all layers
};

// one row: close the last layer's gated residual, then (before the last layer's end) adaRMS into xn
__device__ void norm_row(const MlpArgs& p, int row, int layer, float* warp_sums) {
  const bool norm = layer < p.layers;
  norm_row<WIDTH>(p.h, p.xn, p.part, DN_SPLITS, p.rows, layer > 0 ? p.gate + (layer - 1) * WIDTH : nullptr,
                  norm ? p.scale + layer * WIDTH : nullptr, norm ? p.shift + layer * WIDTH : nullptr, p.eps, row,
                  warp_sums);
}

template <int STAGED, bool SLICE>  // MlpArgs::staged and slice_sync, one build each: no mode's branches
                                   // in another's registers
__global__ void __launch_bounds__(256, 1)
    mlp_rs_kernel(const __grid_constant__ CUtensorMap xn_map, const __grid_constant__ CUtensorMap act_map,
                  const MlpArgs p) {
  extern __shared__ uint8_t smem_raw[];
  MlpSmem& sm = aligned_smem<MlpSmem>(smem_raw);
  __shared__ float warp_sums[8];
  const int tid = threadIdx.x, t = tid % 128, cta = blockIdx.x, grid = gridDim.x;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const bool gu_busy = cta < GU_TILES, dn_busy = cta < DN_TILES * DN_SPLITS;
  const int ft = cta % DN_TILES, ks = cta / DN_TILES;  // the down's feature tile and K slice
  unsigned int target = 0;
  auto barrier = [&]() {
    asm volatile("fence.proxy.async.global;" ::: "memory");  // this thread's stores, before TMA reads them
    __syncthreads();
    target += grid;
    if (tid == 0) grid_barrier(p.counter, target);
    __syncthreads();
  };
  auto mark = [&](int layer, int event) {
    if (p.trace && tid == 0) p.trace[(layer * grid + cta) * TRACE_EVENTS + event] = clock64();
  };
  if (tid == 0) {
    for (int k = 0; k < GU_BOXES; ++k) mbar_init(&sm.full_gu[k], 1);
    for (int k = 0; k < DN_BOXES; ++k) mbar_init(&sm.full_dn[k], 1);
    mbar_init(&sm.w_full, 1);
    mbar_init(&sm.dn_full, 1);
    mbar_init_fence();
  }
  __syncthreads();
  uint32_t w_gu[GU_JJ][4], w_dn[DN_JJ][4];
  auto wl = [&](int layer) { return p.one_layer ? 0 : layer; };  // whose weights layer `layer` runs on
  const size_t gu_block = NWG * GU_JJ * 128, dn_block = NWG * DN_JJ * 128;  // uint4 per CTA
  auto gu_of = [&](int layer) { return p.w_gu + (static_cast<size_t>(wl(layer)) * GU_TILES + cta) * gu_block; };
  auto dn_of = [&](int layer) {
    return p.w_dn + ((static_cast<size_t>(wl(layer)) * DN_TILES + ft) * DN_SPLITS + ks) * dn_block;
  };
  // staged: thread 0 copies a CTA's fragment block into the shared region once its MMAs are done
  // with it; every thread takes its fragments out while the other CTAs arrive at the barrier
  int stages = 0, dn_stages = 0;
  constexpr bool paced = STAGED == 5, overlapped = STAGED == 4 || paced, ahead = STAGED == 2 || overlapped;
  constexpr bool late = STAGED == 3;
  // (paced) bytes [from, to) of a block; the first chunk announces the whole block (`all` bytes)
  auto chunk = copy_chunk;
  constexpr uint32_t GU_BYTES = NWG * GU_JJ * 128 * 16, DN_BYTES = NWG * DN_JJ * 128 * 16;
  const uint32_t gu_cut0 = p.gu_cut[0] * 1024u, gu_cut1 = p.gu_cut[1] * 1024u, dn_cut = p.dn_cut * 1024u;
  auto stage_to = [&](uint4* region, uint64_t* full, const uint4* block, uint32_t bytes) {
    asm volatile("bar.sync 2, 256;" ::: "memory");  // both warpgroups' MMAs done with the region
    if (tid == 0) stage_fragments(region, block, bytes, full);
  };
  auto stage = [&](const uint4* block, uint32_t bytes) { stage_to(sm.w, &sm.w_full, block, bytes); };
  auto unstage = [&](auto& w) { unstage_fragments(w, sm.w, &sm.w_full, stages++ & 1, wg, t); };
  auto unstage_dn = [&](auto& w) { unstage_fragments(w, sm.dn.w, &sm.dn_full, dn_stages++ & 1, wg, t); };
  // a grid barrier with `work` between arriving and waiting
  // (overlapped, after a GEMM) warpgroup 1 has no stores to wait for and may still be issuing a copy
  auto barrier_with = [&](auto work, bool wg0_stores = false) {
    asm volatile("fence.proxy.async.global;" ::: "memory");
    if (overlapped && wg0_stores && wg == 0)
      asm volatile("bar.sync 4, 128;" ::: "memory");
    else if (!(overlapped && wg0_stores))
      __syncthreads();
    arrive_work_wait(p.counter, target, grid, work);
  };
  if (ahead) {  // layer 0's weights: gate|up's into registers at the first norm's barrier
    if (gu_busy) stage(gu_of(0), gu_block * 16);
    if (dn_busy) stage_to(sm.dn.w, &sm.dn_full, dn_of(0), dn_block * 16);
  } else if (gu_busy && STAGED) {
    stage(gu_of(0), gu_block * 16);
    if (!late) unstage(w_gu);
  } else if (gu_busy) {
    fragments_from_global(w_gu, gu_of(0) + wg * GU_JJ * 128 + t);
  }
  float d[ACC];
  for (int layer = 0; layer < p.layers; ++layer) {
    mark(layer, 0);
    if (p.prefetch && tid == 0) {  // a layer (~11 us) ahead of their staging copies
      if (layer == 0 && dn_busy) prefetch_l2(dn_of(0), dn_block * 16);
      if (layer + 1 < p.layers && gu_busy) prefetch_l2(gu_of(layer + 1), gu_block * 16);
      if (layer + 1 < p.layers && dn_busy) prefetch_l2(dn_of(layer + 1), dn_block * 16);
    }
    for (int row = cta; row < p.rows; row += grid) norm_row(p, row, layer, warp_sums);
    if (ahead || late)
      barrier_with([&] {
        if (gu_busy) unstage(w_gu);
      });
    else
      barrier();
    mark(layer, 1);
    if (gu_busy) {  // gate|up + GeGLU: features 32 * cta ..
      if (tid == 0) burst_load(sm.a, &xn_map, sm.full_gu, GU_BOXES, NWG, 0);
      if (paced && layer > 0 && dn_busy && tid == 0) chunk(sm.dn.w, &sm.dn_full, dn_of(layer), dn_cut, DN_BYTES, 0);
      mma_boxes<GU_BOXES / NWG>(d, w_gu, sm.a, sm.full_gu, wg * (GU_BOXES / NWG), layer & 1, [] {});
      mark(layer, 2);
      if (ahead) {  // the region is free: its next layer's weights, a whole layer's phases to land
        if (!overlapped && layer + 1 < p.layers) stage(gu_of(layer + 1), gu_block * 16);
      } else if (dn_busy && STAGED) {
        stage(dn_of(layer), dn_block * 16);
      } else if (dn_busy) {
        fragments_from_global(w_dn, dn_of(layer) + wg * DN_JJ * 128 + t);  // in flight through the epilogue
      }
      sum_warpgroups<NWG>(d, sm.red, wg, t);  // after it, both warpgroups' MMAs are done
      if (paced && wg == 1 && t == 0 && layer + 1 < p.layers) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        chunk(sm.w, &sm.w_full, gu_of(layer + 1), 0, gu_cut0, GU_BYTES);
      } else if (overlapped && wg == 1 && t == 0 && layer + 1 < p.layers) {
        stage_fragments(sm.w, gu_of(layer + 1), gu_block * 16, &sm.w_full);
      }
      if (wg == 0) geglu_epilogue<FF>(d, p.act, cta, p.rows, t);
    }
    if (SLICE) {  // gate|up -> down by K slice: a unit's 32 features lie in slice cta / 16
      constexpr int GU_PER_SLICE = GU_TILES / DN_SPLITS;
      asm volatile("fence.proxy.async.global;" ::: "memory");  // the act stores, before TMA reads them
      if (wg == 0) asm volatile("bar.sync 4, 128;" ::: "memory");
      if (gu_busy && tid == 0) grid_arrive(&p.slice_counter[cta / GU_PER_SLICE]);
      if (dn_busy) unstage_dn(w_dn);
      __syncthreads();
      if (dn_busy && tid == 0) grid_wait(&p.slice_counter[ks], GU_PER_SLICE * (layer + 1));
      __syncthreads();
    } else {
      barrier_with(
          [&] {
            if (dn_busy && ahead)
              unstage_dn(w_dn);
            else if (dn_busy && STAGED)
              unstage(w_dn);
          },
          true);
    }
    mark(layer, 3);
    if (dn_busy) {  // down: features 64 * ft .., K slice ks
      Box* acts = ahead ? sm.dn.a : sm.a;
      if (tid == 0) burst_load(acts, &act_map, sm.full_dn, DN_BOXES, NWG, ks * DN_BOXES);
      if (paced && gu_busy && tid == 0 && layer + 1 < p.layers)
        chunk(sm.w, &sm.w_full, gu_of(layer + 1), gu_cut0, gu_cut1, 0);
      mma_boxes<DN_BOXES / NWG>(d, w_dn, acts, sm.full_dn, wg * (DN_BOXES / NWG), layer & 1, [] {});
      mark(layer, 4);
      if (ahead) {
        if (!overlapped && layer + 1 < p.layers) stage_to(sm.dn.w, &sm.dn_full, dn_of(layer + 1), dn_block * 16);
      } else if (gu_busy && layer + 1 < p.layers && STAGED) {
        stage(gu_of(layer + 1), gu_block * 16);
      } else if (gu_busy && layer + 1 < p.layers) {
        fragments_from_global(w_gu, gu_of(layer + 1) + wg * GU_JJ * 128 + t);
      }
      sum_warpgroups<NWG>(d, sm.red, wg, t);
      if (paced && wg == 1 && t == 0 && layer + 1 < p.layers) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        if (gu_busy) chunk(sm.w, &sm.w_full, gu_of(layer + 1), gu_cut1, GU_BYTES, 0);
        chunk(sm.dn.w, &sm.dn_full, dn_of(layer + 1), 0, dn_cut, DN_BYTES);
      } else if (overlapped && !paced && wg == 1 && t == 0 && layer + 1 < p.layers)
        stage_fragments(sm.dn.w, dn_of(layer + 1), dn_block * 16, &sm.dn_full);
      if (wg == 0) partial_epilogue<WIDTH>(d, p.part, ft, ks, p.rows, t);
    }
    mark(layer, 5);
    barrier_with(
        [&] {
          if (gu_busy && STAGED == 1 && layer + 1 < p.layers) unstage(w_gu);
        },
        true);
  }
  for (int row = cta; row < p.rows; row += grid) norm_row(p, row, p.layers, warp_sums);
}

}  // namespace proto

// xn [64, 1024] and act [64, 4096] bf16 (rows past `rows` zero); the rest as MlpArgs. Returns 0 or
// a cudaError.
extern "C" int mlp_rs_launch(const proto::MlpArgs* args, int grid, cudaStream_t stream) {
  using namespace proto;
  const CUtensorMap xn_map = tile_map(args->xn, 64, WIDTH, NTOK, 64);
  const CUtensorMap act_map = tile_map(args->act, 64, FF, NTOK, 64);
  const int smem = sizeof(MlpSmem) + 1024;
  if (args->slice_sync && args->staged != 5) return static_cast<int>(cudaErrorInvalidValue);
  auto kernel = args->slice_sync       ? mlp_rs_kernel<5, true>
                : args->staged == 5 ? mlp_rs_kernel<5, false>
                : args->staged == 4 ? mlp_rs_kernel<4, false>
                : args->staged == 3 ? mlp_rs_kernel<3, false>
                : args->staged == 2 ? mlp_rs_kernel<2, false>
                : args->staged == 1 ? mlp_rs_kernel<1, false>
                                    : mlp_rs_kernel<0, false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<grid, 256, smem, stream>>>(xn_map, act_map, *args);
  return static_cast<int>(cudaGetLastError());
}

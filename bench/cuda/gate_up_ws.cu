// Prototype (bench only): the step kernel's gate|up phase as a warp-specialised CUDA kernel.
// One CTA per 64-row weight tile (32 gate + 32 up rows, interleaved), A = the [64 x 1024]
// normed activations shared by all CTAs; a producer warp streams A and W k-tiles with TMA into
// a 4-stage ring (mbarriers), a consumer warpgroup runs wgmma m64n64k16 and the GeGLU epilogue.
// The kernel walks `layers` layers (each its own weights) with a grid barrier after each, like
// the persistent step kernel, so time / layers is one phase + one barrier.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "sm90.cuh"

namespace proto {

constexpr int BM = 64;       // activation rows (tokens, padded)
constexpr int BN = 64;       // weight rows per CTA: 32 gate + 32 up
constexpr int BK = 64;       // K per stage: 128 bytes, one 128B-swizzle row
constexpr int STAGES_DEFAULT = 4;  // ring slots; DEEP8 / DEEP12 launch the 8- and 12-slot builds
constexpr int KDIM = 1024;
constexpr int KSTEPS = KDIM / BK;
constexpr int FF = 4096;     // GeGLU output columns
constexpr int TILES = 2 * FF / BN;
constexpr uint32_t A_BYTES = BM * BK * 2, W_BYTES = BN * BK * 2;

// Shared memory: STAGES + KSTEPS tiles of [64 x 64] bf16 (8 KB, one 128B-swizzle atom column
// each). The ring modes use tiles 0..STAGES-1 for A and the rest for the W ring (or, RESIDENT_W,
// the whole weight tile); A_BURST uses tiles 0..KSTEPS-1 for the whole A tile and the rest for
// the W ring.
template <int STAGES>
struct Smem {
  __nv_bfloat16 tile[STAGES + KSTEPS][BM * BK];
  uint64_t full_a[KSTEPS];  // per ring slot, or (A_BURST) per K box
  uint64_t full_w[STAGES];
  uint64_t empty[STAGES];
  uint64_t full_w_all;
};

// mode bits: the next layer's first STAGES weight tiles issued before the grid barrier; A
// multicast over a 2-CTA cluster (each CTA loads half its rows for both); the consumer keeps
// one wgmma group in flight
constexpr int PREFETCH_W = 1, MULTICAST_A = 2, WGMMA_DEPTH2 = 4;
// RESIDENT_W: every layer uses layer 0's weight tile, loaded into shared memory once (what a unit
// costs once its weights are on chip: the activation stream, the MMAs, the epilogue, the barrier);
constexpr int RESIDENT_W = 8, DEEP8 = 32, DEEP12 = 64;
// A_BURST: the whole A tile issued at once after the grid barrier (16 boxes, one mbarrier each:
// no ring, no releases), the weights through the ring; W_FROM_L2: every layer streams layer 0's
// weights (L2-resident after the first); NO_MMA: the consumer only waits and releases (the
// data movement alone; its output is not checked)
constexpr int A_BURST = 128, W_FROM_L2 = 256, NO_MMA = 512;

__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(1));
}

template <int STAGES>
__global__ void __launch_bounds__(256, 1)
    gate_up_ws_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap w_map,
                      __nv_bfloat16* act, unsigned int* counter, int layers, int rows, int mode) {
  extern __shared__ uint8_t smem_raw[];
  Smem<STAGES>& sm = aligned_smem<Smem<STAGES>>(smem_raw);
  const int tid = threadIdx.x;
  const int tile = blockIdx.x;
  const bool busy = tile < TILES;
  const bool prew = mode & PREFETCH_W, mcast = mode & MULTICAST_A, deep = mode & WGMMA_DEPTH2;
  const bool resident = mode & RESIDENT_W, burst = mode & A_BURST, mma = !(mode & NO_MMA);
  const int w_layer0 = (mode & W_FROM_L2) ? 0 : 1;  // 0: every layer's weight rows are layer 0's
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform role (CUTLASS's canonical index)
  const uint32_t rank = mcast ? cluster_rank() : 0;
  // the tiles: A's ring slot s (or, A_BURST, its K box k) is tile s (k); the W ring's slot s and
  // the resident weight tile's box k follow A's tiles
  const int w_base = burst ? KSTEPS : STAGES;
  auto a_tile = [&](int i) { return sm.tile[i]; };
  auto w_tile = [&](int i) { return sm.tile[w_base + i]; };
  if (tid == 0) {
    for (int i = 0; i < KSTEPS; ++i) mbar_init(&sm.full_a[i], 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&sm.full_w[s], 1);
      mbar_init(&sm.empty[s], mcast ? 2 : 1);  // both CTAs' consumers free a multicast slot
    }
    mbar_init(&sm.full_w_all, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (mcast) cluster_sync();
  auto load_w = [&](int layer, int k) {
    const int it = layer * KSTEPS + k, s = it % STAGES;
    if (it >= STAGES) mbar_wait(&sm.empty[s], ((it / STAGES) - 1) & 1);
    mbar_expect_tx(&sm.full_w[s], W_BYTES);
    tma_load(w_tile(s), &w_map, &sm.full_w[s], k * BK, w_layer0 * layer * 2 * FF + tile * BN);
  };
  auto release = [&](int s) {
    if (tid != 128) return;
    mbar_arrive(&sm.empty[s]);
    if (mcast) mbar_arrive_cluster(&sm.empty[s], rank ^ 1);
  };
  if (busy && resident && tid == 0) {
    mbar_expect_tx(&sm.full_w_all, KSTEPS * W_BYTES);
    for (int k = 0; k < KSTEPS; ++k) tma_load(w_tile(k), &w_map, &sm.full_w_all, k * BK, tile * BN);
  }
  for (int layer = 0; layer < layers; ++layer) {
    if (busy) {
      if (wg == 0) {  // producer warpgroup: thread 0 issues
        if (tid == 0) {
          const int first = (prew && layer > 0) ? STAGES : 0;  // W tiles issued before the barrier
          if (burst) {  // every consumer finished the last layer's A before the grid barrier
            for (int k = 0; k < KSTEPS; ++k) {
              mbar_expect_tx(&sm.full_a[k], A_BYTES);
              tma_load(a_tile(k), &a_map, &sm.full_a[k], k * BK, 0);
            }
            for (int k = first; k < KSTEPS; ++k) load_w(layer, k);
          }
          for (int k = 0; k < KSTEPS && !burst; ++k) {
            const int s = (layer * KSTEPS + k) % STAGES;
            if (resident) {  // only A streams; the slot is free once its consumer released it
              const int it = layer * KSTEPS + k;
              if (it >= STAGES) mbar_wait(&sm.empty[s], ((it / STAGES) - 1) & 1);
            } else if (k >= first) {
              load_w(layer, k);
            }
            mbar_expect_tx(&sm.full_a[s], A_BYTES);
            if (mcast)
              tma_load_multicast(&a_tile(s)[rank * (BM / 2) * BK], &a_map, &sm.full_a[s], k * BK, rank * (BM / 2), 3);
            else
              tma_load(a_tile(s), &a_map, &sm.full_a[s], k * BK, 0);
          }
          if (prew && !resident && layer + 1 < layers)
            for (int k = 0; k < STAGES; ++k) load_w(layer + 1, k);
        }
      } else {  // consumer warpgroup
        float d[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) d[i] = 0.f;
        if (resident && layer == 0) mbar_wait(&sm.full_w_all, 0);
        for (int k = 0; k < KSTEPS; ++k) {
          const int it = layer * KSTEPS + k, s = it % STAGES;
          if (!resident) mbar_wait(&sm.full_w[s], (it / STAGES) & 1);
          if (burst)
            mbar_wait(&sm.full_a[k], layer & 1);
          else
            mbar_wait(&sm.full_a[s], (it / STAGES) & 1);
          const __nv_bfloat16* at = a_tile(burst ? k : s);
          const __nv_bfloat16* wt = w_tile(resident ? k : s);
          if (mma) {
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < BK / 16; ++kk) wgmma_m64n64k16(d, gmma_desc(&at[kk * 16]), gmma_desc(&wt[kk * 16]));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
          }
          if (deep) {
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (k > 0) release((it - 1) % STAGES);
          } else {
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            release(s);
          }
        }
        if (deep) {
          asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
          release((layer * KSTEPS + KSTEPS - 1) % STAGES);
        }
        // accumulator layout of m64n64: row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2),
        // col = 8 * (i / 4) + 2 * (lane % 4) + i % 2; up (cols 32..63) of col c is d[i + 16]
        const int t = tid - 128, warp = t / 32, lane = t % 32;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const int row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
          const int col = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
          if (row < rows) act[row * FF + tile * (BN / 2) + col] = __float2bfloat16(gelu_tanh(d[i]) * d[i + 16]);
        }
      }
    }
    __syncthreads();
    if (tid == 0) grid_barrier(counter, (layer + 1) * gridDim.x);
    __syncthreads();
  }
  if (mcast) cluster_sync();  // no CTA leaves while its peer may still signal its barriers
}

}  // namespace proto

// ---- host -------------------------------------------------------------------------------------

template <int STAGES>
static void launch(const CUtensorMap& a_map, const CUtensorMap& w_map, void* act, unsigned int* counter, int layers,
                   int rows, int grid, int mode, cudaStream_t stream) {
  using namespace proto;
  const int smem = sizeof(Smem<STAGES>) + 1024;
  cudaFuncSetAttribute(gate_up_ws_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  ClusterLaunch config(grid, 256, smem, (mode & MULTICAST_A) ? 2 : 1, stream);
  cudaLaunchKernelEx(&config.cfg, gate_up_ws_kernel<STAGES>, a_map, w_map, static_cast<__nv_bfloat16*>(act), counter, layers,
                     rows, mode);
}

// x [64, 1024] bf16 (rows past `rows` zero), w [layers * 8192, 1024] bf16 (gate|up interleaved in
// blocks of 32), act [64, 4096] bf16, counter: one zeroed uint32 per launch
extern "C" int gate_up_ws_launch(const void* x, const void* w, void* act, unsigned int* counter, int layers,
                                 int rows, int grid, int mode, cudaStream_t stream) {
  using namespace proto;
  const bool mcast = mode & MULTICAST_A;
  CUtensorMap a_map = tile_map(x, BM, KDIM, mcast ? BM / 2 : BM, BK);
  CUtensorMap w_map = tile_map(w, (uint64_t)layers * 2 * FF, KDIM, BN, BK);
  if (mode & DEEP12)
    launch<12>(a_map, w_map, act, counter, layers, rows, grid, mode, stream);
  else if (mode & DEEP8)
    launch<8>(a_map, w_map, act, counter, layers, rows, grid, mode, stream);
  else
    launch<STAGES_DEFAULT>(a_map, w_map, act, counter, layers, rows, grid, mode, stream);
  return static_cast<int>(cudaGetLastError());
}

// Prototype (bench only): how fast can one shared activation tile reach every SM's shared memory?
// Every GEMM op of a dataflow step kernel (docs/step_megakernel.md) has such a broadcast operand:
// the [rows x 1024] bf16 normed activations that all 128 CTAs multiply with their own weight tile.
// Each CTA loads the whole tile (16 boxes of [rows x 64], 128-byte swizzle) into shared memory,
// waits for it, and repeats `reps` times. With a cluster of C CTAs, rank r loads the boxes
// k = r (mod C) once and multicasts them to the C CTAs, so L2 serves each box 128 / C times
// instead of 128.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "sm90.cuh"

namespace proto {

constexpr int BOXES = 16;  // 1024 columns in 64-column (128-byte) boxes
constexpr int BOX_ELEMS = 64 * 64;

struct BroadcastSmem {
  __nv_bfloat16 a[BOXES][BOX_ELEMS];
  uint64_t full[BOXES];
};

// mode bits: a grid barrier after every rep (as between ops; else only a cluster barrier, or none
// for C = 1); each CTA walks the boxes from its own start (no two clusters asking L2 for the same
// box at once); no loads at all (the barriers' own cost, to subtract)
constexpr int GRID_BARRIER = 1, ROTATE = 2, NO_LOAD = 4;

template <int C>
__global__ void __launch_bounds__(128, 1)
    broadcast_kernel(const __grid_constant__ CUtensorMap a_map, unsigned int* counter, float* sums, int reps,
                     int rows, int mode) {
  extern __shared__ uint8_t smem_raw[];
  BroadcastSmem& sm = aligned_smem<BroadcastSmem>(smem_raw);
  const int tid = threadIdx.x;
  const uint32_t rank = C > 1 ? cluster_rank() : 0;
  const uint32_t box_bytes = rows * 128;
  const int start = (mode & ROTATE) ? (blockIdx.x / C) % BOXES : 0;
  if (tid == 0) {
    for (int k = 0; k < BOXES; ++k) mbar_init(&sm.full[k], 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (C > 1) cluster_sync();
  for (int rep = 0; rep < reps; ++rep) {
    if (!(mode & NO_LOAD)) {
      if (tid == 0) {
        for (int j = 0; j < BOXES; ++j) {
          const int k = (j + start) % BOXES;
          mbar_expect_tx(&sm.full[k], box_bytes);  // this CTA's bytes of box k, whoever issues them
          if (k % C != static_cast<int>(rank)) continue;
          if (C > 1)
            tma_load_multicast(sm.a[k], &a_map, &sm.full[k], k * 64, 0, static_cast<uint16_t>((1u << C) - 1));
          else
            tma_load(sm.a[k], &a_map, &sm.full[k], k * 64, 0);
        }
      }
      for (int j = 0; j < BOXES; ++j) mbar_wait(&sm.full[(j + start) % BOXES], rep & 1);
    }
    __syncthreads();
    if (mode & GRID_BARRIER) {
      if (tid == 0) grid_barrier(counter, (rep + 1) * gridDim.x);
      __syncthreads();
    } else if (C > 1) {
      cluster_sync();  // no peer's next multicast lands in a box this CTA still waits on
    }
  }
  // what arrived, summed (the swizzle only permutes within a box): the host checks every CTA's
  float s = 0.f;
  for (int i = tid; i < BOXES * rows * 64; i += blockDim.x) s += __bfloat162float(sm.a[i / (rows * 64)][i % (rows * 64)]);
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (tid % 32 == 0) atomicAdd(&sums[blockIdx.x], s);
  if (C > 1) cluster_sync();  // no CTA leaves while a peer's multicast may still target it
}

template <int C>
static int launch(const CUtensorMap& a_map, unsigned int* counter, float* sums, int reps, int rows, int grid, int mode,
                  cudaStream_t stream) {
  const int smem = sizeof(BroadcastSmem) + 1024;
  cudaFuncSetAttribute(broadcast_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (C > 8) cudaFuncSetAttribute(broadcast_kernel<C>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  ClusterLaunch config(grid, 128, smem, C, stream);
  int clusters = 0;  // a grid barrier over CTAs that cannot all be resident would never open
  if (cudaOccupancyMaxActiveClusters(&clusters, broadcast_kernel<C>, &config.cfg) != cudaSuccess) return -1;
  if (clusters * C < grid) return -2;
  cudaLaunchKernelEx(&config.cfg, broadcast_kernel<C>, a_map, counter, sums, reps, rows, mode);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace proto

// x [64, 1024] bf16; counter: one zeroed uint32; sums: `grid` zeroed floats (each CTA's tile sum).
// Returns 0, a cudaError, -1 (occupancy query failed) or -2 (the grid's clusters cannot all be
// resident at once).
extern "C" int broadcast_launch(const void* x, unsigned int* counter, float* sums, int reps, int rows, int grid,
                                int cluster, int mode, cudaStream_t stream) {
  using namespace proto;
  CUtensorMap a_map = tile_map(x, 64, 1024, rows, 64);
  switch (cluster) {
    case 1: return launch<1>(a_map, counter, sums, reps, rows, grid, mode, stream);
    case 2: return launch<2>(a_map, counter, sums, reps, rows, grid, mode, stream);
    case 4: return launch<4>(a_map, counter, sums, reps, rows, grid, mode, stream);
    case 8: return launch<8>(a_map, counter, sums, reps, rows, grid, mode, stream);
    case 16: return launch<16>(a_map, counter, sums, reps, rows, grid, mode, stream);
    default: return -3;
  }
}

// Prototype (bench only): step 2's attention for 18 layers in one persistent launch, two phases per
// layer with a grid barrier after each, to set against the Triton step kernel's attention phases:
//   attend   128 CTAs, one per (head, chunk of 64 keys): S = Q_h K_c^T / 16 for the 50 (64) queries,
//            the chunk's softmax (row max m, row sum l), O_c = P V_c unnormalised, fp32 to a workspace;
//   combine  every CTA, 8 heads x 50 queries x 256 dims: out = sum_c e^(m_c - M) O_c / sum_c e^(m_c - M) l_c.
// One KV head (multi-query): K, V [keys, 256] per layer, keys past `keys` masked. Q and its K / V
// chunk come into shared memory by cp.async (rows of 512 bytes, 16-byte chunks XOR-swizzled by
// row), the MMAs are mma.sync m16n8k16 (bf16, fp32 accumulate) on ldmatrix fragments, and P goes
// from the score accumulators straight into the second MMA's A fragments (no shared memory).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attend.cuh"

namespace proto {

constexpr int THREADS = 128;

struct AttendArgs {
  const __nv_bfloat16* q;  // [layers][64][2048] (rows >= rows zero)
  const __nv_bfloat16* k;  // [layers][KEYS_PAD][256] (rows >= keys masked)
  const __nv_bfloat16* v;  // [layers][KEYS_PAD][256]
  __nv_bfloat16* out;      // [layers][64][2048]
  AttendPartials part;
  unsigned int* counter;
  long long* trace;  // null or [layers][grid][4]: layer start, attend done, combine start, combine done
  int layers, rows, keys;
};

__global__ void __launch_bounds__(THREADS, 1) attend_kernel(const AttendArgs p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  unsigned int target = 0;
  auto barrier = [&] {
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) grid_barrier(p.counter, target);
    __syncthreads();
  };
  auto mark = [&](int layer, int event) {
    if (p.trace && threadIdx.x == 0) p.trace[(layer * gridDim.x + blockIdx.x) * 4 + event] = clock64();
  };
  for (int layer = 0; layer < p.layers; ++layer) {
    mark(layer, 0);
    const size_t q0 = static_cast<size_t>(layer) * QROWS * WIDTH_Q, kv0 = static_cast<size_t>(layer) * KEYS_PAD * HD;
    for (int u = blockIdx.x; u < HEADS * CHUNKS; u += gridDim.x)
      attend_unit(p.q + q0, p.k + kv0, p.v + kv0, p.part, p.rows, p.keys, u / CHUNKS, u % CHUNKS, smem);
    __threadfence();
    mark(layer, 1);
    barrier();
    mark(layer, 2);
    combine(p.part, p.out + q0, p.rows);
    mark(layer, 3);
    barrier();
  }
}

}  // namespace proto

// Returns 0 or a cudaError.
extern "C" int attend_launch(const proto::AttendArgs* args, int grid, cudaStream_t stream) {
  using namespace proto;
  const int smem = ATTEND_SMEM;
  cudaFuncSetAttribute(attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  attend_kernel<<<grid, THREADS, smem, stream>>>(*args);
  return static_cast<int>(cudaGetLastError());
}

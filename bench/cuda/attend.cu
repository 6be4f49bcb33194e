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

#include "sm90.cuh"

namespace proto {

constexpr int HEADS = 8, HD = 256, QROWS = 64, CHUNK = 64, CHUNKS = 16, WIDTH_Q = HEADS * HD;
constexpr int ROW_BYTES = HD * 2, THREADS = 128;

struct AttendArgs {
  const __nv_bfloat16* q;  // [layers][64][2048] (rows >= rows zero)
  const __nv_bfloat16* k;  // [layers][CHUNKS * CHUNK][256] (rows >= keys masked)
  const __nv_bfloat16* v;  // [layers][CHUNKS * CHUNK][256]
  __nv_bfloat16* out;      // [layers][64][2048]
  float* po;               // [HEADS][CHUNKS][64][256] unnormalised chunk outputs
  float* pm;               // [HEADS][CHUNKS][64] chunk row maxima (log2 units)
  float* pl;               // [HEADS][CHUNKS][64] chunk row sums
  unsigned int* counter;
  long long* trace;  // null or [layers][grid][4]: layer start, attend done, combine start, combine done
  int layers, rows, keys;
};

// byte offset of 16-byte chunk j of row r in a [rows][512 B] tile, swizzled against ldmatrix's
// 8-row reads hitting one bank group
__device__ __forceinline__ uint32_t tile_off(int r, int j) { return r * ROW_BYTES + ((j ^ (r & 7)) << 4); }

// 64 rows x 256 bf16 from global (row stride `stride` elements) into a swizzled tile
__device__ __forceinline__ void load_tile(uint8_t* tile, const __nv_bfloat16* src, int stride) {
  for (int i = threadIdx.x; i < 64 * 32; i += THREADS) {
    const int r = i / 32, j = i % 32;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(su32(tile + tile_off(r, j))),
                 "l"(src + r * stride + j * 8)
                 : "memory");
  }
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(su32(p)));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(su32(p)));
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// one (head, chunk) unit: warp w takes queries 16w .. 16w + 15
__device__ void attend_unit(const AttendArgs& p, int layer, int head, int chunk, uint8_t* smem) {
  uint8_t *qs = smem, *ks = smem + QROWS * ROW_BYTES, *vs = ks + CHUNK * ROW_BYTES;
  const size_t kv0 = static_cast<size_t>(layer) * CHUNKS * CHUNK * HD + static_cast<size_t>(chunk) * CHUNK * HD;
  load_tile(qs, p.q + static_cast<size_t>(layer) * QROWS * WIDTH_Q + head * HD, WIDTH_Q);
  load_tile(ks, p.k + kv0, HD);
  asm volatile("cp.async.commit_group;" ::: "memory");
  load_tile(vs, p.v + kv0, HD);  // lands while the scores are computed
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 1;" ::: "memory");
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q0 = warp * 16;
  float s[CHUNK / 8][4] = {};
#pragma unroll
  for (int kc = 0; kc < HD / 8; kc += 2) {  // 16 dims per step: chunks kc, kc + 1
    uint32_t a[4];
    ldsm_x4(a, qs + tile_off(q0 + lane % 8 + 8 * ((lane / 8) % 2), kc + lane / 16));
#pragma unroll
    for (int n = 0; n < CHUNK / 8; n += 2) {  // two 8-key tiles per ldmatrix
      uint32_t b[4];
      ldsm_x4(b, ks + tile_off(n * 8 + lane % 8 + 8 * (lane / 16), kc + (lane / 8) % 2));
      mma16816(s[n], a, b[0], b[1]);
      mma16816(s[n + 1], a, b[2], b[3]);
    }
  }
  // softmax over the chunk's keys, rows q0 + lane / 4 (i = 0, 1) and + 8 (i = 2, 3), log2 units
  constexpr float SCALE = 0.0625f * 1.44269504f;  // 1 / sqrt(256) * log2(e)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < CHUNK / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = chunk * CHUNK + n * 8 + (lane % 4) * 2 + i % 2;
      s[n][i] = key < p.keys ? s[n][i] * SCALE : -INFINITY;
      m[i / 2] = fmaxf(m[i / 2], s[n][i]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    for (int o = 1; o < 4; o *= 2) m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], o));
  uint32_t pa[CHUNK / 16][4];  // P as the A fragments of O = P V, one per 16 keys
#pragma unroll
  for (int n = 0; n < CHUNK / 8; ++n) {
    float e[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) e[i] = exp2f(s[n][i] - m[i / 2]), l[i / 2] += e[i];
    pa[n / 2][(n % 2) * 2] = pack_bf16(e[0], e[1]);
    pa[n / 2][(n % 2) * 2 + 1] = pack_bf16(e[2], e[3]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
    for (int o = 1; o < 4; o *= 2) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
  const size_t unit = static_cast<size_t>(head) * CHUNKS + chunk;
  if (lane % 4 == 0) {
    p.pm[unit * QROWS + q0 + lane / 4] = m[0], p.pm[unit * QROWS + q0 + lane / 4 + 8] = m[1];
    p.pl[unit * QROWS + q0 + lane / 4] = l[0], p.pl[unit * QROWS + q0 + lane / 4 + 8] = l[1];
  }
  float* po = p.po + unit * QROWS * HD;
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();  // V is in
#pragma unroll 4
  for (int dc = 0; dc < HD / 8; dc += 2) {  // two 8-dim output tiles per ldmatrix
    float o[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < CHUNK / 16; ++kk) {
      uint32_t b[4];
      ldsm_x4_t(b, vs + tile_off(kk * 16 + lane % 8 + 8 * ((lane / 8) % 2), dc + lane / 16));
      mma16816(o[0], pa[kk], b[0], b[1]);
      mma16816(o[1], pa[kk], b[2], b[3]);
    }
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int col = (dc + t) * 8 + (lane % 4) * 2, row = q0 + lane / 4;
      if (row < p.rows) *reinterpret_cast<float2*>(&po[row * HD + col]) = make_float2(o[t][0], o[t][1]);
      if (row + 8 < p.rows) *reinterpret_cast<float2*>(&po[(row + 8) * HD + col]) = make_float2(o[t][2], o[t][3]);
    }
  }
  __syncthreads();  // the tiles are free for the next unit
}

// out rows of every head: the chunks' outputs weighed by e^(m_c - M)
__device__ void combine(const AttendArgs& p, int layer) {
  const int n = HEADS * p.rows * (HD / 4);
  for (int i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS) {
    const int row = i / (HD / 4), d = (i % (HD / 4)) * 4, head = row / p.rows, q = row % p.rows;
    float mc[CHUNKS], big = -INFINITY;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) mc[c] = __ldcg(&p.pm[(head * CHUNKS + c) * QROWS + q]), big = fmaxf(big, mc[c]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const float w = exp2f(mc[c] - big);
      const size_t unit = static_cast<size_t>(head) * CHUNKS + c;
      sum += w * __ldcg(&p.pl[unit * QROWS + q]);
      const float4 o = __ldcg(reinterpret_cast<const float4*>(&p.po[(unit * QROWS + q) * HD + d]));
      acc.x += w * o.x, acc.y += w * o.y, acc.z += w * o.z, acc.w += w * o.w;
    }
    const float r = 1.f / sum;
    __nv_bfloat16* dst = &p.out[(static_cast<size_t>(layer) * QROWS + q) * WIDTH_Q + head * HD + d];
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(acc.x * r, acc.y * r), pack_bf16(acc.z * r, acc.w * r));
  }
}

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
    for (int u = blockIdx.x; u < HEADS * CHUNKS; u += gridDim.x) attend_unit(p, layer, u / CHUNKS, u % CHUNKS, smem);
    __threadfence();
    mark(layer, 1);
    barrier();
    mark(layer, 2);
    combine(p, layer);
    mark(layer, 3);
    barrier();
  }
}

}  // namespace proto

// Returns 0 or a cudaError.
extern "C" int attend_launch(const proto::AttendArgs* args, int grid, cudaStream_t stream) {
  using namespace proto;
  const int smem = (QROWS + 2 * CHUNK) * ROW_BYTES;
  cudaFuncSetAttribute(attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  attend_kernel<<<grid, THREADS, smem, stream>>>(*args);
  return static_cast<int>(cudaGetLastError());
}

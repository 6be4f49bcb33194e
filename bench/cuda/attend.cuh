// The step's attention on `mma.sync`, shared by attend.cu and layer_rs.cu: one KV head (multi-query),
// 8 query heads of 256 dims, 64 (50) queries; a unit is (head, chunk of 64 keys): S = Q_h K_c^T / 16,
// the chunk's softmax (row max m, row sum l), O_c = P V_c unnormalised, fp32 partials out; the
// combine then weighs the 16 chunks by e^(m_c - M). Q and the K / V chunk come into shared memory by
// cp.async (rows of 512 bytes, 16-byte chunks XOR-swizzled by row), the MMAs read ldmatrix fragments,
// and P goes from the score accumulators straight into the second MMA's A fragments.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "sm90.cuh"

namespace proto {

constexpr int HEADS = 8, HD = 256, WIDTH_Q = HEADS * HD, QROWS = 64, CHUNK = 64, CHUNKS = 16;
constexpr int KEYS_PAD = CHUNKS * CHUNK, ROW_BYTES = HD * 2;
constexpr int ATTEND_SMEM = (QROWS + 2 * CHUNK) * ROW_BYTES;  // a unit's q, K and V tiles

struct AttendPartials {
  float* po;  // [HEADS][CHUNKS][64][HD] unnormalised chunk outputs
  float* pm;  // [HEADS][CHUNKS][64] chunk row maxima (log2 units)
  float* pl;  // [HEADS][CHUNKS][64] chunk row sums
};

// byte offset of 16-byte chunk j of row r in a [rows][512 B] tile, swizzled against ldmatrix's
// 8-row reads hitting one bank group
__device__ __forceinline__ uint32_t tile_off(int r, int j) { return r * ROW_BYTES + ((j ^ (r & 7)) << 4); }

// 64 rows x 256 bf16 from global (row stride `stride` elements) into a swizzled tile
__device__ __forceinline__ void load_tile(uint8_t* tile, const __nv_bfloat16* src, int stride) {
  for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) {
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

// one (head, chunk) unit over a layer's q [64][WIDTH_Q] and K / V [KEYS_PAD][HD] (`rows` queries,
// `keys` keys): warp w < 4 takes queries 16w .. 16w + 15 (further warps only help load the tiles)
__device__ void attend_unit(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                            const AttendPartials& p, int rows, int keys, int head, int chunk, uint8_t* smem) {
  uint8_t *qs = smem, *ks = smem + QROWS * ROW_BYTES, *vs = ks + CHUNK * ROW_BYTES;
  const size_t kv0 = static_cast<size_t>(chunk) * CHUNK * HD;
  load_tile(qs, q + head * HD, WIDTH_Q);
  load_tile(ks, k + kv0, HD);
  asm volatile("cp.async.commit_group;" ::: "memory");
  load_tile(vs, v + kv0, HD);  // lands while the scores are computed
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 1;" ::: "memory");
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q0 = warp * 16;
  uint32_t pa[CHUNK / 16][4];  // P as the A fragments of O = P V, one per 16 keys
  const size_t unit = static_cast<size_t>(head) * CHUNKS + chunk;
  if (warp < 4) {
    float s[CHUNK / 8][4] = {};
#pragma unroll
    for (int kc = 0; kc < HD / 8; kc += 2) {
      uint32_t a[4];
      ldsm_x4(a, qs + tile_off(q0 + lane % 8 + 8 * ((lane / 8) % 2), kc + lane / 16));
#pragma unroll
      for (int n = 0; n < CHUNK / 8; n += 2) {
        uint32_t b[4];
        ldsm_x4(b, ks + tile_off(n * 8 + lane % 8 + 8 * (lane / 16), kc + (lane / 8) % 2));
        mma16816(s[n], a, b[0], b[1]);
        mma16816(s[n + 1], a, b[2], b[3]);
      }
    }
    constexpr float SCALE = 0.0625f * 1.44269504f;  // 1 / sqrt(256) * log2(e)
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < CHUNK / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = chunk * CHUNK + n * 8 + (lane % 4) * 2 + i % 2;
        s[n][i] = key < keys ? s[n][i] * SCALE : -INFINITY;
        m[i / 2] = fmaxf(m[i / 2], s[n][i]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h)
      for (int o = 1; o < 4; o *= 2) m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], o));
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
    if (lane % 4 == 0) {
      p.pm[unit * QROWS + q0 + lane / 4] = m[0], p.pm[unit * QROWS + q0 + lane / 4 + 8] = m[1];
      p.pl[unit * QROWS + q0 + lane / 4] = l[0], p.pl[unit * QROWS + q0 + lane / 4 + 8] = l[1];
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();  // V is in
  if (warp < 4) {
    float* po = p.po + unit * QROWS * HD;
#pragma unroll 4
    for (int dc = 0; dc < HD / 8; dc += 2) {
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
        if (row < rows) *reinterpret_cast<float2*>(&po[row * HD + col]) = make_float2(o[t][0], o[t][1]);
        if (row + 8 < rows) *reinterpret_cast<float2*>(&po[(row + 8) * HD + col]) = make_float2(o[t][2], o[t][3]);
      }
    }
  }
  __syncthreads();  // the tiles are free
}

// out [64][WIDTH_Q] rows of every head: the chunks' outputs weighed by e^(m_c - M), over the grid
__device__ void combine(const AttendPartials& p, __nv_bfloat16* out, int rows) {
  const int n = HEADS * rows * (HD / 4);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int row = i / (HD / 4), d = (i % (HD / 4)) * 4, head = row / rows, q = row % rows;
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
    __nv_bfloat16* dst = &out[q * WIDTH_Q + head * HD + d];
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_bf16(acc.x * r, acc.y * r), pack_bf16(acc.z * r, acc.w * r));
  }
}

}  // namespace proto

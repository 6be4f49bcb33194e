// The register-operand GEMM pieces shared by gate_up_rs.cu and mlp_rs.cu: the weights live in each
// thread's registers as wgmma's A operand (fragments laid out on the host, 128 threads x 16 bytes
// per K step of 16), the activations come through shared memory as the B operand, N = 56 tokens,
// in boxes of [56 x 64] with 128-byte swizzle.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "sm90.cuh"

namespace proto {

constexpr int NTOK = 56;                    // wgmma N: tokens, padded to a multiple of 8
constexpr int ACC = NTOK / 2;               // f32 accumulators per thread of m64n56
constexpr uint32_t BOX_BYTES = NTOK * 128;  // one activation box: 7 KB, whole 1 KB swizzle atoms
using Box = __nv_bfloat16[NTOK * 64];

// this thread's J fragments from global memory (each __ldg holds the thread until it lands)
template <int J>
__device__ __forceinline__ void fragments_from_global(uint32_t (&w)[J][4], const uint4* src) {
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const uint4 v = __ldg(src + j * 128);
    w[j][0] = v.x, w[j][1] = v.y, w[j][2] = v.z, w[j][3] = v.w;
  }
}

// thread 0: a CTA's fragment block into shared memory by the TMA engine, once the region's
// generic reads are done (fence) and every warpgroup's MMAs are done with it (the caller's sync)
__device__ __forceinline__ void stage_fragments(uint4* dst, const uint4* src, uint32_t bytes, uint64_t* full) {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  mbar_expect_tx(full, bytes);
  bulk_load(dst, src, bytes, full);
}

// every thread: its first J fragments (all of w by default) out of a staged block (warpgroup wg's
// run starts at wg * J). With `wait` false (a CTA with no unit in the next GEMM) it reads the stale
// region without waiting: w is then written on every path, so ptxas does not keep an earlier GEMM's
// fragments alive until w's next use (it spilled)
template <int J = 0, int WJ>
__device__ __forceinline__ void unstage_fragments(uint32_t (&w)[WJ][4], const uint4* block, uint64_t* full,
                                                  uint32_t parity, int wg, int t, bool wait = true) {
  constexpr int N = J ? J : WJ;
  static_assert(N <= WJ, "more fragments than the register array holds");
  if (wait) mbar_wait(full, parity);
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const uint4 v = block[(wg * N + j) * 128 + t];
    w[j][0] = v.x, w[j][1] = v.y, w[j][2] = v.z, w[j][3] = v.w;
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // before the next TMA writes the region
}

// one thread: bytes [from, to) of a fragment block into `region`; with `all`, the first copy of the
// block also tells the mbarrier how many bytes the whole block brings (a block copied in chunks)
__device__ __forceinline__ void copy_chunk(uint4* region, uint64_t* full, const uint4* block, uint32_t from,
                                           uint32_t to, uint32_t all) {
  if (all) mbar_expect_tx(full, all);
  if (to > from) bulk_load(region + from / 16, block + from / 16, to - from, full);
}

// thread 0: `boxes` activation boxes (columns from box x0 on) in one burst, each warpgroup's first
// box first
__device__ __forceinline__ void burst_load(Box* tiles, const CUtensorMap* map, uint64_t* full, int boxes, int nwg,
                                           int x0) {
  for (int i = 0; i < boxes; ++i) {
    const int k = (i % nwg) * (boxes / nwg) + i / nwg;
    mbar_expect_tx(&full[k], BOX_BYTES);
    tma_load(tiles[k], map, &full[k], (x0 + k) * 64, 0);
  }
}

// d = w (this warpgroup's first BPW * 4 K steps, registers) @ the boxes [first, first + BPW);
// `on_first` runs once the first box is in
template <int BPW, int WJ, class OnFirst>
__device__ __forceinline__ void mma_boxes(float (&d)[ACC], const uint32_t (&w)[WJ][4], Box* tiles, uint64_t* full,
                                          int first, uint32_t parity, OnFirst on_first) {
  static_assert(BPW * 4 <= WJ, "more K steps than the register array holds");
#pragma unroll
  for (int i = 0; i < ACC; ++i) d[i] = 0.f;
#pragma unroll
  for (int b = 0; b < BPW; ++b) {
    mbar_wait(&full[first + b], parity);
    if (b == 0) on_first();
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n56k16_rs(d, w[b * 4 + kk], gmma_desc(&tiles[first + b][kk * 16]));
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}

// the other warpgroups' accumulators added into warpgroup 0's (which then holds the CTA's sum)
template <int NWG>
__device__ __forceinline__ void sum_warpgroups(float (&d)[ACC], float (*red)[ACC][128], int wg, int t) {
  if (wg > 0) {
#pragma unroll
    for (int i = 0; i < ACC; ++i) red[wg - 1][i][t] = d[i];
  }
  asm volatile("bar.sync 1, %0;" ::"r"(NWG * 128) : "memory");
  if (wg == 0) {
#pragma unroll
    for (int i = 0; i < ACC; ++i)
      for (int g = 0; g < NWG - 1; ++g) d[i] += red[g][i][t];
  }
}

// The epilogues (warpgroup 0, holding the warpgroups' sum): m64n56 accumulator i of thread t is
// M-row 16 warp + lane / 4 + 8 ((i / 2) % 2) and token 8 (i / 4) + 2 (lane % 4) + i % 2.

// gate|up + GeGLU: rows r and r + 8 of each warp's 16 are one feature's gate and up; features
// 32 tile .. into act [tokens][FF]
template <int FF>
__device__ __forceinline__ void geglu_epilogue(const float (&d)[ACC], __nv_bfloat16* act, int tile, int rows, int t) {
  const int warp = t / 32, lane = t % 32, feature = tile * 32 + 8 * warp + lane / 4;
#pragma unroll
  for (int i = 0; i < ACC; ++i) {
    const int token = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    if (i % 4 < 2 && token < rows) act[token * FF + feature] = __float2bfloat16(gelu_tanh(d[i]) * d[i + 2]);
  }
}

// a split-K GEMM: the fp32 partial of features 64 tile .. for K slice `split`, into part
// [splits][rows][WIDTH]
template <int WIDTH>
__device__ __forceinline__ void partial_epilogue(const float (&d)[ACC], float* part, int tile, int split, int rows,
                                                 int t) {
  const int warp = t / 32, lane = t % 32;
#pragma unroll
  for (int i = 0; i < ACC; ++i) {
    const int feature = tile * 64 + 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
    const int token = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
    if (token < rows) part[(split * rows + token) * WIDTH + feature] = d[i];
  }
}

}  // namespace proto

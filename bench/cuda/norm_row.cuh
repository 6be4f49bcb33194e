// The row phase shared by mlp_rs.cu and layer_rs.cu: close a gated residual from split-K partials
// and take the adaRMS norm of the row, one row per CTA.
#pragma once
#include <cuda_bf16.h>

namespace proto {

// one row of the residual stream h [rows][WIDTH]: h += gate * (the sum of `nparts` partials
// [nparts][rows][WIDTH]) (gate null: none), then (scale not null) adaRMS into xn [64][WIDTH]:
// bf16(h * rsqrt(mean(h^2) + eps) * scale + shift). 256 threads x 4 columns; every load is issued
// before the first sum
template <int WIDTH>
__device__ void norm_row(float* hs, __nv_bfloat16* xn, const float* parts, int nparts, int rows, const float* gate,
                         const float* scale, const float* shift, float eps, int row, float* warp_sums) {
  static_assert(WIDTH == 256 * 4, "one row is 256 threads x 4 columns");
  const int c = threadIdx.x * 4;
  float4 h = *reinterpret_cast<float4*>(&hs[row * WIDTH + c]);
  float4 g = {}, sc = {}, sh = {};
  if (gate) g = *reinterpret_cast<const float4*>(&gate[c]);
  if (scale) sc = *reinterpret_cast<const float4*>(&scale[c]), sh = *reinterpret_cast<const float4*>(&shift[c]);
  if (gate) {
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < nparts; ++k) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(&parts[(k * rows + row) * WIDTH + c]));
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    h.x += g.x * s.x, h.y += g.y * s.y, h.z += g.z * s.z, h.w += g.w * s.w;
    *reinterpret_cast<float4*>(&hs[row * WIDTH + c]) = h;
  }
  if (!scale) return;
  float ss = h.x * h.x + h.y * h.y + h.z * h.z + h.w * h.w;
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < 8; ++w) total += warp_sums[w];
  __syncthreads();  // warp_sums free for the next row
  const float r = rsqrtf(total / WIDTH + eps);
  __nv_bfloat16* out = &xn[row * WIDTH + c];
  out[0] = __float2bfloat16(h.x * r * sc.x + sh.x);
  out[1] = __float2bfloat16(h.y * r * sc.y + sh.y);
  out[2] = __float2bfloat16(h.z * r * sc.z + sh.z);
  out[3] = __float2bfloat16(h.w * r * sc.w + sh.w);
}

}  // namespace proto

// Prototype (bench only): the step kernel's gate|up phase with the weights as wgmma's *register*
// operand. Why: in gate_up_ws.cu both operands pass through shared memory; its MMA loop costs about
// 2.1 us per layer (docs/results/gate_up_ws_cce2c28.log), about what it takes to push 128 KB of
// activations and 128 KB of weights through shared memory twice (TMA write, wgmma read) at
// 128 B/clock. Here each thread holds its slice of the CTA's weight tile in registers, loaded
// from global memory in wgmma's fragment order (laid out once on the host) *before* the grid
// barrier opens: the weights do not depend on the activations. Only the activations pass
// through shared memory, as the B operand (N = 56 tokens: 50 real, padded to a multiple of 8),
// loaded in one TMA burst after the barrier. NWG warpgroups split K; warpgroup 0 sums their
// accumulators and runs the GeGLU epilogue. 18 layers with a grid barrier after each.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "rs_gemm.cuh"

namespace proto {

constexpr int KDIM = 1024, BOXES = KDIM / 64;  // K in 64-column (128-byte) boxes
constexpr int FF = 4096, FEAT = 32;            // GeGLU features; per CTA
constexpr int TILES = FF / FEAT;
constexpr int TRACE_EVENTS = 4;  // layer start, first box in, MMA done, arrive
// mode bits: every layer on layer 0's weights (L2-resident); the next layer's weights copied by
// the TMA engine into shared memory (where the activations were) after the MMAs, and from there
// into registers between arriving at the grid barrier and waiting on it (no thread stalls on
// loads from global memory; the plain path's __ldg loads hold each thread until they land)
constexpr int W_FROM_L2 = 1, W_STAGED = 2;

template <int NWG>
struct RsSmem {
  union {
    Box a[BOXES];
    uint4 w[NWG * (KDIM / 16 / NWG) * 128];  // W_STAGED: the next layer's fragments, CTA order
  };
  float red[NWG - 1][ACC][128];  // the other warpgroups' partial accumulators, thread-minor
  uint64_t full[BOXES];
  uint64_t w_full;
};

// wfrag: [layers][TILES][NWG][K steps of 16 per warpgroup][128 threads] uint4 (8 bf16 each);
// rows of the CTA's 64-row tile: in each warp's 16, 8 gate features then the same 8's up rows
template <int NWG>
__global__ void __launch_bounds__(NWG * 128, 1)
    gate_up_rs_kernel(const __grid_constant__ CUtensorMap a_map, const uint4* __restrict__ wfrag,
                      __nv_bfloat16* act, unsigned int* counter, long long* trace, int layers, int rows, int mode) {
  constexpr int JJ = KDIM / 16 / NWG, BPW = BOXES / NWG;  // K steps and A boxes per warpgroup
  extern __shared__ uint8_t smem_raw[];
  RsSmem<NWG>& sm = aligned_smem<RsSmem<NWG>>(smem_raw);
  const int tid = threadIdx.x, t = tid % 128;
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);  // warp-uniform
  const int tile = blockIdx.x;
  const bool busy = tile < TILES;
  const int w_layer = (mode & W_FROM_L2) ? 0 : 1;
  auto mark = [&](int layer, int event) {
    if (trace && tid == 0) trace[(layer * gridDim.x + blockIdx.x) * TRACE_EVENTS + event] = clock64();
  };
  if (tid == 0) {
    for (int k = 0; k < BOXES; ++k) mbar_init(&sm.full[k], 1);
    mbar_init(&sm.w_full, 1);
    mbar_init_fence();
  }
  __syncthreads();
  uint32_t w[JJ][4];
  auto block = [&](int layer) { return wfrag + (static_cast<size_t>(layer) * TILES + tile) * NWG * JJ * 128; };
  auto load_w = [&](int layer) {
    fragments_from_global(w, wfrag + ((static_cast<size_t>(layer) * TILES + tile) * NWG + wg) * JJ * 128 + t);
  };
  const bool staged = mode & W_STAGED;
  constexpr uint32_t W_BYTES = sizeof(RsSmem<NWG>::w);
  auto stage_w = [&](int layer) { stage_fragments(sm.w, block(layer), W_BYTES, &sm.w_full); };  // thread 0
  auto unstage_w = [&](int phase) { unstage_fragments(w, sm.w, &sm.w_full, phase & 1, wg, t); };
  if (busy && staged) {
    if (tid == 0) stage_w(0);
    unstage_w(0);
    __syncthreads();
  } else if (busy) {
    load_w(0);
  }
  for (int layer = 0; layer < layers; ++layer) {
    if (busy) {
      mark(layer, 0);
      if (tid == 0) burst_load(sm.a, &a_map, sm.full, BOXES, NWG, 0);
      float d[ACC];
      mma_boxes<BPW>(d, w, sm.a, sm.full, wg * BPW, layer & 1, [&] { mark(layer, 1); });
      mark(layer, 2);
      if (staged) {
        asm volatile("bar.sync 2, %0;" ::"r"(NWG * 128) : "memory");  // every warpgroup's MMAs done with the region
        if (tid == 0 && layer + 1 < layers) stage_w(w_layer * (layer + 1));
      } else if (layer + 1 < layers) {
        load_w(w_layer * (layer + 1));  // in flight through the epilogue and the barrier
      }
      sum_warpgroups<NWG>(d, sm.red, wg, t);
      if (wg == 0) {
        // m64nN accumulator: row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) +
        // 2 * (lane % 4) + i % 2; rows r and r + 8 are one feature's gate and up
        const int warp = t / 32, lane = t % 32, feature = tile * FEAT + 8 * warp + lane / 4;
#pragma unroll
        for (int i = 0; i < ACC; ++i) {
          if (i % 4 >= 2) continue;
          const int token = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
          if (token < rows) act[token * FF + feature] = __float2bfloat16(gelu_tanh(d[i]) * d[i + 2]);
        }
      }
    }
    __syncthreads();
    if (busy) mark(layer, 3);
    if (tid == 0) grid_arrive(counter);
    if (busy && staged && layer + 1 < layers) unstage_w(layer + 1);  // while the other CTAs arrive
    __syncthreads();
    if (tid == 0) grid_wait(counter, (layer + 1) * gridDim.x);
    __syncthreads();
  }
}

template <int NWG>
static int launch(const CUtensorMap& a_map, const void* wfrag, void* act, unsigned int* counter, long long* trace,
                  int layers, int rows, int grid, int mode, cudaStream_t stream) {
  const int smem = sizeof(RsSmem<NWG>) + 1024;
  cudaFuncSetAttribute(gate_up_rs_kernel<NWG>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  gate_up_rs_kernel<NWG><<<grid, NWG * 128, smem, stream>>>(a_map, static_cast<const uint4*>(wfrag),
                                                             static_cast<__nv_bfloat16*>(act), counter, trace, layers,
                                                             rows, mode);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace proto

// x [64, 1024] bf16 (rows past `rows` zero); wfrag: the weights in fragment order for `nwg`
// (gate_up_rs.py's `fragments`); act [64, 4096] bf16; counter: one zeroed uint32 per launch;
// trace: null or [layers, grid, TRACE_EVENTS] int64. Returns 0, a cudaError, or -3 (no such nwg).
extern "C" int gate_up_rs_launch(const void* x, const void* wfrag, void* act, unsigned int* counter, long long* trace,
                                 int layers, int rows, int grid, int nwg, int mode, cudaStream_t stream) {
  using namespace proto;
  CUtensorMap a_map = tile_map(x, 64, KDIM, NTOK, 64);
  switch (nwg) {
    case 2: return launch<2>(a_map, wfrag, act, counter, trace, layers, rows, grid, mode, stream);
    case 4: return launch<4>(a_map, wfrag, act, counter, trace, layers, rows, grid, mode, stream);
    default: return -3;
  }
}

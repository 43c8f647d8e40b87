// The skinny GEMM (gemm_skinny.h). One CTA: 4 or 8 warps, 64 or 128 weight rows (16 a
// warp: the A operand of m16n8k16) by BM = 8·MT token rows (MT n8 tiles: the B operands), over its
// split's share of k in 64-wide steps through a 4-stage cp.async pipeline. Shared-memory
// tiles hold rows of 64 elements (eight 16-byte chunks), chunk c of row r stored at
// c ^ (r & 7): the eight rows an ldmatrix reads land in distinct bank groups.
#include "backends/cuda/ops/gemm_skinny.h"

#include <cooperative_groups.h>

#include <atomic>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/linear_common.cuh"
#include "backends/cuda/ops/mma_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kSkK = 64, kSkStages = 4, kSkMaxSplits = 8;

template <int MT>
constexpr int sk_bm() {
  return MT * 8;
}
// NW warps: 16·NW weight rows a CTA. The f32 partial tile is [token][rows + 4]
// (conflict-free fragment stores).
template <int NW>
constexpr int sk_red_ld() {
  return NW * 16 + 4;
}
template <int MT, int NW>
constexpr size_t sk_smem_bytes() {
  const size_t pipe = size_t(kSkStages) * size_t(NW * 16 + sk_bm<MT>()) * kSkK * 2;
  const size_t red = size_t(sk_bm<MT>()) * sk_red_ld<NW>() * 4;
  return pipe > red ? pipe : red;
}

struct SkParams {
  const void* x;
  const void* w;
  const void* bias;
  const void* residual;
  void* y;
  int m, n, k, ldy, splits;
  GemvEpilogue act;  // kNone, kGeluErf, kGeluTanh or kSilu
};

__device__ __forceinline__ void sk_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();  // launched with splits > 1 only on sm_90+ (gemm_skinny_supported)
#endif
}
__device__ __forceinline__ const float* sk_peer(const float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(const_cast<float*>(p), rank);
#else
  (void)rank;
  return p;
#endif
}

template <typename T, int MT, int NW>
__global__ void __launch_bounds__(NW * 32) gemm_skinny_kernel(const SkParams p) {
  constexpr int BM = sk_bm<MT>(), kSkRows = NW * 16, kSkThreads = NW * 32, kSkRedLd = sk_red_ld<NW>();
  static_assert(MT % 2 == 0, "B fragments load two n8 tiles per ldmatrix");
  extern __shared__ __align__(16) unsigned char sk_smem[];
  // Stage st: weights at [st][rows][64], x at [stages][rows][64] + [st][BM][64] (elements).
  constexpr uint32_t kWStage = kSkRows * kSkK * 2, kXStage = BM * kSkK * 2;  // bytes
  const uint32_t smem0 = uint32_t(__cvta_generic_to_shared(sk_smem)), xsmem0 = smem0 + kSkStages * kWStage;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = int(blockIdx.x), n0 = int(blockIdx.y) * kSkRows;
  const int chunks = (p.k + kSkK - 1) / kSkK;
  const int c_begin = int(int64_t(split) * chunks / p.splits), c_end = int(int64_t(split + 1) * chunks / p.splits);
  const int nc = c_end - c_begin;

  // Copies: this thread moves 16-byte chunk `ch` of rows r0, r0 + threads / 8, ...; all its
  // rows share r0 & 7, so the swizzled offsets differ by whole rows. Pointers advance by
  // 64 elements a step; a row past n or m, or k past its end, is zero-filled.
  constexpr int kRowStep = kSkThreads / 8, kWPieces = kSkRows / kRowStep;
  constexpr int kXPieces = (BM + kRowStep - 1) / kRowStep;
  const int ch = tid & 7, r0 = tid >> 3;
  const uint32_t sw_off = uint32_t(r0 * kSkK + ((ch ^ (r0 & 7)) << 3)) * 2;
  const T* wp = static_cast<const T*>(p.w) + int64_t(n0 + r0) * p.k + int64_t(c_begin) * kSkK + ch * 8;
  const T* xp = static_cast<const T*>(p.x) + int64_t(r0) * p.k + int64_t(c_begin) * kSkK + ch * 8;
  const int64_t w_step_rows = int64_t(kRowStep) * p.k;
  uint32_t w_ok = 0, x_ok = 0;  // bit i: row r0 + i * kRowStep exists
#pragma unroll
  for (int i = 0; i < kWPieces; ++i) w_ok |= uint32_t(n0 + r0 + i * kRowStep < p.n) << i;
#pragma unroll
  for (int i = 0; i < kXPieces; ++i) x_ok |= uint32_t(r0 + i * kRowStep < p.m && r0 + i * kRowStep < BM) << i;
  int k_left = p.k - (c_begin * kSkK + ch * 8);  // elements of this thread's column left in k

  auto load_w = [&](int slot, int step) {
    const bool col_ok = k_left - step * kSkK > 0;
#pragma unroll
    for (int i = 0; i < kWPieces; ++i) {
      const bool ok = col_ok && (w_ok >> i & 1);
      cp_async16_u32(smem0 + slot * kWStage + sw_off + uint32_t(i * kRowStep * kSkK * 2),
                     ok ? wp + i * w_step_rows + step * kSkK : p.w, ok);
    }
  };
  auto load_x = [&](int slot, int step) {
    const bool col_ok = k_left - step * kSkK > 0;
#pragma unroll
    for (int i = 0; i < kXPieces; ++i) {
      if (BM % kRowStep != 0 && r0 + i * kRowStep >= BM) break;
      const bool ok = col_ok && (x_ok >> i & 1);
      cp_async16_u32(xsmem0 + slot * kXStage + sw_off + uint32_t(i * kRowStep * kSkK * 2),
                     ok ? xp + i * w_step_rows + step * kSkK : p.x, ok);
    }
  };

  // Weights first: no kernel writes them, so they stream while the previous kernel ends.
#pragma unroll
  for (int st = 0; st < kSkStages - 1; ++st)
    if (st < nc) load_w(st, st);
  pdl_wait();
#pragma unroll
  for (int st = 0; st < kSkStages - 1; ++st) {
    if (st < nc) load_x(st, st);
    cp_async_commit();
  }

  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  // Fragment addresses within a stage (bytes). A: rows warp·16 + (lane & 15), k half
  // lane >> 4; B (two n8 tiles a load): rows (lane & 7) + (lane >> 4)·8 of the pair, k half
  // (lane >> 3) & 1. A row's chunk c sits at c ^ (row & 7), and row & 7 is lane & 7 for both.
  const int ar = warp * 16 + (lane & 15), br = (lane & 7) + ((lane >> 4) << 3);
  const int ahalf = lane >> 4, bhalf = (lane >> 3) & 1, sx = lane & 7;
  uint32_t a_off[kSkK / 16], b_off[kSkK / 16];
#pragma unroll
  for (int kk = 0; kk < kSkK / 16; ++kk) {
    a_off[kk] = uint32_t(ar * kSkK + (((kk * 2 + ahalf) ^ sx) << 3)) * 2;
    b_off[kk] = uint32_t(br * kSkK + (((kk * 2 + bhalf) ^ sx) << 3)) * 2;
  }

  int slot = 0, fill = kSkStages - 1;  // the stage read now, the stage loaded next
  for (int i = 0; i < nc; ++i) {
    cp_async_wait<kSkStages - 2>();
    __syncthreads();  // stage i landed for every thread; the slot read at i - 1 is free
    if (i + kSkStages - 1 < nc) {
      load_w(fill, i + kSkStages - 1);
      load_x(fill, i + kSkStages - 1);
    }
    cp_async_commit();
    const uint32_t wt = smem0 + slot * kWStage, xt = xsmem0 + slot * kXStage;
#pragma unroll
    for (int kk = 0; kk < kSkK / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4_u32(a, wt + a_off[kk]);
#pragma unroll
      for (int j = 0; j < MT; j += 2) {
        uint32_t b[4];
        ldmatrix_x4_u32(b, xt + b_off[kk] + uint32_t(j * 8 * kSkK * 2));
        mma16816<T>(acc[j], a, b[0], b[1]);
        mma16816<T>(acc[j + 1], a, b[2], b[3]);
      }
    }
    slot = slot + 1 == kSkStages ? 0 : slot + 1;
    fill = fill + 1 == kSkStages ? 0 : fill + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the pipeline's shared memory
  pdl_trigger();    // the weights are read: the next kernel may launch

  // The partial tile, token-major: this thread holds weight rows warp·16 + g (+ 8) of
  // tokens 8j + 2t, + 1 (the mma's C layout).
  float* red = reinterpret_cast<float*>(sk_smem);
  {
    const int g = lane >> 2, t = lane & 3, r0 = warp * 16 + g;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const int tok = j * 8 + 2 * t;
      red[tok * kSkRedLd + r0] = acc[j][0];
      red[(tok + 1) * kSkRedLd + r0] = acc[j][1];
      red[tok * kSkRedLd + r0 + 8] = acc[j][2];
      red[(tok + 1) * kSkRedLd + r0 + 8] = acc[j][3];
    }
  }
  if (p.splits > 1)
    sk_cluster_sync();  // every split's partial is in its shared memory
  else
    __syncthreads();

  // This CTA's share of the tile's tokens: the sum over splits in rank order, + bias +
  // residual in f32, one rounding; two adjacent weight rows a thread.
  const int per = BM / p.splits, tok0 = split * per;
  const T* __restrict__ bias = static_cast<const T*>(p.bias);
  const T* __restrict__ res = static_cast<const T*>(p.residual);
  T* __restrict__ y = static_cast<T*>(p.y);
  for (int e = tid; e < per * (kSkRows / 2); e += kSkThreads) {
    const int tok = tok0 + e / (kSkRows / 2), r = (e % (kSkRows / 2)) * 2, col = n0 + r;
    if (tok >= p.m || col >= p.n) continue;  // n is even: col + 1 < n too
    // Every split's pair requested before any is added (one distributed shared-memory
    // round trip, not one per split), then summed in rank order.
    float2 pv[kSkMaxSplits];
#pragma unroll
    for (int sp = 0; sp < kSkMaxSplits; ++sp)
      if (sp < p.splits)
        pv[sp] = *reinterpret_cast<const float2*>((p.splits > 1 ? sk_peer(red, sp) : red) + tok * kSkRedLd + r);
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int sp = 0; sp < kSkMaxSplits; ++sp)
      if (sp < p.splits) {
        v0 += pv[sp].x;
        v1 += pv[sp].y;
      }
    if (bias) {
      v0 += to_f32(bias[col]);
      v1 += to_f32(bias[col + 1]);
    }
    const int64_t at = int64_t(tok) * p.ldy + col;
    if (p.act != GemvEpilogue::kNone) {
      // As cuBLASLt's T output, the activation pass and the residual add would round.
      const T a0 = linear_epilogue_out<T>(p.act, v0), a1 = linear_epilogue_out<T>(p.act, v1);
      y[at] = res ? from_f32<T>(to_f32(a0) + to_f32(res[at])) : a0;
      y[at + 1] = res ? from_f32<T>(to_f32(a1) + to_f32(res[at + 1])) : a1;
      continue;
    }
    if (res) {
      v0 += to_f32(res[at]);
      v1 += to_f32(res[at + 1]);
    }
    y[at] = from_f32<T>(v0);
    y[at + 1] = from_f32<T>(v1);
  }
  if (p.splits > 1) sk_cluster_sync();  // no CTA leaves while a peer still reads its tile
}

template <typename T, int MT, int NW>
void launch_mt(const SkParams& p, int64_t n, cudaStream_t s) {
  auto* kernel = gemm_skinny_kernel<T, MT, NW>;
  constexpr size_t smem = sk_smem_bytes<MT, NW>();
  // The shared-memory attribute is per device: one bit per device this instantiation has
  // set it on (devices past 63 set it at every launch).
  static std::atomic<uint64_t> attr_set{0};
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (!bit || !(attr_set.load(std::memory_order_acquire) & bit)) {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr_set.fetch_or(bit, std::memory_order_acq_rel);
  }
  const dim3 grid(unsigned(p.splits), unsigned((n + NW * 16 - 1) / (NW * 16)));
  launch_k_cluster(kernel, grid, dim3(NW * 32), smem, s, dim3(unsigned(p.splits), 1, 1), p);
}

template <typename T, int NW>
void launch_typed(const SkParams& p, int64_t n, cudaStream_t s) {
  if (p.m <= 16) launch_mt<T, 2, NW>(p, n, s);
  else if (p.m <= 32) launch_mt<T, 4, NW>(p, n, s);
  else if (p.m <= 64) launch_mt<T, 8, NW>(p, n, s);
  else launch_mt<T, 16, NW>(p, n, s);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Compute capability major of each device, read once (0: not read yet).
int device_major() {
  static std::atomic<int> major[64];
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) return 0;
  int v = major[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev));
    major[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

}  // namespace

bool gemm_skinny_supported(DType t, int64_t m, int64_t n, int64_t k, int64_t ldy, const void* x, const void* w,
                           const void* bias, const void* y, const void* residual) {
  if (ldy == 0) ldy = n;
  if (t != DType::kBF16 && t != DType::kF16) return false;
  if (m < 1 || m > kSkinnyMaxRows || n < 2 || n % 2 != 0 || k < 8 || k % 8 != 0 || ldy < n || ldy % 2 != 0)
    return false;
  if (n > int64_t(65535) * 64 || k > (int64_t(1) << 30) || ldy > (int64_t(1) << 30)) return false;
  if (!aligned16(x) || !aligned16(w) || !aligned16(y) || (bias && !aligned16(bias)) ||
      (residual && !aligned16(residual)))
    return false;
  return device_major() >= 9;
}

bool gemm_skinny_config_useful(int config, int64_t k) {
  if (config < 0 || config >= kSkinnyConfigs) return false;
  const int64_t chunks = (k + kSkK - 1) / kSkK;
  return chunks >= 2 * int64_t(kSkinnyConfigList[config].splits);
}

void launch_gemm_skinny(int config, DType t, const void* x, const void* w, const void* bias, const void* residual,
                        void* y, int64_t m, int64_t n, int64_t k, int64_t ldy, cudaStream_t s, GemvEpilogue act) {
  KILN_THROW_IF(act == GemvEpilogue::kSwiGlu, kInternal, "cuda skinny gemm: no SwiGLU epilogue");
  KILN_THROW_IF(config < 0 || config >= kSkinnyConfigs, kInternal, "cuda skinny gemm: configuration ", config);
  KILN_THROW_IF(!gemm_skinny_supported(t, m, n, k, ldy, x, w, bias, y, residual), kInternal,
                "cuda skinny gemm: unsupported call (", dtype_name(t), " m=", m, " n=", n, " k=", k, " ldy=", ldy,
                ")");
  const SkinnyConfig c = kSkinnyConfigList[config];
  const SkParams p{x, w, bias, residual, y, int(m), int(n), int(k), int(ldy == 0 ? n : ldy), c.splits, act};
  if (t == DType::kBF16) {
    if (c.rows == 128) launch_typed<__nv_bfloat16, 8>(p, n, s);
    else launch_typed<__nv_bfloat16, 4>(p, n, s);
  } else {
    if (c.rows == 128) launch_typed<__half, 8>(p, n, s);
    else launch_typed<__half, 4>(p, n, s);
  }
}

}  // namespace kiln::cuda

// The skinny GEMM (see skinny_gemm.h): a CTA of 4 warps owns BN weight rows and all MP
// (padded) token rows. The weight is the mma's A operand (16 rows per m16n8k16 tile), the
// tokens its N (8 per tile), as in gemv_quant_mma.cu; a warp holds MT x NT tiles of
// accumulators so each fragment it loads from shared memory feeds several mmas. Each stage
// of the cp.async ring holds a [BN][64] weight tile and an [MP][64] activation tile, 128-byte
// rows whose 16-byte chunks are XOR-swizzled by row (ldmatrix's 8 rows of a chunk then hit
// distinct banks); out-of-range rows and k past K are zero-filled by the copy itself. With
// SwiGLU a tile's 16-row groups hold 8 gate rows then the matching 8 up rows, so one
// reduction row pair gives an output. After the K loop the f32 sums go to shared memory;
// with split-K (grid.y = the cluster's CTAs, each a contiguous K range) the cluster syncs
// and every CTA reduces a slice of the outputs, adding the CTAs' partials in rank order.
// Tested by tests/backends/cuda/skinny_test.cpp; timed by bench/cuda_gemv_bench.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "backends/cuda/ops/linear_common.cuh"
#include "backends/cuda/ops/skinny_gemm.h"

namespace kiln::cuda {
namespace {

constexpr int kBK = 64;         // k per stage: a 128-byte row of 8 16-byte chunks
constexpr int kThreads = 128;   // 4 warps
constexpr int kMinKTiles = 4;   // k tiles per split at least (256 of K)
constexpr int kMaxDevices = 64;

struct SkArgs {
  const void* x;
  const void* w;
  const void* bias;
  void* y;
  int m, n_out, k, split;
  GemvEpilogue epi;
};

// BN weight rows x MP token rows per CTA, WN x WM warps, STAGES ring slots.
template <int BN_, int MP_, int WN_, int WM_, int STAGES_>
struct Cfg {
  static constexpr int BN = BN_, MP = MP_, WN = WN_, WM = WM_, STAGES = STAGES_;
  static constexpr int MT = BN / (16 * WN), NT = MP / (8 * WM);
  static constexpr int kLdR = BN + 4;  // f32 stride of the split-K partials' token rows (no bank conflicts)
  static constexpr int kStageBytes = (BN + MP) * kBK * 2;
  static constexpr int kRedBytes = MP * kLdR * 4;
  static constexpr int kSmem = STAGES * kStageBytes > kRedBytes ? STAGES * kStageBytes : kRedBytes;
  static_assert(WN * WM * 32 == kThreads && MT >= 1 && NT % 2 == 0 && BN % 16 == 0 && MP % 16 == 0);
};
using Cfg16 = Cfg<64, 16, 4, 1, 6>;     // m <= 16: 60 KB, 3 CTAs per SM
using Cfg32 = Cfg<64, 32, 4, 1, 6>;     // m <= 32: 72 KB
using Cfg64 = Cfg<64, 64, 2, 2, 5>;     // m <= 64: 80 KB, 2 x 4 tiles per warp
using Cfg128 = Cfg<128, 128, 2, 2, 3>;  // m <= 128: 96 KB (2 CTAs per SM), 4 x 8 tiles per warp
                                        // (128 f32 accumulators, ~214 registers)

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 128 + ((c ^ (r & 7)) << 4)); }

__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();  // split-K is launched only on sm_90+
#endif
}
__device__ __forceinline__ const float* cluster_rank_smem(float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  __trap();
  return p;
#endif
}

template <typename T, class C, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads, 1) skinny_kernel(const SkArgs a) {
  constexpr int BN = C::BN, MP = C::MP, MT = C::MT, NT = C::NT, STAGES = C::STAGES;
  constexpr int kOuts = kSwiGlu ? BN / 2 : BN;
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wn = warp % C::WN, wm = warp / C::WN;
  const int o0 = int(blockIdx.x) * kOuts;
  const int split = a.split, part = int(blockIdx.y);
  const int k_tiles = (a.k + kBK - 1) / kBK;
  const int kt0 = int(int64_t(k_tiles) * part / split), nkt = int(int64_t(k_tiles) * (part + 1) / split) - kt0;

  // Loads: thread i copies chunk c = i % 8 of tile rows i / 8 + 16 j (j = 0, 1, ...), so
  // its rows share their low 3 bits (and their swizzle) and advance by a fixed stride.
  const int lr = int(threadIdx.x) >> 3, lc = int(threadIdx.x) & 7;
  const T* w = static_cast<const T*>(a.w);
  const T* x = static_cast<const T*>(a.x);
  // Weight tile row lr + 16 j -> output o(j) = wo + wstep j, weight row o(j) + whalf.
  const int wo = kSwiGlu ? o0 + (lr & 7) : o0 + lr, wstep = kSwiGlu ? 8 : 16;
  const int64_t whalf = kSwiGlu ? int64_t(lr >> 3) * a.n_out : 0;
  const T* wbase = w + (int64_t(wo) + whalf) * a.k + lc * 8;
  const T* xbase = x + int64_t(lr) * a.k + lc * 8;
  const uint32_t dst0 = swz(lr, lc);

  // Plain cp.async: the L2::cache_hint form with a source size (evict-first weights) raised
  // an illegal instruction on the H200 (driver 580), so the weights take the default policy.
  auto load_w = [&](int slot, int kt) {
    uint8_t* st = smem + slot * C::kStageBytes;
    const int kb = kt * kBK;
    const bool k_ok = kb + lc * 8 < a.k;
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) {
      const bool ok = k_ok && wo + wstep * j < a.n_out;
      cp_async16(st + dst0 + j * 16 * 128, ok ? wbase + int64_t(wstep * j) * a.k + kb : w, ok);
    }
  };
  auto load_x = [&](int slot, int kt) {
    uint8_t* st = smem + slot * C::kStageBytes + BN * 128;
    const int kb = kt * kBK;
    const bool k_ok = kb + lc * 8 < a.k;
#pragma unroll
    for (int j = 0; j < MP / 16; ++j) {
      const bool ok = k_ok && lr + 16 * j < a.m;
      cp_async16(st + dst0 + j * 16 * 128, ok ? xbase + int64_t(16 * j) * a.k + kb : x, ok);
    }
  };

  // The first stages' weights are requested before the PDL wait (the weights are never
  // written by an earlier kernel: launch_skinny_gemm's contract), overlapping the previous
  // kernel's tail; they join the first commit group, so waiting for stage 0 covers them.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < nkt) load_w(s, kt0 + s);
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes (x) are visible
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkt) load_x(s, kt0 + s);
    cp_async_commit();  // always: the wait below counts groups
  }
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;

  for (int it = 0; it < nkt; ++it) {
    cp_async_wait<STAGES - 2>();  // tile `it` has landed (for this thread's copies)...
    __syncthreads();              // ...for every thread's, and slot it-1 is no longer read
    const int next = it + STAGES - 1;
    if (next < nkt) load_w(next % STAGES, kt0 + next), load_x(next % STAGES, kt0 + next);
    cp_async_commit();
    const uint8_t* sw = smem + (it % STAGES) * C::kStageBytes;
    const uint8_t* sx = sw + BN * 128;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[MT][4], bf[NT][2];
#pragma unroll
      for (int i = 0; i < MT; ++i)  // matrices: rows 0-7 / 8-15 x k 0-7 / 8-15 of the 16x16 tile
        ldmatrix_x4(af[i], sw + swz(wn * 16 * MT + 16 * i + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < NT; j += 2) {  // matrices: token tiles j, j+1 x k 0-7 / 8-15
        uint32_t r[4];
        ldmatrix_x4(r, sx + swz(wm * 8 * NT + 8 * (j + (lane >> 4)) + (lane & 7), 2 * kk + ((lane >> 3) & 1)));
        bf[j][0] = r[0], bf[j][1] = r[1], bf[j + 1][0] = r[2], bf[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_16816<T>(acc[i][j], af[i], bf[j][0], bf[j][1], acc[i][j]);
    }
  }
  cp_async_wait<0>();
  pdl_trigger();  // the weights are read: the next kernel may launch (it waits for our writes)
  const T* bias = static_cast<const T*>(a.bias);
  T* y = static_cast<T*>(a.y);

  if (split == 1) {
    // Straight from the accumulators: lane (g, t) holds rows g, g+8 of each 16-row tile
    // (with SwiGLU the gate and up rows of one output) for tokens 2t, 2t+1 of each 8.
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = wm * 8 * NT + 8 * j + 2 * t + e;
          if (tok >= a.m) continue;
          if constexpr (kSwiGlu) {
            const int o = o0 + 8 * (wn * MT + i) + g;
            if (o >= a.n_out) continue;
            float gate = acc[i][j][e], up = acc[i][j][2 + e];
            if (bias) gate += to_f32(bias[o]), up += to_f32(bias[a.n_out + o]);
            y[int64_t(tok) * a.n_out + o] = linear_swiglu_out<T>(gate, up);
          } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int o = o0 + wn * 16 * MT + 16 * i + g + 8 * h;
              if (o >= a.n_out) continue;
              float v = acc[i][j][2 * h + e];
              if (bias) v += to_f32(bias[o]);
              y[int64_t(tok) * a.n_out + o] = linear_epilogue_out<T>(a.epi, v);
            }
          }
        }
    return;
  }

  // Split-K: the partials go to shared memory as red[token][row] (the ring is free once
  // every warp is past its last tile), the cluster syncs, and CTA `part` finishes its share
  // of the (token, 4-row group) items, adding the CTAs' float4s in rank order (the same sums
  // on every run); a warp's items are consecutive rows of one token: contiguous stores.
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int r = wn * 16 * MT + 16 * i + g + 8 * (c >> 1), tok = wm * 8 * NT + 8 * j + 2 * t + (c & 1);
        red[tok * C::kLdR + r] = acc[i][j][c];
      }
  cluster_sync();  // every CTA's partials are written and visible cluster-wide
  constexpr int kGroups = kSwiGlu ? BN / 8 : BN / 4;  // 4-row groups of outputs per token
  constexpr int kU = 2;                               // items whose loads are issued together
  const int items = kGroups * a.m, lo = items * part / split, hi = items * (part + 1) / split;
  for (int base = lo + int(threadIdx.x); base < hi; base += kThreads * kU) {
    float4 v[kU][2];
    int tok[kU], r[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int idx = base + u * kThreads, q = idx % kGroups;
      tok[u] = idx / kGroups;
      // SwiGLU: gate rows 16 (q/2) + 4 (q%2) + 0..3, their up rows 8 further.
      r[u] = kSwiGlu ? 16 * (q >> 1) + 4 * (q & 1) : 4 * q;
      v[u][0] = v[u][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (idx >= hi) continue;
#pragma unroll
      for (int p = 0; p < kSkinnyMaxSplit; ++p) {
        if (p >= split) break;
        const float* rp = cluster_rank_smem(red, p) + tok[u] * C::kLdR + r[u];
#pragma unroll
        for (int h = 0; h < (kSwiGlu ? 2 : 1); ++h) {
          const float4 w4 = *reinterpret_cast<const float4*>(rp + 8 * h);
          v[u][h].x += w4.x, v[u][h].y += w4.y, v[u][h].z += w4.z, v[u][h].w += w4.w;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (base + u * kThreads >= hi) continue;
      const float s0[4] = {v[u][0].x, v[u][0].y, v[u][0].z, v[u][0].w};
      const float s1[4] = {v[u][1].x, v[u][1].y, v[u][1].z, v[u][1].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kSwiGlu) {
          const int o = o0 + 8 * (r[u] >> 4) + (r[u] & 7) + e;
          if (o >= a.n_out) continue;
          float gate = s0[e], up = s1[e];
          if (bias) gate += to_f32(bias[o]), up += to_f32(bias[a.n_out + o]);
          y[int64_t(tok[u]) * a.n_out + o] = linear_swiglu_out<T>(gate, up);
        } else {
          const int o = o0 + r[u] + e;
          if (o >= a.n_out) continue;
          float x0 = s0[e];
          if (bias) x0 += to_f32(bias[o]);
          y[int64_t(tok[u]) * a.n_out + o] = linear_epilogue_out<T>(a.epi, x0);
        }
      }
    }
  }
  cluster_sync();  // no CTA leaves while others may still read its shared memory
}

struct DeviceInfo {
  int sms = 0, major = 0, smem_optin = 0;
};

DeviceInfo device_info() {
  static std::atomic<int> sms[kMaxDevices], major[kMaxDevices], smem[kMaxDevices];
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CHECK(dev >= 0 && dev < kMaxDevices, "cuda skinny gemm: device ", dev, " out of range");
  if (sms[dev].load() == 0) {  // racing threads store the same values
    int v = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev));
    major[dev].store(v);
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    smem[dev].store(v);
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    sms[dev].store(v);
  }
  return {sms[dev].load(), major[dev].load(), smem[dev].load()};
}

// The kernel for m rows, its shared memory raised to what it needs and its CTAs per SM
// measured, once per device.
template <typename T, class C, bool kSwiGlu>
int kernel_occupancy() {
  static std::atomic<int> occ[kMaxDevices];
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CHECK(dev >= 0 && dev < kMaxDevices, "cuda skinny gemm: device ", dev, " out of range");
  if (occ[dev].load() == 0) {
    auto* kernel = skinny_kernel<T, C, kSwiGlu>;
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
    int n = 0;
    KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, C::kSmem));
    occ[dev].store(std::max(n, 1));
  }
  return occ[dev].load();
}

int env_split() {
  static const int v = [] {
    const char* e = std::getenv("KILN_CUDA_SKINNY_SPLIT");
    if (!e || !*e) return 0;
    char* end = nullptr;
    const long s = std::strtol(e, &end, 10);
    KILN_THROW_IF(*end != '\0' || s < 1 || s > kSkinnyMaxSplit, kInvalidArgument, "KILN_CUDA_SKINNY_SPLIT='", e,
                  "': expected a split-K factor from 1 to ", kSkinnyMaxSplit);
    return int(s);
  }();
  return v;
}

// Split K until the CTAs cover every SM, within one wave of resident CTAs, each split
// keeping kMinKTiles tiles; only sm_90+ (the reduction goes through a cluster).
int choose_split(int64_t tiles, int64_t k, int occupancy, const DeviceInfo& d) {
  if (d.major < 9) return 1;
  const int64_t k_tiles = (k + kBK - 1) / kBK, slots = int64_t(d.sms) * occupancy;
  int64_t s = (d.sms + tiles - 1) / tiles;
  s = std::min<int64_t>({s, kSkinnyMaxSplit, std::max<int64_t>(1, k_tiles / kMinKTiles)});
  if (tiles * s > slots) s = std::max<int64_t>(1, slots / tiles);
  return int(s);
}

template <class C>
int64_t tiles_for(int64_t n_out, bool swiglu) {
  const int64_t outs = swiglu ? C::BN / 2 : C::BN;
  return (n_out + outs - 1) / outs;
}

template <typename T, class C, bool kSwiGlu>
int split_cfg(int64_t n_out, int64_t k) {
  if (const int e = env_split()) return e;
  return choose_split(tiles_for<C>(n_out, kSwiGlu), k, kernel_occupancy<T, C, kSwiGlu>(), device_info());
}

template <typename T, class C, bool kSwiGlu>
void launch_cfg(SkArgs a, cudaStream_t s, int split) {
  auto* kernel = skinny_kernel<T, C, kSwiGlu>;
  kernel_occupancy<T, C, kSwiGlu>();  // sets the shared-memory attribute on this device
  if (split <= 0) split = split_cfg<T, C, kSwiGlu>(a.n_out, a.k);
  KILN_THROW_IF(split > 1 && device_info().major < 9, kUnsupported,
                "cuda skinny gemm: split-K ", split, " needs thread-block clusters (sm_90+)");
  a.split = split;
  const dim3 grid(unsigned(tiles_for<C>(a.n_out, kSwiGlu)), unsigned(split));
  launch_k_cluster(kernel, grid, kThreads, C::kSmem, s, dim3(1, unsigned(split), 1), a);
  KILN_CUDA_CHECK_LAUNCH();
}

// The one dispatch from (m, epilogue) to the kernel's template arguments; `f` is called
// as f.template operator()<C, kSwiGlu>().
template <typename F>
decltype(auto) with_cfg(int64_t m, bool swiglu, F&& f) {
  auto pick = [&]<bool S>() -> decltype(auto) {
    if (m <= 16) return f.template operator()<Cfg16, S>();
    if (m <= 32) return f.template operator()<Cfg32, S>();
    if (m <= 64) return f.template operator()<Cfg64, S>();
    return f.template operator()<Cfg128, S>();
  };
  return swiglu ? pick.template operator()<true>() : pick.template operator()<false>();
}

int smem_for(int64_t m) {
  return m <= 16 ? Cfg16::kSmem : m <= 32 ? Cfg32::kSmem : m <= 64 ? Cfg64::kSmem : Cfg128::kSmem;
}

}  // namespace

bool skinny_supports(DType dtype, int64_t m, int64_t k) {
  if (!(dtype == DType::kBF16 || dtype == DType::kF16) || m < 1 || m > kSkinnyMaxRows || k <= 0 || k % 8 != 0 ||
      k >= (int64_t(1) << 30))
    return false;
  const DeviceInfo d = device_info();
  return d.major >= 8 && d.smem_optin >= smem_for(m);  // mma.sync with bf16, cp.async: sm_80+
}

int64_t skinny_rows_limit() {  // read at every call: Linears call it when they are prepared
  // Off unless asked for: on the H200 it was never faster than cuBLASLt's tuned GEMMs at
  // 8-64 rows (Llama-3.2-1B batch decode: equal at 8 and 16, 1.40 vs 1.36 ms at 32,
  // 1.75 vs 1.51 ms at 64; bench/RESULTS.md).
  const char* e = std::getenv("KILN_CUDA_SKINNY");
  if (!e || !*e) return 0;
  char* end = nullptr;
  const long r = std::strtol(e, &end, 10);
  KILN_THROW_IF(*end != '\0' || r < 0 || r > kSkinnyMaxRows, kInvalidArgument, "KILN_CUDA_SKINNY='", e,
                "': expected 0 (off) or the most token rows for the skinny GEMM, up to ", kSkinnyMaxRows);
  return int64_t(r);
}

int skinny_split_for(int64_t m, int64_t n_out, int64_t k, GemvEpilogue epi) {
  return with_cfg(m, epi == GemvEpilogue::kSwiGlu,
                  [&]<class C, bool S>() { return split_cfg<__nv_bfloat16, C, S>(n_out, k); });
}

void launch_skinny_gemm(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                        int64_t k, cudaStream_t s, GemvEpilogue epi, int split) {
  KILN_THROW_IF(!skinny_supports(dtype, m, k), kInternal, "cuda skinny gemm: unsupported ", dtype_name(dtype),
                " m=", m, " k=", k);
  KILN_THROW_IF(n < 0 || n >= (int64_t(1) << 30) || split < 0 || split > kSkinnyMaxSplit, kInternal,
                "cuda skinny gemm: n=", n, " split=", split);
  if (n == 0) return;
  const SkArgs a{x, w, bias, y, int(m), int(n), int(k), 1, epi};
  const bool swiglu = epi == GemvEpilogue::kSwiGlu;
  if (dtype == DType::kBF16)
    with_cfg(m, swiglu, [&]<class C, bool S>() { launch_cfg<__nv_bfloat16, C, S>(a, s, split); });
  else
    with_cfg(m, swiglu, [&]<class C, bool S>() { launch_cfg<__half, C, S>(a, s, split); });
}

}  // namespace kiln::cuda

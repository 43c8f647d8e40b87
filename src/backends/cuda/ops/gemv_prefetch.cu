// The prefetching GEMV (GemvKind::kPrefetch, gemv.h) for 1-4 token rows on Hopper: the
// weight-streaming GEMV of a decode step arranged so that its weights are in flight before
// the kernel ahead of it has finished. One CTA per SM owns a contiguous slice of output
// features; a producer warp streams the slice's weights with 1-D bulk copies (TMA without
// a tensor map) into a ring of 16 KB shared-memory stages (mbarrier "full"/"empty" per
// stage), eight consumer warps take the stages in order. The first ring's worth is
// requested before griddepcontrol.wait (weights are never written by a kernel), and every
// CTA triggers its dependents at its start, so the next kernel of the chain launches and
// starts its own prefetch while this one streams. Tested against the CPU reference and the
// streaming kernel in tests/backends/cuda/gemv_prefetch_test.cpp.
//
// Tiles: while 8 whole rows (x2 for SwiGLU's gate and up halves) fit a stage, a tile is a
// multiple of 8 whole rows (one copy per half: a slice's rows are contiguous) and each
// consumer warp finishes its rows inside the tile; longer rows are cut into tiles of 8 rows
// x 1024/R columns (one copy per row piece) and warp j keeps row j's sums across the
// row group's column tiles. Lane l always takes 16-byte chunks l, l+32, ... of a row in
// order, which is the streaming kernel's order with one warp per row: where that kernel
// does not split K (k < 1024 or n > 8192) the results are the same bits.
//
// Residency and ordering (the chain must never wait on a kernel that cannot run):
// - A dependent grid launches only once every CTA of this grid has triggered, i.e. is
//   resident; the dependent's CTAs then wait in griddepcontrol.wait for this grid to
//   complete, holding their slots. Nothing here waits on another CTA, so this grid always
//   completes, and the oldest unfinished kernel of the chain always has every CTA
//   resident: no cycle. Kernels that do wait on other CTAs keep out of early triggering
//   or cannot starve: the fused decode attention's last-split merge takes a ticket and
//   never spins; the P2P all-reduce (ops/allreduce.cu) spins on peer GPUs' flags, so it
//   is launched without the dependent-launch attribute and never triggers early - it
//   starts only after its predecessor completed and nothing launches beside it.
// - Every CTA executes griddepcontrol.wait before it stores, so this grid completes only
//   after the previous one (and, by induction, all before it): a later kernel reading an
//   older kernel's output (the residual stream) sees it.
// - Size: 288 threads, a 64 KB ring (+ x's rows, at most 32 KB) per CTA and at most 2
//   CTAs' worth of registers (__launch_bounds__ below): the next GEMV's CTA (and a
//   latency-bound kernel's) fits beside this one on each SM (228 KB of shared memory,
//   2048 threads, 64K registers), which is what lets the prefetch overlap.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/gemv_norm.cuh"
#include "backends/cuda/ops/gemv_prefetch.h"
#include "backends/cuda/ops/linear_common.cuh"
#include "core/log.h"

namespace kiln::cuda {
namespace {

constexpr int kPfWarps = 8;                      // consumer warps; warp kPfWarps is the producer
constexpr int kPfThreads = (kPfWarps + 1) * 32;  // 288
constexpr int kPfTileBytes = 16 << 10;           // one ring stage
constexpr int kPfMaxStages = 12;                 // 192 KB (+32 KB of x rows: under 227 KB per CTA)
constexpr int64_t kPfDefaultRingBytes = 64 << 10;

// Host-chosen geometry, identical for every CTA.
struct PfPlan {
  int rows_per_cta;  // output features per CTA (the last CTA may have fewer, never none)
  int tile_rows;     // features per tile
  int tile_k;        // columns per tile: k (whole rows) or 1024 / R
  int stages;        // ring stages
  int xs;            // 1: x's rows (normalized with a norm prologue) staged in shared memory
};

struct PfTile {
  int row0, rows, c0, cols;
};

__device__ __forceinline__ PfTile pf_tile(int t, int kt, const PfPlan& p, int r_begin, int r_end, int k) {
  const int g = t / kt, kk = t - g * kt;
  PfTile tl;
  tl.row0 = r_begin + g * p.tile_rows;
  tl.rows = min(p.tile_rows, r_end - tl.row0);
  tl.c0 = kk * p.tile_k;
  tl.cols = min(p.tile_k, k - tl.c0);
  return tl;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
// Returns once the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
  } while (!done);
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) global -> shared, counted on
// `bar`; evict-first in L2, as the streaming kernel's loads, so x and the KV cache stay.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}
#endif

// acc += the 8 products of one 16-byte chunk of weights and x (gemv.cu's Wide16::fma).
template <typename T>
__device__ __forceinline__ void fma8(float& acc, const uint4& w, const uint4& x) {
  const T* wv = reinterpret_cast<const T*>(&w);
  const T* xv = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(to_f32(wv[i]), to_f32(xv[i]), acc);
}

template <typename T, int M, GemvEpilogue E>
__global__ void __launch_bounds__(kPfThreads, 3)
gemv_prefetch_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* y, int n,
                     int k, PfPlan p, GemvNorm norm, const float* __restrict__ gamma, const float* __restrict__ beta,
                     float eps, const T* residual) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int R = E == GemvEpilogue::kSwiGlu ? 2 : 1;
  constexpr int kStageVecs = kPfTileBytes / 16;
  extern __shared__ uint4 pf_smem[];  // [stages][kStageVecs] ring, then x's M rows
  __shared__ __align__(8) uint64_t full[kPfMaxStages], empty[kPfMaxStages];
  // Dependents may launch as soon as every CTA of this grid is resident (see the file
  // comment for why this cannot starve anything); they wait for our stores themselves.
  pdl_trigger();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r_begin = int(blockIdx.x) * p.rows_per_cta, r_end = min(n, r_begin + p.rows_per_cta);
  const int kt = (k + p.tile_k - 1) / p.tile_k;  // column tiles per row group
  const int ntiles = (r_end - r_begin + p.tile_rows - 1) / p.tile_rows * kt;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      mbar_init(&full[s], 1);          // the producer's arrive, plus the copies' bytes
      mbar_init(&empty[s], kPfWarps);  // one arrive per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const bool producer = warp == kPfWarps;
  uint64_t policy = 0;
  if (producer) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  // Producer: tile t into stage t % stages once the consumers have released the stage's
  // previous tile (t - stages).
  auto produce = [&](int t) {
    const int st = t % p.stages;
    if (t >= p.stages) mbar_wait(&empty[st], uint32_t(t / p.stages - 1) & 1u);
    const PfTile tl = pf_tile(t, kt, p, r_begin, r_end, k);
    const uint32_t piece = uint32_t(tl.cols) * uint32_t(sizeof(T));
    const bool whole = tl.cols == k;  // the tile's rows of each half are contiguous in w
    const int pieces = whole ? R : R * tl.rows;
    char* dst = reinterpret_cast<char*>(pf_smem + size_t(st) * kStageVecs);
    if (lane == 0) mbar_arrive_expect_tx(&full[st], uint32_t(R * tl.rows) * piece);
    __syncwarp();
    for (int i = lane; i < pieces; i += 32) {
      const int r = whole ? i : i / tl.rows, j = whole ? 0 : i % tl.rows;
      const T* src = w + (int64_t(r) * n + tl.row0 + j) * k + tl.c0;
      bulk_copy(dst + size_t(r * tl.rows + j) * piece, src, whole ? piece * uint32_t(tl.rows) : piece, &full[st],
                policy);
    }
  };
  const int pre = min(ntiles, p.stages);
  if (producer)
    for (int t = 0; t < pre; ++t) produce(t);  // before the wait: the prefetch

  pdl_wait();  // the previous kernel's writes (x, the residual) are visible
  const int kv = k / 8;
  const uint4* xg = reinterpret_cast<const uint4*>(x);
  uint4* xs = pf_smem + size_t(p.stages) * kStageVecs;
  if (norm != GemvNorm::kNone) {
    gemv_norm_rows<T, M, kPfWarps + 1>(xg, xs, kv, k, norm, gamma, beta, eps);
  } else if (p.xs) {
    for (int i = threadIdx.x; i < M * kv; i += kPfThreads) xs[i] = __ldg(xg + i);
    __syncthreads();
  }
  if (producer) {
    for (int t = pre; t < ntiles; ++t) produce(t);
    return;
  }

  float acc[R][M];
  for (int t = 0; t < ntiles; ++t) {
    const int st = t % p.stages;
    mbar_wait(&full[st], uint32_t(t / p.stages) & 1u);
    const PfTile tl = pf_tile(t, kt, p, r_begin, r_end, k);
    const uint4* tile = pf_smem + size_t(st) * kStageVecs;
    const int cv = tl.cols / 8, c0v = tl.c0 / 8;
    // Column tiles exist only with tile_rows <= kPfWarps: warp j's one row per tile.
    for (int j = warp; j < tl.rows; j += kPfWarps) {
      if (tl.c0 == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
      }
      const uint4* wr[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wr[r] = tile + (r * tl.rows + j) * cv;
#pragma unroll 2
      for (int i = lane; i < cv; i += 32) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) wv[r] = wr[r][i];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = p.xs ? xs[m * kv + c0v + i] : __ldg(xg + int64_t(m) * kv + c0v + i);
#pragma unroll
          for (int r = 0; r < R; ++r) fma8<T>(acc[r][m], wv[r], xv);
        }
      }
      if (tl.c0 + tl.cols < k) continue;  // the row's sums go on in the next column tile
      const int row = tl.row0 + j;
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float v[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          v[r] = warp_sum(acc[r][m]);
          if (bias) v[r] += to_f32(bias[row + r * n]);
        }
        if (lane != 0) continue;
        // Rounded as the unfused kernels would (linear_common.cuh), as gemv_kernel does.
        const int64_t at = int64_t(m) * n + row;
        T out;
        if constexpr (E == GemvEpilogue::kSwiGlu) out = linear_swiglu_out<T>(v[0], v[R - 1]);
        else out = linear_epilogue_out<T>(E, v[0]);
        if (residual) out = from_f32<T>(to_f32(out) + to_f32(residual[at]));
        y[at] = out;
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[st]);  // this warp is done with the stage
  }
#else
  __trap();  // launch_gemv runs this kernel only on sm_90+
#endif
}

int current_device() {
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  return dev;
}

// Multiprocessors of the current device (0: not Hopper-class), cached per device.
int prefetch_sms() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> by_device[kMaxDevices] = {};  // 0 unknown, -1 unavailable, else SMs
  const int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices) return 0;
  int v = by_device[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, sms = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    v = major >= 9 && sms > 0 ? sms : -1;
    by_device[dev].store(v, std::memory_order_relaxed);
  }
  return v > 0 ? v : 0;
}

template <typename T, GemvEpilogue E, int M>
void launch_m(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t k, cudaStream_t s, const GemvFusion& f,
              const PfPlan& p, unsigned grid, size_t smem) {
  auto* kernel = gemv_prefetch_kernel<T, M, E>;
  // The largest ring and x rows this kernel may be given, set once per instantiation
  // (before any capture: the first call of a shape runs eagerly).
  static const bool sized = [&] {
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(kPfMaxStages * kPfTileBytes + kGemvNormSmemBytes)));
    return true;
  }();
  (void)sized;
  launch_k(kernel, dim3(grid), dim3(kPfThreads), smem, s, x, w, b, y, int(n), int(k), p, f.norm, f.gamma, f.beta,
           f.eps, static_cast<const T*>(f.residual));
}

template <typename T, GemvEpilogue E>
void launch_typed(const T* x, const T* w, const T* b, T* y, int64_t m, int64_t n, int64_t k, cudaStream_t s,
                  const GemvFusion& f) {
  constexpr int R = E == GemvEpilogue::kSwiGlu ? 2 : 1;
  const int sms = prefetch_sms();
  KILN_CHECK(sms > 0, "cuda prefetch gemv launched on a device before sm_90");
  PfPlan p;
  p.rows_per_cta = int((n + sms - 1) / sms);
  const unsigned grid = unsigned((n + p.rows_per_cta - 1) / p.rows_per_cta);
  const int64_t row_bytes = int64_t(R) * k * int64_t(sizeof(T));  // one feature's weights (both halves)
  if (row_bytes * kPfWarps <= kPfTileBytes) {  // whole rows, a multiple of 8 per tile
    p.tile_k = int(k);
    p.tile_rows = int(kPfTileBytes / row_bytes) / kPfWarps * kPfWarps;
  } else {  // 8 rows x 1024 / R columns (a multiple of 32 chunks: the lanes' order is kept)
    p.tile_k = kPfTileBytes / (R * kPfWarps * int(sizeof(T)));
    p.tile_rows = kPfWarps;
  }
  p.tile_rows = std::min(p.tile_rows, p.rows_per_cta);
  // No more stages than the largest slice has tiles: a small GEMV's CTAs then take less
  // shared memory, and more kernels of the chain fit beside each other.
  const int64_t tiles = (p.rows_per_cta + p.tile_rows - 1) / p.tile_rows * ((k + p.tile_k - 1) / p.tile_k);
  p.stages = int(std::min<int64_t>(gemv_prefetch_ring_bytes() / kPfTileBytes, tiles));
  const int64_t xs_bytes = m * k * int64_t(sizeof(T));
  p.xs = xs_bytes <= kGemvNormSmemBytes ? 1 : 0;
  KILN_CHECK(f.norm == GemvNorm::kNone || p.xs, "cuda prefetch gemv: norm rows of ", xs_bytes, " bytes");
  KILN_CHECK(p.stages >= 1 && p.stages <= kPfMaxStages && p.tile_rows >= 1, "cuda prefetch gemv: plan");
  const size_t smem = size_t(p.stages) * kPfTileBytes + (p.xs ? size_t(xs_bytes) : 0);
  switch (m) {
    case 1: launch_m<T, E, 1>(x, w, b, y, n, k, s, f, p, grid, smem); break;
    case 2: launch_m<T, E, 2>(x, w, b, y, n, k, s, f, p, grid, smem); break;
    case 3: launch_m<T, E, 3>(x, w, b, y, n, k, s, f, p, grid, smem); break;
    default: launch_m<T, E, 4>(x, w, b, y, n, k, s, f, p, grid, smem); break;
  }
}

template <typename T>
void launch_epi(const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n, int64_t k,
                cudaStream_t s, GemvEpilogue epi, const GemvFusion& f) {
  auto* xt = static_cast<const T*>(x);
  auto* wt = static_cast<const T*>(w);
  auto* bt = static_cast<const T*>(bias);
  auto* yt = static_cast<T*>(y);
  switch (epi) {
    case GemvEpilogue::kNone: launch_typed<T, GemvEpilogue::kNone>(xt, wt, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kGeluErf: launch_typed<T, GemvEpilogue::kGeluErf>(xt, wt, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kGeluTanh: launch_typed<T, GemvEpilogue::kGeluTanh>(xt, wt, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kSilu: launch_typed<T, GemvEpilogue::kSilu>(xt, wt, bt, yt, m, n, k, s, f); break;
    case GemvEpilogue::kSwiGlu: launch_typed<T, GemvEpilogue::kSwiGlu>(xt, wt, bt, yt, m, n, k, s, f); break;
  }
}

}  // namespace

GemvChoice gemv_choice_from_env() {
  const char* e = std::getenv("KILN_CUDA_GEMV");
  if (!e || !*e || std::strcmp(e, "stream") == 0) return {};
  if (std::strcmp(e, "prefetch") == 0) return {true, GemvKind::kPrefetch};
  if (std::strcmp(e, "0") == 0) return {false, GemvKind::kStream};
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_GEMV='", e,
              "': expected stream (the default), prefetch, or 0 (no GEMV for Linears)");
}

int64_t gemv_prefetch_ring_bytes() {
  const char* e = std::getenv("KILN_CUDA_GEMV_RING_KB");
  if (!e || !*e) return kPfDefaultRingBytes;
  char* end = nullptr;
  const long kb = std::strtol(e, &end, 10);
  constexpr long kMaxKb = kPfMaxStages * kPfTileBytes / 1024;
  KILN_THROW_IF(*end != '\0' || kb < 16 || kb > kMaxKb || kb % 16 != 0, kInvalidArgument, "KILN_CUDA_GEMV_RING_KB='",
                e, "': expected the prefetching GEMV's ring in KB, 16 to ", kMaxKb, " in steps of 16");
  return int64_t(kb) << 10;
}

bool gemv_prefetch_available() { return prefetch_sms() > 0; }

void launch_gemv_prefetch(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
                          int64_t k, cudaStream_t s, GemvEpilogue epi, const GemvFusion& fusion) {
  if (dtype == DType::kBF16) launch_epi<__nv_bfloat16>(x, w, bias, y, m, n, k, s, epi, fusion);
  else launch_epi<__half>(x, w, bias, y, m, n, k, s, epi, fusion);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda

// The decode stack kernel (decode_stack.h). One CTA of 16 warps per SM; a layer is five
// phases that meet through counters in global memory:
//   qkv    norm(residual) -> q|k|v GEMV: an item per RoPE pair (rows u and u + d/2 of a
//          head), rotated and stored to q or to the layer's cache slot;
//   attn   after every CTA's qkv: (KV head, split) units over the context, 64 keys at a
//          time through shared-memory tiles (online softmax), each writing its partial;
//   o      after every unit: each CTA merges the partials into its GEMV input row, o GEMV
//          + residual;
//   gateup after every CTA's o: norm -> gate|up GEMV, SwiGLU;
//   down   after every CTA's gate|up: down GEMV + residual.
// GEMV phases: each CTA owns a contiguous share of the output items, its warps stream
// contiguous runs of the share's 16-byte weight chunks through registers (the next batch
// loaded while the current one is multiplied), and a phase's first batch is requested
// before the CTA waits for the phase's input (weights are never written), as is the first
// K/V tile of the attention (all but the new token's key).
// Reads of what other CTAs wrote in this launch go through L2 (ld.global.cg / cp.async.cg),
// never the non-coherent or L1 path. A CTA finishing a phase adds to the phase's counter
// (one thread, after a block barrier and a fence), and a CTA waiting for a phase polls its
// counter (one thread, acquire loads) before a block barrier - the pattern of cooperative
// groups' grid sync; the last CTA to exit zeroes the counters for the next launch.
#include <atomic>
#include <cmath>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/attention_kernels.cuh"
#include "backends/cuda/ops/decode_stack.h"
#include "backends/cuda/ops/linear_common.cuh"
#include "backends/cuda/ops/mma_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kStackWarps = 16, kStackThreads = kStackWarps * 32;
constexpr int kMaxGroup = 8, kMaxHeadDim = 128, kKeyChunk = 64, kMinSplitKeys = 64, kMaxMergeWeights = 2048,
              kMaxMergeHeads = 128;
// A GEMV batch: kChunksPerLane 16-byte weight chunks a lane (over the item's R rows).
constexpr int kChunksPerLane = 4;
// K and V tiles of one chunk of keys.
constexpr size_t kKvTileBytes = size_t(kKeyChunk) * kMaxHeadDim * 2;
// The GEMV input row at most (hidden, inter, hq * d elements of 2 bytes).
constexpr size_t kMaxRowBytes = 48 << 10;
enum Phase : int { kQkv, kAttn, kO, kGateUp, kDown, kPhases };
static_assert(kPhases == kDecodeStackPhases);

// Splits of a KV head's context at most: the (KV head, split) units fit one wave, and
// the merge's weights (2 floats per split and head) fit kMaxMergeWeights.
__host__ __device__ inline int max_splits(const DecodeStackShape& s, int grid) {
  const int wave = grid / s.hkv, room = kMaxMergeWeights / (2 * s.hq);
  const int m = wave < room ? wave : room;
  return m > 1 ? m : 1;
}

// Byte offsets into the scratch buffer.
struct Layout {
  size_t r0, r1, q, act, partials, counters, exit, total;
  __host__ __device__ Layout(const DecodeStackShape& s, int grid) {
    auto al = [](size_t x) { return (x + 255) / 256 * 256; };
    size_t o = 0;
    auto take = [&](size_t bytes) {
      const size_t at = o;
      o += al(bytes);
      return at;
    };
    r0 = take(size_t(s.hidden) * 2);
    r1 = take(size_t(s.hidden) * 2);
    q = take(size_t(s.hq) * s.d * 2);
    act = take(size_t(s.inter) * 2);
    partials = take(size_t(max_splits(s, grid)) * s.hq * (s.d + 2) * 4);
    counters = take(size_t(s.layers) * kPhases * 4);
    exit = take(4);
    total = o;
  }
};

// The GEMV input row in shared memory (the largest of hidden, inter, hq * d), 16-byte rounded.
__host__ __device__ inline size_t row_bytes(const DecodeStackShape& s) {
  const int n = s.hidden > s.inter ? (s.hidden > s.hq * s.d ? s.hidden : s.hq * s.d)
                                   : (s.inter > s.hq * s.d ? s.inter : s.hq * s.d);
  return (size_t(n) * 2 + 15) / 16 * 16;
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// The phases' synchronization: a counter per phase that the CTAs (or, for the attention,
// the units) finishing it add to. (A flag per CTA set by the last arrival, polled on
// lines of their own, measured slower: the broadcasting CTA starts its next phase late.)
struct Sync {
  int* counters;
  // Releases this block's writes so far to whoever acquires the counter.
  __device__ __forceinline__ void arrive(int phase) const {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counters + phase, 1);
    }
  }
  // Blocks until the counter of `phase` reaches target; then the block sees what the
  // arrivals released.
  __device__ __forceinline__ void wait(int phase, int target) const {
    if (threadIdx.x == 0) {
      while (ld_acquire(counters + phase) < target) __nanosleep(32);
      __threadfence();
    }
    __syncthreads();
  }
};

__device__ __forceinline__ int64_t global_ns() {
  int64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// The timeline entry of this CTA (DecodeStackArgs::timeline), by thread 0.
__device__ __forceinline__ void mark(int64_t* timeline, int slot) {
  if (timeline && threadIdx.x == 0) timeline[int64_t(slot) * gridDim.x + blockIdx.x] = global_ns();
}
template <typename T>
__device__ __forceinline__ void fma8(float& acc, const uint4& w, const uint4& x) {
  const T* wv = reinterpret_cast<const T*>(&w);
  const T* xv = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(to_f32(wv[i]), to_f32(xv[i]), acc);
}

template <typename T>
__device__ __forceinline__ float ld_cg(const T* p) {
  return to_f32(__ldcg(p));
}

// xs[0, n) = rms_norm(src) * gamma in T, as the norm kernels compute it; src was written
// by other CTAs of this launch (or before it). Rows of up to kNormRegs * 512 elements are
// read once (kept in registers), longer ones twice.
constexpr int kNormRegs = 16;
template <typename T>
__device__ void norm_into(T* xs, const T* src, const float* gamma, float eps, int n, float* red) {
  float v[kNormRegs];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormRegs; ++i) {
    const int j = threadIdx.x + i * kStackThreads;
    v[i] = j < n ? ld_cg(src + j) : 0.0f;
    ss += v[i] * v[i];
  }
  for (int j = threadIdx.x + kNormRegs * kStackThreads; j < n; j += kStackThreads) {
    const float x = ld_cg(src + j);
    ss += x * x;
  }
  const float r = rsqrtf(block_sum(ss, red) / float(n) + eps);
#pragma unroll
  for (int i = 0; i < kNormRegs; ++i) {
    const int j = threadIdx.x + i * kStackThreads;
    if (j < n) xs[j] = from_f32<T>(v[i] * r * __ldg(gamma + j));
  }
  for (int j = threadIdx.x + kNormRegs * kStackThreads; j < n; j += kStackThreads)
    xs[j] = from_f32<T>(ld_cg(src + j) * r * __ldg(gamma + j));
  __syncthreads();
}

// xs[0, n) = src[0, n) (n a multiple of 8).
template <typename T>
__device__ void copy_into(T* xs, const T* src, int n) {
  auto* d = reinterpret_cast<uint4*>(xs);
  const auto* s = reinterpret_cast<const uint4*>(src);
  for (int c = threadIdx.x; c < n / 8; c += kStackThreads) d[c] = __ldcg(s + c);
  __syncthreads();
}

// The part of a GEMV phase's items a CTA owns: [begin, end), balanced over the grid.
struct Share {
  int begin, end;
};
__device__ __forceinline__ Share share_of(int items) {
  return {int(int64_t(items) * blockIdx.x / gridDim.x), int(int64_t(items) * (blockIdx.x + 1) / gridDim.x)};
}

// One GEMV phase over `items` outputs of R weight rows each (rows_of(item, r)) with k
// inputs in xs. A CTA owns a contiguous share of the items; their batches (kChunksPerLane
// / R chunks of each row per lane) are split into one contiguous run per warp, so every
// warp streams the same amount within a batch, holding the next batch in registers while it
// multiplies the current one (a ring of cp.async stages in shared memory instead, with 3
// batches in flight, measured slower: RESULTS.md, session 12). Each warp's sum of an item goes to
// `part` [item][warp][R]; after a block barrier one thread per item adds the warps' sums in
// warp order and calls epi(item, v, side[item]). Before the wait for the phase's input
// (prep(), called by every thread), the first batch is requested and side[i] = pre(item)
// is loaded (what the epilogue reads that was complete before this phase: the residual).
template <typename T, int R, typename RowsOf, typename Pre, typename Prep, typename Epi>
__device__ __forceinline__ void gemv_phase(const T* w, int k, int items, const uint4* xs, float* part,
                                           RowsOf rows_of, Pre&& pre, Prep&& prep, Epi&& epi) {
  constexpr int U = kChunksPerLane / R;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kc = k >> 3;
  const Share sh = share_of(items);
  const int n_items = sh.end - sh.begin;
  const int per_item = (kc + 32 * U - 1) / (32 * U);  // batches of one item
  const int total = n_items * per_item;
  float* side = part + n_items * kStackWarps * R;
  for (int i = threadIdx.x; i < n_items * kStackWarps * R; i += kStackThreads) part[i] = 0.0f;
  for (int i = threadIdx.x; i < n_items; i += kStackThreads) side[i] = pre(sh.begin + i);
  // The warp's batches are a contiguous run [b0, b1) of the CTA's: mostly whole items, so
  // a warp streams long stretches of a row and reduces only at an item's end.
  const int b0 = int(int64_t(total) * warp / kStackWarps), b1 = int(int64_t(total) * (warp + 1) / kStackWarps);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  // Multiplies the warp's j-th batch (chunk(r, u): its weights) and, at the warp's last
  // batch of an item, leaves the item's sums in part.
  auto consume = [&](int j, auto&& chunk) {
    const int b = b0 + j, item = b / per_item, base = (b % per_item) * 32 * U;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = base + u * 32 + lane;
      if (c < kc) {
        const uint4 x = xs[c];
#pragma unroll
        for (int r = 0; r < R; ++r) fma8<T>(acc[r], chunk(r, u), x);
      }
    }
    if (b + 1 == b1 || (b + 1) / per_item != item) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) part[(item * kStackWarps + warp) * R + r] = v;
        acc[r] = 0.0f;
      }
    }
  };
  auto row_of = [&](int j, int r) {
    return reinterpret_cast<const uint4*>(w) + int64_t(rows_of(sh.begin + (b0 + j) / per_item, r)) * kc;
  };
  // The next batch is loaded (streaming, evict-first) before the current one is multiplied.
  uint4 cur[R][U], nxt[R][U];
  auto load = [&](uint4 (&buf)[R][U], int j) {
    if (b0 + j >= b1) return;
    const int base = ((b0 + j) % per_item) * 32 * U;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4* row = row_of(j, r);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = base + u * 32 + lane;
        buf[r][u] = c < kc ? __ldcs(row + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  load(cur, 0);
  prep();
  for (int j = 0; b0 + j < b1; ++j) {
    load(nxt, j + 1);
    consume(j, [&](int r, int u) { return cur[r][u]; });
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) cur[r][u] = nxt[r][u];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_items; i += kStackThreads) {
    float v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float sum = 0.0f;
      for (int wp = 0; wp < kStackWarps; ++wp) sum += part[(i * kStackWarps + wp) * R + r];
      v[r] = sum;
    }
    epi(sh.begin + i, v, side[i]);
  }
}

struct AttnSmem {
  float q[kMaxGroup][kMaxHeadDim];
  float p[kMaxGroup][kKeyChunk];
  float m[kMaxGroup], l[kMaxGroup], alpha[kMaxGroup];
  float merge_w[kMaxMergeWeights];  // merge_into's (split, head) weights
};

// Copies the K and V rows of keys [j0, j0 + n) of KV head g into rows j - tile0 of the
// tiles (cp.async; the caller waits): all of them, or (skip >= 0) all but key `skip`.
template <typename T>
__device__ __forceinline__ void stage_kv(uint4* sk, uint4* sv, const T* kc, const T* vc, const int32_t* table, int bs,
                                         int hkv, int g, int d, int tile0, int j0, int n, int skip) {
  const int vec = d / 8;
  for (int i = threadIdx.x; i < n * vec; i += kStackThreads) {
    const int j = j0 + i / vec, c = i % vec;
    if (j == skip) continue;
    const int64_t off = ((int64_t(__ldg(table + j / bs)) * bs + j % bs) * hkv + g) * d;
    const int at = (j - tile0) * vec + c;
    cp_async16(sk + at, reinterpret_cast<const uint4*>(kc + off) + c, true);
    cp_async16(sv + at, reinterpret_cast<const uint4*>(vc + off) + c, true);
  }
  cp_async_commit();
}

// Layer l's attention: the (KV head, split) units of this CTA (at most one: the units fit
// one wave), each writing its unnormalized partial with its max and sum and arriving on the
// phase's counter (the o phase waits for every unit and merges). A unit's keys go through
// shared-memory tiles 64 at a time; the first tile, but for the new token's key (written
// by the q|k|v phase), is requested before the wait for that phase.
template <typename T>
__device__ void attention_phase(const DecodeStackArgs& a, const Layout& lay, char* scratch, int l, const Sync& sync,
                                AttnSmem& sm, uint4* sk, uint4* sv, int ready_slot) {
  const DecodeStackShape& s = a.shape;
  const int d = s.d, g_size = s.hq / s.hkv, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int ctx = __ldg(&a.seq->ctx_len), bs = a.block_size;
  const int splits = min(max_splits(s, int(gridDim.x)), (ctx + kMinSplitKeys - 1) / kMinSplitKeys);
  const int per = (ctx + splits - 1) / splits, units = s.hkv * splits;
  if (int(blockIdx.x) >= units) return;
  const T* q = reinterpret_cast<const T*>(scratch + lay.q);
  float* partials = reinterpret_cast<float*>(scratch + lay.partials);
  const T* kc = reinterpret_cast<const T*>(static_cast<const char*>(a.k_cache) + size_t(l) * a.kv_layer_bytes);
  const T* vc = reinterpret_cast<const T*>(static_cast<const char*>(a.v_cache) + size_t(l) * a.kv_layer_bytes);
  const int32_t* table = a.block_tables + __ldg(&a.seq->bt_offset);
  const T* tk = reinterpret_cast<const T*>(sk);
  const T* tv = reinterpret_cast<const T*>(sv);
  bool waited = false;
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int g = unit / splits, split = unit % splits;
    const int k0 = split * per, k1 = min(ctx, k0 + per);
    float acc[2] = {0.0f, 0.0f};  // (head, dim) items threadIdx.x and threadIdx.x + kStackThreads
    if (waited) {
      for (int i = threadIdx.x; i < g_size * d; i += kStackThreads) sm.q[i / d][i % d] = ld_cg(q + g * g_size * d + i);
    }
    if (threadIdx.x < g_size) {
      sm.m[threadIdx.x] = -INFINITY;
      sm.l[threadIdx.x] = 0.0f;
    }
    for (int j0 = k0; j0 < k1; j0 += kKeyChunk) {
      const int n = min(kKeyChunk, k1 - j0);
      if (!waited) {
        stage_kv(sk, sv, kc, vc, table, bs, s.hkv, g, d, j0, j0, n, ctx - 1);
        sync.wait(l * kPhases + kQkv, int(gridDim.x));
        mark(a.timeline, ready_slot);
        waited = true;
        if (j0 + n == ctx) stage_kv(sk, sv, kc, vc, table, bs, s.hkv, g, d, j0, ctx - 1, 1, -1);
        for (int i = threadIdx.x; i < g_size * d; i += kStackThreads) sm.q[i / d][i % d] = ld_cg(q + g * g_size * d + i);
      } else {
        stage_kv(sk, sv, kc, vc, table, bs, s.hkv, g, d, j0, j0, n, -1);
      }
      cp_async_wait<0>();
      __syncthreads();
      for (int jj = warp; jj < n; jj += kStackWarps) {
        float dot[kMaxGroup];
#pragma unroll
        for (int i = 0; i < kMaxGroup; ++i) dot[i] = 0.0f;
        for (int e = lane; e < d; e += 32) {
          const float kv = to_f32(tk[jj * d + e]);
#pragma unroll
          for (int i = 0; i < kMaxGroup; ++i)
            if (i < g_size) dot[i] = fmaf(sm.q[i][e], kv, dot[i]);
        }
#pragma unroll
        for (int i = 0; i < kMaxGroup; ++i)
          if (i < g_size) {
            const float v = warp_sum(dot[i]);
            if (lane == 0) sm.p[i][jj] = v * a.scale;
          }
      }
      __syncthreads();
      if (warp < g_size) {  // online softmax of head `warp` over this chunk
        float mx = -INFINITY;
        for (int jj = lane; jj < n; jj += 32) mx = fmaxf(mx, sm.p[warp][jj]);
        mx = warp_max(mx);
        const float m_old = sm.m[warp], m_new = fmaxf(m_old, mx);
        float sum = 0.0f;
        for (int jj = lane; jj < n; jj += 32) {
          const float e = expf(sm.p[warp][jj] - m_new);
          sm.p[warp][jj] = e;
          sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
          const float alpha = expf(m_old - m_new);
          sm.alpha[warp] = alpha;
          sm.l[warp] = sm.l[warp] * alpha + sum;
          sm.m[warp] = m_new;
        }
      }
      __syncthreads();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int it = threadIdx.x + h * kStackThreads;
        if (it < g_size * d) {
          const int i = it / d, e = it % d;
          float o = acc[h] * sm.alpha[i];
          for (int jj = 0; jj < n; ++jj) o = fmaf(sm.p[i][jj], to_f32(tv[jj * d + e]), o);
          acc[h] = o;
        }
      }
      __syncthreads();  // the tiles and p are refilled next
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int it = threadIdx.x + h * kStackThreads;
      if (it < g_size * d) {
        const int i = it / d, e = it % d;
        float* part = partials + (size_t(split) * s.hq + g * g_size + i) * (d + 2);
        part[e] = acc[h];
        if (e == 0) {
          part[d] = sm.m[i];
          part[d + 1] = sm.l[i];
        }
      }
    }
    sync.arrive(l * kPhases + kAttn);
  }
}

// The number of (KV head, split) units of a step's attention (every CTA computes the same).
__device__ __forceinline__ int attention_units(const DecodeStackArgs& a) {
  const int ctx = __ldg(&a.seq->ctx_len);
  return a.shape.hkv * min(max_splits(a.shape, int(gridDim.x)), (ctx + kMinSplitKeys - 1) / kMinSplitKeys);
}

// xs[h * d + e] = the attention output: the splits' partials merged. Every (split, head)
// pair's m and l are read by a thread of their own into `w` (2 * splits * hq floats of
// shared memory), then turned into that split's weight for the head.
template <typename T>
__device__ void merge_into(T* xs, const DecodeStackArgs& a, const float* partials, float* w) {
  const DecodeStackShape& s = a.shape;
  const int d = s.d, splits = attention_units(a) / s.hkv, pairs = splits * s.hq;
  const size_t stride = size_t(s.hq) * (d + 2);
  __shared__ float head_max[kMaxMergeHeads], head_inv[kMaxMergeHeads];
  float* lw = w + pairs;
  for (int i = threadIdx.x; i < pairs; i += kStackThreads) {
    const float* pp = partials + (i / s.hq) * stride + size_t(i % s.hq) * (d + 2);
    w[i] = __ldcg(pp + d);
    lw[i] = __ldcg(pp + d + 1);
  }
  __syncthreads();
  for (int h = threadIdx.x; h < s.hq; h += kStackThreads) {
    float mx = -INFINITY;
    for (int p = 0; p < splits; ++p) mx = fmaxf(mx, w[p * s.hq + h]);
    float lsum = 0.0f;
    for (int p = 0; p < splits; ++p) lsum = fmaf(expf(w[p * s.hq + h] - mx), lw[p * s.hq + h], lsum);
    head_max[h] = mx;
    head_inv[h] = 1.0f / lsum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += kStackThreads) {
    const int h = i % s.hq;
    w[i] = expf(w[i] - head_max[h]) * head_inv[h];  // 0 for a split without keys (m = -inf)
  }
  __syncthreads();
  for (int it = threadIdx.x; it < s.hq * d; it += kStackThreads) {
    const int h = it / d, e = it % d;
    float o = 0.0f;
    for (int p = 0; p < splits; ++p) o = fmaf(w[p * s.hq + h], __ldcg(partials + p * stride + size_t(h) * (d + 2) + e), o);
    xs[it] = from_f32<T>(o);
  }
  __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(kStackThreads, 1) decode_stack_kernel(DecodeStackArgs a, Layout lay) {
  extern __shared__ uint4 stack_xs[];  // the GEMV input row
  __shared__ float red[32];
  __shared__ AttnSmem att;
  T* xs = reinterpret_cast<T*>(stack_xs);
  uint4* sk = stack_xs + row_bytes(a.shape) / 16;
  uint4* sv = sk + kKvTileBytes / 16;
  float* part = reinterpret_cast<float*>(sk);  // the GEMV partial sums share the K/V tiles' space
  const DecodeStackShape& s = a.shape;
  const int grid = int(gridDim.x), d = s.d, half = d / 2;
  char* scratch = static_cast<char*>(a.scratch);
  T* r0 = reinterpret_cast<T*>(scratch + lay.r0);
  T* r1 = reinterpret_cast<T*>(scratch + lay.r1);
  T* q = reinterpret_cast<T*>(scratch + lay.q);
  const float* partials = reinterpret_cast<const float*>(scratch + lay.partials);
  T* act = reinterpret_cast<T*>(scratch + lay.act);
  int* ctr = reinterpret_cast<int*>(scratch + lay.counters);
  const Sync sync{ctr};
  const int pos = __ldg(a.positions);
  const int64_t slot = __ldg(a.slot_mapping);
  auto one_row = [](int item, int) { return item; };
  auto no_side = [](int) { return 0.0f; };
  mark(a.timeline, 2 * s.layers * kPhases);
  for (int l = 0; l < s.layers; ++l) {
    const DecodeStackLayer ly = a.layers[l];
    const int ready = (s.layers + l) * kPhases;  // the timeline's "input ready" slots of this layer
    const T* res_in = l == 0 ? static_cast<const T*>(a.x) : r1;
    T* res_out = l + 1 == s.layers ? static_cast<T*>(a.out_sum) : r1;
    T* kc = reinterpret_cast<T*>(static_cast<char*>(a.k_cache) + size_t(l) * a.kv_layer_bytes);
    T* vc = reinterpret_cast<T*>(static_cast<char*>(a.v_cache) + size_t(l) * a.kv_layer_bytes);
    const T* bias = static_cast<const T*>(ly.b_qkv);

    // q|k|v: item = (head, pair u), rows u and u + d/2 of the head.
    gemv_phase<T, 2>(
        static_cast<const T*>(ly.w_qkv), s.hidden, (s.hq + 2 * s.hkv) * half, stack_xs, part,
        [=](int item, int r) { return (item / half) * d + item % half + r * half; }, no_side,
        [&] {
          if (l > 0) sync.wait((l - 1) * kPhases + kDown, grid);
          mark(a.timeline, ready + kQkv);
          norm_into(xs, res_in, ly.attn_norm, ly.attn_eps, s.hidden, red);
        },
        [&](int item, const float (&v)[2], float) {
          const int h = item / half, u = item % half, row = h * d + u;
          float y1 = v[0], y2 = v[1];
          if (bias) {
            y1 += to_f32(bias[row]);
            y2 += to_f32(bias[row + half]);
          }
          y1 = to_f32(from_f32<T>(y1));
          y2 = to_f32(from_f32<T>(y2));
          if (h < s.hq + s.hkv) rope_pair(y1, y2, pos, __ldg(a.inv_freq + u));
          T* dst;
          if (h < s.hq) {
            dst = q + h * d;
          } else {
            if (slot < 0) return;
            const bool is_k = h < s.hq + s.hkv;
            dst = (is_k ? kc : vc) + (slot * s.hkv + (is_k ? h - s.hq : h - s.hq - s.hkv)) * d;
          }
          dst[u] = from_f32<T>(y1);
          dst[u + half] = from_f32<T>(y2);
        });
    sync.arrive(l * kPhases + kQkv);
    mark(a.timeline, l * kPhases + kQkv);

    attention_phase<T>(a, lay, scratch, l, sync, att, sk, sv, ready + kAttn);
    mark(a.timeline, l * kPhases + kAttn);

    // o + residual.
    gemv_phase<T, 1>(
        static_cast<const T*>(ly.w_o), s.hq * d, s.hidden, stack_xs, part, one_row,
        [&](int n) { return ld_cg(res_in + n); },
        [&] {
          sync.wait(l * kPhases + kAttn, attention_units(a));
          mark(a.timeline, ready + kO);
          merge_into(xs, a, partials, att.merge_w);
        },
        [&](int n, const float (&v)[1], float res) { r0[n] = from_f32<T>(to_f32(from_f32<T>(v[0])) + res); });
    sync.arrive(l * kPhases + kO);
    mark(a.timeline, l * kPhases + kO);

    // gate|up with SwiGLU: item j, rows j and inter + j.
    gemv_phase<T, 2>(
        static_cast<const T*>(ly.w_gate_up), s.hidden, s.inter, stack_xs, part,
        [inter = s.inter](int item, int r) { return item + r * inter; }, no_side,
        [&] {
          sync.wait(l * kPhases + kO, grid);
          mark(a.timeline, ready + kGateUp);
          norm_into(xs, r0, ly.mlp_norm, ly.mlp_eps, s.hidden, red);
        },
        [&](int j, const float (&v)[2], float) { act[j] = linear_swiglu_out<T>(v[0], v[1]); });
    sync.arrive(l * kPhases + kGateUp);
    mark(a.timeline, l * kPhases + kGateUp);

    // down + residual.
    gemv_phase<T, 1>(
        static_cast<const T*>(ly.w_down), s.inter, s.hidden, stack_xs, part, one_row,
        [&](int n) { return ld_cg(r0 + n); },
        [&] {
          sync.wait(l * kPhases + kGateUp, grid);
          mark(a.timeline, ready + kDown);
          copy_into(xs, act, s.inter);
        },
        [&](int n, const float (&v)[1], float res) { res_out[n] = from_f32<T>(to_f32(from_f32<T>(v[0])) + res); });
    sync.arrive(l * kPhases + kDown);
    mark(a.timeline, l * kPhases + kDown);
  }
  if (blockIdx.x == 0) {
    sync.wait((s.layers - 1) * kPhases + kDown, grid);
    norm_into(xs, static_cast<const T*>(a.out_sum), a.final_norm, a.final_eps, s.hidden, red);
    T* out = static_cast<T*>(a.out_norm);
    for (int j = threadIdx.x; j < s.hidden; j += kStackThreads) out[j] = xs[j];
  }
  // The last CTA out zeroes the counters: every CTA has passed all its waits.
  __syncthreads();
  if (threadIdx.x == 0) {
    int* exit = reinterpret_cast<int*>(scratch + lay.exit);
    __threadfence();
    if (atomicAdd(exit, 1) == grid - 1) {
      for (int i = 0; i < s.layers * kPhases; ++i) ctr[i] = 0;
      *exit = 0;
      __threadfence();
    }
  }
}

size_t smem_bytes(const DecodeStackShape& s) { return row_bytes(s) + 2 * kKvTileBytes; }

std::atomic<uint64_t> g_launches{0};

template <typename T>
void launch_typed(const DecodeStackArgs& a, int grid, cudaStream_t st) {
  const size_t smem = smem_bytes(a.shape);
  KILN_CUDA_CHECK(cudaFuncSetAttribute(decode_stack_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(kStackThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  KILN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_stack_kernel<T>, a, Layout(a.shape, grid)));
}

}  // namespace

bool decode_stack_supports(DType dtype, const DecodeStackShape& s, int grid, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (dtype != DType::kBF16 && dtype != DType::kF16) return no("activations are not 16-bit");
  if (s.layers < 1 || s.hidden <= 0 || s.inter <= 0 || s.hq <= 0 || s.hkv <= 0 || s.d <= 0) return no("empty shape");
  const std::string shape = "hidden " + std::to_string(s.hidden) + ", intermediate " + std::to_string(s.inter) +
                            ", heads " + std::to_string(s.hq) + "/" + std::to_string(s.hkv) + " x " +
                            std::to_string(s.d);
  if (s.hidden % 8 || s.inter % 8 || (s.hq * s.d) % 8)
    return no("hidden, intermediate and heads x head_dim must be multiples of 8 (" + shape + ")");
  if (s.d % 8 || s.d > kMaxHeadDim) return no("head_dim must be a multiple of 8 and at most 128 (" + shape + ")");
  if (s.hq % s.hkv || s.hq / s.hkv > kMaxGroup) return no("query heads must be 1-8 per KV head (" + shape + ")");
  // The GEMV input row in shared memory.
  if (row_bytes(s) > kMaxRowBytes) return no("a GEMV input row exceeds 48 KB (" + shape + ")");
  if (grid < 1) return no("no CTAs");
  if (s.hq > kMaxMergeHeads) return no("more than 128 attention heads (" + shape + ")");
  // A CTA's share of a GEMV phase's items: per item a sum per warp and row, and a side value.
  auto share_fits = [&](int64_t items, int r) {
    return (items + grid - 1) / grid * (kStackWarps * r + 1) * 4 <= int64_t(2 * kKvTileBytes);
  };
  if (!share_fits(int64_t(s.hq + 2 * s.hkv) * s.d / 2, 2) || !share_fits(s.hidden, 1) || !share_fits(s.inter, 2))
    return no("a CTA's share of a GEMV phase does not fit its shared memory (" + shape + ", " +
              std::to_string(grid) + " CTAs)");
  return true;
}

int decode_stack_grid() {
  int dev = 0, sms = 0, per_sm = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  int coop = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  if (!coop) return 0;
  const int most = int(kMaxRowBytes + 2 * kKvTileBytes);
  KILN_CUDA_CHECK(cudaFuncSetAttribute(decode_stack_kernel<__nv_bfloat16>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_stack_kernel<__nv_bfloat16>,
                                                                kStackThreads, most));
  return per_sm >= 1 ? sms : 0;
}

size_t decode_stack_scratch_bytes(const DecodeStackShape& s, int grid) { return Layout(s, grid).total; }

void launch_decode_stack(const DecodeStackArgs& a, int grid, cudaStream_t st) {
  KILN_THROW_IF(!decode_stack_supports(a.dtype, a.shape, grid), kInvalidArgument,
                "decode stack: unsupported shape or grid");
  if (a.dtype == DType::kBF16) launch_typed<__nv_bfloat16>(a, grid, st);
  else launch_typed<__half>(a, grid, st);
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

uint64_t decode_stack_launches() { return g_launches.load(std::memory_order_relaxed); }

}  // namespace kiln::cuda

// TopKLogits (see topk.h), two exact paths sharing one order and one radix select:
// values map to order-preserving 32-bit keys (-0 == +0, NaN below -inf) and an element to
// the 64-bit item key << 32 | ~index, unique per row and larger when ahead (value desc,
// index asc). A block-wide radix select (radix_select) narrows to the k-th largest item
// 8 bits a pass, stopping as soon as the chosen bin holds exactly the items still needed.
//
// Split (where it fits: rows longer than a chunk and than k): a row is cut into chunks of
// 2^chunk_log2 logits, one 256-thread CTA each, E logits per thread in registers (the row
// is read once; with more chunks than fit on the device at once, a CTA loops over chunks
// and loads its next one while selecting in the current one). A chunk keeps its max and
// its sum of exp(x - max) (f32 exp, compensated f32 sum per thread, f64 across threads)
// and its top kc = min(k, chunk) items: the kc-th largest of the threads' max keys bounds
// the chunk's kc-th key from below, so only the few elements at or above it enter the
// select. A second kernel, one 512-thread CTA per row, loads the row's candidates into
// shared memory, picks the k best the same way, orders them (k <= 256: each item's place
// is the count of items above it; else a bitonic sort) and combines the log-sum-exp:
// M = max m_c, S = sum S_c e^(m_c - M).
//
// One CTA per row (rows the split does not fit: short rows, or k too large for the
// chunks' candidates to fit one merge): the row's max as std::max keeps it (NaN never
// wins) and the sum of exp(double(x) - max) in double, as the host's logprobs_of
// computes them; the select over the whole row (re-read each pass); a bitonic sort of
// the k in shared memory.
//
// k = 1 (a greedy step) skips the selects: a chunk's and a row's best item is the block's
// largest (one 64-bit max reduction each).
//
// Both give the CPU kernel's ids and values bit for bit; log-probs differ by the
// log-sum-exp's rounding (f64 summation order; the split path's f32 exp terms, each
// within a few f32 ulps), far below the 1e-6 the tests allow.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/common.cuh"
#include "backends/cuda/ops/topk.h"
#include "ir/op_registry.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float neg_inf() { return __int_as_float(int(0xff800000u)); }

__device__ __forceinline__ uint32_t order_key(float f) {
  if (isnan(f)) return 0u;
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;  // -0 ties with +0, as float == says
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <int kWarps>
__device__ __forceinline__ float block_max_keep(float v, float* scratch) {
  // std::max(a, b) == (a < b ? b : a); the partial maxima are never NaN.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = v < w ? w : v;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < kWarps; ++w) m = m < scratch[w] ? scratch[w] : m;
  return m;
}

template <int kWarps>
__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < kWarps; ++w) s += scratch[w];  // the same order in every thread
  return s;
}

template <typename T>
constexpr int key_passes() {
  // 8 key bits a pass over the bits a value of T can set: bf16 16, f16 24 (f16 -> f32
  // leaves 13 low mantissa bits zero), f32 all 32.
  if constexpr (std::is_same_v<T, float>) return 4;
  else if constexpr (std::is_same_v<T, __half>) return 3;
  else return 2;
}

__device__ __forceinline__ uint64_t make_item(uint32_t key, uint32_t index) {
  return (static_cast<uint64_t>(key) << 32) | uint32_t(~index);
}

// The 8-bit digits a radix select looks at, highest first (shifts into the 64-bit item).
// Digits left out are bits every item still in the running shares with the items it
// ties with on the digits above (a 16-bit value's low key bits follow from its sign, an
// index's high bits are the same across a chunk or a row), so comparing items on the
// listed digits only orders them as their full bits do.
struct Digits {
  int n = 0;
  int shift[8];
  __device__ void add_key(int key_digits) {
    for (int d = 0; d < key_digits; ++d) shift[n++] = 56 - 8 * d;
  }
  __device__ void add_index(int index_bits) {  // bits [index_bits - 1, 0] of ~index
    for (int s = ((index_bits - 1) / 8) * 8; s >= 0; s -= 8) shift[n++] = s;
  }
};

struct SelectSmem {
  uint32_t hist[2][256];  // a pass counts into one while the other is cleared for the next
  uint32_t bin, need, count;
};

// Block-wide radix select: `visit(fn)` calls fn(item) for each item the calling thread
// holds (every thread, the same set each call). Narrows (prefix, mask) over `digits` to
// the need-th largest item, stopping early once the chosen bin holds exactly the items
// still needed. On return, the items with (item & mask) > prefix number need_in -
// need_out and those with (item & mask) == prefix number exactly need_out: together
// they are the need_in largest items (when the digits separate all items, as they do
// for unique items; a select over fewer digits gives a lower bound, see below). Requires
// at least `need` items. Two barriers a pass; `sm` may be reused by the next select at
// once (its first barrier comes before anything it writes is read).
template <int kThreads, typename Visit>
__device__ void radix_select(const Visit& visit, const Digits& digits, uint32_t& need, uint64_t& prefix,
                             uint64_t& mask, SelectSmem& sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < 256; i += kThreads) sm.hist[0][i] = 0;
  __syncthreads();
  for (int d = 0; d < digits.n; ++d) {
    const int shift = digits.shift[d];
    uint32_t* hist = sm.hist[d & 1];
    visit([&](uint64_t item) {
      if ((item & mask) == prefix) atomicAdd(&hist[uint32_t(item >> shift) & 255u], 1u);
    });
    // The other buffer was last read by the previous pass's scan, before its last barrier.
    for (int i = threadIdx.x; i < 256; i += kThreads) sm.hist[(d + 1) & 1][i] = 0;
    __syncthreads();
    // The bin holding the need-th largest item: lane l owns bins 255-8l .. 248-8l.
    if (warp == 0) {
      uint32_t c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += c[j] = hist[255 - (lane * 8 + j)];
      uint32_t incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      uint32_t acc = incl - sum;
      if (acc < need && need <= incl) {
        for (int j = 0; j < 8; ++j) {
          if (acc + c[j] >= need) {
            sm.bin = uint32_t(255 - (lane * 8 + j));
            sm.need = need - acc;
            sm.count = c[j];
            break;
          }
          acc += c[j];
        }
      }
      if (lane == 31 && incl < need) {  // fewer items than needed: a broken invariant; stop
        sm.bin = 0;
        sm.need = sm.count = need;
      }
    }
    __syncthreads();
    // bin/need/count are rewritten only after the next pass's (or select's) first
    // barrier, which every thread reaches after these reads.
    prefix |= uint64_t(sm.bin) << shift;
    mask |= uint64_t(255) << shift;
    need = sm.need;
    if (sm.count == need) break;  // uniform: every thread read the same shared values
  }
}

// Bitonic sort of a[0, n) (n a power of two) in shared memory, descending.
template <int kThreads>
__device__ void bitonic_sort_desc(uint64_t* a, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < n / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const uint64_t ci = a[i], cj = a[j];
        if (((i & size) == 0) ? ci < cj : ci > cj) {
          a[i] = cj;
          a[j] = ci;
        }
      }
      __syncthreads();
    }
}

// One CTA per row: the k best items of row blockIdx.x, ordered, with their log-probs.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    topk_row_kernel(const T* x, int64_t v, int k, int key_digits, int index_bits, int sort_n, float* values,
                    int32_t* ids, float* logprobs) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  extern __shared__ uint64_t row_smem[];  // [sort_n]: the selected items
  __shared__ SelectSmem sm;
  __shared__ float red_f[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ uint32_t s_slot;

  const T* row = x + int64_t(blockIdx.x) * v;
  const int tid = threadIdx.x;
  float lmx = neg_inf();
  for (int64_t i = tid; i < v; i += kThreads) {
    const float f = to_f32(row[i]);
    lmx = lmx < f ? f : lmx;
  }
  const float mx = block_max_keep<kWarps>(lmx, red_f);
  double lsum = 0;
  for (int64_t i = tid; i < v; i += kThreads) lsum += exp(double(to_f32(row[i])) - double(mx));
  const double lse = double(mx) + log(block_sum_double<kWarps>(lsum, red_d));

  auto visit = [&](auto&& fn) {
    for (int64_t i = tid; i < v; i += kThreads) fn(make_item(order_key(to_f32(row[i])), uint32_t(i)));
  };
  const int n = int(min(v, int64_t(k)));
  if (v > k) {
    // Over the key and the index digits: items are unique, so exactly k pass the test.
    Digits d;
    d.add_key(key_digits);
    d.add_index(index_bits);
    uint64_t prefix = 0, mask = 0;
    uint32_t need = uint32_t(k);
    if (tid == 0) s_slot = 0;  // read after the select's barriers
    radix_select<kThreads>(visit, d, need, prefix, mask, sm);
    visit([&](uint64_t item) {
      if ((item & mask) >= prefix) {
        const uint32_t slot = atomicAdd(&s_slot, 1u);
        if (slot < uint32_t(k)) row_smem[slot] = item;
      }
    });
  } else {
    for (int64_t i = tid; i < v; i += kThreads) row_smem[i] = make_item(order_key(to_f32(row[i])), uint32_t(i));
  }
  for (int i = n + tid; i < sort_n; i += kThreads) row_smem[i] = 0;  // pads sort last
  __syncthreads();
  bitonic_sort_desc<kThreads>(row_smem, sort_n);

  float* vo = values + int64_t(blockIdx.x) * k;
  int32_t* io = ids + int64_t(blockIdx.x) * k;
  float* lo = logprobs + int64_t(blockIdx.x) * k;
  for (int j = tid; j < k; j += kThreads) {
    if (j < n) {
      const int32_t i = int32_t(~uint32_t(row_smem[j] & 0xffffffffu));
      const float f = to_f32(row[i]);
      vo[j] = f;
      io[j] = i;
      lo[j] = float(double(f) - lse);
    } else {
      vo[j] = lo[j] = neg_inf();
      io[j] = -1;
    }
  }
}

// ---- split path ---------------------------------------------------------------------

constexpr int kChunkThreads = 256;
constexpr int kMergeThreads = 512;
constexpr int kMinChunkLog2 = 9;   // 512 logits: E = 2 per thread
constexpr int kMaxChunkLog2 = 13;  // 8192 logits: E = 32 per thread
constexpr int kAutoMaxChunkLog2 = 11;  // the longest chunk chosen for the grid's sake
// Candidates one merge CTA holds in shared memory (128 KiB), at most 32 per thread so
// that a thread's live ones fit a 32-bit mask.
constexpr int64_t kMergeMaxItems = 32 * kMergeThreads;

// The smallest key a select over kc items may need: the kc-th largest of the threads'
// largest keys, over the top 16 key bits only (lower bits zero). At least kc threads hold
// a key at or above it, so at least kc elements are: every element of the top kc is.
// `have`: whether this thread holds any element; needs kc <= the number that do.
// The largest item of the block (every thread returns it); items are unique, so it is
// the best one: k = 1 needs no select.
template <int kWarps>
__device__ __forceinline__ uint64_t block_max_item(uint64_t v, unsigned long long* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, uint64_t(__shfl_xor_sync(0xffffffffu, (unsigned long long)v, o)));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  uint64_t m = scratch[0];
  for (int w = 1; w < kWarps; ++w) m = max(m, uint64_t(scratch[w]));
  return m;
}

template <int kThreads>
__device__ uint32_t kth_thread_max_bound(uint32_t thread_max, bool have, uint32_t kc, SelectSmem& sm) {
  Digits d;
  d.add_key(2);
  uint64_t prefix = 0, mask = 0;
  uint32_t need = kc;
  radix_select<kThreads>(
      [&](auto&& fn) {
        if (have) fn(static_cast<uint64_t>(thread_max) << 32);
      },
      d, need, prefix, mask, sm);
  return uint32_t(prefix >> 32);
}

struct ChunkSmem {
  SelectSmem sel;
  float red_f[kChunkThreads / 32];
  double red_d[kChunkThreads / 32];
  unsigned long long red_u[kChunkThreads / 32];
  uint32_t slot;
};

// Part p of the chunk grid: chunk p % chunks of row p / chunks.
struct ChunkPart {
  int64_t row, base;
  int n;  // logits in the chunk
  __device__ ChunkPart(int64_t p, int64_t v, int64_t chunks, int chunk_log2)
      : row(p / chunks), base((p % chunks) << chunk_log2), n(int(min(v - base, int64_t(1) << chunk_log2))) {}
};

// Element e of thread t is chunk element e * 256 + t (coalesced loads; rows need not be
// aligned); -inf past the end.
template <typename T, int E>
__device__ __forceinline__ void chunk_load(const T* x, int64_t v, const ChunkPart& cp, T (&raw)[E]) {
  const T* src = x + cp.row * v + cp.base;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int j = e * kChunkThreads + int(threadIdx.x);
    raw[e] = j < cp.n ? src[j] : from_f32<T>(neg_inf());
  }
}

// One chunk: writes its max, its sum of exp(x - max) and its kc best items, in no
// particular order (0 pads a chunk shorter than kc; no real item is 0).
template <int E>
__device__ __forceinline__ void chunk_select(const float (&f)[E], const ChunkPart& cp, int64_t part, int chunk_log2,
                                             int kc, int key_digits, uint64_t* cand, float* chunk_max,
                                             double* chunk_sum, ChunkSmem& sm) {
  constexpr int kWarps = kChunkThreads / 32;
  const int tid = threadIdx.x, n = cp.n;
  // Max as std::max keeps it (NaN never wins), then the sum of exp(x - max): -inf adds
  // 0 (also when the max is -inf), NaN and inf - inf give NaN, as in the host's double
  // sum. Compensated (Kahan) in f32 over a thread's E terms, f64 across threads. The
  // reductions' first barriers also order this chunk after the previous one's selects.
  float lmx = neg_inf();
#pragma unroll
  for (int e = 0; e < E; ++e) lmx = lmx < f[e] ? f[e] : lmx;
  const float mx = block_max_keep<kWarps>(lmx, sm.red_f);
  float sum = 0.0f, comp = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float term = f[e] == neg_inf() ? 0.0f : expf(f[e] - mx);
    const float y = term - comp;
    const float t = sum + y;
    comp = (t - sum) - y;
    sum = t;
  }
  const double total = block_sum_double<kWarps>(double(sum) - double(comp), sm.red_d);
  if (tid == 0) {
    chunk_max[part] = mx;
    chunk_sum[part] = total;
    sm.slot = 0;
  }

  uint64_t* out = cand + part * kc;
  const uint32_t index0 = uint32_t(cp.base) + uint32_t(tid);
  if (n <= kc) {  // a short last chunk: every element is a candidate
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int j = e * kChunkThreads + tid;
      if (j < n) out[j] = make_item(order_key(f[e]), index0 + uint32_t(e * kChunkThreads));
    }
    for (int j = n + tid; j < kc; j += kChunkThreads) out[j] = 0;
    return;
  }
  if (kc == 1) {  // a greedy step's width: the chunk's best item is its largest
    uint64_t best = 0;
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (e * kChunkThreads + tid < n) best = max(best, make_item(order_key(f[e]), index0 + uint32_t(e * kChunkThreads)));
    best = block_max_item<kWarps>(best, sm.red_u);
    if (tid == 0) out[0] = best;
    return;
  }

  uint32_t kmax = 0;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e * kChunkThreads + tid < n) kmax = max(kmax, order_key(f[e]));
  const bool have = tid < n;
  const int holders = min(kChunkThreads, n);
  const uint32_t floor_key =
      kc <= holders ? kth_thread_max_bound<kChunkThreads>(kmax, have, uint32_t(kc), sm.sel) : 0u;

  uint32_t live = 0;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (e * kChunkThreads + tid < n && order_key(f[e]) >= floor_key) live |= 1u << e;
  auto visit = [&](auto&& fn) {
    if (live == 0) return;
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (live & (1u << e)) fn(make_item(order_key(f[e]), index0 + uint32_t(e * kChunkThreads)));
  };
  Digits d;
  d.add_key(key_digits);
  d.add_index(chunk_log2);
  uint64_t prefix = 0, mask = 0;
  uint32_t need = uint32_t(kc);
  radix_select<kChunkThreads>(visit, d, need, prefix, mask, sm.sel);
  visit([&](uint64_t item) {
    if ((item & mask) >= prefix) {
      const uint32_t slot = atomicAdd(&sm.slot, 1u);
      if (slot < uint32_t(kc)) out[slot] = item;
    }
  });
}

// Kernel 1: parts (row, chunk) blockIdx.x, blockIdx.x + gridDim.x, ... With fewer CTAs
// than parts, a CTA loads its next chunk before selecting in the current one, so that
// the loads of every resident CTA stay in flight through the selects' barriers.
template <typename T, int E>
__global__ void __launch_bounds__(kChunkThreads)
    topk_chunk_kernel(const T* x, int64_t v, int64_t chunks, int64_t parts, int chunk_log2, int kc, int key_digits,
                      uint64_t* cand, float* chunk_max, double* chunk_sum) {
  pdl_wait();
  __shared__ ChunkSmem sm;
  int64_t part = blockIdx.x;
  ChunkPart cp(part, v, chunks, chunk_log2);
  T raw[E];
  chunk_load<T, E>(x, v, cp, raw);
  while (true) {
    float f[E];
#pragma unroll
    for (int e = 0; e < E; ++e) f[e] = to_f32(raw[e]);
    const int64_t next = part + gridDim.x;
    const ChunkPart np(next < parts ? next : part, v, chunks, chunk_log2);
    if (next < parts) chunk_load<T, E>(x, v, np, raw);  // consumed by the next iteration
    chunk_select<E>(f, cp, part, chunk_log2, kc, key_digits, cand, chunk_max, chunk_sum, sm);
    if (next >= parts) break;
    part = next;
    cp = np;
  }
}

// Kernel 2: row blockIdx.x. Its chunks * kc candidates go to shared memory (thread t
// holds t, t + 512, ...), the k best are selected, ordered and written out.
template <typename T>
__global__ void __launch_bounds__(kMergeThreads)
    topk_merge_kernel(const T* x, int64_t v, int k, int chunks, int kc, int key_digits, int index_bits, int sort_n,
                      const uint64_t* cand, const float* chunk_max, const double* chunk_sum, float* values,
                      int32_t* ids, float* logprobs) {
  pdl_wait();
  constexpr int kWarps = kMergeThreads / 32;
  extern __shared__ uint64_t merge_smem[];  // [n] candidates, then [sort_n] the k selected
  __shared__ SelectSmem sm;
  __shared__ float red_f[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ unsigned long long red_u[kWarps];
  __shared__ uint32_t s_slot;

  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  const int n = chunks * kc;
  uint64_t* items = merge_smem;
  uint64_t* sel = merge_smem + n;
  const uint64_t* src = cand + row * n;
  uint32_t kmax = 0;
  bool have = false;
#pragma unroll 8
  for (int i = tid; i < n; i += kMergeThreads) {
    const uint64_t item = src[i];
    items[i] = item;
    if (item != 0) {
      kmax = max(kmax, uint32_t(item >> 32));
      have = true;
    }
  }

  // The row's log-sum-exp from the chunks' (m_c, S_c); M == -inf (no number above -inf)
  // gives NaN, as the host's sum of exp(-inf - -inf) does.
  const float* cm = chunk_max + row * chunks;
  const double* cs = chunk_sum + row * chunks;
  float lmx = neg_inf();
  for (int c = tid; c < chunks; c += kMergeThreads) lmx = lmx < cm[c] ? cm[c] : lmx;
  const float mx = block_max_keep<kWarps>(lmx, red_f);
  double lsum = 0;
  for (int c = tid; c < chunks; c += kMergeThreads) lsum += cs[c] * exp(double(cm[c]) - double(mx));
  const double total = block_sum_double<kWarps>(lsum, red_d);
  const double lse = mx == neg_inf() ? __longlong_as_double(0x7ff8000000000000LL) : double(mx) + log(total);

  const T* xr = x + row * v;
  auto write = [&](int j, uint64_t item) {  // output j of the row
    const int32_t i = int32_t(~uint32_t(item & 0xffffffffu));
    const float f = to_f32(xr[i]);
    values[row * k + j] = f;
    ids[row * k + j] = i;
    logprobs[row * k + j] = float(double(f) - lse);
  };
  if (k == 1) {  // the largest candidate (items are unique; 0 pads, never the largest of a real row)
    uint64_t best = 0;
    for (int i = tid; i < n; i += kMergeThreads) best = max(best, items[i]);
    best = block_max_item<kWarps>(best, red_u);
    if (tid == 0) write(0, best);
    return;
  }
  const int holders = __syncthreads_count(have);  // also: items[] is complete
  const uint32_t floor_key =
      k <= holders ? kth_thread_max_bound<kMergeThreads>(kmax, have, uint32_t(k), sm) : 0u;
  uint32_t live = 0;
  for (int i = tid, e = 0; i < n; i += kMergeThreads, ++e) {
    const uint64_t item = items[i];
    if (item != 0 && uint32_t(item >> 32) >= floor_key) live |= 1u << e;
  }
  auto visit = [&](auto&& fn) {
    for (uint32_t b = live; b != 0; b &= b - 1) fn(items[tid + (__ffs(int(b)) - 1) * kMergeThreads]);
  };
  Digits d;
  d.add_key(key_digits);
  d.add_index(index_bits);
  uint64_t prefix = 0, mask = 0;
  uint32_t need = uint32_t(k);
  if (tid == 0) s_slot = 0;
  radix_select<kMergeThreads>(visit, d, need, prefix, mask, sm);
  visit([&](uint64_t item) {
    if ((item & mask) >= prefix) {
      const uint32_t slot = atomicAdd(&s_slot, 1u);
      if (slot < uint32_t(k)) sel[slot] = item;
    }
  });
  __syncthreads();

  if (k <= 256) {
    // The items are unique: each one's place is the number of items above it (k reads of
    // shared memory, the same address across a warp, instead of a sort's barriers).
    for (int j = tid; j < k; j += kMergeThreads) {
      const uint64_t me = sel[j];
      int place = 0;
      for (int i = 0; i < k; ++i) place += sel[i] > me;
      write(place, me);
    }
    return;
  }
  for (int i = k + tid; i < sort_n; i += kMergeThreads) sel[i] = 0;  // pads sort last
  __syncthreads();
  bitonic_sort_desc<kMergeThreads>(sel, sort_n);
  for (int j = tid; j < k; j += kMergeThreads) write(j, sel[j]);
}
int sort_size(int64_t n) {
  int s = 1;
  while (s < n) s <<= 1;
  return s;
}

size_t merge_smem_bytes(int64_t items, int64_t k) { return size_t(items + sort_size(k)) * sizeof(uint64_t); }

// The chunk kernel for E logits a thread (chunks of 256 E), by chunk_log2.
template <typename T, typename Fn>
void with_chunk_kernel(int chunk_log2, Fn&& fn) {
  switch (chunk_log2) {
    case 9: fn(topk_chunk_kernel<T, 2>); break;
    case 10: fn(topk_chunk_kernel<T, 4>); break;
    case 11: fn(topk_chunk_kernel<T, 8>); break;
    case 12: fn(topk_chunk_kernel<T, 16>); break;
    default: fn(topk_chunk_kernel<T, 32>); break;
  }
}

// The split plan, or the one-CTA-per-row one where the split does not fit.
TopKPlan plan_split(const TopKConfig& c, int64_t rows, int64_t v, int64_t k, int chunk) {
  TopKPlan p;
  p.dtype = c.dtype;
  if (v <= k || v <= (int64_t(1) << kMinChunkLog2)) return p;
  auto items = [&](int lg) { return ((v + (int64_t(1) << lg) - 1) >> lg) * std::min<int64_t>(k, int64_t(1) << lg); };
  int lg = kMinChunkLog2;
  if (chunk > 0) {
    while (lg < kMaxChunkLog2 && (int64_t(1) << lg) < chunk) ++lg;
  } else {
    // Grow the chunk while the grid still covers about 3/4 of the SMs (batch 1: many
    // small chunks; large batches: fewer, longer ones, amortizing each CTA's selects),
    // and while it is short next to k or the row would have too many candidates.
    // Growth for the grid's sake stops at 2048: E = 8 holds a chunk and the next one's
    // loads in 61 registers, four CTAs an SM (E = 16 takes 109: two).
    const int64_t target = std::max(1, c.num_sms * 3 / 4);
    while (lg < kMaxChunkLog2 &&
           ((lg < kAutoMaxChunkLog2 && rows * ((v + (int64_t(1) << (lg + 1)) - 1) >> (lg + 1)) >= target) ||
            (int64_t(1) << lg) < 4 * k || items(lg) > kMergeMaxItems))
      ++lg;
  }
  const int64_t chunks = (v + (int64_t(1) << lg) - 1) >> lg;
  if (chunks < 2 || items(lg) > kMergeMaxItems || merge_smem_bytes(items(lg), k) > c.max_merge_smem) return p;
  p.chunk_log2 = lg;
  p.chunks = chunks;
  p.kc = std::min<int64_t>(k, int64_t(1) << lg);
  const int64_t parts = rows * chunks;
  p.grid = c.fit_grid ? std::min(parts, c.resident[lg - kMinChunkLog2]) : parts;
  p.scratch_bytes = size_t(parts) * (sizeof(double) + sizeof(float) + size_t(p.kc) * sizeof(uint64_t));
  return p;
}

}  // namespace

TopKConfig topk_logits_config(DType t) {
  TopKConfig c;
  c.dtype = t;
  if (const char* e = std::getenv("KILN_CUDA_TOPK_CHUNK"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    KILN_THROW_IF(*end != '\0' || v < (1L << kMinChunkLog2) || v > (1L << kMaxChunkLog2), kInvalidArgument,
                  "KILN_CUDA_TOPK_CHUNK='", e, "': expected a chunk of ", 1 << kMinChunkLog2, " to ",
                  1 << kMaxChunkLog2, " logits");
    c.chunk = int(v);
  }
  if (const char* e = std::getenv("KILN_CUDA_TOPK_GRID")) c.fit_grid = std::string(e) != "full";
  int dev = 0, optin = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&c.num_sms, cudaDevAttrMultiProcessorCount, dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  // Room is left for the merge kernel's static shared memory (the select's histogram).
  c.max_merge_smem =
      std::min(merge_smem_bytes(kMergeMaxItems, ir::kTopKLogitsMaxK), size_t(std::max(optin - 4096, 0)));
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    if (c.max_merge_smem > 48 * 1024)
      KILN_CUDA_CHECK(cudaFuncSetAttribute(topk_merge_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(c.max_merge_smem)));
    for (int lg = kMinChunkLog2; lg <= kMaxChunkLog2; ++lg)
      with_chunk_kernel<T>(lg, [&](auto kernel) {
        int per_sm = 0;
        KILN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kChunkThreads, 0));
        c.resident[lg - kMinChunkLog2] = int64_t(std::max(per_sm, 1)) * c.num_sms;
      });
  });
  return c;
}

TopKPlan topk_logits_plan(const TopKConfig& c, int64_t rows, int64_t v, int64_t k, int chunk) {
  if (rows < 1 || k < 1) return {.dtype = c.dtype};
  return plan_split(c, rows, v, k, chunk > 0 ? chunk : c.chunk);
}

void launch_topk_logits(DType t, const void* x, int64_t rows, int64_t v, int64_t k, float* values, int32_t* ids,
                        float* logprobs, const TopKPlan& plan, void* scratch, cudaStream_t s) {
  KILN_THROW_IF(k < 1 || k > ir::kTopKLogitsMaxK, kInvalidArgument, "TopKLogits: k must be in [1, ",
                ir::kTopKLogitsMaxK, "], got ", k);
  KILN_THROW_IF(v < 1 || v >= (int64_t(1) << 31), kInvalidArgument, "TopKLogits: ", v,
                " logits per row (expected 1 to 2^31 - 1)");
  if (rows == 0) return;
  const int index_bits = v > 1 ? 32 - __builtin_clz(uint32_t(v - 1)) : 1;
  if (!plan.split()) {
    const int sort_n = sort_size(std::min(k, v));
    KILN_CUDA_DISPATCH_FLOAT(t, T, {
      launch_k(topk_row_kernel<T>, unsigned(rows), kThreads, size_t(sort_n) * sizeof(uint64_t), s,
          static_cast<const T*>(x), v, int(k), key_passes<T>(), index_bits, sort_n, values, ids, logprobs);
    });
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  KILN_CHECK(plan.dtype == t && v > k && plan.chunk_log2 >= kMinChunkLog2 && plan.chunk_log2 <= kMaxChunkLog2 &&
                 plan.chunks == (v + (int64_t(1) << plan.chunk_log2) - 1) >> plan.chunk_log2 &&
                 plan.kc == std::min<int64_t>(k, int64_t(1) << plan.chunk_log2) &&
                 plan.chunks * plan.kc <= kMergeMaxItems && plan.grid >= 1 && plan.grid <= rows * plan.chunks,
             "TopKLogits: a split plan made for other shapes or another dtype");
  KILN_CHECK(scratch != nullptr, "TopKLogits: the split plan needs ", plan.scratch_bytes, " bytes of scratch");
  KILN_THROW_IF(rows * plan.chunks >= (int64_t(1) << 31), kInvalidArgument, "TopKLogits: ", rows, " rows of ", v,
                " logits are too many chunks for one grid");
  const int64_t parts = rows * plan.chunks;
  auto* csum = static_cast<double*>(scratch);
  auto* cand = reinterpret_cast<uint64_t*>(csum + parts);
  auto* cmax = reinterpret_cast<float*>(cand + parts * plan.kc);
  const int sort_n = sort_size(k);
  const size_t smem = merge_smem_bytes(plan.chunks * plan.kc, k);
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    const T* xt = static_cast<const T*>(x);
    constexpr int kd = key_passes<T>();
    with_chunk_kernel<T>(plan.chunk_log2, [&](auto kernel) {
      launch_k(kernel, unsigned(plan.grid), kChunkThreads, 0, s, xt, v, plan.chunks, parts, plan.chunk_log2,
               int(plan.kc), kd, cand, cmax, csum);
    });
    KILN_CUDA_CHECK_LAUNCH();
    launch_k(topk_merge_kernel<T>, unsigned(rows), kMergeThreads, smem, s, xt, v, int(k), int(plan.chunks),
             int(plan.kc), kd, index_bits, sort_n, static_cast<const uint64_t*>(cand), static_cast<const float*>(cmax),
             static_cast<const double*>(csum), values, ids, logprobs);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda

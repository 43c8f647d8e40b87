// TopKLogits (see topk.h): one CTA per row, exact. Values map to order-preserving 32-bit
// keys (-0 == +0, NaN below -inf); a radix select, 8 key bits a pass from the top, finds
// the k-th largest key (two passes for bf16, three for f16, four for f32: the lower
// key bits of a converted 16-bit value follow from its sign); one ordered pass keeps
// every element above that key plus the lowest-index ones equal to it; a bitonic sort
// in shared memory orders the k candidates by (key desc, index asc). The log-sum-exp
// rides along the first two passes: the max as std::max keeps it (NaN never wins), then
// the sum of exp(double(x) - max) in double, as the host's logprobs_of computes it
// (only the summation order differs, far below f32 rounding of the log-probs).
#include <algorithm>
#include <type_traits>

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

template <typename T, int kPasses>
__global__ void __launch_bounds__(kThreads)
    topk_logits_kernel(const T* x, int64_t v, int k, int sort_n, float* values, int32_t* ids, float* logprobs) {
  pdl_wait();  // programmatic dependent launch: the previous kernel's writes are visible
  extern __shared__ unsigned long long cand[];  // [sort_n]: key << 32 | ~index
  __shared__ uint32_t hist[256];
  __shared__ float red_f[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ uint32_t s_bin, s_need;
  __shared__ int s_above, s_warp_eq[kWarps];

  const T* row = x + int64_t(blockIdx.x) * v;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool select = v > k;  // else every element is a candidate
  uint32_t prefix = 0, mask = 0, need = uint32_t(k);
  float mx = neg_inf();
  double lse = 0;

  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    float lmx = neg_inf();
    double lsum = 0;
    for (int64_t i = tid; i < v; i += kThreads) {
      const float f = to_f32(row[i]);
      if (pass == 0) lmx = lmx < f ? f : lmx;
      if (pass == 1) lsum += exp(double(f) - double(mx));
      if (select) {
        const uint32_t key = order_key(f);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
    }
    if (pass == 0) mx = block_max_keep(lmx, red_f);
    if (pass == 1) lse = double(mx) + log(block_sum_double(lsum, red_d));
    __syncthreads();
    if (!select) continue;
    // The bin holding the need-th largest key: lane l owns bins 255-8l .. 248-8l.
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
            s_bin = uint32_t(255 - (lane * 8 + j));
            s_need = need - acc;
            break;
          }
          acc += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= s_bin << shift;
    mask |= 255u << shift;
    need = s_need;
  }

  // Candidates: keys above the k-th go first (any order), then the `need` lowest-index
  // ones equal to it, found by an ordered scan of the row, a CTA-wide chunk at a time.
  if (tid == 0) s_above = 0;
  __syncthreads();
  const int above_total = select ? k - int(need) : 0;
  uint32_t eq_taken = 0;
  for (int64_t base = 0; base < v; base += kThreads) {
    const int64_t i = base + tid;
    bool eq = false;
    unsigned long long c = 0;
    if (i < v) {
      const uint32_t key = order_key(to_f32(row[i]));
      c = (static_cast<unsigned long long>(key) << 32) | uint32_t(~uint32_t(i));
      if (!select) {
        cand[i] = c;
      } else if ((key & mask) > prefix) {
        cand[atomicAdd(&s_above, 1)] = c;
      } else if ((key & mask) == prefix && eq_taken < need) {
        eq = true;
      }
    }
    if (!select || eq_taken >= need) continue;  // uniform across the CTA
    const unsigned ballot = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) s_warp_eq[warp] = __popc(ballot);
    __syncthreads();
    uint32_t before = 0, total = 0;
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? uint32_t(s_warp_eq[w]) : 0u;
      total += uint32_t(s_warp_eq[w]);
    }
    const uint32_t rank = eq_taken + before + uint32_t(__popc(ballot & ((1u << lane) - 1u)));
    if (eq && rank < need) cand[above_total + int(rank)] = c;
    eq_taken += total;
    __syncthreads();  // s_warp_eq is rewritten by the next chunk
  }
  const int n = select ? k : int(v);
  for (int i = n + tid; i < sort_n; i += kThreads) cand[i] = 0;  // pads sort last
  __syncthreads();

  // Bitonic sort, descending.
  for (int size = 2; size <= sort_n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = tid; t < sort_n / 2; t += kThreads) {
        const int a = 2 * t - (t & (stride - 1)), b = a + stride;
        const unsigned long long ca = cand[a], cb = cand[b];
        if (((a & size) == 0) ? ca < cb : ca > cb) {
          cand[a] = cb;
          cand[b] = ca;
        }
      }
      __syncthreads();
    }

  float* vo = values + int64_t(blockIdx.x) * k;
  int32_t* io = ids + int64_t(blockIdx.x) * k;
  float* lo = logprobs + int64_t(blockIdx.x) * k;
  for (int j = tid; j < k; j += kThreads) {
    if (j < n) {
      const int32_t i = int32_t(~uint32_t(cand[j] & 0xffffffffu));
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

template <typename T>
constexpr int key_passes() {
  // 8 key bits a pass over the bits a value of T can set: bf16 16, f16 24 (f16 -> f32
  // leaves 13 low mantissa bits zero), f32 all 32.
  if constexpr (std::is_same_v<T, float>) return 4;
  else if constexpr (std::is_same_v<T, __half>) return 3;
  else return 2;
}

}  // namespace

void launch_topk_logits(DType t, const void* x, int64_t rows, int64_t v, int64_t k, float* values, int32_t* ids,
                        float* logprobs, cudaStream_t s) {
  KILN_THROW_IF(k < 1 || k > ir::kTopKLogitsMaxK, kInvalidArgument, "TopKLogits: k must be in [1, ",
                ir::kTopKLogitsMaxK, "], got ", k);
  KILN_THROW_IF(v < 1 || v >= (int64_t(1) << 31), kInvalidArgument, "TopKLogits: ", v,
                " logits per row (expected 1 to 2^31 - 1)");
  if (rows == 0) return;
  int sort_n = 1;
  while (sort_n < int(std::min(k, v))) sort_n <<= 1;
  const size_t smem = size_t(sort_n) * sizeof(unsigned long long);
  KILN_CUDA_DISPATCH_FLOAT(t, T, {
    launch_k(topk_logits_kernel<T, key_passes<T>()>, unsigned(rows), kThreads, smem, s,
        static_cast<const T*>(x), v, int(k), sort_n, values, ids, logprobs);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda

// Weight-only q8/q4 Linear layers on the device (formats of core/weight_quant.h).
// Few token rows (decode, m <= kQGemvMaxRows): a GEMV that streams the codes with 16-byte
// loads and dequantizes in registers, with the epilogues of the 16-bit GEMV (bias, GELU,
// SiLU, SwiGLU on a merged gate|up weight). Three kernels over two device layouts; a
// weight is uploaded once, in the layout of the kernel chosen when the graph is compiled:
//  - kDp4a (bf16/f16 activations, the default on sm_61+): the kRows layout; x rounded to
//    int8 per group of 32 in each CTA's shared memory, integer dot products with dp4a, the
//    group's scale and min applied in f32 (gemv_quant_dp4a.cu; x's rounding bounds its
//    extra error, no measurable perplexity cost on the real SmolLM2: bench/RESULTS.md).
//    Every row count 1..8 runs it where x fits a CTA's shared memory (at 8 rows up to
//    k = 23K on an H100/H200), else the kRows kernel below; in the Linear op 1-5 rows by
//    default where the skinny GEMM below applies (kQGemmSkinnyMinRowsDefault). The mma kernel
//    cannot stand in at 4-8 rows: it reads the other layout, and a second copy of the weights would
//    undo the point of q4.
//  - kMma (bf16/f16, KILN_CUDA_QGEMV=mma): 16 weight rows x 8 token rows per warp
//    through tensor-core mma.sync (codes decoded exactly to 16-bit integers, products
//    summed in f32 per group, then scale·dot + min·Σx in f32), from a layout reordered at
//    upload so each lane's 16-byte load holds exactly its fragment (see QuantLayout).
//  - kRows (f32 activations, or KILN_CUDA_QGEMV=old): the row-major CPU layout, f32 math
//    on the CUDA cores, 4 weight rows per warp.
// More rows: the skinny GEMM (launch_qgemm_skinny, by default 6-64 rows of 16-bit
// activations), else tiles of the weight dequantized into a workspace and multiplied by
// cuBLASLt. Tested against the CPU backend's q8/q4 kernels (the same quantized weights)
// in tests/backends/cuda/quant_test.cpp; timed by bench/cuda_gemv_bench.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backends/cuda/ops/gemv.h"
#include "core/dtype.h"
#include "core/weight_quant.h"

namespace kiln::cuda {

constexpr int64_t kQGemvMaxRows = 8;

// How a quantized weight lies on the device.
//  kRows: row-major as core/weight_quant.h's QuantizedRows: row r's codes at
//    codes + r * code_stride (k for q8, k / 2 for q4), its group scales at
//    scales + r * scale_stride (q8: f16; q4: an f16 (scale, min) pair per group as 32 bits,
//    scale in the low half).
//  kMma: each row cut into 64-byte blocks (q4: 4 groups, q8: 2 groups; the last block
//    zero-padded, so code_stride = 64 * blocks); inside a block, lane quarter t (0..3)
//    owns bytes [16t, 16t + 16): the 8 codes k = 32G + 8t .. 32G + 8t + 7 of each group G
//    of the block, group after group (q4: 4 bytes each, q8: 8). In a q4 slice's 32-bit
//    word, codes 2j and 2j+1 sit in nibbles j and j + 4, so one mask pulls both into the
//    two halves of a 16-bit pair. Scales as kRows with scale_stride rounded up to the
//    padded group count (zeros past k), so a block's scales are one aligned load.
enum class QuantLayout : uint8_t { kRows, kMma };

// A quantized [n, k] weight on the device, with its power-of-two factor at row_factor[r].
struct QuantWeightView {
  QuantFormat format = QuantFormat::kQ4;
  int64_t n = 0, k = 0;
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;
  const float* row_factor = nullptr;
  QuantLayout layout = QuantLayout::kRows;
  int64_t code_stride = 0;   // bytes between rows' codes
  int64_t scale_stride = 0;  // scale entries (16 or 32 bits) between rows' scales
  size_t scale_bytes() const { return format == QuantFormat::kQ4 ? 4 : 2; }
  size_t bytes() const {  // what a forward streams (codes incl. padding, scales, factors)
    return size_t(n) * (size_t(code_stride) + size_t(scale_stride) * scale_bytes() + 4);
  }
};

// The strides of `layout` for a [., k] weight (k % 32 == 0).
QuantWeightView quant_view_shape(QuantFormat f, int64_t n, int64_t k, QuantLayout layout);

// A weight's device image built on the host: codes | scales | row factors, each section
// 256-byte aligned; view_at(base) points a view into a copy of it at `base`.
struct QuantImage {
  std::vector<uint8_t> bytes;
  QuantWeightView shape;  // pointers null; the strides
  size_t scales_off = 0, factor_off = 0;
  QuantWeightView view_at(const void* base) const;
};
QuantImage quant_image(const QuantizedRows& q, QuantLayout layout);

// The GEMV kernels of a decode-sized quantized Linear (see the file comment).
enum class QGemvKernel : uint8_t { kRows, kMma, kDp4a };
const char* qgemv_kernel_name(QGemvKernel k);  // "old", "mma", "dp4a"
// The kernel for activations of `dtype` on the current device, read from KILN_CUDA_QGEMV
// when a graph is compiled (never per step): "dp4a" kDp4a (sm_61+), "mma" kMma (sm_80+),
// "old" kRows; unset or empty: kDp4a. f32 activations, and a device without the
// instruction, get kRows. Any other value is kInvalidArgument naming the variable.
QGemvKernel qgemv_kernel(DType dtype);
// The layout a kernel reads: kMma for kMma, kRows for kRows and kDp4a.
QuantLayout qgemv_kernel_layout(QGemvKernel k);
// qgemv_kernel_layout(qgemv_kernel(dtype)).
QuantLayout qgemv_layout(DType dtype);

// Whether launch_gemv_quant handles m rows of `dtype` (f32, f16, bf16; 1 <= m <= 8).
bool gemv_quant_supports(DType dtype, int64_t m);
// y[m, n_out] = x[m, k] · wᵀ (+ bias), x/bias/y in `dtype`, 16-byte aligned; bias may be
// null. With kSwiGlu, w holds 2 n_out rows ([gate; up], bias 2 n_out) and
// y = silu(gate) * up; otherwise w.n == n_out. A kMma weight needs bf16/f16.
void launch_gemv_quant(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m,
                       int64_t n_out, cudaStream_t s, GemvEpilogue epi = GemvEpilogue::kNone);
// The same through `kernel`, which must read w's layout (qgemv_kernel_layout). kDp4a runs
// the kRows kernel where qgemv_dp4a_supports says no (f32, or x too large for shared memory).
// beside_attention: QGemvDp4aTuning::beside_attention for the dp4a kernel.
void launch_gemv_quant(DType dtype, const void* x, const QuantWeightView& w, const void* bias,
                       void* y, int64_t m, int64_t n_out, cudaStream_t s, GemvEpilogue epi,
                       QGemvKernel kernel, bool beside_attention = false);
// The prompt GEMM over a kRows weight (qgemm.cu): y[m, w.n] (rows ldy apart) = x[m, k]·wᵀ
// (+ bias), the weight decoded group by group in shared memory with launch_dequant_rows'
// formula and rounding, so it matches the dequantize + cuBLASLt path up to summation order.
// Supported: bf16/f16, the kRows layout (its strides), k % 32 == 0, even n; any m (x, y,
// bias 16-byte aligned; ldy even).
bool qgemm_supports(DType dtype, const QuantWeightView& w);
// warps: a CTA's, 4 or 8 (8: two threads decode each weight row, half the serial decoding
// per CTA; which is faster is for cuda_qgemm_bench to say).
void launch_qgemm(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y,
                  int64_t m, int64_t ldy, cudaStream_t s, int warps = 4);
// The skinny prompt / batch-decode GEMM over a kRows weight (qgemm.cu): the same product and
// support (qgemm_supports, ldy >= n) for m <= kQGemmSkinnyMaxRows token rows, each
// weight read once and dequantized in registers into the mma fragments (the tile
// dequantizer's formula and rounding), x through shared memory; f32 sums, one rounding.
// Split-K over `splits` (1..kQGemmSkinnyMaxSplits) slices of whole k blocks (q4: 128 k,
// q8: 64), each CTA's f32 partial sums in ws (splits x m x n floats; with less, one split)
// added in split order by a second kernel with the bias: the same bits on every run.
// qgemm_skinny_splits: the rule's count for an [n, k] weight on `sms` SMs (until the CTAs
// fill two a SM, keeping at least 4 k blocks a split). `depth`: k blocks of codes a lane
// has in flight (1 or 2; KILN_CUDA_QGEMM_SKINNY_DEPTH), the same bits.
constexpr int64_t kQGemmSkinnyMaxRows = 64;
// The fewest token rows the Linear op gives it by default (KILN_CUDA_QGEMM_SKINNY_MIN_ROWS;
// fewer: the dp4a GEMV, whose time grows with each row while this GEMM's stays flat up to
// 8, one mma n-tile). H100, session 54: at 6 rows 8B q4 decode 1.09x the GEMV's, at 8 rows 1.28x (TinyLlama
// 1.38x); at 4 rows 0.82x / 0.94x.
constexpr int64_t kQGemmSkinnyMinRowsDefault = 6;
constexpr int kQGemmSkinnyMaxSplits = 8;
int qgemm_skinny_splits(int64_t n, int64_t k, QuantFormat f, int sms);
void launch_qgemm_skinny(DType dtype, const void* x, const QuantWeightView& w, const void* bias,
                         void* y, int64_t m, int64_t ldy, cudaStream_t s, int splits = 1,
                         void* ws = nullptr, size_t ws_bytes = 0, int depth = 1);
// Rows [r0, r0 + rows) of w (either layout), dequantized (w = factor * (scale * q + min),
// rounded once to `dtype`) into out [rows, k] (256-byte aligned for cuBLASLt). kRows
// weights: `words` (the default) one thread per 32-bit code word, else the earlier kernel
// of one thread per 16-byte chunk (KILN_CUDA_DEQUANT_WORDS=0, for A/B timing); the same bits.
void launch_dequant_rows(DType dtype, const QuantWeightView& w, int64_t r0, int64_t rows, void* out,
                         cudaStream_t s, bool words = true);

// The kMma GEMV (gemv_quant_mma.cu), called by launch_gemv_quant after its checks.
void launch_qgemv_mma(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m,
                      int64_t n_out, cudaStream_t s, GemvEpilogue epi);

// The dp4a GEMV (gemv_quant_dp4a.cu) over a kRows weight. Each CTA keeps x rounded to int8
// in shared memory, m * k * 1.25 bytes: supported for bf16/f16, 1 <= m <= 8, k % 32 == 0,
// on sm_61+ where that fits a CTA (at 8 rows up to k = 23K on an H100/H200).
bool qgemv_dp4a_supports(DType dtype, int64_t m, int64_t k);
// Launch parameters, for the bench's sweep; 0 = the default. ctas_per_sm: resident CTAs
// per SM, of 24 warps (16 with SwiGLU; capped by occupancy, which allows 1; default 1);
// depth: 16-byte chunks of loads in flight per lane, 2, 4 or 8 at one token row (more rows
// always run 4; default 4; the one-row forms built: chunks_per_step below);
// splits: warps of a CTA that share an output unit, each taking 1/splits of K, 1, 2, 4 or
// 8 (default: qgemv_dp4a_default_splits; 1 where the exchange does not fit shared memory).
// The defaults are placeholders until `cuda_gemv_bench qgemv` has been run on the target
// device: its sweep prints each shape's time for every combination.
// skip_x (a timing ablation only, `cuda_gemv_bench qprologue`): leave x's rounding out,
// so the output is garbage; the difference in time is what the prologue costs.
struct QGemvDp4aTuning {
  int ctas_per_sm = 0;
  int depth = 0;
  int splits = 0;
  bool skip_x = false;
  // A one-row GEMV whose output only the decode attention reads: 16 warps instead of 24 at
  // the same register cap, and the dependent launch released at the kernel's start, so
  // the attention's CTAs fit beside it and read their tables and cache while it streams.
  bool beside_attention = false;
  // Outputs a warp owns at one token row: 1 (32 lanes along K) or 2 (16 lanes along K each:
  // the per-output reduction and pointer setup shared by twice the steps); 0: the default, 2.
  int outs_one_row = 0;
  // 16-byte chunks a lane loads and consumes per step of its loop at one token row: 1, or
  // 2 (two chunks 32 / outs lanes apart: half the loop's bookkeeping per chunk); 0: the
  // default, 2. The one-row forms built: outs 1 and chunks 1 at depth 2, 4 or 8; outs 2 and /
  // or chunks 2 at depth 4; outs 2 with chunks 2 at depth 2 (others are an error). The
  // default, outs 2 and chunks 2 at depth 4, decoded Llama-3.1-8B q4 1.044x and q8 1.018x
  // faster than outs 1 and chunks 1 on an H100, and 1B-class models 1.000-1.042x (none
  // slower beyond the runs' spread; bench/RESULTS.md, session 57). Beside an attention the
  // one-row kernel without SwiGLU stays outs 1, chunks 1, depth 4.
  int chunks_per_step = 0;
  // Before its dependent-launch wait, lane 0 of each warp asks for the codes and scales of
  // its first output units in L2 (cp.async.bulk.prefetch, sm_90+; as many rounds of units
  // as fit half the L2, at least one), so the loads past the first `depth` chunks find them
  // there rather than in DRAM. Opt-in (KILN_CUDA_QGEMV_L2_PREFETCH=1); not yet run on a GPU
  // (session 57). The same bits: only where the loads are served from changes.
  bool l2_prefetch = false;
};
// Whether the one-row form `tune` selects (its zeros resolved to the defaults) is built.
bool qgemv_dp4a_one_row_built(const QGemvDp4aTuning& tune);
// KILN_CUDA_QGEMV_ONE_ROW's value (read once by launch_gemv_quant): the one-row dp4a form
// for A/B runs as '+'-separated parts that replace the default's - outs1|outs2,
// chunks1|chunks2, depth2|depth4|depth8 (e.g. "outs1+chunks1", the kernel before session
// 57, or "depth2"); null or empty: the default. An unknown, empty or repeated part, or a
// form that is not built, throws kInvalidArgument naming the variable.
QGemvDp4aTuning qgemv_one_row_form_parse(const char* value);
// The default split count for `units` output units of `steps` steps each (a step: a lane's
// 16-byte chunks of one loop step, chunks_per_step of them) over `resident_warps` warps: the fewest serial steps of the
// busiest warp (rounds of units x steps per split), more splits only for a gain of more
// than 10%, at least 2 steps per split.
int qgemv_dp4a_default_splits(int64_t units, int64_t steps, int64_t resident_warps);
// What a launch with `tune` runs: CTAs per SM (after the occupancy cap), load depth,
// splits, and the grid's CTAs.
struct QGemvDp4aPlan {
  int ctas_per_sm = 0, depth = 0, splits = 0, ctas = 0;
};
void launch_qgemv_dp4a(DType dtype, const void* x, const QuantWeightView& w, const void* bias, void* y, int64_t m,
                       int64_t n_out, cudaStream_t s, GemvEpilogue epi, const QGemvDp4aTuning& tune = {},
                       QGemvDp4aPlan* plan_only = nullptr);  // plan_only: fill it, launch nothing

}  // namespace kiln::cuda

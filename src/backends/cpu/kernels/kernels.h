// Raw CPU kernels: plain functions on raw pointers, f32 activations, f32 accumulation.
// Each op family has a portable scalar version (also the fallback) and an AVX2/FMA
// version chosen at run time (cpu_isa()). Tested against independent references in
// tests/backends/cpu/ (both ISAs); timed by bench/cpu_kernels_bench.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/dtype.h"
#include "core/hadamard.h"
#include "core/weight_quant.h"

namespace kiln::cpu {

// ---- ISA selection -----------------------------------------------------------------
enum class CpuIsa : uint8_t { kScalar, kAvx2 };
// The ISA used by all kernels: the best the CPU supports, unless KILN_CPU_ISA=scalar.
CpuIsa cpu_isa();
// Forces an ISA (tests run each kernel under every supported one); kAvx2 is ignored on
// a CPU without AVX2+FMA+F16C. Not thread-safe with respect to running kernels.
void cpu_isa_set(CpuIsa isa);
bool cpu_isa_supported(CpuIsa isa);
const char* cpu_isa_name(CpuIsa isa);

// ---- Linear / GEMM: y[T,N] = x[T,K] · W[N,K]ᵀ + b ---------------------------------
// Storage of packed GEMM weights. kQ8/kQ4 are weight-only quantization in the shared
// formats of core/weight_quant.h (every group of kQuantGroup consecutive K values of one
// output shares a scale): q8 symmetric, int8 codes in [-127, 127], w = scale * q (GGUF's
// Q8_0 grid); q4 asymmetric, 4-bit codes in [0, 15] (two per byte), w = scale * q + min
// (GGUF's Q4_1 grid, so Q4_1 checkpoints repack without loss). The panels keep each
// scale/min as its f16 value and the row factor as its power-of-two exponent; kernels
// multiply the two back (exact: the f32 scale the format stands for). Activations and
// accumulation stay f32.
enum class WeightStorage : uint8_t { kF32, kBF16, kF16, kQ8, kQ4 };
using kiln::kQuantGroup;
const char* weight_storage_name(WeightStorage s);
// Bytes per element for kF32/kBF16/kF16 (quantized storages have no whole-byte size).
size_t weight_storage_size(WeightStorage s);
inline bool weight_storage_quantized(WeightStorage s) {
  return s == WeightStorage::kQ8 || s == WeightStorage::kQ4;
}

// Weights repacked into column panels of kPanelWidth outputs: panel p holds outputs
// [16p, 16p+16) as [K][16] contiguous, so the microkernel streams one panel front to
// back and a T=1 GEMV reads every weight byte exactly once. The last panel is zero-padded.
// bf16 panels store their rows in pairs (K rounded up to even, the last row zero): the
// 32-bit word c of pair j holds column c of row 2j in its low half and of row 2j+1 in its
// high half, so one 64-byte load widens to both rows with a shift and a mask (an f32 is
// its bf16 bits shifted up), in column order. Quantized panels are a sequence of groups:
// kQuantGroup rows of 16 codes, then the group's 16 f16 scales, for q4 its 16 f16 mins,
// then the 16 columns' row-factor exponents e (int8; F = 2^e, in [-126, 127]), so one
// stream carries all: a column's f32 scale is f16 scale x 2^e, exactly the value the
// shared format stands for (core/weight_quant.h). Per weight: q4 5.25 bits (f32 scales and
// mins took 6), q8 8.75 (9). A quantized panel is padded to whole 64-byte lines.
constexpr size_t quant_code_bytes(WeightStorage s) {
  return s == WeightStorage::kQ8 ? kQuantGroup * 16 : kQuantGroup * 8;
}
// Bytes from a group's start to its f16 scales, f16 mins (q4) and int8 exponents.
constexpr size_t quant_scales_at(WeightStorage s) { return quant_code_bytes(s); }
constexpr size_t quant_mins_at(WeightStorage s) { return quant_code_bytes(s) + 32; }
constexpr size_t quant_exps_at(WeightStorage s) {
  return quant_code_bytes(s) + (s == WeightStorage::kQ8 ? 32 : 64);
}
constexpr size_t quant_group_bytes(WeightStorage s) { return quant_exps_at(s) + 16; }
// Bytes of a quantized panel of k rows: its groups, padded to whole 64-byte lines.
constexpr size_t quant_panel_bytes(WeightStorage s, int64_t k) {
  return (size_t(k / kQuantGroup) * quant_group_bytes(s) + 63) / 64 * 64;
}
// The row factor 2^e as an f32, e in [-126, 127] (the int8 a group stores).
inline float quant_exp_factor(int8_t e) {
  const uint32_t bits = uint32_t(int32_t(e) + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// The f32 scale (or q4 min) of column c of a group: its f16 value times 2^e.
inline float quant_group_value(WeightStorage s, const uint8_t* group, bool min, int64_t c) {
  uint16_t h;
  std::memcpy(&h, group + (min ? quant_mins_at(s) : quant_scales_at(s)) + 2 * c, 2);
  return f16_to_f32(h) * quant_exp_factor(int8_t(group[quant_exps_at(s) + c]));
}
struct PackedWeight {
  static constexpr int64_t kPanelWidth = 16;
  int64_t n = 0, k = 0;
  WeightStorage storage = WeightStorage::kF32;
  std::shared_ptr<uint8_t[]> data;  // 64-byte aligned; panels() * panel_bytes()

  int64_t panels() const { return (n + kPanelWidth - 1) / kPanelWidth; }
  // Rows a panel stores: K, rounded up to even for bf16's row pairs.
  int64_t stored_k() const { return storage == WeightStorage::kBF16 ? (k + 1) / 2 * 2 : k; }
  // Bytes from a panel's start to its row k0 (a multiple of kQuantGroup when quantized,
  // even for bf16).
  size_t offset(int64_t k0) const {
    switch (storage) {
      case WeightStorage::kQ8:
      case WeightStorage::kQ4: return size_t(k0 / kQuantGroup) * quant_group_bytes(storage);
      default: return size_t(k0 * kPanelWidth) * weight_storage_size(storage);
    }
  }
  size_t panel_bytes() const {
    return weight_storage_quantized(storage) ? quant_panel_bytes(storage, k) : offset(stored_k());
  }
  size_t bytes() const { return size_t(panels()) * panel_bytes(); }
  const uint8_t* panel(int64_t p) const { return data.get() + size_t(p) * panel_bytes(); }
};

// w: PyTorch Linear layout [N, K] (out, in), f32. bf16/f16 round to nearest even;
// kQ8/kQ4 need K to be a multiple of kQuantGroup (kInvalidArgument otherwise).
PackedWeight pack_weight(const float* w, int64_t n, int64_t k, WeightStorage storage);
// The same from weights stored as f32, bf16 or f16 (a 16-bit checkpoint's), widened a
// panel's rows at a time, so no f32 copy of the whole weight is made.
PackedWeight pack_weight(const void* w, DType dtype, int64_t n, int64_t k, WeightStorage storage);
// Packs rows that arrive already quantized (a GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K weight): the same
// panels pack_weight(w, q8|q4) makes, from q's own codes, scales, mins and row factors.
PackedWeight pack_quantized_weight(const QuantizedRows& q);

// How linear() splits and blocks the work; a builder may time several and keep the best.
enum class LinearSplit : uint8_t { kAuto, kPanels /*threads own N panels*/, kRows /*threads own T rows*/ };
struct LinearTactic {
  int mr = 0;        // rows per microkernel call: 1-6, up to 12 with the AVX-512 kernel (0 = auto)
  int64_t kc = 0;    // K cache block (0 = auto; >= K means unblocked)
  LinearSplit split = LinearSplit::kAuto;
  int threads = 0;   // 0 = the global pool's size; 1 = run on the calling thread
  int panels = 0;    // 16-column panels per microkernel call: 1, or 2 (the AVX-512 kernel's
                     // 32-wide tile; else 1); 0 = auto
  // q8/q4 weights may take the int8-activation GEMV (linear()); false keeps x as given
  // (the CPU backend's logits GEMM, whose errors move the distribution itself).
  // Not part of the tactic string: the backend sets it per node.
  bool int8_x = true;
  // q8/q4 weights with the AVX-512 or AVX2 kernels: each K slice of a panel dequantized to f32
  // once per row block (code x scale (+ min), dequantize_row's values) and multiplied by
  // the f32 tiles, at every row count - f32 activations and the f32 kernels' speed on
  // prompts, the bits of the f32 kernels on the dequantized weights. For encoders, which
  // have no decode GEMV whose rows would have to agree with the prompt's (the CPU
  // backend sets it for graphs whose every Attention is bidirectional). Not part of the
  // tactic string.
  bool widen_quant = false;
};
// The heuristic behind LinearTactic{} for a shape (with every field filled in), for a
// microkernel of at most max_mr rows (6: AVX2 and scalar, 12: AVX-512, whose kernel also
// takes two panels a call).
LinearTactic linear_default_tactic(int64_t t, int64_t n, int64_t k, int max_mr = 6);

// bias may be null. y must not alias x. q8/q4 weights on a CPU with AVX-512 VNNI + VBMI (and
// cpu_qgemv_acts() != kF32, tactic.int8_x) take the int8-activation GEMV at every row count:
// each row's x rounded per group of 32 as quantize_rows_groups does - by default to two
// int8 digits (kInt16), else one (kInt8) -, exact integer dot products of each digit with
// the codes, then the f32 kernels' scaling. x's rounding is the only new error: |Δy[c]| <=
// Σ_g |scale_g[c]| Σ_k |q_k| e_g, e_g = d_g / 2 with one digit and d_g / 508 (d_g / 254 / 2,
// plus an ulp of the residual) with two; q4's min term takes the exact Σx. Each row's bits
// are the same whatever rows share the call (a sequence's logits do not depend on the batch
// it was stepped in, nor prefill's numerics on the prompt's length); elsewhere, and for
// other weights, the f32 kernels multiply x as given.
void linear(const float* x, int64_t t, int64_t k, const PackedWeight& w, const float* bias,
            float* y, const LinearTactic& tactic = {});

// Rows per call of the int8-activation q8/q4 GEMV kernel: linear() walks each weight panel
// over all of a Linear's rows in blocks of this many (a decode step of up to 8 sequences is
// one block; 8 rows keep 8 independent vpdpbusd chains in flight).
inline constexpr int kQGemvInt8RowBlock = 8;
// What the q8/q4 Linears multiply (KILN_CPU_QGEMV, read once; anything else is a
// kInvalidArgument error naming it; tests flip it with cpu_qgemv_acts_set):
//  kInt16 ("int16", the default): x rounded to two int8 digits per value, x ~ d (q + q_lo /
//         254): 16-bit codes (|254 q + q_lo| <= 32385) for two vpdpbusd per code block. Error
//         <= d / 508 a value. SmolLM2-135M --weight-dtype q4 perplexity on GPL-3 vs f32:
//         +3.97%, as with x as given; one digit: +6.16% (bench/RESULTS.md).
//  kInt8 ("int8"): one digit, x ~ d q, error <= d / 2: half the integer work, and the
//         SmolLM2 outlier activations' groups get a coarse grid.
//  kF32 ("f32"): the f32 kernels, x as given (as on CPUs without AVX-512 VNNI + VBMI).
enum class QGemvActs : uint8_t { kF32, kInt8, kInt16 };
QGemvActs cpu_qgemv_acts();
void cpu_qgemv_acts_set(QGemvActs acts);
// The weight of the second digit: x ~ d (q + kQGemvLoDigit q_lo).
inline constexpr float kQGemvLoDigit = 1.0f / 254.0f;
// Its rounding of x [t, k] (k a multiple of kQuantGroup): per row and group g of 32, d =
// max|x| / 127 (0 for a group of zeros), qx = rint(x * (127 / max|x|)) (ties to even),
// dx[g] = d (NaN for a group holding a NaN) and sx[g] = the f32 sum of the group's x in
// order; qx rows k bytes apart, dx / sx rows k / 32 apart. With qlo (rows as qx's), the
// second digit: qlo = rint(fma(-d, qx, x) * (127 / max|x| * 254)), the residual (|.| <= d /
// 2 up to an ulp) in steps of d / 254, so |qlo| <= 127 and |x - d (qx + qlo / 254)| <= d /
// 508 up to a few ulps of d; codes of NaN (and of the inf * 0 an infinite x meets) are 0.
void quantize_rows_groups(const float* x, int64_t t, int64_t k, int8_t* qx, float* dx, float* sx,
                          int8_t* qlo = nullptr);

// ---- W8A8 int8 GEMM: y[T,N] = (x_scale * w_scale[n]) * Σ_k qx[t,k] * qw[n,k] + b[n] ----
// Weights are symmetric int8 per output channel (codes in [-127, 127], w = scale[n] * q);
// activations are symmetric int8 per tensor: qx = clamp(round(x / x_scale), -127, 127)
// (ties to even). Accumulation is exact int32, so AVX2 and scalar agree bit for bit.
// Panels of 16 outputs hold K4 = ceil(K/4) rows of [16 outputs][4 consecutive k]
// bytes (64 bytes, zero-padded in K and N): one AVX2 maddubs step reads 4 k of 8 outputs.
struct PackedInt8Weight {
  static constexpr int64_t kPanelWidth = 16;
  int64_t n = 0, k = 0, k4 = 0;
  std::shared_ptr<int8_t[]> data;   // 64-byte aligned; panels() * k4 * 64 bytes
  std::shared_ptr<float[]> scale;   // [panels() * 16], 0 past N
  // [panels() * 16]: 128 * Σ_k of each column's codes (0 past N), which the AVX-512 VNNI
  // tiles take off their sums over x biased to unsigned bytes.
  std::shared_ptr<int32_t[]> bias128;
  int64_t panels() const { return (n + kPanelWidth - 1) / kPanelWidth; }
  const int8_t* panel(int64_t p) const { return data.get() + size_t(p * k4 * 64); }
  size_t bytes() const { return size_t(panels() * k4 * 64) + size_t(panels() * 16 * 8); }
};
// w: [N, K] f32. Per-channel scale = max|w[n,:]| / 127 (a zero row gets scale 0), or
// row_amax[n] / 127 when given (each >= max|w[n,:]|: a row-parallel shard's rows).
PackedInt8Weight pack_weight_int8(const float* w, int64_t n, int64_t k,
                                  const float* row_amax = nullptr);
// Activation quantization of rows of x [t, k] into q [t, ldq] (ldq >= k; the padding
// columns are zeroed): q = clamp(round(x * inv_scale), -127, 127); NaN -> -127.
void quantize_rows_int8(const float* x, int64_t t, int64_t k, float inv_scale, int8_t* q, int64_t ldq);
// Exact integer accumulators acc[t, n] = Σ_k qx[t,k] * qw[n,k] of already quantized rows
// (qx: [t, 4 * w.k4], zero-padded). For conformance tests and diagnostics.
void gemm_int8_acc(const int8_t* qx, int64_t t, const PackedInt8Weight& w, int32_t* acc);
// The whole W8A8 Linear: quantizes x with x_scale, multiplies, rescales, adds bias (may
// be null): y = float(acc) * (x_scale * scale[n]) + b[n] (a multiply then an add).
// x_scale <= 0 selects dynamic per-row (per-token) scales: row r uses max|x[r,:]| / 127
// (1 for an all-zero row) in place of x_scale.
void linear_int8(const float* x, int64_t t, int64_t k, const PackedInt8Weight& w, float x_scale,
                 const float* bias, float* y);

// ---- FP8 E4M3 GEMM: y[T,N] = (x_scale * w_scale) * Σ_k e(qx[t,k]) * e(qw[n,k]) + b[n] ----
// e() decodes an E4M3 code (core/dtype.h); qx = e4m3(x * x_inv) with one static
// per-tensor activation scale, qw the weight codes with one per-tensor scale
// (core/fp8.h). Every decoded value has at most 4 significant bits, so the codes are
// packed exactly as bf16 panels and the products are exact in f32; the sums accumulate
// in f32 through the bf16 GEMM (linear()), as the GPU's tensor cores accumulate them.
struct PackedFp8Weight {
  PackedWeight values;   // the decoded weight codes, bf16 panels
  float w_scale = 1.0f;  // w ≈ e(qw) * w_scale
  int64_t n() const { return values.n; }
};
// codes: [N, K] E4M3.
PackedFp8Weight pack_weight_fp8(const uint8_t* codes, int64_t n, int64_t k, float w_scale);
// Quantizes rows of x [t, k] to E4M3 with x_inv and writes the decoded values to xq.
void quantize_rows_fp8(const float* x, int64_t t, int64_t k, float x_inv, float* xq);
// The whole FP8 Linear (bias may be null): y = acc * (x_scale * w_scale) + b[n], acc the
// f32 sum of the decoded products (a multiply then an add).
void linear_fp8(const float* x, int64_t t, int64_t k, const PackedFp8Weight& w, float x_scale, float x_inv,
                const float* bias, float* y, const LinearTactic& tactic = {});

// ---- Norms (rows × dim, row-major; y may alias x) ------------------------------------
void layer_norm(const float* x, const float* gamma, const float* beta, float eps, int64_t rows,
                int64_t dim, float* y);
// Llama RMSNorm: y = x / sqrt(mean(x²) + eps) * w, all in f32.
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t dim, float* y);
// Per-head RMSNorm (HeadRMSNorm): rows of `width` values; the first `groups` groups of d
// values each normalized and scaled by w + g * w_stride (w_stride 0: one weight shared by
// every group, d: one per group); values from groups * d on copied.
void head_rms_norm(const float* x, const float* w, int64_t w_stride, float eps, int64_t rows, int64_t width,
                   int64_t groups, int64_t d, float* y);
// Fused residual add: sum = x + residual (written, may alias either), y = norm(sum).
void add_rms_norm(const float* x, const float* residual, const float* w, float eps, int64_t rows,
                  int64_t dim, float* sum, float* y);
void add_layer_norm(const float* x, const float* residual, const float* gamma, const float* beta,
                    float eps, int64_t rows, int64_t dim, float* sum, float* y);

// ---- Elementwise (n elements; out may alias an input) -------------------------------
void add(const float* a, const float* b, int64_t n, float* out);
void mul(const float* a, const float* b, int64_t n, float* out);
void gelu_erf(const float* x, int64_t n, float* out);   // BERT "gelu": 0.5x(1+erf(x/√2))
void gelu_tanh(const float* x, int64_t n, float* out);  // GPT-2 "gelu_new"
void silu(const float* x, int64_t n, float* out);
void swiglu(const float* gate, const float* up, int64_t n, float* out);  // silu(gate)*up
void tanh(const float* x, int64_t n, float* out);
void exp(const float* x, int64_t n, float* out);
// Numerically stable softmax over each row of [rows, dim] (in place allowed).
void softmax_rows(const float* x, int64_t rows, int64_t dim, float* out);
// One row of softmax_rows on the calling thread (for kernels already inside a
// parallel loop); same arithmetic, so fused and unfused softmaxes agree bit for bit.
void softmax_row(const float* x, int64_t dim, float* out);

// ---- RoPE, HF Llama "rotate_half" (NeoX) convention, in place ----------------------
// x: [T, heads, head_dim]; dims [0, rotary_dim) rotate, the rest pass through.
// θ = float(pos) * inv_freq[i] in f32, cos/sin in f32, as HF computes them.
void rope(float* x, int64_t t, int64_t heads, int64_t head_dim, int64_t rotary_dim,
          const int32_t* positions, const float* inv_freq);

// ---- Paged attention -----------------------------------------------------------------
// One sequence of a batch. ctx_len counts the whole context including this step's
// q_len new tokens, which are its last q_len positions: query j sits at position
// ctx_len - q_len + j. Token at position p lives in block block_table[p / block_size],
// row p % block_size.
struct AttentionSeq {
  int32_t q_start;  // first row of this sequence in q/out
  int32_t q_len;
  int32_t ctx_len;
  const int32_t* block_table;
};
// q, out: [T, Hq, D]; k_cache, v_cache (one layer): [num_blocks, block_size, Hkv, D].
// GQA: query head h reads kv head h / (Hq / Hkv). causal: query at position p sees
// positions <= p; otherwise all ctx_len positions of its sequence. window > 0 (causal
// only): a sliding window, the query at position p sees positions (p - window, p], as
// transformers' sliding_window (Mistral, Gemma local layers). softcap > 0: each score s
// (q.k times scale) becomes softcap * tanh(s / softcap) before the softmax (Gemma 2's
// attn_logit_softcapping). Online softmax in f32.
void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t hq, int64_t hkv, int64_t d, float scale,
                     bool causal, const AttentionSeq* seqs, int64_t num_seqs, float* out, int64_t window = 0,
                     float softcap = 0.0f);
// Writes k, v [T, Hkv, D] into the caches at slot_mapping[i] = block * block_size + row;
// a slot of -1 skips the token (padding).
void kv_cache_write(const float* k, const float* v, const int64_t* slot_mapping, int64_t t,
                    int64_t hkv, int64_t d, float* k_cache, float* v_cache);

// INT8 KV cache (KvDType::kInt8): K and V rows as int8 codes [slots, Hkv, D] with one f32
// scale per (slot, kv head) in [slots, Hkv]. A row is quantized symmetrically when written:
// s = max|x| / 127 over its D values, code = round(x / s) in [-127, 127] (s = 0 and all codes
// 0 for an all-zero row), so |x - code * s| <= s / 2. Returns s.
float kv_quantize_row(const float* x, int64_t d, int8_t* codes);
// kv_cache_write into the int8 cache: quantizes each (token, kv head) row. k_shift, when
// not null, is the layer's key shift [Hkv, D] (KvLayout::k_shift): key rows are quantized
// as k - k_shift (each difference rounded to f32), value rows as they are. k_rotate
// (KvLayout::k_rotate): key rows go through core/hadamard.h's hadamard_transform (after
// the shift) before they are quantized; queries then need kv_rotate_queries.
void kv_cache_write_int8(const float* k, const float* v, const int64_t* slot_mapping, int64_t t,
                         int64_t hkv, int64_t d, int8_t* k_codes, float* k_scales, int8_t* v_codes,
                         float* v_scales, const float* k_shift = nullptr, bool k_rotate = false);
// The queries' side of KvLayout::k_rotate: rows [rows, d] of q to out (may alias), each
// through hadamard_transform and divided by its block size b (exact: b is a power of
// two). The transform H is symmetric with H H = b I, so (H q / b) . (H k) = q . k.
void kv_rotate_queries(const float* q, int64_t rows, int64_t d, float* out);
// paged_attention over the int8 cache: the scales are applied inside the dot products and
// the V accumulation (q . (s * c) = s * (q . c)); no dequantized copy is made.
void paged_attention_int8(const float* q, const int8_t* k_codes, const float* k_scales,
                          const int8_t* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                          int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                          int64_t num_seqs, float* out, int64_t window = 0,
                     float softcap = 0.0f);

// FP8 KV cache (KvDType::kFp8): the same layout with FP8 E4M3 codes (one byte, their own
// type so the attention loop overloads on it). A row is quantized when written: s = max|x|
// / 448 over its D values, code = e4m3(x * (448 / max|x|)) (core/dtype.h's rounding: to
// nearest even, saturating at 448), so |x - decode(code) * s| <= 2^-4 |x| for the normal
// range (|x| >= 2^-6 * s) and <= 2^-10 * s below it. Zero and non-finite rows as for int8.
enum class Fp8Code : uint8_t {};
float kv_quantize_row_fp8(const float* x, int64_t d, Fp8Code* codes);
// The same into the fp8 cache (k_shift and k_rotate as for int8).
void kv_cache_write_fp8(const float* k, const float* v, const int64_t* slot_mapping, int64_t t,
                        int64_t hkv, int64_t d, Fp8Code* k_codes, float* k_scales, Fp8Code* v_codes,
                        float* v_scales, const float* k_shift = nullptr, bool k_rotate = false);
// paged_attention over the fp8 cache, the scales applied as in paged_attention_int8 and the
// codes decoded exactly in registers.
void paged_attention_fp8(const float* q, const Fp8Code* k_codes, const float* k_scales,
                         const Fp8Code* v_codes, const float* v_scales, int64_t block_size, int64_t hq,
                         int64_t hkv, int64_t d, float scale, bool causal, const AttentionSeq* seqs,
                         int64_t num_seqs, float* out, int64_t window = 0,
                     float softcap = 0.0f);

// ---- Embedding -----------------------------------------------------------------------
// out[i] = table[ids[i]]; throws kiln::Error (kOutOfRange) naming the id and vocab size.
void embedding(const float* table, int64_t vocab, const int32_t* ids, int64_t t, int64_t dim,
               float* out);
// One lookup of a summed embedding: table [vocab, dim] indexed by ids[t].
struct EmbeddingLookup {
  const float* table;
  int64_t vocab;
  const int32_t* ids;
};
// BERT's embeddings in one op: out[i] = LayerNorm(sum_j lookups[j].table[ids_j[i]]) with
// gamma and beta (beta may be null). Every id is bounds-checked first (kOutOfRange).
void embedding_layer_norm(const EmbeddingLookup* lookups, int64_t num_lookups, int64_t t, int64_t dim,
                          const float* gamma, const float* beta, float eps, float* out);

// ---- TopKLogits -----------------------------------------------------------------------
// Per row of x [rows, v]: the k largest values in descending order (equal values: the
// lower index first; NaN after every number), their indices, and their log-softmax values
// float(double(x) - lse) with lse = max + log(sum exp(double(x) - max)) summed in index
// order, bit for bit what runtime/sampling.cpp's logprobs_of computes. Rows with v < k
// are padded with id -1 and value/logprob -inf. Outputs are [rows, k].
void topk_logits(const float* x, int64_t rows, int64_t v, int64_t k, float* values, int32_t* ids,
                 float* logprobs);

}  // namespace kiln::cpu

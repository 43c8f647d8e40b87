// W8A8 INT8 Linear on the device (see cuda_w8a8_linear.h). Host code: weight
// quantization and upload, the per-step launch sequence, the choice between the fused
// CUTLASS GEMM and cuBLASLt's int8 GEMM (KILN_CUDA_W8A8_GEMM), the activation after the
// CUTLASS GEMM (KILN_CUDA_W8A8_ACT_EPILOGUE) and the int8 codes it may write, the row
// tiling of the int32 sums, and tuning of either GEMM.
#include "backends/cuda/cuda_w8a8_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/cuda/cuda_gelu_lut.h"
#include "backends/cuda/cuda_int8_fuse.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/int8_gemm_sm90.h"
#include "core/env_switch.h"
#include "core/hadamard.h"
#include "core/int8.h"
#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln::cuda {

namespace {

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Codes [n, k], then (256 bytes aligned) the per-channel scales [n] as f32.
struct Int8Weights {
  DeviceBuffer buf;
  size_t scales_off = 0;
  const int8_t* codes() const { return static_cast<const int8_t*>(buf.get()); }
  const float* scales() const { return reinterpret_cast<const float*>(static_cast<const char*>(buf.get()) + scales_off); }
};

GemvEpilogue epilogue_of(const ir::Node& n) {
  const std::string act = n.attr_str("activation", "");
  if (act.empty()) return GemvEpilogue::kNone;
  if (act == "gelu_erf") return GemvEpilogue::kGeluErf;
  if (act == "gelu_tanh") return GemvEpilogue::kGeluTanh;
  if (act == "silu") return GemvEpilogue::kSilu;
  if (act == "swiglu") return GemvEpilogue::kSwiGlu;
  throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "' activation '", act,
              "' (expected gelu_erf, gelu_tanh, silu or swiglu)");
}

// KILN_CUDA_W8A8_GEMM: which GEMM runs prefill rows (above the GEMV's). true: the fused
// CUTLASS kernel (the default) where it is built and supports the Linear; false: cuBLASLt.
bool w8a8_gemm_cutlass_from_env() {
  const char* e = std::getenv("KILN_CUDA_W8A8_GEMM");
  const std::string v = e ? e : "";
  if (v.empty() || v == "cutlass") return true;
  if (v == "cublaslt") return false;
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_W8A8_GEMM='", v, "' (expected cutlass or cublaslt)");
}

// Whether this Linear's prefill GEMM can be the fused kernel; when not, `why` says so.
// The kernel's other conditions (x, y and the row scales 16-byte aligned) hold for the
// backend's buffers and are checked again per call.
bool w8a8_fused_gemm_ok(DType act, const int8_t* codes, int64_t out_n, int64_t k, const Int8Epilogue& e,
                        std::string* why) {
  if (!int8_gemm_sm90_available(why)) {
    static std::once_flag once;
    std::call_once(once, [&] { log_debug("cuda: W8A8 Linears use cuBLASLt's int8 GEMM: ", *why); });
    why->clear();  // said once, not per Linear
    return false;
  }
  // Stand-in x, y and row scale pointers (aligned as the backend's are) for the shape checks.
  const auto* p16 = reinterpret_cast<const int8_t*>(uintptr_t(256));
  Int8Epilogue pe = e;
  pe.row_scale = reinterpret_cast<const float*>(p16);
  *why = int8_gemm_sm90_check(act, p16, codes, p16, 128, out_n, k, pe);
  return why->empty();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The activation's pass after the GEMM, or none (SwiGLU, no activation).
std::optional<UnaryOp> unary_of(GemvEpilogue e) {
  if (e == GemvEpilogue::kGeluErf) return UnaryOp::kGeluErf;
  if (e == GemvEpilogue::kGeluTanh) return UnaryOp::kGeluTanh;
  if (e == GemvEpilogue::kSilu) return UnaryOp::kSilu;
  return std::nullopt;
}

// KILN_CUDA_W8A8_CODES_EPILOGUE: the fused GEMM writes a GELU output's static codes itself.
bool w8a8_codes_epilogue_from_env() {
  return env_switch("KILN_CUDA_W8A8_CODES_EPILOGUE",
                    "the fused GEMM writes a gelu_erf output's static int8 codes in its epilogue",
                    "the GEMM writes the activation dtype and a pass the codes");
}

// KILN_CUDA_W8A8_TUNE_CODES: a Linear with the codes epilogue times its configurations with
// that epilogue (the kernel it runs), not as the plain GEMM.
bool w8a8_tune_codes_from_env() {
  return env_switch("KILN_CUDA_W8A8_TUNE_CODES",
                    "a GEMM with the codes epilogue picks its tile configuration timed with that epilogue",
                    "the codes epilogue takes the configuration timed for the plain GEMM");
}

}  // namespace

bool w8a8_act_in_epilogue() {
  const char* e = std::getenv("KILN_CUDA_W8A8_ACT_EPILOGUE");
  if (!e || !*e || std::strcmp(e, "0") == 0) return false;
  if (std::strcmp(e, "1") == 0) return true;
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_W8A8_ACT_EPILOGUE='", e,
              "' (expected 0: the W8A8 GEMM without its activation, then one pass applying it, or 1: the activation "
              "in the GEMM's epilogue)");
}

bool w8a8_linear_supported(const ir::Node& n, const ir::Graph& g, std::string* why) {
  auto fail = [&](std::string msg) {
    if (why) *why = std::move(msg);
    return false;
  };
  if (!g.is_weight(n.inputs[1]) || n.has_attr("weight_layout")) return fail("w8a8 Linear weights must be plain weights");
  const Tensor& w = g.weight(n.inputs[1]);
  if (w.rank() != 2 || w.dim(1) % 4 != 0)
    return fail(str_cat("w8a8 Linear weight ", w.shape_str(),
                        ": cuBLASLt's int8 GEMM needs K a multiple of 4 (keep this Linear unquantized with --keep)"));
  // --hadamard (quant/w8a8.h): the Linear rotates and quantizes its own input
  // (launch_int8_quantize_hadamard), holding a row in shared memory.
  if (n.has_attr("act_hadamard")) {
    const int64_t b = n.attr_int("act_hadamard"), k = w.dim(1);
    if (b != hadamard_block(k))
      return fail(str_cat("act_hadamard ", b, " (its K = ", k, " rotates in blocks of ", hadamard_block(k), ")"));
    if (k > kInt8HadamardMaxK)
      return fail(str_cat("its input is rotated (--hadamard) and K = ", k, " is past the ", kInt8HadamardMaxK,
                          " values a row the CUDA rotation holds"));
  }
  if (n.input(2) != ir::kNoValue && !g.is_weight(n.input(2))) return fail("w8a8 Linear bias must be a weight");
  return true;
}

bool w8a8_graph_gemms_are_cutlass(const ir::Graph& g) {
  bool any = false;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != "Linear") continue;
    if (n.attr_str("quant", "") != "w8a8") return false;
    any = true;
  }
  return any && w8a8_gemm_cutlass_from_env() && int8_gemm_sm90_available();
}

OpRun prepare_w8a8_linear(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  std::string why;
  if (!w8a8_linear_supported(n, g, &why)) throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "': ", why);
  const double amax = n.attr_float("act_amax");
  if (!(amax >= 0) || !std::isfinite(amax))
    throw_error(ErrorCode::kInvalidArgument, "cuda: Linear '", n.name, "' has act_amax ", amax,
                " (expected a finite value >= 0 from calibration)");
  const bool dynamic = n.attr_int("act_dynamic", 0) != 0;
  const float x_scale = int8_act_scale(amax), inv = 1.0f / x_scale;  // as linear_int8 quantizes
  const Tensor& wt = g.weight(n.inputs[1]);
  const int64_t nn = wt.dim(0), k = wt.dim(1);
  const GemvEpilogue epi = epilogue_of(n);
  const bool swiglu = epi == GemvEpilogue::kSwiGlu;
  KILN_THROW_IF(swiglu && nn % 2 != 0, kInvalidArgument, "linear '", n.name, "': swiglu needs an even number of rows");
  const int64_t out_n = swiglu ? nn / 2 : nn;
  // cuBLASLt's int8 GEMM takes N a multiple of 4: zero rows pad the weight (a 3-label
  // classifier, GPT-2's 50257-token head); the epilogue never reads their sums.
  const int64_t n_pad = (nn + 3) / 4 * 4;

  // Per-channel codes on the host, exactly as the CPU backend packs them; a row-parallel
  // shard's weight_amax (parallel/tensor_parallel.h) gives each row the unsharded row's scale.
  Tensor wf = wt.dtype() == DType::kF32 ? wt : wt.to(DType::kF32);
  std::vector<float> row_amax;
  if (n.has_attr("weight_amax")) {
    const auto* list = std::get_if<std::vector<double>>(&n.attrs.at("weight_amax"));
    KILN_THROW_IF(!list, kInvalidArgument, "cuda: Linear '", n.name,
                  "' has a weight_amax that is not a list of numbers");
    row_amax = int8_weight_amax(*list, wf.data_as<float>(), nn, k, "cuda: Linear '" + n.name + "'");
  }
  std::vector<int8_t> codes(static_cast<size_t>(n_pad * k), 0);
  std::vector<float> scales(static_cast<size_t>(n_pad), 0.0f);
  ThreadPool::global().parallel_for(nn, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = wf.data_as<float>() + r * k;
      scales[size_t(r)] = row_amax.empty() ? int8_quantize_channel(row, k, codes.data() + r * k)
                                           : int8_quantize_channel_amax(row, k, row_amax[size_t(r)],
                                                                        codes.data() + r * k);
    }
  });
  auto dw = std::make_shared<Int8Weights>();
  dw->scales_off = align256(codes.size());
  dw->buf = DeviceBuffer(dw->scales_off + scales.size() * sizeof(float));
  KILN_CUDA_CHECK(cudaMemcpy(dw->buf.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dw->buf.get()) + dw->scales_off, scales.data(),
                             scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  pc.weights->add_bytes(dw->buf.size());
  // The bias in f32, added in f32 as the CPU adds it.
  const auto* bias = static_cast<const float*>(pc.weights->get(g, n.input(2), DType::kF32));

  Int8Epilogue base;
  base.x_scale = x_scale;
  base.w_scale = dw->scales();
  base.bias = bias;
  base.act = epi;
  // The CUTLASS GEMM leaves GELU / SiLU to a pass after it (unless
  // KILN_CUDA_W8A8_ACT_EPILOGUE=1): `split`, and the epilogue it runs.
  const std::optional<UnaryOp> unary = unary_of(epi);
  const bool split = unary && !w8a8_act_in_epilogue();
  Int8Epilogue gemm_base = base;
  if (split) gemm_base.act = GemvEpilogue::kNone;

  // Prefill rows through the fused GEMM when it is built and takes this Linear (not
  // SwiGLU, whose gate and up halves are far apart in N), its configuration timed per row
  // bucket; else cuBLASLt's int8 GEMM + the dequantize kernel.
  std::string why_not;
  const bool fused =
      w8a8_gemm_cutlass_from_env() && w8a8_fused_gemm_ok(pc.act, dw->codes(), out_n, k, gemm_base, &why_not);
  if (!fused && !why_not.empty()) log_debug("cuda: Linear '", n.name, "' uses cuBLASLt's int8 GEMM: ", why_not);
  // The input may arrive as codes (and row scales) from its norm (cuda_int8_fuse.h), made
  // with this Linear's scale: no quantize pass then. That holds for a norm whose output
  // other nodes read too: on the compiled graph's copy this Linear reads the codes output
  // the norm writes beside it (int8_add_dual_outputs), whose readers are all such Linears.
  const auto [x_producer, x_out] = value_producer(g, n.inputs[0]);
  const bool x_codes = x_producer && int8_fused_output(*x_producer, x_out, g, pc.act).has_value();
  // --hadamard: the input rows go through the transform before their rounding, here (no
  // producer writes this Linear's codes: int8_reader_codes).
  const int64_t hadamard = n.attr_int("act_hadamard", 0);
  KILN_CHECK(!(x_codes && hadamard), "cuda: w8a8 Linear '", n.name, "' got codes for a rotated input");
  // The output may leave as the int8 codes of the W8A8 Linears reading it (only with
  // `split`: int8_fused_output asks w8a8_act_in_epilogue): every path first makes the
  // output in the activation dtype, in scratch, then its codes from it, as the readers'
  // quantize would.
  const std::optional<Int8Codes> y_codes = int8_fused_output(n, 0, g, pc.act);
  KILN_CHECK(!y_codes || split, "cuda: w8a8 Linear '", n.name, "' writes codes without its activation pass");
  if (x_codes || y_codes)
    log_debug("cuda: w8a8 Linear '", n.name, "'", x_codes ? " reads int8 codes" : "", y_codes ? " writes int8 codes" : "");

  // The activation pass after the fused GEMM through tables (KILN_CUDA_GELU_LUT): T values,
  // and the codes of a static y_codes, by T bits.
  const bool static_codes_table = y_codes && !y_codes->per_token;
  std::optional<UnaryLut> lut;
  if (split && fused)
    lut = gelu_lut(*pc.cx, *unary, pc.act, y_codes ? GeluPass::kCodes : GeluPass::kValues,
                   static_codes_table ? std::optional<float>(y_codes->inv) : std::nullopt);
  // Static codes of a gelu_erf output straight from the fused GEMM's epilogue, which looks
  // each code up in that codes table (int8_gemm_sm90.h): no T output in scratch, no pass.
  const int8_t* code_table = lut && static_codes_table ? lut->codes : nullptr;
  const bool codes_epilogue = split && fused && code_table && *unary == UnaryOp::kGeluErf && out_n % 16 == 0 &&
                              w8a8_codes_epilogue_from_env();
  if (codes_epilogue)
    log_debug("cuda: w8a8 Linear '", n.name, "' writes its GELU's int8 codes from the GEMM epilogue");
  Int8Epilogue codes_base = gemm_base;
  codes_base.act = GemvEpilogue::kGeluErf;

  Int8GemmPlan plan;
  const int sms = pc.cx->num_sms;
  if (fused && Gemm::tuning_enabled()) {
    std::vector<Int8GemmTiming> times;
    // The configuration of the kernel this Linear runs at prefill: with the codes epilogue,
    // that kernel's (KILN_CUDA_W8A8_TUNE_CODES=0: the plain GEMM's, as before).
    if (codes_epilogue && w8a8_tune_codes_from_env())
      plan = int8_gemm_sm90_tune(pc.act, dw->codes(), out_n, k, codes_base, dynamic, sms, pc.cx->stream, &times,
                                 code_table);
    else
      plan = int8_gemm_sm90_tune(pc.act, dw->codes(), out_n, k, gemm_base, dynamic, sms, pc.cx->stream, &times);
    std::string line;
    for (const Int8GemmTiming& tt : times)
      line += str_cat(" m=", tt.m, " ", int8_gemm_config_name(tt.config), "=", int(tt.ms * 1e3f), "us");
    log_debug("cuda: int8 gemm (sm90) n=", out_n, " k=", k, codes_epilogue ? " (codes epilogue)" : "", line);
  } else if (!fused && Gemm::tuning_enabled()) {
    // cuBLASLt's int8 algorithms timed at a prefill shape, as tune_gemms does for bf16.
    const int64_t m = 128;
    DeviceBuffer xb(size_t(m * k) * 2), xq(size_t(m * k)), acc(size_t(m * n_pad) * 4);
    launch_fill_random(xb.get(), DType::kBF16, m * k, 13, pc.cx->stream);  // never time on zeros
    launch_int8_quantize(DType::kBF16, xb.get(), m, k, 1.0f / 0.02f, static_cast<int8_t*>(xq.get()), nullptr,
                         pc.cx->stream);
    Gemm::log_tactics("int8 gemm", m, n_pad, k,
                      pc.cx->gemm->tune_int8(xq.get(), dw->codes(), static_cast<int32_t*>(acc.get()), m, n_pad, k,
                                             pc.cx->stream));
  }

  const std::string name = n.name;
  const DType act = pc.act;
  return [=](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    KILN_THROW_IF(x.dim(1) != k, kInvalidArgument, "linear '", name, "': x has ", x.dim(1),
                  " features, the weight expects ", k);
    const int64_t t = x.dim(0);
    KILN_CHECK((x.dtype == DType::kI8) == x_codes, "cuda: w8a8 Linear '", name, "' got ", dtype_name(x.dtype),
               x_codes ? ", expected its producer's int8 codes" : ", expected activations");
    // y in the activation dtype, or as codes (retyped; the activation dtype is `ot`).
    Int8Out yq{nullptr, nullptr};
    DevTensor* yp = nullptr;
    if (y_codes) {
      yq = int8_out(c, 0, {t, out_n}, *y_codes);
    } else {
      yp = &c.out(0, {t, out_n});
    }
    const DType ot = y_codes ? act : yp->dtype;
    if (t == 0) return;
    cudaStream_t s = c.cx->stream;
    // Scratch: the input's codes and per-token scales (unless they arrive so), the output
    // in `ot` before its codes (y_codes), then one tile of int32 sums (the fused GEMM: its
    // workspace, if any).
    const bool gemv = int8_gemv_supports(t, k);
    // Where the GEMM's output goes: y, or scratch before the codes (256-byte aligned), or
    // (the codes epilogue) the codes.
    const bool gemm_fused = !gemv && fused && (y_codes || aligned16(yp->data));
    const bool codes_out = gemm_fused && codes_epilogue;
    const size_t q_bytes = x_codes ? 0 : align256(size_t(t * k)),
                 rs_bytes = dynamic && !x_codes ? align256(size_t(t) * 4) : 0,
                 mid_bytes = y_codes && !codes_out ? align256(size_t(t * out_n) * dtype_size(ot)) : 0;
    const Int8GemmConfig cfg = plan.tuned ? plan.pick(t) : int8_gemm_sm90_default(t, out_n, sms);
    const int64_t tile = gemv || gemm_fused ? t : int8_tile_rows(t, n_pad);
    const size_t acc_bytes =
        gemv         ? 0
        : codes_out  ? int8_gemm_sm90_workspace(cfg, ot, t, out_n, k, codes_base.act, true)
        : gemm_fused ? int8_gemm_sm90_workspace(cfg, ot, t, out_n, k, gemm_base.act)
                     : size_t(tile * n_pad) * 4;
    auto* scratch = static_cast<char*>(c.scratch(q_bytes + rs_bytes + mid_bytes + acc_bytes));
    auto* xq = reinterpret_cast<int8_t*>(scratch);
    auto* rs = dynamic ? reinterpret_cast<float*>(scratch + q_bytes) : nullptr;
    void* yt = y_codes ? static_cast<void*>(scratch + q_bytes + rs_bytes) : yp->data;
    auto* acc = reinterpret_cast<int32_t*>(scratch + q_bytes + rs_bytes + mid_bytes);
    if (x_codes) {
      xq = static_cast<int8_t*>(x.data);
      rs = dynamic ? reinterpret_cast<float*>(static_cast<char*>(x.data) + int8_row_scales_offset(t, k)) : nullptr;
    } else if (hadamard) {
      launch_int8_quantize_hadamard(x.dtype, x.data, t, k, hadamard, inv, xq, rs, s);
    } else {
      launch_int8_quantize(x.dtype, x.data, t, k, inv, xq, rs, s);
    }
    Int8Epilogue e = base;
    e.row_scale = rs;
    if (codes_out) {
      Int8Epilogue ce = codes_base;
      ce.row_scale = rs;
      launch_int8_gemm_sm90(cfg, ot, xq, dw->codes(), t, out_n, k, ce, yq.q, acc, acc_bytes, sms, s, code_table);
      return;
    }
    if (gemm_fused) {
      // The activation (split) in a pass after the GEMM: into y in place, or to the codes.
      Int8Epilogue ge = gemm_base;
      ge.row_scale = rs;
      launch_int8_gemm_sm90(cfg, ot, xq, dw->codes(), t, out_n, k, ge, yt, acc, acc_bytes, sms, s);
      if (split && y_codes)
        launch_unary_int8_or_lut(lut, *unary, ot, yt, t, out_n, y_codes->inv, yq.q, yq.row_scale, s);
      else if (split)
        launch_unary_or_lut(lut, *unary, ot, yt, t * out_n, yt, s);
      return;
    }
    // The GEMV and cuBLASLt's GEMM apply the activation in their epilogues; codes from
    // their output.
    if (gemv) {
      launch_int8_gemv(ot, xq, dw->codes(), t, out_n, k, e, yt, s);
    } else {
      const size_t es = dtype_size(ot);
      for (int64_t r0 = 0; r0 < t; r0 += tile) {
        const int64_t rows = std::min(tile, t - r0);
        c.cx->gemm->run_int8(xq + r0 * k, dw->codes(), acc, rows, n_pad, k, s);
        e.row_scale = rs ? rs + r0 : nullptr;
        launch_int8_dequant(ot, acc, rows, n_pad, out_n, e, static_cast<char*>(yt) + size_t(r0 * out_n) * es, s);
      }
    }
    if (y_codes) launch_int8_quantize(ot, yt, t, out_n, y_codes->inv, yq.q, yq.row_scale, s);
  };
}

}  // namespace kiln::cuda

// FP8 Linear on the device (see cuda_fp8_linear.h). Host code: weight quantization and
// upload, the per-step launch sequence, tuning of cuBLASLt's FP8 algorithms, and the
// decision where the activation quantize is fused into the producer.
#include "backends/cuda/cuda_fp8_linear.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/elementwise_fp8.h"
#include "backends/cuda/ops/fp8.h"
#include "core/env_switch.h"
#include "core/fp8.h"
#include "core/log.h"
#include "core/status.h"

namespace kiln::cuda {

namespace {

// Codes [n, k] then, 256 bytes further on, the cuBLASLt scales w_scale, x_scale and (for
// an E4M3 output) d_scale, 16 bytes apart (floats 0, 4 and 8).
struct Fp8Weights {
  DeviceBuffer buf;
  size_t scales_off = 0;
  const uint8_t* codes() const { return static_cast<const uint8_t*>(buf.get()); }
  const float* scales() const { return reinterpret_cast<const float*>(static_cast<const char*>(buf.get()) + scales_off); }
};

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Whether node n writes output `out` through an E4M3 kernel when asked to.
bool fp8_codes_producer(const ir::Node& n, size_t out) {
  if (n.op == "RMSNorm" || n.op == "LayerNorm" || n.op == "SwiGLU" || n.op == "Gelu" || n.op == "Attention")
    return out == 0;
  if (n.op == "AddRMSNorm" || n.op == "AddLayerNorm") return out == 1;
  if (n.op == "Linear") return out == 0 && n.attr_str("quant", "") == "fp8" && !n.attr_str("activation", "").empty();
  return false;
}

}  // namespace

bool fp8_gate_up_e4m3_enabled() {
  const char* e = std::getenv("KILN_CUDA_FP8_GATEUP_E4M3");
  if (!e || !*e || std::strcmp(e, "1") == 0) return true;
  if (std::strcmp(e, "0") == 0) return false;
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_FP8_GATEUP_E4M3='", e,
              "' (expected 1: a gate|up Linear with out_amax writes E4M3, or 0: bf16 as without it)");
}

bool fp8_fuse_enabled() {
  return env_switch("KILN_CUDA_FP8_FUSE", "the quantize fused into the producer",
                    "a separate quantize pass before each FP8 Linear");
}

std::optional<Fp8Scale> fp8_fused_output(const ir::Node& n, size_t out, const ir::Graph& g, DType act) {
  if (act != DType::kBF16 || out >= n.outputs.size() || !fp8_codes_producer(n, out) || !fp8_fuse_enabled())
    return std::nullopt;
  const ir::ValueId v = n.outputs[out];
  for (auto& [name, id] : g.outputs())
    if (id == v) return std::nullopt;  // the caller reads it in the activation dtype
  std::optional<Fp8Scale> scale;
  for (const ir::Node& m : g.nodes())
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      if (m.inputs[i] != v) continue;
      if (i != 0 || m.op != "Linear" || m.attr_str("quant", "") != "fp8" || !fp8_linear_supported(m, g, nullptr))
        return std::nullopt;
      const double amax = m.attr_float("act_amax", -1.0);
      if (!(amax >= 0) || !std::isfinite(amax)) return std::nullopt;  // its prepare reports it
      const Fp8Scale s = fp8_scale_for_amax(amax);
      if (scale && (s.scale != scale->scale || s.inv != scale->inv)) return std::nullopt;
      scale = s;
    }
  return scale;
}

std::string fp8_profile_tag(const ir::Node& n, const ir::Graph& g, DType act) {
  std::string tag;
  if (n.op == "Linear" && n.attr_str("quant", "") == "fp8") {
    tag = "{fp8}";
    if (!n.inputs.empty()) {
      const auto [p, o] = value_producer(g, n.inputs[0]);
      if (p && fp8_fused_output(*p, o, g, act)) tag += "{e4m3 in}";
    }
  }
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (fp8_fused_output(n, o, g, act)) tag += "{+e4m3 quantize}";
  return tag;
}

bool fp8_linear_supported(const ir::Node& n, const ir::Graph& g, std::string* why) {
  auto fail = [&](std::string msg) {
    if (why) *why = std::move(msg);
    return false;
  };
  if (!g.is_weight(n.inputs[1]) || n.has_attr("weight_layout")) return fail("fp8 Linear weights must be plain weights");
  const Tensor& w = g.weight(n.inputs[1]);
  if (w.rank() != 2 || w.dim(0) % 16 != 0 || w.dim(1) % 16 != 0)
    return fail(str_cat("fp8 Linear weight ", w.shape_str(), ": cuBLASLt's FP8 GEMM needs N and K multiples of 16"));
  return true;
}

OpRun prepare_fp8_linear(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  std::string why;
  if (!fp8_linear_supported(n, g, &why)) throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "': ", why);
  if (!fp8_device_supported(pc.cx->device))
    throw_error(ErrorCode::kUnsupported, "cuda: fp8 Linear '", n.name, "' needs a GPU with FP8 (compute capability 8.9+: "
                "Ada, Hopper); device ", pc.cx->device, " has none (run --quant fp8 on the CPU backend)");
  if (pc.act != DType::kBF16)
    throw_error(ErrorCode::kUnsupported, "cuda: fp8 Linear '", n.name, "' runs with bf16 activations, this graph is ",
                dtype_name(pc.act), " (load it with weight dtype fp8 or bf16)");
  const double amax = n.attr_float("act_amax");
  if (!(amax >= 0) || !std::isfinite(amax))
    throw_error(ErrorCode::kInvalidArgument, "cuda: Linear '", n.name, "' has act_amax ", amax,
                " (expected a finite value >= 0 from calibration)");
  const Fp8Scale xs = fp8_scale_for_amax(amax);
  // out_amax (quant/fp8.h): the GEMM's output leaves as E4M3 with this scale (prefill).
  Fp8Scale os;
  const bool has_out_amax = n.has_attr("out_amax");
  if (has_out_amax)
    os = fp8_out_scale(n.attr_float("out_amax"), "cuda: fp8 Linear '" + n.name + "'");
  const Tensor& wt = g.weight(n.inputs[1]);
  const int64_t nn = wt.dim(0), k = wt.dim(1);
  // The codes on the host: the engine's, or the f32 weights quantized as the CPU does.
  Tensor codes;
  float w_scale = 1.0f;
  if (wt.dtype() == DType::kFP8E4M3) {
    w_scale = fp8_stored_weight_scale(n.attr_float("weight_scale", -1.0),
                                      "cuda: fp8 Linear '" + n.name + "'");
    codes = wt;
  } else {
    Tensor wf = wt.dtype() == DType::kF32 ? wt : wt.to(DType::kF32);
    codes = Tensor(DType::kFP8E4M3, wf.shape());
    w_scale = fp8_quantize_tensor(wf.data_as<float>(), size_t(wf.numel()), codes.data_as<uint8_t>()).scale;
  }
  for (int64_t i = 0; i < codes.numel(); ++i)
    if ((codes.data_as<uint8_t>()[i] & 0x7f) == 0x7f)
      throw_error(ErrorCode::kInvalidArgument, "cuda: fp8 Linear '", n.name, "' has a NaN weight (element ", i, ")");
  const ir::ValueId bias_v = n.input(2);
  if (bias_v != ir::kNoValue && !g.is_weight(bias_v))
    throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "' needs its bias to be a weight");
  const void* bias = pc.weights->get(g, bias_v, DType::kBF16);

  const std::string act = n.attr_str("activation", "");
  GemvEpilogue epi = GemvEpilogue::kNone;
  UnaryOp unary = UnaryOp::kSilu;
  if (act == "gelu_erf") epi = GemvEpilogue::kGeluErf, unary = UnaryOp::kGeluErf;
  else if (act == "gelu_tanh") epi = GemvEpilogue::kGeluTanh, unary = UnaryOp::kGeluTanh;
  else if (act == "silu") epi = GemvEpilogue::kSilu, unary = UnaryOp::kSilu;
  else if (act == "swiglu") epi = GemvEpilogue::kSwiGlu;
  else if (!act.empty())
    throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "' activation '", act,
                "' (expected gelu_erf, gelu_tanh, silu or swiglu)");
  const bool swiglu = epi == GemvEpilogue::kSwiGlu;
  KILN_THROW_IF(swiglu && nn % 2 != 0, kInvalidArgument, "linear '", n.name, "': swiglu needs an even number of rows");
  const int64_t out_n = swiglu ? nn / 2 : nn;
  const float scale = xs.scale * w_scale;
  // Fused quantizes: x arrives as codes made with this Linear's scale (its producer asked
  // fp8_fused_output too), and/or y leaves as codes for the FP8 Linears reading it.
  const auto [x_producer, x_out] = value_producer(g, n.inputs[0]);
  const bool x_codes = x_producer && fp8_fused_output(*x_producer, x_out, g, pc.act).has_value();
  const std::optional<Fp8Scale> y_codes = fp8_fused_output(n, 0, g, pc.act);
  // [gate | up] as E4M3 (half the bytes of bf16) when the node carries out_amax and its
  // SwiGLU writes codes for the down projection; decode rows (the GEMV) keep bf16.
  const bool gu_e4m3 = swiglu && has_out_amax && y_codes && bias == nullptr && fp8_gate_up_e4m3_enabled();
  if (has_out_amax && !gu_e4m3)
    log_debug("cuda: fp8 Linear '", n.name, "' has out_amax but keeps its output in bf16 (",
              !swiglu ? "no swiglu" : !y_codes ? "its output is not E4M3 codes" : bias ? "a bias" :
              "KILN_CUDA_FP8_GATEUP_E4M3=0", ")");
  if (x_codes || y_codes)
    log_debug("cuda: fp8 Linear '", n.name, "'", x_codes ? " reads E4M3 codes" : "",
              y_codes ? " writes E4M3 codes" : "");
  auto dw = std::make_shared<Fp8Weights>();
  const size_t code_bytes = size_t(nn * k);
  dw->scales_off = align256(code_bytes);
  // Each scale on its own 16 bytes: cuBLASLt refused (NOT_SUPPORTED, H200) a B scale
  // pointer 4 bytes after the A scale.
  dw->buf = DeviceBuffer(dw->scales_off + 12 * sizeof(float));
  const float scales[12] = {w_scale, 0.0f, 0.0f, 0.0f, xs.scale, 0.0f, 0.0f, 0.0f, os.inv, 0.0f, 0.0f, 0.0f};
  KILN_CUDA_CHECK(cudaMemcpy(dw->buf.get(), codes.data(), code_bytes, cudaMemcpyHostToDevice));
  KILN_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dw->buf.get()) + dw->scales_off, scales, sizeof(scales),
                             cudaMemcpyHostToDevice));
  pc.weights->add_bytes(code_bytes);

  // cuBLASLt's FP8 algorithms timed at a prefill shape, as tune_gemms does for bf16.
  if (Gemm::tuning_enabled()) {
    const int64_t m = 128;
    DeviceBuffer xb(size_t(m * k) * 2), xq(size_t(m * k)), yb(size_t(m * nn) * 2);
    launch_fill_random(xb.get(), DType::kBF16, m * k, 11, pc.cx->stream);  // never time on zeros
    launch_fp8_quantize(DType::kBF16, xb.get(), m * k, 1.0f, static_cast<uint8_t*>(xq.get()), pc.cx->stream);
    Gemm::log_tactics("fp8 gemm", m, nn, k,
                      pc.cx->gemm->tune_fp8(xq.get(), dw->codes(), dw->scales(), bias, yb.get(), m, nn, k, pc.cx->stream));
  }

  const std::string name = n.name;
  const std::optional<DType> y_dtype = y_codes ? std::optional<DType>(DType::kFP8E4M3) : std::nullopt;
  return [=](OpContext& c) {
    const auto [x, y, t] = linear_io(c, name, k, out_n, y_dtype);
    KILN_CHECK((x.dtype == DType::kFP8E4M3) == x_codes, "cuda: fp8 Linear '", name, "' got ", dtype_name(x.dtype),
               x_codes ? ", expected its producer's E4M3 codes" : ", expected activations");
    cudaStream_t s = c.cx->stream;
    // Scratch: the input's E4M3 codes (unless they arrive so), then [gate | up] in bf16
    // (SwiGLU through cuBLASLt) or y in bf16 before its codes (y_codes otherwise).
    const bool gemv = fp8_gemv_supports(t, k);
    const size_t q_bytes = x_codes ? 0 : align256(size_t(t * k));
    const size_t mid_bytes = !gemv && swiglu ? size_t(t * nn) * (gu_e4m3 ? 1 : 2)
                             : y_codes        ? size_t(t * out_n) * 2
                                              : 0;
    auto* scratch = static_cast<char*>(c.scratch(q_bytes + mid_bytes));
    const uint8_t* xq = static_cast<const uint8_t*>(x.data);
    if (!x_codes) {
      launch_fp8_quantize(x.dtype, x.data, t * k, xs.inv, reinterpret_cast<uint8_t*>(scratch), s);
      xq = reinterpret_cast<const uint8_t*>(scratch);
    }
    void* mid = scratch + q_bytes;
    auto* yq = static_cast<uint8_t*>(y.data);
    if (gemv) {
      launch_fp8_gemv(xq, dw->codes(), scale, bias, y_codes ? mid : y.data, t, out_n, k, s, epi);
      if (y_codes) launch_fp8_quantize(DType::kBF16, mid, t * out_n, y_codes->inv, yq, s);
    } else if (gu_e4m3) {
      c.cx->gemm->run_fp8_e4m3(xq, dw->codes(), dw->scales(), mid, t, nn, k, s);
      launch_swiglu_e4m3(static_cast<const uint8_t*>(mid), t, out_n, os.scale, y_codes->inv, yq, s);
    } else if (swiglu) {
      c.cx->gemm->run_fp8(xq, dw->codes(), dw->scales(), bias, mid, t, nn, k, s);
      if (y_codes) launch_swiglu_fp8(DType::kBF16, mid, t, out_n, y_codes->inv, yq, s);
      else launch_swiglu(y.dtype, mid, t, out_n, y.data, s);
    } else if (y_codes) {  // an activation epilogue (fp8_fused_output asks for one)
      c.cx->gemm->run_fp8(xq, dw->codes(), dw->scales(), bias, mid, t, nn, k, s);
      launch_unary_fp8(unary, DType::kBF16, mid, t * out_n, y_codes->inv, yq, s);
    } else {
      c.cx->gemm->run_fp8(xq, dw->codes(), dw->scales(), bias, y.data, t, nn, k, s);
      if (epi != GemvEpilogue::kNone) launch_unary(unary, y.dtype, y.data, y.numel(), y.data, s);
    }
  };
}

}  // namespace kiln::cuda

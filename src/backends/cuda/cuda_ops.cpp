// CUDA implementations of the IR ops (see cuda_ops.h): each prepare function uploads the
// node's weights and returns a runner that re-derives shapes from its actual inputs, so
// any T within the graph's symbolic shapes runs without recompiling.
#include "backends/cuda/cuda_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/communicator.h"
#include "backends/cuda/cuda_fp8_linear.h"
#include "backends/cuda/cuda_gelu_lut.h"
#include "backends/cuda/cuda_int8_fuse.h"
#include "backends/cuda/cuda_w8a8_linear.h"
#include "backends/cuda/ops/attention.h"
#include "backends/cuda/ops/elementwise.h"
#include "backends/cuda/ops/elementwise_fp8.h"
#include "backends/cuda/ops/elementwise_int8.h"
#include "backends/cuda/ops/embedding.h"
#include "backends/cuda/ops/fp8.h"
#include "backends/cuda/ops/gemv.h"
#include "backends/cuda/ops/int8.h"
#include "backends/cuda/ops/norm.h"
#include "backends/cuda/ops/rope.h"
#include "backends/cuda/ops/rows.h"
#include "backends/cuda/ops/topk.h"
#include "core/env_switch.h"
#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "ir/rewrite.h"
#include "core/weight_quant.h"
#include "ir/plugin.h"

namespace kiln::cuda {

LinearIo linear_io(OpContext& c, const std::string& name, int64_t k, int64_t out_n, std::optional<DType> y_dtype) {
  const DevTensor& x = *c.inputs[0];
  KILN_THROW_IF(x.dim(1) != k, kInvalidArgument, "linear '", name, "': x has ", x.dim(1),
                " features, the weight expects ", k);
  const int64_t t = x.dim(0);
  return {x, c.out(0, {t, out_n}, y_dtype), t};
}

std::pair<const ir::Node*, size_t> value_producer(const ir::Graph& g, ir::ValueId v) {
  const int32_t p = g.value(v).producer;
  if (g.value(v).kind != ir::ValueKind::kIntermediate || p < 0) return {nullptr, 0};
  const ir::Node& n = g.nodes()[size_t(p)];
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (n.outputs[o] == v) return {&n, o};
  return {nullptr, 0};
}

std::optional<QuantFormat> cuda_linear_quant_format(const ir::Node& n, const ir::Graph& g,
                                                    const std::string& weight_dtype) {
  if (n.op != "Linear") return std::nullopt;
  const std::string p = n.attr_str("precision", weight_dtype);
  // A weight kept quantized (a GGUF's own q8/q4 codes) has no 16-bit copy: it runs
  // quantized, in the precision asked for when that is q8/q4, else in its own format.
  if (n.has_attr("weight_quant")) {
    if (p == "q8" || p == "q4") return p == "q8" ? QuantFormat::kQ8 : QuantFormat::kQ4;
    log_debug("cuda: ", n.name, " keeps its file's ", n.attr_str("weight_quant"), " codes instead of ", p);
    return n.attr_str("weight_quant") == "q8" ? QuantFormat::kQ8 : QuantFormat::kQ4;
  }
  if (p != "q8" && p != "q4") return std::nullopt;
  const ir::ValueId wv = n.input(1);
  if (wv == ir::kNoValue || !g.is_weight(wv)) return std::nullopt;
  const Tensor& w = g.weight(wv);
  if (w.rank() != 2 || w.dim(1) % kQuantGroup != 0) {
    log_debug("cuda: ", n.name, " has K=", w.rank() == 2 ? w.dim(1) : -1, ", not a multiple of ", kQuantGroup,
              "; its weights stay in the activation dtype instead of ", p);
    return std::nullopt;
  }
  return p == "q8" ? QuantFormat::kQ8 : QuantFormat::kQ4;
}

namespace {

// The node's input i must be a weight (Linear weights, norm parameters, tables...).
ir::ValueId need_weight(const ir::Node& n, const ir::Graph& g, size_t i, const char* role, bool optional = false) {
  ir::ValueId v = n.input(i);
  if (v == ir::kNoValue) {
    if (optional) return v;
    throw_error(ErrorCode::kInvalidArgument, "cuda: node '", n.name, "' (", n.op, ") lacks its ", role);
  }
  if (!g.is_weight(v))
    throw_error(ErrorCode::kUnsupported, "cuda: node '", n.name, "' (", n.op, ") needs ", role, " %",
                g.value(v).name, " to be a weight, not a computed value");
  return v;
}

OpRun prepare_embedding(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  ir::ValueId tv = need_weight(n, g, 0, "table");
  // A table kept quantized (weight_quant, a GGUF's codes) is expanded at upload.
  const bool image = n.has_attr("weight_quant");
  const void* table =
      image ? pc.weights->get_dequantized(g, tv, pc.act, n.attr_int("weight_k", -1),
                                          quant_format_from_name(n.attr_str("weight_quant"), "cuda: node '" + n.name + "'"))
            : pc.weights->get(g, tv, pc.act);
  const int64_t vocab = g.weight(tv).dim(0), dim = image ? n.attr_int("weight_k", -1) : g.weight(tv).dim(1);
  return [=](OpContext& c) {
    const DevTensor& ids = *c.inputs[1];
    const int64_t t = ids.dim(0);
    if (const Tensor* h = c.host_inputs[1]) {
      const int32_t* p = h->data_as<int32_t>();
      for (int64_t i = 0; i < t; ++i)
        KILN_THROW_IF(p[i] < 0 || p[i] >= vocab, kOutOfRange, "embedding: token id ", p[i], " at position ", i,
                      " is outside the vocabulary of size ", vocab);
    }
    DevTensor& y = c.out(0, {t, dim});
    launch_embedding(y.dtype, table, static_cast<const int32_t*>(ids.data), t, dim, y.data, c.cx->stream);
  };
}

template <BinaryOp kOp>
OpRun prepare_binary(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  // A weight operand (a bias row, a scale) is uploaded in the activation dtype.
  const void* wb = g.is_weight(n.inputs[1]) ? pc.weights->get(g, n.inputs[1], pc.act) : nullptr;
  // A SmoothQuant Mul read only by W8A8 Linears writes their int8 codes (int8_fused_output).
  if constexpr (kOp == BinaryOp::kMul)
    if (const auto q = int8_fused_output(n, 0, g, pc.act))
      return [wb, codes = *q](OpContext& c) {
        const DevTensor& x = *c.inputs[0];
        const int64_t k = x.dim(-1);
        const Int8Out y = int8_out(c, 0, x.shape, codes);
        launch_mul_int8(x.dtype, x.data, wb, x.numel() / k, k, codes.inv, y.q, y.row_scale, c.cx->stream);
      };
  return [wb](OpContext& c) {
    const DevTensor& a = *c.inputs[0];
    const DevTensor& b = *c.inputs[1];
    DevTensor& y = c.out(0, a.shape);
    launch_binary(kOp, y.dtype, a.data, wb ? wb : b.data, a.numel(), b.numel(), y.data, c.cx->stream);
  };
}

// The norms, SwiGLU and GELU write their output as E4M3 codes where only FP8 Linears
// read it (fp8_fused_output: the quantize fused in; those Linears then skip theirs); the
// norms write int8 codes where only W8A8 Linears read it (int8_fused_output), and both
// their T output and the codes, into the output after it, where other nodes read it too
// (int8_dual_codes, on the compiled graph's rewritten copy).
// LayerNorm / RMSNorm, and AddLayerNorm / AddRMSNorm (pass fuse_add_norm: output 0 the
// residual sum x + r, output 1 its norm): one prepare for the four, each output form one
// launcher (norm.h's add_* launchers take a null residual and sum for the plain norms).
OpRun prepare_norm(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  const bool rms = n.op == "RMSNorm" || n.op == "AddRMSNorm";
  const bool add = n.op == "AddLayerNorm" || n.op == "AddRMSNorm";
  const size_t wi = add ? 2 : 1, yo = add ? 1 : 0;  // the weight's input, the norm's output
  auto* w = static_cast<const float*>(pc.weights->get(g, need_weight(n, g, wi, "weight"), DType::kF32));
  auto* b = rms ? nullptr
                : static_cast<const float*>(pc.weights->get(g, need_weight(n, g, wi + 1, "bias", true), DType::kF32));
  const float eps = float(n.attr_float("eps"));
  // What every form reads and the residual sum it writes (AddNorms: output 0, first).
  struct Rows {
    const DevTensor& x;
    const void* res;
    void* sum;
    int64_t rows, dim;
  };
  // A post-norm block's sum (BERT's x + sublayer(x)) has no reader: it is not stored.
  const bool keep_sum = add && ir::compute_uses(g).count(n.outputs[0]) > 0;
  auto rows_of = [add, keep_sum](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    const int64_t dim = x.dim(-1);
    return Rows{x, add ? c.inputs[1]->data : nullptr, keep_sum ? c.out(0, x.shape).data : nullptr, x.numel() / dim,
                dim};
  };
  if (const auto q = int8_dual_codes(n, g, pc.act))
    return [=, codes = *q](OpContext& c) {
      const Rows r = rows_of(c);
      DevTensor& y = c.out(yo, r.x.shape);
      const Int8Out yq = int8_out(c, yo + 1, r.x.shape, codes);
      if (rms)
        launch_add_rms_norm_dual(r.x.dtype, r.x.data, r.res, w, eps, r.rows, r.dim, r.sum, y.data, yq.q, codes.inv,
                                 yq.row_scale, c.cx->stream);
      else
        launch_add_layer_norm_dual(r.x.dtype, r.x.data, r.res, w, b, eps, r.rows, r.dim, r.sum, y.data, yq.q,
                                   codes.inv, yq.row_scale, c.cx->stream);
    };
  if (const auto q = int8_fused_output(n, yo, g, pc.act))
    return [=, codes = *q](OpContext& c) {
      const Rows r = rows_of(c);
      const Int8Out y = int8_out(c, yo, r.x.shape, codes);
      if (rms)
        launch_add_rms_norm_int8(r.x.dtype, r.x.data, r.res, w, eps, r.rows, r.dim, r.sum, y.q, codes.inv,
                                 y.row_scale, c.cx->stream);
      else
        launch_add_layer_norm_int8(r.x.dtype, r.x.data, r.res, w, b, eps, r.rows, r.dim, r.sum, y.q, codes.inv,
                                   y.row_scale, c.cx->stream);
    };
  if (const auto q = fp8_fused_output(n, yo, g, pc.act))
    return [=, inv = q->inv](OpContext& c) {
      const Rows r = rows_of(c);
      auto* y = static_cast<uint8_t*>(c.out(yo, r.x.shape, DType::kFP8E4M3).data);
      if (rms)
        launch_add_rms_norm_fp8(r.x.dtype, r.x.data, r.res, w, eps, r.rows, r.dim, r.sum, y, inv, c.cx->stream);
      else
        launch_add_layer_norm_fp8(r.x.dtype, r.x.data, r.res, w, b, eps, r.rows, r.dim, r.sum, y, inv, c.cx->stream);
    };
  return [=](OpContext& c) {
    const Rows r = rows_of(c);
    DevTensor& y = c.out(yo, r.x.shape);
    if (rms) launch_add_rms_norm(r.x.dtype, r.x.data, r.res, w, eps, r.rows, r.dim, r.sum, y.data, c.cx->stream);
    else launch_add_layer_norm(r.x.dtype, r.x.data, r.res, w, b, eps, r.rows, r.dim, r.sum, y.data, c.cx->stream);
  };
}

// HeadRMSNorm: RMSNorm over each head's values (Qwen3's q_norm / k_norm).
OpRun prepare_head_norm(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  const ir::ValueId wid = need_weight(n, g, 1, "weight");
  const int64_t d = n.attr_int("head_dim"), groups_attr = n.attr_int("groups", 0);
  const int64_t w_stride = g.weight(wid).numel() == d ? 0 : d;
  auto* w = static_cast<const float*>(pc.weights->get(g, wid, DType::kF32));
  const float eps = float(n.attr_float("eps"));
  return [=](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    DevTensor& y = c.out(0, x.shape);
    const int64_t width = x.dim(-1);
    launch_head_rms_norm(x.dtype, x.data, w, w_stride, eps, x.numel() / width, width,
                         groups_attr ? groups_attr : width / d, d, y.data, c.cx->stream);
  };
}

// SwiGLU (pass fuse_swiglu): [T, 2I] = [gate | up] -> [T, I].
OpRun prepare_swiglu(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  if (const auto q = fp8_fused_output(n, 0, g, pc.act))
    return [inv = q->inv](OpContext& c) {
      const DevTensor& x = *c.inputs[0];
      const int64_t t = x.dim(0), inter = x.dim(1) / 2;
      DevTensor& y = c.out(0, {t, inter}, DType::kFP8E4M3);
      launch_swiglu_fp8(x.dtype, x.data, t, inter, inv, static_cast<uint8_t*>(y.data), c.cx->stream);
    };
  return [](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    const int64_t t = x.dim(0), inter = x.dim(1) / 2;
    DevTensor& y = c.out(0, {t, inter});
    launch_swiglu(y.dtype, x.data, t, inter, y.data, c.cx->stream);
  };
}

// GeGLU (pass fuse_swiglu, Gemma): [T, 2I] = [gate | up] -> gelu_tanh(gate) * up, [T, I].
OpRun prepare_geglu(const ir::Node&, const ir::Graph&, PrepareContext&) {
  return [](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    const int64_t t = x.dim(0), inter = x.dim(1) / 2;
    DevTensor& y = c.out(0, {t, inter});
    launch_geglu(y.dtype, x.data, t, inter, y.data, c.cx->stream);
  };
}

// A Linear's activation epilogue (pass fuse_linear_activation): inside the GEMV; after a
// cuBLASLt GEMM, one elementwise pass in place.
struct LinearEpilogue {
  GemvEpilogue gemv = GemvEpilogue::kNone;
  UnaryOp unary = UnaryOp::kSilu;  // for the elementwise pass (not for kSwiGlu)
};
LinearEpilogue linear_epilogue(const ir::Node& n) {
  const std::string act = n.attr_str("activation", "");
  if (act.empty()) return {};
  if (act == "gelu_erf") return {GemvEpilogue::kGeluErf, UnaryOp::kGeluErf};
  if (act == "gelu_tanh") return {GemvEpilogue::kGeluTanh, UnaryOp::kGeluTanh};
  if (act == "silu") return {GemvEpilogue::kSilu, UnaryOp::kSilu};
  if (act == "swiglu") return {GemvEpilogue::kSwiGlu, UnaryOp::kSilu};
  throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "' activation '", act,
              "' (expected gelu_erf, gelu_tanh, silu or swiglu)");
}

// A one-row q8/q4 GEMV read only by the decode attention runs 16 warps and releases the
// attention's launch at its start (QGemvDp4aTuning::beside_attention) where it streams at
// most this many bytes. Measured on an H100 (bench/RESULTS.md, session 51): decode 1.02-1.05x
// faster with q|k|v GEMVs of 3.3-6.7 MB (TinyLlama and Llama-3.2-1B, q4 and q8), 0.98x with
// the 15.8 MB of Llama-3.1-8B q4, whose stream needs the 24 warps.
constexpr size_t kBesideAttnMaxBytes = size_t(8) << 20;

// KILN_CUDA_QGEMV_BESIDE_ATTN: unset, empty or "auto" (by size), "1" or "0".
EnvAuto beside_attn_from_env() {
  return env_auto(
      "KILN_CUDA_QGEMV_BESIDE_ATTN",
      "a one-row q8/q4 GEMV read only by the decode attention runs 16 warps beside it where its "
      "weights are at most 8 MiB",
      "at every size", "never");
}

// A Linear's norm prologue and residual epilogue (pass fuse_norm_linear). In the 16-bit
// GEMV (few rows) both run inside the kernel, so no norm kernel launches and the
// normalized rows are never stored. Elsewhere (more rows, f32, q8/q4, rows too long for
// the GEMV's shared memory) the norm runs first into scratch with the unfused norm node's
// kernel, and the residual is cuBLASLt's C (beta = 1: added before the one rounding), so
// a block's launches there are the unfused graph's (its AddNorm becomes the norm). After
// an activation epilogue and in the quantized paths (the pass is off for quantized
// models; a q8/q4 pin can still meet it) the residual is one elementwise add, rounded as
// the unfused add: one launch more than the unfused AddNorm there.
struct LinearFusion {
  GemvNorm norm = GemvNorm::kNone;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float eps = 0.0f;
  bool residual = false;
  // Launch order beside the decode attention, for a Linear whose output only packed q|k|v
  // Attention nodes read (the kernel launched next), read when the Linear is prepared.
  // KILN_CUDA_GEMV_TRIGGER_EARLY=1 (opt-in: no faster on GPT-2 or TinyLlama, H100): the
  // 16-bit GEMV releases its dependent launch at its start (GemvFusion::trigger_early).
  // The dp4a q8/q4 GEMV runs QGemvDp4aTuning::beside_attention (beside_attention_for).
  bool trigger_early = false;
  EnvAuto beside = EnvAuto::kOff;
  // Whether a q8/q4 GEMV streaming weight_bytes runs beside the attention: by default
  // (KILN_CUDA_QGEMV_BESIDE_ATTN unset) where its weights are at most kBesideAttnMaxBytes,
  // always with =1, never with =0.
  bool beside_attention_for(size_t weight_bytes) const {
    return beside == EnvAuto::kOn ||
           (beside == EnvAuto::kAuto && weight_bytes <= kBesideAttnMaxBytes);
  }
  GemvFusion gemv(const void* res, bool with_norm) const {
    GemvFusion f = with_norm ? GemvFusion{norm, gamma, beta, eps, res}
                             : GemvFusion{GemvNorm::kNone, nullptr, nullptr, 0, res};
    f.trigger_early = trigger_early;
    return f;
  }
};

// Whether every reader of n's first output is an Attention node taking packed q|k|v (at
// least one, and the value is not a graph output): the node launched right after it.
bool read_only_by_attention(const ir::Node& n, const ir::Graph& g) {
  const ir::ValueId out = n.outputs.at(0);
  for (auto& [name, id] : g.outputs())
    if (id == out) return false;
  int readers = 0;
  for (const ir::Node& m : g.nodes())
    for (ir::ValueId in : m.inputs)
      if (in == out) {
        if (m.op != "Attention" || m.attr_int("packed_qkv", 0) == 0) return false;
        ++readers;
      }
  return readers > 0;
}

LinearFusion linear_fusion(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  LinearFusion f;
  f.residual = n.input(3) != ir::kNoValue;
  const bool trigger =
      env_switch_off_value("KILN_CUDA_GEMV_TRIGGER_EARLY",
                           std::getenv("KILN_CUDA_GEMV_TRIGGER_EARLY"), "after its main loop",
                           "a GEMV read only by the decode attention lets it launch at its start");
  const EnvAuto beside = beside_attn_from_env();
  if ((trigger || beside != EnvAuto::kOff) && read_only_by_attention(n, g)) {
    f.trigger_early = trigger;
    f.beside = beside;
  }
  const std::string norm = n.attr_str("norm", "");
  if (norm.empty()) return f;
  if (norm != "rms" && norm != "layer")
    throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "' norm '", norm, "' (expected rms or layer)");
  f.norm = norm == "rms" ? GemvNorm::kRms : GemvNorm::kLayer;
  f.gamma = static_cast<const float*>(pc.weights->get(g, need_weight(n, g, 4, "norm_weight"), DType::kF32));
  if (f.norm == GemvNorm::kLayer)
    f.beta = static_cast<const float*>(pc.weights->get(g, need_weight(n, g, 5, "norm_bias", true), DType::kF32));
  f.eps = float(n.attr_float("norm_eps"));
  return f;
}

// The residual input of a fused Linear (null without one), checked against its output y.
const void* linear_residual(const OpContext& c, const LinearFusion& f, const DevTensor& y, const std::string& name) {
  if (!f.residual) return nullptr;
  const DevTensor& r = *c.inputs[3];
  KILN_THROW_IF(r.shape != y.shape || r.dtype != y.dtype, kInvalidArgument, "linear '", name, "': residual ",
                dtype_name(r.dtype), " [", r.numel(), " elements] does not match the output ", dtype_name(y.dtype), " [",
                y.numel(), " elements]");
  return r.data;
}

// x's rows normalized into dst by the norm node's own kernel.
void linear_norm_into(const LinearFusion& f, DType t, const void* x, int64_t rows, int64_t k, void* dst,
                      cudaStream_t s) {
  if (f.norm == GemvNorm::kRms) launch_rms_norm(t, x, f.gamma, f.eps, rows, k, dst, s);
  else launch_layer_norm(t, x, f.gamma, f.beta, f.eps, rows, k, dst, s);
}

size_t round_up_256(size_t b) { return (b + 255) / 256 * 256; }

// A Linear run's scratch before its GEMM, in one op-scratch buffer: x's rows normalized by
// the fused norm (`norm`: when it does not run inside the kernel), then [rows, gu_cols]
// for the output of a SwiGLU GEMM (gu_cols = 0: none).
struct LinearScratch {
  const void* x;  // the GEMM's input: x itself, or its normalized rows
  char* gu;       // null without gu_cols
};
LinearScratch linear_scratch(OpContext& c, const LinearFusion& f, bool norm, DType t, const void* x, int64_t rows,
                             int64_t k, int64_t gu_cols) {
  const size_t es = dtype_size(t);
  const size_t xn_bytes = norm ? round_up_256(size_t(rows * k) * es) : 0, gu_bytes = size_t(rows * gu_cols) * es;
  char* scr = xn_bytes + gu_bytes ? static_cast<char*>(c.scratch(xn_bytes + gu_bytes)) : nullptr;
  if (norm) linear_norm_into(f, t, x, rows, k, scr, c.cx->stream);
  return {norm ? scr : x, gu_bytes ? scr + xn_bytes : nullptr};
}

// Bytes of one dequantized weight tile: small enough to stay in L2 (50 MB on an H100/H200)
// between the dequantize kernel writing it and cuBLASLt reading it.
constexpr size_t kDequantTileBytes = size_t(24) << 20;
// The largest tile a prompt's rows may take (the workspace grows to it, or to the largest
// q8/q4 weight if smaller).
constexpr size_t kDequantWideTileBytes = size_t(256) << 20;
// From this many token rows the GEMM behind a tile is bound by its arithmetic, and a tile
// too small to fill the device costs more than the tile's trip through memory.
constexpr int64_t kDequantWideFromRows = 256;

}  // namespace

// Rows of the weight tiles of a q8/q4 Linear's dequantize + cuBLASLt path (see the header).
int64_t dequant_tile_rows(int64_t n, int64_t k, size_t elem_bytes, int64_t t, int sms, bool wide) {
  const auto rows_of = [&](size_t bytes) {
    return std::max<int64_t>(128, int64_t(bytes / (size_t(k) * elem_bytes)) / 128 * 128);
  };
  int64_t rows = rows_of(kDequantTileBytes);
  if (wide && t >= kDequantWideFromRows) {
    // Enough 128 x 256 output tiles for four waves, within the wide cap.
    const int64_t row_tiles = (t + 127) / 128, want = int64_t(4) * std::max(sms, 1);
    rows = std::min(std::max(rows, (want + row_tiles - 1) / row_tiles * 256), rows_of(kDequantWideTileBytes));
  }
  if (rows >= n) return n;
  const int64_t tiles = (n + rows - 1) / rows;  // even tiles, each a multiple of 128 rows
  return std::min(n, ((n + tiles - 1) / tiles + 127) / 128 * 128);
}

namespace {

// KILN_CUDA_QGEMM: unset, empty or "skinny" (the default: launch_qgemm_skinny from
// KILN_CUDA_QGEMM_SKINNY_MIN_ROWS (default 6) to kQGemmSkinnyMaxRows rows, weight tiles dequantized
// into a workspace for cuBLASLt beyond; session 53 on an H100: Llama-3.1-8B q4 batch-16
// decode 2.10x, q8 batch-32 2.11x, TinyLlama q4 batch-32 1.13x the tiles / chunked GEMV), "dequant"
// (tiles at every row count, 9-16 rows of big weights through the chunked GEMV), or "fused" /
// "fused8" (launch_qgemm with CTAs of 4 or 8 warps for every row count past the GEMV's; measured
// slower, session 52).
struct QGemmMode {
  int fused_warps = 0;
  bool skinny = true;
};
QGemmMode qgemm_mode_from_env() {
  const char* e = std::getenv("KILN_CUDA_QGEMM");
  if (!e || !*e || std::strcmp(e, "skinny") == 0) return {};
  if (std::strcmp(e, "dequant") == 0) return {0, false};
  if (std::strcmp(e, "fused") == 0) return {4, false};
  if (std::strcmp(e, "fused8") == 0) return {8, false};
  throw_error(
      ErrorCode::kInvalidArgument, "KILN_CUDA_QGEMM='", e,
      "' (expected skinny, the default: q8/q4 GEMMs of up to 64 token rows dequantize in "
      "registers, longer ones dequantize weight tiles for cuBLASLt; dequant: the tiles at every "
      "row count; or fused / fused8: the GEMM that decodes the weight in shared memory, CTAs of "
      "4 / 8 warps)");
}

// The chunked GEMV's defaults (qgemv_chunk_rows), for the rows the skinny GEMM does not take
// (KILN_CUDA_QGEMM=dequant, or weights it cannot read). From an H100 (bench/RESULTS.md, session
// 52; the 8-row dp4a GEMV costs ~2x the one-row one): at 16 rows `cuda_qgemm_bench` timed
// two chunks 28% (q4) and 38% (q8) faster than the tiles on the 8B gate|up weight (117M
// values) but 2-7% slower on its down projection (59M) and 7-50% slower on every smaller
// weight. End to end at batch 16, q4: the 8B shape 12.25 ms a step on tiles, 9.57 with every
// weight chunked, 9.38 with its gate|up and LM head chunked (these defaults' choice); TinyLlama
// (its largest weight the 66M-value LM head) 1.85 on tiles, 1.93 with the LM head chunked, 2.58
// with every weight. Three chunks on the big weights at 24 rows: 0.974x.
constexpr int64_t kQGemvChunkRowsDefault = 16;
constexpr int64_t kQGemvChunkMinWeightsDefault = 80'000'000;

}  // namespace

int64_t qgemv_chunk_rows(int64_t weights, int64_t chunk_rows, int64_t min_weights,
                         bool kernel_fits) {
  return kernel_fits && weights >= min_weights ? chunk_rows : 0;
}

namespace {

// A q8/q4 Linear: the quantized GEMV for up to kQGemvMaxRows rows; by default from
// kQGemmSkinnyMinRowsDefault (KILN_CUDA_QGEMM_SKINNY_MIN_ROWS) the skinny GEMM up to
// kQGemmSkinnyMaxRows (16-bit activations, kRows weights), else (or with KILN_CUDA_QGEMM=dequant)
// the GEMV in chunks of as many up to KILN_CUDA_QGEMV_CHUNK_ROWS (large weights); beyond, tiles of
// whole rows (dequant_tile_rows: multiples of 128, so each tile's slice of y and of the bias keeps
// cuBLASLt's 256-byte alignment) dequantized into the workspace, each multiplied by cuBLASLt into
// its column slice of y (or of the [gate | up] scratch).
OpRun prepare_linear_quant(const ir::Node& n, const ir::Graph& g, PrepareContext& pc, QuantFormat f,
                           LinearEpilogue epi) {
  ir::ValueId wv = need_weight(n, g, 1, "weight");
  // The GEMV that runs the decode steps (KILN_CUDA_QGEMV: old | mma | dp4a) and its layout.
  const QGemvKernel qk = qgemv_kernel(pc.act);
  const bool image = n.has_attr("weight_quant");
  const QuantWeightView w =
      pc.weights->get_quant(g, wv, f, qgemv_kernel_layout(qk), image ? n.attr_int("weight_k", -1) : 0,
                            image && n.attr_str("weight_quant") == "q8" ? QuantFormat::kQ8 : QuantFormat::kQ4);
  const void* bias = pc.weights->get(g, need_weight(n, g, 2, "bias", true), pc.act);
  const int64_t nn = w.n, k = w.k;
  const bool swiglu = epi.gemv == GemvEpilogue::kSwiGlu;
  KILN_THROW_IF(swiglu && nn % 2 != 0, kInvalidArgument, "linear '", n.name, "': swiglu needs an even number of rows");
  const int64_t out_n = swiglu ? nn / 2 : nn;
  const size_t es = dtype_size(pc.act);
  // Tiles sized per call from the token rows (KILN_CUDA_DEQUANT_WIDE=0: the L2-sized tiles
  // at every row count); the workspace holds the largest.
  const bool wide = env_switch("KILN_CUDA_DEQUANT_WIDE", "prompts' tiles fill the device",
                               "every tile sized for L2");
  const int sms = pc.cx->num_sms;
  // KILN_CUDA_QGEMM unset or =skinny: up to kQGemmSkinnyMaxRows rows through
  // launch_qgemm_skinny (16-bit activations, kRows weights); =fused: prompt rows through the
  // GEMM that decodes the weight in shared memory (launch_qgemm), no workspace.
  const QGemmMode mode = qgemm_mode_from_env();
  const bool qgemm_ok = qgemm_supports(pc.act, w);
  const int fused = qgemm_ok ? mode.fused_warps : 0;
  const bool skinny = qgemm_ok && mode.skinny;
  // Its split-K (KILN_CUDA_QGEMM_SKINNY_SPLITS, 0: qgemm_skinny_splits' rule), the partial
  // sums in the dequantization workspace.
  const int skinny_splits =
      skinny ? int(env_count("KILN_CUDA_QGEMM_SKINNY_SPLITS", 0, 0, kQGemmSkinnyMaxSplits,
                             "k splits of the skinny q8/q4 GEMM (0: by its rule)"))
             : 1;
  // The k blocks of codes each of its lanes has in flight (KILN_CUDA_QGEMM_SKINNY_DEPTH),
  // and the fewest token rows it takes (KILN_CUDA_QGEMM_SKINNY_MIN_ROWS; fewer: the GEMV).
  const int skinny_depth =
      skinny ? int(env_count("KILN_CUDA_QGEMM_SKINNY_DEPTH", 1, 1, 2,
                             "k blocks of codes in flight a lane of the skinny q8/q4 GEMM"))
             : 1;
  const int64_t skinny_min_rows =
      skinny ? env_count("KILN_CUDA_QGEMM_SKINNY_MIN_ROWS", kQGemmSkinnyMinRowsDefault, 1,
                         kQGemmSkinnyMaxRows,
                         "the fewest token rows of the skinny q8/q4 GEMM (fewer: the GEMV)")
             : kQGemmSkinnyMaxRows + 1;
  const int splits =
      skinny_splits ? skinny_splits : qgemm_skinny_splits(nn, k, w.format, pc.cx->num_sms);
  // The chunked GEMV (qgemv_chunk_rows): both settings read (and checked) for every weight.
  const int64_t chunk_rows_env = env_count(
      "KILN_CUDA_QGEMV_CHUNK_ROWS", kQGemvChunkRowsDefault, 0, int64_t(1) << 20,
      "q8/q4 Linears of up to this many token rows run the GEMV in chunks of at most 8 rows "
      "rather than dequantized tiles + cuBLASLt; 0: never");
  const int64_t chunk_min_weights = env_count(
      "KILN_CUDA_QGEMV_CHUNK_MIN_WEIGHTS", kQGemvChunkMinWeightsDefault, 0, int64_t(1) << 40,
      "the chunked GEMV only for q8/q4 weights of at least this many values (rows x k)");
  const bool chunk_fits =
      qk == QGemvKernel::kMma ||
      (qk == QGemvKernel::kDp4a && qgemv_dp4a_supports(pc.act, kQGemvMaxRows, k));
  const int64_t chunk_rows =
      qgemv_chunk_rows(nn * k, chunk_rows_env, chunk_min_weights, chunk_fits);
  // KILN_CUDA_DEQUANT_WORDS=0: the tiles through the earlier dequantize kernel (A/B timing).
  const bool deq_words = env_switch("KILN_CUDA_DEQUANT_WORDS", "one thread per code word",
                                    "one thread per 16-byte chunk (the earlier kernel)");
  const int64_t max_tile_rows = dequant_tile_rows(nn, k, es, kDequantWideFromRows, sms, wide);
  KILN_CHECK(pc.dequant_ws, "cuda: no dequantization workspace");
  // Nothing runs yet: no stream to drain.
  if (!fused)
    pc.dequant_ws->grow(
        std::max(
            size_t(max_tile_rows * k) * es,
            skinny && splits > 1 ? size_t(splits * kQGemmSkinnyMaxRows * nn) * sizeof(float) : 0),
        nullptr);
  DeviceBuffer* ws = pc.dequant_ws;
  const std::string name = n.name;
  // Norm and residual (pass fuse_norm_linear, for a Linear pinned to q8/q4): the norm
  // kernel into scratch, one add after; the unfused graph's launches.
  const LinearFusion fu = linear_fusion(n, g, pc);
  // The activation's pass after cuBLASLt through tables (KILN_CUDA_GELU_LUT), if any.
  const std::optional<UnaryLut> lut = gelu_lut(*pc.cx, epi.unary, pc.act, GeluPass::kValues);
  return [=](OpContext& c) {
    const auto [x, y, t] = linear_io(c, name, k, out_n);
    cudaStream_t s = c.cx->stream;
    if (t == 0) return;
    const void* res = linear_residual(c, fu, y, name);
    const bool skinny_now = skinny && t >= skinny_min_rows && t <= kQGemmSkinnyMaxRows;
    const bool gemv = !skinny_now && gemv_quant_supports(y.dtype, t);
    const bool chunked = !gemv && !skinny_now && t <= chunk_rows;
    const LinearScratch scr = linear_scratch(c, fu, fu.norm != GemvNorm::kNone, y.dtype, x.data, t,
                                             k, !gemv && !chunked && swiglu ? nn : 0);
    const void* xin = scr.x;
    if (gemv) {
      launch_gemv_quant(y.dtype, xin, w, bias, y.data, t, out_n, s, epi.gemv, qk,
                        fu.beside_attention_for(w.bytes()));
    } else if (chunked) {
      // Even chunks (20 rows: 7, 7, 6), each row of x and y contiguous.
      const size_t ys = dtype_size(y.dtype);
      const int64_t chunks = (t + kQGemvMaxRows - 1) / kQGemvMaxRows,
                    per = (t + chunks - 1) / chunks;
      for (int64_t r0 = 0; r0 < t; r0 += per)
        launch_gemv_quant(y.dtype, static_cast<const char*>(xin) + size_t(r0 * k) * ys, w, bias,
                          static_cast<char*>(y.data) + size_t(r0 * out_n) * ys,
                          std::min(per, t - r0), out_n, s, epi.gemv, qk, false);
    } else if (fused || skinny_now) {
      if (skinny_now)
        launch_qgemm_skinny(y.dtype, xin, w, bias, swiglu ? scr.gu : y.data, t, nn, s, splits,
                            ws->get(), ws->size(), skinny_depth);
      else
        launch_qgemm(y.dtype, xin, w, bias, swiglu ? scr.gu : y.data, t, nn, s, fused);
      if (swiglu)
        launch_swiglu(y.dtype, scr.gu, t, out_n, y.data, s);
      else if (epi.gemv != GemvEpilogue::kNone)
        launch_unary_or_lut(lut, epi.unary, y.dtype, y.data, y.numel(), y.data, s);
    } else {
      const int64_t tile_rows = dequant_tile_rows(nn, k, es, t, sms, wide);
      KILN_CHECK(ws->size() >= size_t(tile_rows * k) * es, "cuda: dequantization workspace too small");
      auto* dst = swiglu ? scr.gu : static_cast<char*>(y.data);
      for (int64_t r0 = 0; r0 < nn; r0 += tile_rows) {
        const int64_t rows = std::min(tile_rows, nn - r0);
        launch_dequant_rows(y.dtype, w, r0, rows, ws->get(), s, deq_words);
        c.cx->gemm->run(y.dtype, xin, ws->get(), bias ? static_cast<const char*>(bias) + size_t(r0) * es : nullptr,
                        dst + size_t(r0) * es, t, rows, k, s, nn);
      }
      if (swiglu) launch_swiglu(y.dtype, dst, t, out_n, y.data, s);
      else if (epi.gemv != GemvEpilogue::kNone) launch_unary_or_lut(lut, epi.unary, y.dtype, y.data, y.numel(), y.data, s);
    }
    if (res) launch_binary(BinaryOp::kAdd, y.dtype, y.data, res, y.numel(), y.numel(), y.data, s);
  };
}

OpRun prepare_linear(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  if (n.has_attr("quant") && (n.has_attr("norm") || n.input(3) != ir::kNoValue))
    throw_error(ErrorCode::kUnsupported, "cuda: Linear '", n.name, "' (quant ", n.attr_str("quant"),
                ") has a fuse_norm_linear norm or residual, which its kernels do not take; build with "
                "--disable-pass fuse_norm_linear");
  if (n.attr_str("quant", "") == "fp8") return prepare_fp8_linear(n, g, pc);
  if (n.attr_str("quant", "") == "w8a8") return prepare_w8a8_linear(n, g, pc);
  const LinearEpilogue epi = linear_epilogue(n);
  if (auto f = cuda_linear_quant_format(n, g, pc.weight_dtype)) return prepare_linear_quant(n, g, pc, *f, epi);
  ir::ValueId wv = need_weight(n, g, 1, "weight");
  const void* w = pc.weights->get(g, wv, pc.act);
  const void* bias = pc.weights->get(g, need_weight(n, g, 2, "bias", true), pc.act);
  const int64_t nn = g.weight(wv).dim(0), k = g.weight(wv).dim(1);
  // Few token rows (decode) stream the weights through our GEMV (KILN_CUDA_GEMV=0: not
  // used), the rest go through cuBLASLt.
  const bool use_gemv = gemv_enabled_from_env();
  const bool swiglu = epi.gemv == GemvEpilogue::kSwiGlu;
  KILN_THROW_IF(swiglu && nn % 2 != 0, kInvalidArgument, "linear '", n.name, "': swiglu needs an even number of rows");
  const int64_t out_n = swiglu ? nn / 2 : nn;
  const LinearFusion fu = linear_fusion(n, g, pc);
  const std::string name = n.name;
  // The activation's pass after cuBLASLt through tables (KILN_CUDA_GELU_LUT), if any.
  const std::optional<UnaryLut> lut = gelu_lut(*pc.cx, epi.unary, pc.act, GeluPass::kValues);
  return [=](OpContext& c) {
    const auto [x, y, t] = linear_io(c, name, k, out_n);
    cudaStream_t s = c.cx->stream;
    const void* res = linear_residual(c, fu, y, name);
    const bool gemv = use_gemv && gemv_supports(y.dtype, t, k);
    const bool norm = fu.norm != GemvNorm::kNone;
    if (gemv && (!norm || gemv_norm_supports(y.dtype, t, k))) {
      launch_gemv(y.dtype, x.data, w, bias, y.data, t, out_n, k, s, epi.gemv, fu.gemv(res, norm));
      return;
    }
    // The norm's rows (when it does not run inside the GEMV) and [gate | up] in scratch.
    const LinearScratch scr = linear_scratch(c, fu, norm, y.dtype, x.data, t, k, !gemv && swiglu ? nn : 0);
    const void* xin = scr.x;
    if (gemv) {
      launch_gemv(y.dtype, xin, w, bias, y.data, t, out_n, k, s, epi.gemv, fu.gemv(res, false));
    } else if (swiglu) {  // [gate | up] into scratch, then silu(gate) * up
      c.cx->gemm->run(y.dtype, xin, w, bias, scr.gu, t, nn, k, s);
      launch_swiglu(y.dtype, scr.gu, t, out_n, y.data, s);
      if (res) launch_binary(BinaryOp::kAdd, y.dtype, y.data, res, y.numel(), y.numel(), y.data, s);
    } else if (epi.gemv != GemvEpilogue::kNone) {
      // The skinny GEMM applies the activation itself (returns true); cuBLASLt needs the pass.
      if (!c.cx->gemm->run(y.dtype, xin, w, bias, y.data, t, nn, k, s, 0, nullptr, epi.gemv))
        launch_unary_or_lut(lut, epi.unary, y.dtype, y.data, y.numel(), y.data, s);
      if (res) launch_binary(BinaryOp::kAdd, y.dtype, y.data, res, y.numel(), y.numel(), y.data, s);
    } else {
      c.cx->gemm->run(y.dtype, xin, w, bias, y.data, t, nn, k, s, 0, res);
    }
  };
}

template <UnaryOp kOp>
OpRun prepare_unary(const ir::Node&, const ir::Graph&, PrepareContext& pc) {
  // Through tables (KILN_CUDA_GELU_LUT: the erf GELU on bf16/f16), if any.
  return [lut = gelu_lut(*pc.cx, kOp, pc.act, GeluPass::kValues)](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    DevTensor& y = c.out(0, x.shape);
    launch_unary_or_lut(lut, kOp, y.dtype, x.data, x.numel(), y.data, c.cx->stream);
  };
}

OpRun prepare_gelu(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  const std::string approx = n.attr_str("approximate", "none");
  if (const auto q = fp8_fused_output(n, 0, g, pc.act); q && (approx == "none" || approx == "tanh"))
    return [op = approx == "none" ? UnaryOp::kGeluErf : UnaryOp::kGeluTanh, inv = q->inv](OpContext& c) {
      const DevTensor& x = *c.inputs[0];
      DevTensor& y = c.out(0, x.shape, DType::kFP8E4M3);
      launch_unary_fp8(op, x.dtype, x.data, x.numel(), inv, static_cast<uint8_t*>(y.data), c.cx->stream);
    };
  if (approx == "none") return prepare_unary<UnaryOp::kGeluErf>(n, g, pc);
  if (approx == "tanh") return prepare_unary<UnaryOp::kGeluTanh>(n, g, pc);
  throw_error(ErrorCode::kUnsupported, "cuda: Gelu approximate='", approx, "' (expected none or tanh)");
}

OpRun prepare_rope(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  auto* inv_freq = static_cast<const float*>(pc.weights->get(g, need_weight(n, g, 2, "inv_freq"), DType::kF32));
  const int64_t heads = n.attr_int("num_heads"), hd = n.attr_int("head_dim");
  const int64_t rot = n.attr_int("rotary_dim", hd);
  KILN_THROW_IF(rot % 2 != 0 || rot > hd || rot <= 0, kInvalidArgument, "rope '", n.name,
                "': rotary_dim must be even and in (0, head_dim], got rotary_dim=", rot, " head_dim=", hd);
  return [=](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    const DevTensor& pos = *c.inputs[1];
    DevTensor& y = c.out(0, x.shape);
    launch_rope(y.dtype, x.data, y.data, static_cast<const int32_t*>(pos.data), inv_freq, x.dim(0), heads, hd, rot,
                c.cx->stream);
  };
}

// Attention over the paged KV cache. Separate q, k, v inputs, or (packed_qkv=1, pass
// fuse_qkv_attention) one [T, (hq + 2 hkv) d] input whose q and k are rotated in place
// and whose k, v go to the cache in one kernel (launch_qkv_prep); the packed input has
// no other reader (cuda_op_supported checks), so rotating it in place is safe.
OpRun prepare_attention(const ir::Node& n, const ir::Graph& g, PrepareContext& pc) {
  const int64_t layer = n.attr_int("layer"), hq = n.attr_int("num_heads");
  const int64_t hkv = n.attr_int("num_kv_heads"), d = n.attr_int("head_dim");
  const float scale = float(n.attr_float("scale"));
  const bool causal = n.attr_int("causal") != 0;
  const int64_t window = n.attr_int("window", 0);
  KILN_THROW_IF(window < 0 || (window > 0 && !causal), kInvalidArgument, "attention '", n.name, "': window ", window,
                " (a sliding window is positive and causal)");
  const float softcap = float(n.attr_float("softcap", 0.0));
  const bool window_or_cap = attention_window_or_cap(n);
  const bool packed = n.attr_int("packed_qkv", 0) != 0;
  const int64_t rot = n.attr_int("rotary_dim", d);
  const float* inv_freq =
      packed && n.input(2) != ir::kNoValue
          ? static_cast<const float*>(pc.weights->get(g, need_weight(n, g, 2, "inv_freq"), DType::kF32))
          : nullptr;
  // Read only by FP8 Linears, or by W8A8 Linears of one static scale: the output leaves as
  // their E4M3 / int8 codes, written by the flash kernel itself, else quantized from a
  // scratch copy.
  const std::optional<Fp8Scale> codes = fp8_fused_output(n, 0, g, pc.act);
  const std::optional<Int8Codes> icodes = codes ? std::nullopt : int8_fused_output(n, 0, g, pc.act);
  KILN_CHECK(!icodes || !icodes->per_token, "cuda: attention '", n.name, "' asked for per-token int8 codes");
  const std::string name = n.name;
  return [=](OpContext& c) {
    const DevTensor& q = *c.inputs[0];
    const int64_t t = q.dim(0), width = packed ? (hq + 2 * hkv) * d : hq * d;
    KILN_THROW_IF(c.step->num_tokens() != t, kInvalidArgument, "attention '", name, "': the step lays out ",
                  c.step->num_tokens(), " tokens but q has ", t, " rows");
    KILN_THROW_IF(q.dim(1) != width, kInvalidArgument, "attention '", name, "': input rows have ", q.dim(1),
                  " features, expected ", width);
    // y: the output, or its codes (int8: retyped from the planned activation buffer).
    void* y = icodes ? static_cast<void*>(int8_out(c, 0, {t, hq * d}, *icodes).q)
                     : c.out(0, {t, hq * d}, codes ? std::optional<DType>(DType::kFP8E4M3) : std::nullopt).data;
    const DType dt = q.dtype;  // of q, k, v, the cache and the attention's own output
    AttentionArgs a;
    a.dtype = dt;
    a.q = q.data;
    a.out = codes || icodes ? c.scratch(size_t(t * hq * d) * dtype_size(dt)) : y;
    // After a kernel wrote a.out: its codes into y (when it did not write them itself).
    auto quantize_out = [&](const AttentionArgs& done) {
      if (done.out_codes) return;
      if (codes)
        launch_fp8_quantize(dt, done.out, t * hq * d, codes->inv, static_cast<uint8_t*>(y), c.cx->stream);
      else if (icodes)
        launch_int8_quantize(dt, done.out, t, hq * d, icodes->inv, static_cast<int8_t*>(y), nullptr, c.cx->stream);
    };
    a.hq = hq;
    a.hkv = hkv;
    a.d = d;
    a.scale = scale;
    a.causal = causal;
    a.softcap = softcap;
    for (const StepSequence& ss : c.step->seqs) a.max_q_len = std::max<int64_t>(a.max_q_len, ss.q_len);
    const size_t es = dtype_size(dt);
    const void* k = packed ? static_cast<const char*>(q.data) + size_t(hq * d) * es : c.inputs[1]->data;
    const void* v = packed ? static_cast<const char*>(k) + size_t(hkv * d) * es : c.inputs[2]->data;
    if (packed) a.q_stride = width;
    a.seqs = c.dev->seqs;
    a.block_tables = c.dev->block_tables;
    const DevAttentionPlan& p = c.dev->plans.at({hq, hkv, window_or_cap});
    a.window = p.windowed ? int32_t(window) : 0;  // else no context is longer than the window
    KILN_CHECK(p.windowed || softcap == 0.0f, "cuda: attention '", name, "' planned without its soft cap");
    a.work = p.work;
    a.num_work = p.num_work;
    a.combine = p.combine;
    a.num_combine = p.num_combine;
    a.num_partials = p.num_partials;
    a.flash_width = p.flash_width;
    a.flash_items_per_sm = p.flash_items_per_sm;
    a.flash_warp_rows = c.dev->flash_warp_rows;
    a.workspace = c.dev->attn_workspace;
    if (c.kv) {
      KILN_THROW_IF(layer < 0 || layer >= c.kv->layout().num_layers, kInvalidArgument, "attention '", name,
                    "': layer ", layer, " is outside the KV pool's ", c.kv->layout().num_layers, " layers");
      CudaKv& kv = *c.kv;
      const bool quantized = kv.code() != KvCode::kNone, k_rotated = kv.layout().k_rotated();
      {
        // A decode step: RoPE, the (quantizing) cache write, attention and the split merge
        // in one kernel.
        AttentionArgs f = a;
        f.k_cache = kv.k(layer);
        f.v_cache = kv.v(layer);
        f.kv_code = kv.code();
        f.k_scales = kv.k_scales(layer);
        f.v_scales = kv.v_scales(layer);
        f.k_shift = kv.k_shift(layer);
        f.k_rotate = k_rotated;
        f.block_size = kv.layout().block_size;
        f.k_new = k;
        f.v_new = v;
        f.new_stride = packed ? width : hkv * d;
        f.positions = packed && inv_freq ? static_cast<const int32_t*>(c.inputs[1]->data) : nullptr;
        f.inv_freq = packed ? inv_freq : nullptr;
        f.rotary_dim = rot;
        f.slot_mapping = c.dev->slot_mapping;
        f.counters = c.dev->attn_counters;
        f.early_trigger = t <= kGemvMaxRows;  // the next Linear is a GEMV: let it launch early
        if (p.decode_splits > 0) {
          f.decode_splits = p.decode_splits;
          f.decode_warp = p.decode_warp;
          f.num_seqs = c.dev->num_seqs;
          launch_attention_decode_cluster(f, c.cx->stream);
          quantize_out(f);
          return;
        }
        if (attention_fused_decode_supported(f)) {
          launch_attention_fused_decode(f, c.cx->stream);
          quantize_out(f);
          return;
        }
      }
      if (packed) {
        // Quantized: RoPE in place here, the quantizing write below.
        QkvPrepArgs qa{dt, q.data, t, hq, hkv, d, rot,
                       inv_freq ? static_cast<const int32_t*>(c.inputs[1]->data) : nullptr, inv_freq,
                       c.dev->slot_mapping, quantized ? nullptr : kv.k(layer), quantized ? nullptr : kv.v(layer)};
        if (!quantized || inv_freq) launch_qkv_prep(qa, c.cx->stream);
      } else if (!quantized) {
        launch_kv_cache_write(dt, k, v, c.dev->slot_mapping, t, hkv * d, kv.k(layer), kv.v(layer),
                              c.cx->stream);
      }
      if (quantized) {
        launch_kv_quant_write(dt, kv.code(), k, v, packed ? width : hkv * d, c.dev->slot_mapping, t, hkv, d,
                              static_cast<uint8_t*>(kv.k(layer)), kv.k_scales(layer),
                              static_cast<uint8_t*>(kv.v(layer)), kv.v_scales(layer), c.cx->stream,
                              kv.k_shift(layer), k_rotated);
        a.kv_code = kv.code();
        a.k_rotate = k_rotated;
        a.k_scales = kv.k_scales(layer);
        a.v_scales = kv.v_scales(layer);
      }
      a.k_cache = kv.k(layer);
      a.v_cache = kv.v(layer);
      a.block_size = c.kv->layout().block_size;
    } else {
      // No cache (encoders): K/V rows are read in place as a pool of one-token blocks;
      // the step upload made each sequence's "block table" its own row indices.
      if (packed && inv_freq) {
        QkvPrepArgs qa{dt, q.data, t, hq, hkv, d, rot, static_cast<const int32_t*>(c.inputs[1]->data),
                       inv_freq, nullptr, nullptr, nullptr};
        launch_qkv_prep(qa, c.cx->stream);
      }
      a.k_cache = k;
      a.v_cache = v;
      a.block_size = 1;
      if (packed) a.kv_stride = width;
    }
    if ((codes || icodes) && a.flash_width > 0 && a.num_partials == 0) {  // a key split's combine writes T
      a.out_codes = static_cast<uint8_t*>(y);
      a.out_code_inv = codes ? codes->inv : icodes->inv;
      a.out_code = codes ? AttnOutCode::kFp8 : AttnOutCode::kInt8;
    }
    launch_attention(a, c.cx->stream);
    quantize_out(a);
  };
}

OpRun prepare_gather_rows(const ir::Node&, const ir::Graph&, PrepareContext&) {
  return [](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    const DevTensor& rows = *c.inputs[1];
    const int64_t r = rows.dim(0), dim = x.dim(1);
    if (const Tensor* h = c.host_inputs[1])
      for (int64_t i = 0; i < r; ++i) {
        const int32_t row = h->data_as<int32_t>()[i];
        KILN_THROW_IF(row < 0 || row >= x.dim(0), kOutOfRange, "GatherRows: row ", row, " outside [0, ", x.dim(0), ")");
      }
    DevTensor& y = c.out(0, {r, dim});
    launch_gather_rows(y.dtype, x.data, static_cast<const int32_t*>(rows.data), r, dim, y.data, c.cx->stream);
  };
}

OpRun prepare_seq_mean_pool(const ir::Node&, const ir::Graph&, PrepareContext&) {
  return [](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    const int64_t b = c.dev->num_seqs, dim = x.dim(1);
    for (const StepSequence& ss : c.step->seqs)
      KILN_THROW_IF(int64_t(ss.q_start) + ss.q_len > x.dim(0), kInvalidArgument, "SeqMeanPool: sequence rows [",
                    ss.q_start, ", +", ss.q_len, ") outside the ", x.dim(0), " rows of x");
    DevTensor& y = c.out(0, {b, dim});
    launch_seq_mean_pool(y.dtype, x.data, reinterpret_cast<const int32_t*>(c.dev->seqs),
                         int64_t(sizeof(AttnSeq) / sizeof(int32_t)), b, dim, y.data, c.cx->stream);
  };
}

// TopKLogits: reads logits in the activation dtype, writes f32 values, i32 ids and f32
// log-probs, each [R, k], or [R, step.top_k] when the step needs fewer candidates
// (StepInfo::top_k; part of the graph key). The split kernels' partials live in the op
// scratch. The device facts and switches the plans need are read here, once, not on
// every step.
OpRun prepare_topk_logits(const ir::Node& n, const ir::Graph&, PrepareContext& pc) {
  const int64_t node_k = n.attr_int("k");
  const TopKConfig cfg = topk_logits_config(pc.act);
  return [node_k, cfg](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    const int64_t r = x.dim(0), v = x.dim(1);
    const int64_t k = c.step && c.step->top_k > 0 ? std::min<int64_t>(node_k, c.step->top_k) : node_k;
    auto* values = static_cast<float*>(c.out(0, {r, k}, DType::kF32).data);
    auto* ids = static_cast<int32_t*>(c.out(1, {r, k}, DType::kI32).data);
    auto* logprobs = static_cast<float*>(c.out(2, {r, k}, DType::kF32).data);
    const TopKPlan plan = topk_logits_plan(cfg, r, v, k);
    void* scratch = plan.split() ? c.scratch(plan.scratch_bytes) : nullptr;
    launch_topk_logits(x.dtype, x.data, r, v, k, values, ids, logprobs, plan, scratch, c.cx->stream);
  };
}

// AllReduce: the sum of x over the tensor-parallel ranks, through NCCL on the stream
// (captured into decode graphs like any kernel).
OpRun prepare_all_reduce(const ir::Node& n, const ir::Graph&, PrepareContext& p) {
  std::shared_ptr<Communicator> comm = p.communicator;
  KILN_THROW_IF(!comm, kInvalidArgument, "node '", n.name,
                "' (AllReduce) needs a communicator: this graph is a tensor-parallel shard");
  return [comm](OpContext& c) {
    const DevTensor& x = *c.inputs[0];
    DevTensor& y = c.out(0, x.shape, x.dtype);
    if (comm->world_size() == 1)
      KILN_CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, size_t(x.numel()) * dtype_size(x.dtype), cudaMemcpyDeviceToDevice,
                                      c.cx->stream));
    else
      comm->all_reduce_sum_device(x.data, y.data, x.numel(), x.dtype, c.cx->stream);
  };
}

const std::map<std::string, OpPrepare>& op_table() {
  static const std::map<std::string, OpPrepare> table = {
      {"Embedding", prepare_embedding},
      {"Add", prepare_binary<BinaryOp::kAdd>},
      {"Mul", prepare_binary<BinaryOp::kMul>},
      {"LayerNorm", prepare_norm},
      {"RMSNorm", prepare_norm},
      {"HeadRMSNorm", prepare_head_norm},
      {"AddLayerNorm", prepare_norm},
      {"AddRMSNorm", prepare_norm},
      {"SwiGLU", prepare_swiglu},
      {"GeGLU", prepare_geglu},
      {"Linear", prepare_linear},
      {"Gelu", prepare_gelu},
      {"Silu", prepare_unary<UnaryOp::kSilu>},
      {"Tanh", prepare_unary<UnaryOp::kTanh>},
      {"Rope", prepare_rope},
      {"Attention", prepare_attention},
      {"GatherRows", prepare_gather_rows},
      {"SeqMeanPool", prepare_seq_mean_pool},
      {"TopKLogits", prepare_topk_logits},
      {"AllReduce", prepare_all_reduce},
  };
  return table;
}

}  // namespace

const OpPrepare* find_cuda_op(const std::string& op) {
  auto it = op_table().find(op);
  return it == op_table().end() ? nullptr : &it->second;
}

bool cuda_op_supported(const ir::Node& n, const ir::Graph& g, std::string* why) {
  auto fail = [&](std::string msg) {
    if (why) *why = std::move(msg);
    return false;
  };
  if (n.op == ir::kPluginOp) {  // a custom op from a plugin library (ir/plugin.h)
    const std::string domain = n.attr_str(ir::kPluginDomainAttr, ""), name = n.attr_str(ir::kPluginOpAttr, "");
    const ir::PluginOp* op = ir::plugin_find_op(domain, name);
    if (!op) return fail(ir::plugin_missing_message(domain, name));
    if (!op->table.execute_cuda)
      return fail(str_cat("plugin ", op->origin(), " has no CUDA implementation of ", op->qualified_name(),
                          " (its execute_cuda callback is NULL); run it with --backend cpu"));
    return fail(str_cat("the cuda backend does not run plugin ops yet (", op->qualified_name(), " of plugin ",
                        op->origin(), " has an execute_cuda callback kiln does not call yet); run it with "
                        "--backend cpu"));
  }
  if (!find_cuda_op(n.op)) return fail(str_cat("no CUDA kernel for op '", n.op, "'"));
  if (n.op == "Attention") {
    const int64_t d = n.attr_int("head_dim", 0);
    if (!attention_supports_head_dim(d))
      return fail(str_cat("attention head_dim ", d, " (supported: ", kAttentionHeadDims, ")"));
    if (n.attr_int("packed_qkv", 0)) {
      // The packed rows are rotated in place: nothing else may read them.
      const ir::ValueId qkv = n.inputs[0];
      int readers = 0;
      for (const ir::Node& m : g.nodes())
        for (ir::ValueId in : m.inputs) readers += in == qkv;
      for (auto& [oname, id] : g.outputs()) readers += id == qkv;
      if (readers != 1 || g.is_weight(qkv)) return fail("packed_qkv input must be read by this attention only");
      if (n.input(2) != ir::kNoValue && !g.is_weight(n.input(2))) return fail("inv_freq must be a weight");
    }
  }
  if (n.op == "Gelu") {
    const std::string a = n.attr_str("approximate", "none");
    if (a != "none" && a != "tanh") return fail(str_cat("Gelu approximate='", a, "'"));
  }
  if (n.op == "Linear" && n.has_attr("quant")) {
    const std::string q = n.attr_str("quant");
    if (q != "fp8" && q != "w8a8") return fail(str_cat("quant '", q, "' (the CUDA backend runs fp8 and w8a8)"));
    if (q == "fp8" && !fp8_linear_supported(n, g, why)) return false;
    if (q == "w8a8" && !w8a8_linear_supported(n, g, why)) return false;
  }
  auto weight_at = [&](size_t i) { return n.input(i) == ir::kNoValue || g.is_weight(n.input(i)); };
  if ((n.op == "Linear" || n.op == "LayerNorm") && !(weight_at(1) && weight_at(2)))
    return fail("weight/bias inputs must be weights");
  if (n.op == "Linear" && !(weight_at(4) && weight_at(5))) return fail("norm_weight/norm_bias inputs must be weights");
  if (n.op == "Linear" && n.input(3) != ir::kNoValue && g.is_weight(n.input(3)))
    return fail("the residual input must be a computed value, not a weight");
  if (n.op == "Linear" && n.has_attr("quant") && (n.has_attr("norm") || n.input(3) != ir::kNoValue))
    return fail(str_cat("quant '", n.attr_str("quant"), "' Linears take no fuse_norm_linear norm or residual (build "
                        "with --disable-pass fuse_norm_linear)"));
  if ((n.op == "AddRMSNorm" || n.op == "AddLayerNorm") && !(weight_at(2) && weight_at(3)))
    return fail("norm weight/bias inputs must be weights");
  if (((n.op == "RMSNorm" || n.op == "HeadRMSNorm") && !weight_at(1)) || (n.op == "Embedding" && !weight_at(0)) || (n.op == "Rope" && !weight_at(2)))
    return fail("parameter inputs must be weights");
  return true;
}

}  // namespace kiln::cuda

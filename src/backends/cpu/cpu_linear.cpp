// The CPU backend's Linear node (cpu_op_util.h's prepare_linear) and the packing of
// Linear weights at build time (cpu_ops.h: tactics, storage, pack_linear_weights): the
// GEMM per precision (f32 / bf16 / f16 / q8 / q4 panels, W8A8, FP8) with its fused
// activation, norm and residual.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <tuple>

#include "backends/cpu/cpu_op_util.h"
#include "backends/cpu/cpu_ops.h"
#include "core/fp8.h"
#include "core/hadamard.h"
#include "core/int8.h"
#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

namespace {

// The builder's tactic for this node (CompileOptions::tactics), else the heuristic.
LinearTactic linear_tactic_for(const ir::Node& n, const CompileOptions& opt) {
  auto it = opt.tactics.find(n.name);
  if (it == opt.tactics.end()) return {};
  return linear_tactic_parse(it->second);
}

// The storage a Linear's weights are packed in: its precision, except that group
// quantization needs whole groups along K (such layers stay in bf16).
WeightStorage linear_storage(const ir::Node& n, int64_t k, const CompileOptions& opt) {
  const std::string wanted = linear_weight_storage(n, opt);
  WeightStorage storage = storage_from_option(wanted);
  if (weight_storage_quantized(storage) && k % kQuantGroup != 0) {
    log_debug("cpu: ", n.name, " has K=", k, ", not a multiple of ", kQuantGroup, "; stored as bf16 instead of ",
              wanted);
    storage = WeightStorage::kBF16;
  }
  return storage;
}

// The GEMM of one Linear node: y[t, n] = x[t, k] · Wᵀ + b.
using LinearGemm = std::function<void(const float* x, int64_t t, int64_t k, float* y)>;

// W8A8 (attrs quant="w8a8", act_amax): per-channel int8 weights, per-tensor int8 input.
LinearGemm w8a8_gemm(const ir::Node& n, const Tensor& w, const Tensor& bias, const CompileOptions& opt,
                     int64_t* out_n) {
  const double amax = n.attr_float("act_amax");
  if (!(amax >= 0) || !std::isfinite(amax))
    throw_error(ErrorCode::kInvalidArgument, "cpu: Linear '", n.name, "' has act_amax ", amax,
                " (expected a finite value >= 0 from calibration)");
  // act_hadamard = b (quant/w8a8.h): the input rows go through the Walsh-Hadamard
  // transform of blocks of b first (the weight was stored as W H / b).
  const int64_t had = n.attr_int("act_hadamard", 0);
  if (had != 0 && had != hadamard_block(w.dim(1)))
    throw_error(ErrorCode::kInvalidArgument, "cpu: Linear '", n.name, "' has act_hadamard ", had, " (its K = ", w.dim(1),
                " rotates in blocks of ", hadamard_block(w.dim(1)), ")");
  // weight_amax (a row-parallel shard, parallel/tensor_parallel.h): each row's scale is
  // the unsharded row's max |w| / 127, so the codes are the unsharded model's.
  std::vector<float> row_amax;
  if (n.has_attr("weight_amax")) {
    const auto* list = std::get_if<std::vector<double>>(&n.attrs.at("weight_amax"));
    if (!list)
      throw_error(ErrorCode::kInvalidArgument, "cpu: Linear '", n.name,
                  "' has a weight_amax that is not a list of numbers");
    row_amax = int8_weight_amax(*list, w.data_as<float>(), w.dim(0), w.dim(1),
                                "cpu: Linear '" + n.name + "'");
  }
  auto packed = std::make_shared<PackedInt8Weight>(pack_weight_int8(
      w.data_as<float>(), w.dim(0), w.dim(1), row_amax.empty() ? nullptr : row_amax.data()));
  // act_dynamic=1: per-token scales computed from each row at run time (x_scale 0).
  const float x_scale = n.attr_int("act_dynamic", 0) ? 0.0f : int8_act_scale(amax);
  *out_n = packed->n;
  const float* b = f32(bias.empty() ? nullptr : &bias);
  std::shared_ptr<const LinearObserver> obs =
      opt.linear_observer && opt.linear_observer->on_quant_output ? opt.linear_observer : nullptr;
  std::shared_ptr<PackedWeight> ref;
  if (obs) ref = std::make_shared<PackedWeight>(pack_weight(w.data_as<float>(), w.dim(0), w.dim(1), WeightStorage::kF32));
  std::string name = n.name;
  return [packed, x_scale, b, bias, obs, ref, name, had](const float* x, int64_t t, int64_t k, float* y) {
    thread_local std::vector<float> rotated;
    if (had) {
      rotated.resize(size_t(t * k));
      float* dst = rotated.data();
      // Rows apart on the pool (a prompt's rows: the copy and 9-10 butterfly passes each);
      // a decode step's few rows (under ~64 K values a chunk) stay on this thread.
      ThreadPool::global().parallel_for(
          t,
          [&](int64_t r0, int64_t r1, int) {
            std::copy(x + r0 * k, x + r1 * k, dst + r0 * k);
            for (int64_t r = r0; r < r1; ++r) hadamard_transform(dst + r * k, k);
          },
          std::max<int64_t>(1, (int64_t(1) << 16) / k));
      x = rotated.data();
    }
    linear_int8(x, t, k, *packed, x_scale, b, y);
    if (obs) {
      std::vector<float> yf(static_cast<size_t>(t * packed->n));
      linear(x, t, k, *ref, b, yf.data());
      obs->on_quant_output(name, y, yf.data(), t, packed->n);
    }
  };
}

// FP8 (attrs quant="fp8", act_amax; weight_scale when the weight is stored as E4M3
// codes, else the f32 weight is quantized here with core/fp8.h's per-tensor scale).
// out_amax (quant/fp8.h, swiglu Linears): the output is rounded through E4M3 with the
// per-tensor scale out_amax / 448 before the epilogue, as a GPU GEMM writing E4M3 does.
LinearGemm fp8_gemm(const ir::Node& n, const ir::Graph& g, const Tensor& bias, const CompileOptions& opt,
                    int64_t* out_n) {
  const double amax = n.attr_float("act_amax");
  if (!(amax >= 0) || !std::isfinite(amax))
    throw_error(ErrorCode::kInvalidArgument, "cpu: Linear '", n.name, "' has act_amax ", amax,
                " (expected a finite value >= 0 from calibration)");
  const Fp8Scale xs = fp8_scale_for_amax(amax);
  const bool round_out = n.has_attr("out_amax");
  Fp8Scale os;
  if (round_out) os = fp8_out_scale(n.attr_float("out_amax"), "cpu: fp8 Linear '" + n.name + "'");
  const ir::ValueId wv = n.inputs[1];
  if (!g.is_weight(wv))
    throw_error(ErrorCode::kUnsupported, "cpu: fp8 Linear '", n.name, "' needs its weight to be a weight");
  const Tensor& wt = g.weight(wv);
  const int64_t nn = wt.dim(0), k = wt.dim(1);
  Tensor codes;
  float w_scale = 1.0f;
  Tensor ref_w;  // f32 weights of the observer's reference GEMM
  if (wt.dtype() == DType::kFP8E4M3) {
    w_scale = fp8_stored_weight_scale(n.attr_float("weight_scale", -1.0),
                                      "cpu: fp8 Linear '" + n.name + "'");
    codes = wt;
  } else {
    Tensor wf = weight_f32(g, wv, n, "weight");
    codes = Tensor(DType::kFP8E4M3, wf.shape());
    w_scale = fp8_quantize_tensor(wf.data_as<float>(), size_t(wf.numel()), codes.data_as<uint8_t>()).scale;
    ref_w = wf;
  }
  auto packed = std::make_shared<PackedFp8Weight>(pack_weight_fp8(codes.data_as<uint8_t>(), nn, k, w_scale));
  *out_n = nn;
  const float* b = f32(bias.empty() ? nullptr : &bias);
  std::shared_ptr<const LinearObserver> obs =
      opt.linear_observer && opt.linear_observer->on_quant_output ? opt.linear_observer : nullptr;
  std::shared_ptr<PackedWeight> ref;
  if (obs) {
    if (ref_w.empty()) {  // an engine's E4M3 weights: the reference sees them dequantized
      ref_w = Tensor(DType::kF32, codes.shape());
      for (int64_t i = 0; i < codes.numel(); ++i)
        ref_w.data_as<float>()[i] = fp8e4m3_to_f32(codes.data_as<uint8_t>()[i]) * w_scale;
    }
    ref = std::make_shared<PackedWeight>(pack_weight(ref_w.data_as<float>(), nn, k, WeightStorage::kF32));
  }
  LinearTactic tactic = linear_tactic_for(n, opt);
  std::string name = n.name;
  return [packed, xs, round_out, os, b, bias, obs, ref, name, tactic](const float* x, int64_t t, int64_t k, float* y) {
    linear_fp8(x, t, k, *packed, xs.scale, xs.inv, b, y, tactic);
    if (round_out) fp8_round_trip(y, size_t(t * packed->n()), os, y);
    if (obs) {
      std::vector<float> yf(static_cast<size_t>(t * packed->n()));
      linear(x, t, k, *ref, b, yf.data());
      obs->on_quant_output(name, y, yf.data(), t, packed->n());
    }
  };
}

// A Linear's weight packed in its storage: a weight kept quantized (weight_quant, a
// GGUF's own codes) packs its rows as they are when the storage is its format, else it
// is expanded to f32 first, like every other weight.
PackedWeight pack_linear_weight(const ir::Graph& g, const ir::Node& n, const CompileOptions& opt) {
  const ir::ValueId src = n.inputs[1];
  if (n.has_attr("weight_quant")) {
    const WeightStorage storage = linear_storage(n, n.attr_int("weight_k", -1), opt);
    if (storage == (n.attr_str("weight_quant") == "q8" ? WeightStorage::kQ8 : WeightStorage::kQ4))
      return pack_quantized_weight(weight_image_rows(n, g.weight(src)));
  }
  // A 16-bit weight packs straight from its own bytes (no f32 copy of it).
  if (const Tensor* t = g.is_weight(src) ? &g.weight(src) : nullptr;
      t && !n.has_attr("weight_quant") && (t->dtype() == DType::kBF16 || t->dtype() == DType::kF16) && t->rank() == 2)
    return pack_weight(t->data(), t->dtype(), t->dim(0), t->dim(1), linear_storage(n, t->dim(1), opt));
  Tensor w = weight_f32(g, src, n, "weight");
  return pack_weight(w.data_as<float>(), w.dim(0), w.dim(1), linear_storage(n, w.dim(1), opt));
}

// Whether the graph is an encoder's: it has Attention nodes and every one is
// bidirectional (causal = 0), so no step of it decodes.
bool is_encoder_graph(const ir::Graph& g) {
  bool attention = false;
  for (const ir::Node& n : g.nodes())
    if (n.op == "Attention") {
      if (n.attr_int("causal", 1) != 0) return false;
      attention = true;
    }
  return attention;
}

}  // namespace

OpRun prepare_linear(const ir::Node& n, const ir::Graph& g, const CompileOptions& opt) {
  Tensor bias = weight_f32(g, n.input(2), n, "bias");
  LinearGemm gemm;
  int64_t out_n = 0;
  const std::string quant = n.attr_str("quant", "");
  if (quant == "w8a8") {
    Tensor w = weight_f32(g, n.inputs[1], n, "weight");
    gemm = w8a8_gemm(n, w, bias, opt, &out_n);
  } else if (quant == "fp8") {
    gemm = fp8_gemm(n, g, bias, opt, &out_n);
  } else if (!quant.empty()) {
    throw_error(ErrorCode::kUnsupported, "cpu: Linear '", n.name, "' quant '", quant, "' (expected w8a8 or fp8)");
  } else {
    std::shared_ptr<PackedWeight> packed;
    if (n.has_attr("weight_layout")) {
      packed = packed_weight_view(n, g, 1);
    } else {
      packed = std::make_shared<PackedWeight>(pack_linear_weight(g, n, opt));
    }
    out_n = packed->n;
    LinearTactic tactic = linear_tactic_for(n, opt);
    // The logits GEMM keeps x as given: rounding its input to int8 (a decode GEMV's
    // shortcut) moved SmolLM2's chat answer off a near-tie of its first token.
    tactic.int8_x = g.find_output("logits") != n.outputs[0];
    // An encoder (every Attention bidirectional, so no decode steps) widens q8/q4 panels
    // to f32 and keeps its activations f32: faster than the int8-activation path on
    // prompts and closer to the weights' values.
    tactic.widen_quant = is_encoder_graph(g);
    const float* b = f32(bias.empty() ? nullptr : &bias);
    gemm = [packed, bias, b, tactic](const float* x, int64_t t, int64_t k, float* y) {
      linear(x, t, k, *packed, b, y, tactic);
    };
  }
  if (opt.linear_observer && (opt.linear_observer->on_input || opt.linear_observer->on_output)) {
    std::shared_ptr<const LinearObserver> obs = opt.linear_observer;
    std::string name = n.name;
    gemm = [inner = std::move(gemm), obs, name, out_n](const float* x, int64_t t, int64_t k, float* y) {
      if (obs->on_input) obs->on_input(name, x, t, k);
      inner(x, t, k, y);
      if (obs->on_output) obs->on_output(name, y, t, out_n);
    };
  }
  // The activation epilogue (fuse_linear_activation) runs over the output right after
  // the GEMM, while it is still in cache.
  using Act = void (*)(const float*, int64_t, float*);
  Act act = nullptr;
  std::string epi = n.attr_str("activation", "");
  if (epi == "gelu_erf") act = &gelu_erf;
  else if (epi == "gelu_tanh") act = &gelu_tanh;
  else if (epi == "silu") act = &silu;
  else if (epi != "swiglu" && !epi.empty())
    throw_error(ErrorCode::kUnsupported, "cpu: Linear '", n.name, "' activation '", epi,
                "' (expected gelu_erf, gelu_tanh, silu or swiglu)");
  // The fused forms of pass fuse_norm_linear (the CPU does not ask for them, but runs
  // them, e.g. in the pass's tests): the norm of x into scratch before the GEMM, the
  // residual added after the activation, each exactly as the unfused nodes compute it.
  const std::string norm = n.attr_str("norm", "");
  if (!norm.empty()) {
    if (norm != "rms" && norm != "layer")
      throw_error(ErrorCode::kUnsupported, "cpu: Linear '", n.name, "' norm '", norm, "' (expected rms or layer)");
    Tensor gamma = weight_f32(g, n.input(4), n, "norm_weight");
    Tensor beta = weight_f32(g, n.input(5), n, "norm_bias");
    if (beta.empty() && norm == "layer") {
      beta = Tensor(DType::kF32, gamma.shape());
      std::fill_n(beta.data_as<float>(), beta.numel(), 0.0f);
    }
    const float eps = float(n.attr_float("norm_eps"));
    const bool rms = norm == "rms";
    auto xn = std::make_shared<std::vector<float>>();
    gemm = [inner = std::move(gemm), gamma, beta, eps, rms, xn](const float* x, int64_t t, int64_t k, float* y) {
      xn->resize(static_cast<size_t>(t * k));
      if (rms) rms_norm(x, gamma.data_as<float>(), eps, t, k, xn->data());
      else layer_norm(x, gamma.data_as<float>(), beta.data_as<float>(), eps, t, k, xn->data());
      inner(xn->data(), t, k, y);
    };
  }
  const bool residual = n.input(3) != ir::kNoValue;
  auto add_residual = [residual](OpContext& c, Tensor& y) {
    if (residual) add(y.data_as<float>(), c.inputs[3]->data_as<float>(), y.numel(), y.data_as<float>());
  };
  if (epi == "swiglu") {
    // [gate | up] into scratch, then silu(gate) * up into the [T, N/2] output.
    auto scratch = std::make_shared<std::vector<float>>();
    return [gemm, out_n, scratch, add_residual](OpContext& c) {
      const Tensor& x = *c.inputs[0];
      const int64_t t = x.dim(0), inter = out_n / 2;
      Tensor& y = c.out(0, {t, inter});
      scratch->resize(static_cast<size_t>(t * out_n));
      gemm(x.data_as<float>(), t, x.dim(1), scratch->data());
      swiglu_rows(scratch->data(), t, inter, y.data_as<float>());
      add_residual(c, y);
    };
  }
  return [gemm, out_n, act, add_residual](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, {x.dim(0), out_n});
    gemm(x.data_as<float>(), x.dim(0), x.dim(1), y.data_as<float>());
    if (act) act(y.data_as<float>(), y.numel(), y.data_as<float>());
    add_residual(c, y);
  };
}

std::string linear_tactic_str(const LinearTactic& t) {
  const char* split = t.split == LinearSplit::kPanels ? "panels" : t.split == LinearSplit::kRows ? "rows" : "auto";
  std::string s = str_cat("mr=", t.mr, ",kc=", t.kc, ",split=", split, ",threads=", t.threads);
  if (t.panels) s += str_cat(",panels=", t.panels);  // absent: auto (engines built before the field)
  return s;
}

LinearTactic linear_tactic_parse(const std::string& s) {
  LinearTactic t;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos), key, val;
    size_t eq = item.find('=');
    if (eq != std::string::npos) key = item.substr(0, eq), val = item.substr(eq + 1);
    auto num = [&](int64_t lo, int64_t hi) {
      char* rest = nullptr;
      long long v = std::strtoll(val.c_str(), &rest, 10);
      if (val.empty() || *rest || v < lo || v > hi)
        throw_error(ErrorCode::kInvalidArgument, "linear tactic '", s, "': bad value in '", item, "'");
      return int64_t(v);
    };
    if (key == "mr") {
      t.mr = int(num(0, 6));
      if (t.mr != 0 && t.mr != 4 && t.mr != 6)
        throw_error(ErrorCode::kInvalidArgument, "linear tactic '", s, "': mr must be 0, 4 or 6");
    } else if (key == "kc") t.kc = num(0, int64_t(1) << 40);
    else if (key == "threads") t.threads = int(num(0, 4096));
    else if (key == "panels") t.panels = int(num(0, 2));
    else if (key == "split" && (val == "auto" || val == "panels" || val == "rows"))
      t.split = val == "panels" ? LinearSplit::kPanels : val == "rows" ? LinearSplit::kRows : LinearSplit::kAuto;
    else
      throw_error(ErrorCode::kInvalidArgument, "linear tactic '", s, "': unknown field '", item,
                  "' (expected mr=, kc=, split=auto|panels|rows, threads=, panels=0|1|2)");
    pos = end + 1;
  }
  return t;
}

std::string linear_weight_storage(const ir::Node& n, const CompileOptions& opt) {
  return n.attr_str("precision", opt.weight_dtype);
}

size_t pack_linear_weights(ir::Graph& g, const CompileOptions& opt) {
  // Tied weights (distinct values sharing one buffer, like GPT-2's LM head and token
  // embedding) pack once: keyed by the source buffer.
  // Every weight's buffer is noted before any is released (below), so an address freed
  // and reused while packing never matches an earlier key.
  using Key = std::tuple<const void*, size_t, WeightStorage>;
  std::map<Key, ir::ValueId> done;
  std::vector<std::pair<const void*, size_t>> buffer_of(g.num_values());
  // Readers of each weight (node inputs, graph outputs): a source's [N, K] tensor is
  // released once its last reader is packed, so the originals and the panels are not all
  // held at once (the peak of a load).
  std::vector<int> readers(g.num_values(), 0);
  for (size_t v = 0; v < g.num_values(); ++v)
    if (g.is_weight(ir::ValueId(v))) buffer_of[v] = {g.weight(ir::ValueId(v)).data(), g.weight(ir::ValueId(v)).nbytes()};
  for (const ir::Node& n : g.nodes())
    for (ir::ValueId v : n.inputs)
      if (v != ir::kNoValue) ++readers[size_t(v)];
  for (const auto& [name, v] : g.outputs()) ++readers[size_t(v)];
  auto key = [&](ir::ValueId v, WeightStorage st) { return Key{buffer_of[size_t(v)].first, buffer_of[size_t(v)].second, st}; };
  size_t packed = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    // Quantized Linears (attr quant) pack their own codes at load.
    if (n.op != "Linear" || n.has_attr("weight_layout") || n.has_attr("quant") || !g.is_weight(n.inputs[1])) continue;
    const ir::ValueId src = n.inputs[1];
    const int64_t out = g.weight(src).dim(0),
                  k = n.has_attr("weight_quant") ? n.attr_int("weight_k", -1) : g.weight(src).dim(1);
    const WeightStorage storage = linear_storage(n, k, opt);
    auto it = done.find(key(src, storage));
    if (it == done.end()) {
      PackedWeight p = pack_linear_weight(g, n, opt);
      // The tensor views the packed buffer and keeps it alive (no copy).
      Tensor bytes = Tensor::view(p.data.get(), DType::kU8, {int64_t(p.bytes())},
                                  std::shared_ptr<const void>(p.data, p.data.get()));
      ir::ValueId v = g.add_weight(g.value(src).name + ".packed", std::move(bytes));
      it = done.emplace(key(src, storage), v).first;
    }
    ir::Node& m = g.nodes()[i];
    m.inputs[1] = it->second;
    if (--readers[size_t(src)] == 0) g.weight(src) = Tensor();  // compact() drops the value
    m.attrs["weight_layout"] = std::string(kCpuPackedLayout);
    m.attrs["weight_n"] = out;
    m.attrs["weight_k"] = k;
    m.attrs["weight_storage"] = std::string(weight_storage_name(storage));
    ++packed;
  }
  // A token embedding tied to an f32 LM head (GPT-2) reads the head's panels, so the
  // tensor is not stored twice (prepare_packed_embedding); other storages round.
  for (ir::Node& n : g.nodes()) {
    if (n.op != "Embedding" || n.has_attr("weight_layout") || !g.is_weight(n.inputs[0]) ||
        g.weight(n.inputs[0]).dtype() != DType::kF32)
      continue;
    auto it = done.find(key(n.inputs[0], WeightStorage::kF32));
    if (it == done.end()) continue;
    const Tensor& table = g.weight(n.inputs[0]);
    n.attrs["weight_layout"] = std::string(kCpuPackedLayout);
    n.attrs["weight_n"] = table.dim(0);
    n.attrs["weight_k"] = table.dim(1);
    n.attrs["weight_storage"] = std::string("f32");
    n.inputs[0] = it->second;
  }
  if (packed) g.compact();  // drops the [N, K] originals nothing reads any more
  return packed;
}

}  // namespace kiln::cpu

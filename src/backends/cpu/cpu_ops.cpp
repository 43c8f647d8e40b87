// CPU implementations of the IR ops on top of kernels/ (see cpu_ops.h). Shapes are
// re-derived from the actual input tensors at run time, so any T within the graph's
// symbolic shapes runs without recompiling.
#include "backends/cpu/cpu_ops.h"

#include <cstring>
#include <map>

#include "backends/communicator.h"
#include "core/log.h"
#include "core/status.h"

namespace kiln::cpu {

namespace {

const float* f32(const Tensor* t) { return t ? t->data_as<float>() : nullptr; }

// A weight input as contiguous f32 (converted once at compile time when stored otherwise).
Tensor weight_f32(const ir::Graph& g, ir::ValueId v, const ir::Node& n, const char* role) {
  if (v == ir::kNoValue) return {};
  if (!g.is_weight(v))
    throw_error(ErrorCode::kUnsupported, "cpu: node '", n.name, "' (", n.op, ") needs ", role,
                " %", g.value(v).name, " to be a weight, not a computed value");
  const Tensor& t = g.weight(v);
  return t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
}

WeightStorage storage_from_option(const std::string& s) {
  if (s == "f32") return WeightStorage::kF32;
  if (s == "bf16") return WeightStorage::kBF16;
  if (s == "f16") return WeightStorage::kF16;
  if (s == "q8") return WeightStorage::kQ8;
  if (s == "q4") return WeightStorage::kQ4;
  throw_error(ErrorCode::kInvalidArgument, "cpu: unknown weight dtype '", s,
              "' (expected f32, bf16, f16, q8 or q4)");
}

OpRun prepare_embedding(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  Tensor table = weight_f32(g, n.inputs[0], n, "table");
  return [table](OpContext& c) {
    const Tensor& ids = *c.inputs[1];
    int64_t t = ids.dim(0), dim = table.dim(1);
    Tensor& y = c.out(0, {t, dim});
    embedding(table.data_as<float>(), table.dim(0), ids.data_as<int32_t>(), t, dim,
              y.data_as<float>());
  };
}

template <bool kMul>
OpRun prepare_binary(const ir::Node&, const ir::Graph&, const CompileOptions&) {
  return [](OpContext& c) {
    const Tensor& a = *c.inputs[0];
    const Tensor& b = *c.inputs[1];
    Tensor& y = c.out(0, a.shape());
    auto fn = kMul ? &mul : &add;
    if (b.numel() == a.numel()) {
      fn(a.data_as<float>(), b.data_as<float>(), a.numel(), y.data_as<float>());
    } else {
      int64_t dim = b.numel(), rows = a.numel() / dim;
      for (int64_t r = 0; r < rows; ++r)
        fn(a.data_as<float>() + r * dim, b.data_as<float>(), dim, y.data_as<float>() + r * dim);
    }
  };
}

OpRun prepare_layer_norm(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  Tensor w = weight_f32(g, n.inputs[1], n, "weight");
  Tensor b = weight_f32(g, n.input(2), n, "bias");
  float eps = float(n.attr_float("eps"));
  return [w, b, eps](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, x.shape());
    int64_t dim = x.dim(-1);
    std::vector<float> zeros;
    const float* beta = b.empty() ? nullptr : b.data_as<float>();
    if (!beta) {
      zeros.assign(size_t(dim), 0.0f);
      beta = zeros.data();
    }
    layer_norm(x.data_as<float>(), w.data_as<float>(), beta, eps, x.numel() / dim, dim,
               y.data_as<float>());
  };
}

OpRun prepare_rms_norm(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  Tensor w = weight_f32(g, n.inputs[1], n, "weight");
  float eps = float(n.attr_float("eps"));
  return [w, eps](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, x.shape());
    int64_t dim = x.dim(-1);
    rms_norm(x.data_as<float>(), w.data_as<float>(), eps, x.numel() / dim, dim, y.data_as<float>());
  };
}

OpRun prepare_linear(const ir::Node& n, const ir::Graph& g, const CompileOptions& opt) {
  Tensor w = weight_f32(g, n.inputs[1], n, "weight");
  Tensor bias = weight_f32(g, n.input(2), n, "bias");
  WeightStorage storage = storage_from_option(opt.weight_dtype);
  if (weight_storage_quantized(storage) && w.dim(1) % kQuantGroup != 0) {
    // Group quantization needs whole groups along K; such layers stay in bf16.
    log_debug("cpu: ", n.name, " has K=", w.dim(1), ", not a multiple of ", kQuantGroup,
              "; stored as bf16 instead of ", opt.weight_dtype);
    storage = WeightStorage::kBF16;
  }
  auto packed = std::make_shared<PackedWeight>(pack_weight(w.data_as<float>(), w.dim(0), w.dim(1), storage));
  return [packed, bias](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, {x.dim(0), packed->n});
    linear(x.data_as<float>(), x.dim(0), x.dim(1), *packed, f32(bias.empty() ? nullptr : &bias),
           y.data_as<float>());
  };
}

template <void (*Fn)(const float*, int64_t, float*)>
OpRun prepare_unary(const ir::Node&, const ir::Graph&, const CompileOptions&) {
  return [](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, x.shape());
    Fn(x.data_as<float>(), x.numel(), y.data_as<float>());
  };
}

OpRun prepare_gelu(const ir::Node& n, const ir::Graph& g, const CompileOptions& o) {
  std::string approx = n.attr_str("approximate", "none");
  if (approx == "none") return prepare_unary<&gelu_erf>(n, g, o);
  if (approx == "tanh") return prepare_unary<&gelu_tanh>(n, g, o);
  throw_error(ErrorCode::kUnsupported, "cpu: Gelu approximate='", approx, "' (expected none or tanh)");
}

OpRun prepare_rope(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  Tensor inv_freq = weight_f32(g, n.inputs[2], n, "inv_freq");
  int64_t heads = n.attr_int("num_heads"), hd = n.attr_int("head_dim");
  int64_t rot = n.attr_int("rotary_dim", hd);
  return [inv_freq, heads, hd, rot](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    const Tensor& pos = *c.inputs[1];
    Tensor& y = c.out(0, x.shape());
    std::memcpy(y.data(), x.data(), x.nbytes());
    rope(y.data_as<float>(), x.dim(0), heads, hd, rot, pos.data_as<int32_t>(),
         inv_freq.data_as<float>());
  };
}

OpRun prepare_attention(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  int64_t layer = n.attr_int("layer"), hq = n.attr_int("num_heads");
  int64_t hkv = n.attr_int("num_kv_heads"), d = n.attr_int("head_dim");
  float scale = float(n.attr_float("scale"));
  bool causal = n.attr_int("causal") != 0;
  std::string name = n.name;
  return [=](OpContext& c) {
    const Tensor& q = *c.inputs[0];
    const Tensor& k = *c.inputs[1];
    const Tensor& v = *c.inputs[2];
    int64_t t = q.dim(0);
    const StepInfo& step = *c.step;
    if (step.num_tokens() != t)
      throw_error(ErrorCode::kInvalidArgument, "attention '", name, "': the step lays out ",
                  step.num_tokens(), " tokens but q has ", t, " rows");
    Tensor& y = c.out(0, {t, hq * d});
    std::vector<AttentionSeq> seqs(step.seqs.size());
    std::vector<int32_t> identity;
    if (c.kv) {
      // Decoder: append this step's K/V to the pool, then attend through block tables.
      kv_cache_write(k.data_as<float>(), v.data_as<float>(), step.slot_mapping.data(), t, hkv, d,
                     c.kv->k(layer), c.kv->v(layer));
      for (size_t s = 0; s < seqs.size(); ++s) {
        auto& ss = step.seqs[s];
        seqs[s] = {ss.q_start, ss.q_len, ss.ctx_len, ss.block_table.data()};
      }
      paged_attention(q.data_as<float>(), c.kv->k(layer), c.kv->v(layer), c.kv->layout().block_size,
                      hq, hkv, d, scale, causal, seqs.data(), int64_t(seqs.size()), y.data_as<float>());
    } else {
      // No cache (encoders): read K/V in place as a pool of one-token blocks, so
      // sequence s's "block table" is just its own rows.
      identity.resize(size_t(t));
      for (int64_t i = 0; i < t; ++i) identity[size_t(i)] = int32_t(i);
      for (size_t s = 0; s < seqs.size(); ++s) {
        auto& ss = step.seqs[s];
        if (ss.ctx_len != ss.q_len)
          throw_error(ErrorCode::kInvalidArgument, "attention '", name,
                      "' has no KV cache, so a sequence's context must be its new tokens");
        seqs[s] = {ss.q_start, ss.q_len, ss.ctx_len, identity.data() + ss.q_start};
      }
      paged_attention(q.data_as<float>(), k.data_as<float>(), v.data_as<float>(), 1, hq, hkv, d,
                      scale, causal, seqs.data(), int64_t(seqs.size()), y.data_as<float>());
    }
  };
}

OpRun prepare_gather_rows(const ir::Node&, const ir::Graph&, const CompileOptions&) {
  return [](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    const Tensor& rows = *c.inputs[1];
    int64_t r = rows.dim(0), dim = x.dim(1);
    Tensor& y = c.out(0, {r, dim});
    for (int64_t i = 0; i < r; ++i) {
      int32_t row = rows.data_as<int32_t>()[i];
      if (row < 0 || row >= x.dim(0))
        throw_error(ErrorCode::kOutOfRange, "GatherRows: row ", row, " outside [0, ", x.dim(0), ")");
      std::memcpy(y.data_as<float>() + i * dim, x.data_as<float>() + row * dim, size_t(dim) * 4);
    }
  };
}

OpRun prepare_seq_mean_pool(const ir::Node&, const ir::Graph&, const CompileOptions&) {
  return [](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    const StepInfo& step = *c.step;
    int64_t b = int64_t(step.seqs.size()), dim = x.dim(1);
    Tensor& y = c.out(0, {b, dim});
    for (int64_t s = 0; s < b; ++s) {
      auto& ss = step.seqs[size_t(s)];
      float* out = y.data_as<float>() + s * dim;
      std::fill(out, out + dim, 0.0f);
      for (int32_t i = 0; i < ss.q_len; ++i) {
        const float* row = x.data_as<float>() + (ss.q_start + i) * dim;
        for (int64_t j = 0; j < dim; ++j) out[j] += row[j];
      }
      float inv = ss.q_len ? 1.0f / float(ss.q_len) : 0.0f;
      for (int64_t j = 0; j < dim; ++j) out[j] *= inv;
    }
  };
}

// AllReduce: sums x over the tensor-parallel ranks through the compile-time communicator.
OpRun prepare_all_reduce(const ir::Node& n, const ir::Graph&, const CompileOptions& opt) {
  std::shared_ptr<Communicator> comm = opt.communicator;
  if (!comm)
    throw_error(ErrorCode::kInvalidArgument, "node '", n.name,
                "' (AllReduce) needs a communicator: this graph is a tensor-parallel shard");
  return [comm](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, x.shape());
    std::memcpy(y.data(), x.data(), x.nbytes());
    comm->all_reduce_sum(y.data_as<float>(), y.numel());
  };
}

const std::map<std::string, OpPrepare>& op_table() {
  static const std::map<std::string, OpPrepare> table = {
      {"Embedding", prepare_embedding},
      {"Add", prepare_binary<false>},
      {"Mul", prepare_binary<true>},
      {"LayerNorm", prepare_layer_norm},
      {"RMSNorm", prepare_rms_norm},
      {"Linear", prepare_linear},
      {"Gelu", prepare_gelu},
      {"Silu", prepare_unary<&silu>},
      {"Tanh", prepare_unary<&kiln::cpu::tanh>},
      {"Rope", prepare_rope},
      {"Attention", prepare_attention},
      {"GatherRows", prepare_gather_rows},
      {"SeqMeanPool", prepare_seq_mean_pool},
      {"AllReduce", prepare_all_reduce},
  };
  return table;
}

}  // namespace

const OpPrepare* find_cpu_op(const std::string& op) {
  auto it = op_table().find(op);
  return it == op_table().end() ? nullptr : &it->second;
}

CpuKv::CpuKv(const KvLayout& layout)
    : layout_(layout),
      k_(DType::kF32, {layout.num_layers * layer_elems()}),
      v_(DType::kF32, {layout.num_layers * layer_elems()}) {}

void CpuKv::copy_block(int32_t src, int32_t dst) {
  int64_t block = layout_.block_size * layout_.num_kv_heads * layout_.head_dim;
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    std::memcpy(k(l) + dst * block, k(l) + src * block, size_t(block) * 4);
    std::memcpy(v(l) + dst * block, v(l) + src * block, size_t(block) * 4);
  }
}

}  // namespace kiln::cpu

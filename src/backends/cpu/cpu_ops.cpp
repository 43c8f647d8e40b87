// CPU implementations of the IR ops on top of kernels/ (see cpu_ops.h). Shapes are
// re-derived from the actual input tensors at run time, so any T within the graph's
// symbolic shapes runs without recompiling.
#include "backends/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>

#include "backends/communicator.h"
#include "backends/cpu/cpu_op_util.h"
#include "core/fp8.h"
#include "core/hadamard.h"
#include "core/int8.h"
#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

QuantizedRows weight_image_rows(const ir::Node& n, const Tensor& img) {
  const QuantFormat f = quant_format_from_name(n.attr_str("weight_quant"), "cpu: node '" + n.name + "'");
  const int64_t k = n.attr_int("weight_k", -1);
  KILN_THROW_IF(img.dtype() != DType::kU8 || img.rank() != 2 || k <= 0 || k % kQuantGroup != 0 ||
                    size_t(img.dim(1)) != quant_image_row_bytes(f, k),
                kInvalidArgument, "cpu: node '", n.name, "': ", quant_format_name(f), " weight image ",
                dtype_name(img.dtype()), img.shape_str(), " does not fit weight_k ", k);
  return quant_rows_from_image(img.data_as<uint8_t>(), img.dim(0), k, f);
}

namespace {

Tensor dequantize_weight_image(const ir::Node& n, const Tensor& img) {
  const QuantizedRows q = weight_image_rows(n, img);
  Tensor out(DType::kF32, {q.n, q.k});
  ThreadPool::global().parallel_for(
      q.n, [&](int64_t r0, int64_t r1, int) { dequantize_rows(q, r0, r1, out.data_as<float>() + r0 * q.k); });
  return out;
}

}  // namespace

Tensor weight_f32(const ir::Graph& g, ir::ValueId v, const ir::Node& n, const char* role) {
  if (v == ir::kNoValue) return {};
  if (!g.is_weight(v))
    throw_error(ErrorCode::kUnsupported, "cpu: node '", n.name, "' (", n.op, ") needs ", role,
                " %", g.value(v).name, " to be a weight, not a computed value");
  const Tensor& t = g.weight(v);
  if (n.op == "Linear" && n.has_attr("weight_quant") && v == n.input(1)) return dequantize_weight_image(n, t);
  return t.dtype() == DType::kF32 ? t : t.to(DType::kF32);
}

WeightStorage storage_from_option(const std::string& s) {
  if (s == "f32") return WeightStorage::kF32;
  if (s == "bf16") return WeightStorage::kBF16;
  if (s == "f16") return WeightStorage::kF16;
  if (s == "q8") return WeightStorage::kQ8;
  if (s == "q4") return WeightStorage::kQ4;
  // Linears left unquantized (--keep) by w8a8 / fp8 stay f32.
  if (s == "w8a8" || s == "fp8") return WeightStorage::kF32;
  throw_error(ErrorCode::kInvalidArgument, "cpu: unknown weight dtype '", s,
              "' (expected f32, bf16, f16, q8, q4, w8a8 or fp8)");
}

bool cpu_packed_layout_readable(const std::string& layout, const std::string& storage) {
  const bool same_since_v1 = storage == "f32" || storage == "f16";
  return layout == kCpuPackedLayout || (layout == kCpuPackedLayoutV2 && (same_since_v1 || storage == "bf16")) ||
         (layout == kCpuPackedLayoutV1 && same_since_v1);
}

// A weight the builder already packed (pack_linear_weights): a view of its bytes,
// which for a loaded engine are the file's mapping, so nothing is copied or repacked.
std::shared_ptr<PackedWeight> packed_weight_view(const ir::Node& n, const ir::Graph& g, size_t input) {
  const std::string layout = n.attr_str("weight_layout");
  if (!cpu_packed_layout_readable(layout, n.attr_str("weight_storage")))
    throw_error(ErrorCode::kUnsupported, "cpu: ", n.op, " '", n.name, "' has ", n.attr_str("weight_storage"),
                " weights packed for layout '", layout, "', the cpu backend reads '", kCpuPackedLayout,
                "'; rebuild the engine for this backend");
  auto w = std::make_shared<PackedWeight>();
  w->n = n.attr_int("weight_n");
  w->k = n.attr_int("weight_k");
  w->storage = storage_from_option(n.attr_str("weight_storage"));
  const Tensor& t = g.weight(n.inputs[input]);
  if (t.nbytes() != w->bytes() || reinterpret_cast<uintptr_t>(t.data()) % 64)
    throw_error(ErrorCode::kInvalidFile, "cpu: packed weight of '", n.name, "' has ", t.nbytes(),
                " bytes at a ", reinterpret_cast<uintptr_t>(t.data()) % 64 ? "misaligned" : "64-byte aligned",
                " address; [", w->n, ", ", w->k, "] ", weight_storage_name(w->storage), " panels need ", w->bytes(),
                " bytes, 64-byte aligned");
  // The deleter holds the tensor, and with it the engine mapping, alive.
  w->data = std::shared_ptr<uint8_t[]>(const_cast<uint8_t*>(t.data_as<uint8_t>()), [keep = t](uint8_t*) {});
  return w;
}

namespace {

// A token embedding tied to a packed f32 LM head reads its rows out of the head's
// panels (row r is column r % 16 of panel r / 16, stride 16 floats along the hidden
// dim), so the engine stores the tensor once. A strided gather of T rows is cheap next
// to any GEMM of the step.
OpRun prepare_packed_embedding(const ir::Node& n, const ir::Graph& g) {
  std::shared_ptr<PackedWeight> table = packed_weight_view(n, g, 0);
  if (table->storage != WeightStorage::kF32)
    throw_error(ErrorCode::kUnsupported, "cpu: Embedding '", n.name, "' reads packed ",
                weight_storage_name(table->storage), " panels; only f32 panels hold exact rows");
  return [table](OpContext& c) {
    const Tensor& ids = *c.inputs[1];
    const int64_t t = ids.dim(0), dim = table->k, w = PackedWeight::kPanelWidth;
    Tensor& y = c.out(0, {t, dim});
    for (int64_t i = 0; i < t; ++i) {
      const int32_t id = ids.data_as<int32_t>()[i];
      KILN_THROW_IF(id < 0 || id >= table->n, kOutOfRange, "embedding: token id ", id, " at position ", i,
                    " is outside the vocabulary of size ", table->n);
      const float* src = reinterpret_cast<const float*>(table->panel(id / w)) + id % w;
      float* dst = y.data_as<float>() + i * dim;
      for (int64_t k = 0; k < dim; ++k) dst[k] = src[k * w];
    }
  };
}

// An Embedding whose rows are widened to f32 one at a time as they are looked up
// (fetch(id, dst) writes row id's dim values), for tables not held as f32.
template <typename Fetch>
OpRun row_lookup_op(int64_t rows, int64_t dim, Fetch fetch) {
  return [rows, dim, fetch](OpContext& c) {
    const Tensor& ids = *c.inputs[1];
    const int64_t t = ids.dim(0);
    Tensor& y = c.out(0, {t, dim});
    for (int64_t i = 0; i < t; ++i) {
      const int32_t id = ids.data_as<int32_t>()[i];
      KILN_THROW_IF(id < 0 || id >= rows, kOutOfRange, "embedding: token id ", id, " at position ", i,
                    " is outside the vocabulary of size ", rows);
      fetch(id, y.data_as<float>() + i * dim);
    }
  };
}

// A table kept quantized (weight_quant: a GGUF's own codes, WeightSpec::table): each
// looked-up row is dequantized from the image, so the table stays at its file size.
OpRun prepare_quant_embedding(const ir::Node& n, const ir::Graph& g) {
  const Tensor& img = g.weight(n.inputs[0]);
  weight_image_rows(n, img.slice_rows(0, std::min<int64_t>(img.dim(0), 1)));  // checks the image's shape
  const QuantFormat f = quant_format_from_name(n.attr_str("weight_quant"), "cpu: node '" + n.name + "'");
  const int64_t dim = n.attr_int("weight_k"), rows = img.dim(0);
  const size_t row_bytes = size_t(img.dim(1));
  return row_lookup_op(rows, dim, [img, f, dim, row_bytes](int32_t id, float* dst) {
    dequantize_image_row(img.data_as<uint8_t>() + size_t(id) * row_bytes, dim, f, dst);
  });
}

OpRun prepare_embedding(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  if (n.has_attr("weight_layout")) return prepare_packed_embedding(n, g);
  if (n.has_attr("weight_quant")) return prepare_quant_embedding(n, g);
  // A 16-bit table (a bf16 checkpoint's, WeightSource::keep_16bit) widens only the rows
  // looked up, so no f32 copy of it is made.
  if (const Tensor table = g.is_weight(n.inputs[0]) ? g.weight(n.inputs[0]) : Tensor();
      table.dtype() == DType::kBF16 || table.dtype() == DType::kF16) {
    const int64_t dim = table.dim(1);
    const size_t row_bytes = size_t(dim) * dtype_size(table.dtype());
    return row_lookup_op(table.dim(0), dim, [table, dim, row_bytes](int32_t id, float* dst) {
      dtype_convert(table.data_as<uint8_t>() + size_t(id) * row_bytes, table.dtype(), dst, DType::kF32, size_t(dim));
    });
  }
  Tensor table = weight_f32(g, n.inputs[0], n, "table");
  return [table](OpContext& c) {
    const Tensor& ids = *c.inputs[1];
    int64_t t = ids.dim(0), dim = table.dim(1);
    Tensor& y = c.out(0, {t, dim});
    embedding(table.data_as<float>(), table.dim(0), ids.data_as<int32_t>(), t, dim,
              y.data_as<float>());
  };
}

// EmbeddingLayerNorm (fuse_embedding_norm): inputs gamma, beta?, then (table, ids) pairs.
OpRun prepare_embedding_layer_norm(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  Tensor gamma = weight_f32(g, n.inputs[0], n, "gamma");
  Tensor beta = weight_f32(g, n.input(1), n, "beta");
  std::vector<Tensor> tables;
  for (size_t i = 2; i < n.inputs.size(); i += 2) tables.push_back(weight_f32(g, n.inputs[i], n, "table"));
  float eps = float(n.attr_float("eps"));
  return [gamma, beta, tables, eps](OpContext& c) {
    const int64_t t = c.inputs[3]->dim(0), dim = gamma.dim(0);
    std::vector<EmbeddingLookup> lookups;
    for (size_t j = 0; j < tables.size(); ++j) {
      const Tensor& ids = *c.inputs[3 + 2 * j];
      if (ids.dim(0) != t)
        throw_error(ErrorCode::kInvalidArgument, "EmbeddingLayerNorm: lookup ", j, " has ", ids.dim(0),
                    " ids, lookup 0 has ", t);
      lookups.push_back({tables[j].data_as<float>(), tables[j].dim(0), ids.data_as<int32_t>()});
    }
    Tensor& y = c.out(0, {t, dim});
    embedding_layer_norm(lookups.data(), int64_t(lookups.size()), t, dim, gamma.data_as<float>(),
                         beta.empty() ? nullptr : beta.data_as<float>(), eps, y.data_as<float>());
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

// AddRMSNorm / AddLayerNorm: outputs sum = a + b and norm(sum) in one pass.
OpRun prepare_add_norm(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  const bool rms = n.op == "AddRMSNorm";
  Tensor w = weight_f32(g, n.inputs[2], n, "weight");
  Tensor b = rms ? Tensor() : weight_f32(g, n.input(3), n, "bias");
  if (!rms && b.empty()) b = Tensor(DType::kF32, {w.dim(0)});  // zero beta
  float eps = float(n.attr_float("eps"));
  return [w, b, eps, rms](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    const Tensor& r = *c.inputs[1];
    Tensor& sum = c.out(0, x.shape());
    Tensor& y = c.out(1, x.shape());
    int64_t dim = x.dim(-1), rows = x.numel() / dim;
    if (rms)
      add_rms_norm(x.data_as<float>(), r.data_as<float>(), w.data_as<float>(), eps, rows, dim,
                   sum.data_as<float>(), y.data_as<float>());
    else
      add_layer_norm(x.data_as<float>(), r.data_as<float>(), w.data_as<float>(), b.data_as<float>(),
                     eps, rows, dim, sum.data_as<float>(), y.data_as<float>());
  };
}

}  // namespace

// SwiGLU over [T, 2I] = [gate | up] rows. Short rows (decode) go in one call per row;
// the kernel threads within a call.
void swiglu_rows(const float* in, int64_t t, int64_t inter, float* out) {
  if (t == 1) return swiglu(in, in + inter, inter, out);  // the kernel threads the row
  // Threads own rows; each call stays below the kernel's threading grain (nested
  // parallel_for calls would serialize on the pool).
  constexpr int64_t kSeg = 4096;
  ThreadPool::global().parallel_for(t, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t s = 0; s < inter; s += kSeg) {
        const float* row = in + r * 2 * inter;
        swiglu(row + s, row + inter + s, std::min(kSeg, inter - s), out + r * inter + s);
      }
  });
}

namespace {

OpRun prepare_swiglu(const ir::Node&, const ir::Graph&, const CompileOptions&) {
  return [](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    const int64_t t = x.dim(0), inter = x.dim(1) / 2;
    Tensor& y = c.out(0, {t, inter});
    swiglu_rows(x.data_as<float>(), t, inter, y.data_as<float>());
  };
}

// GeGLU over [T, 2I] = [gate | up] rows: gelu_tanh(gate) (the Gelu op's and the Linear
// epilogue's kernel) times up, in segments a thread owns.
OpRun prepare_geglu(const ir::Node&, const ir::Graph&, const CompileOptions&) {
  return [](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    const int64_t t = x.dim(0), inter = x.dim(1) / 2;
    Tensor& y = c.out(0, {t, inter});
    const float* in = x.data_as<float>();
    float* out = y.data_as<float>();
    constexpr int64_t kSeg = 2048;
    const int64_t segs = (inter + kSeg - 1) / kSeg;
    ThreadPool::global().parallel_for(t * segs, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = i / segs, s = (i % segs) * kSeg, n = std::min(kSeg, inter - s);
        const float* row = in + r * 2 * inter;
        gelu_tanh(row + s, n, out + r * inter + s);
        mul(out + r * inter + s, row + inter + s, n, out + r * inter + s);
      }
    });
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

// HeadRMSNorm (Qwen3's q_norm / k_norm): each head's values normalized on its own.
OpRun prepare_head_rms_norm(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  Tensor w = weight_f32(g, n.inputs[1], n, "weight");
  const float eps = float(n.attr_float("eps"));
  const int64_t d = n.attr_int("head_dim"), groups_attr = n.attr_int("groups", 0);
  return [w, eps, d, groups_attr](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    Tensor& y = c.out(0, x.shape());
    const int64_t width = x.dim(-1), groups = groups_attr ? groups_attr : width / d;
    head_rms_norm(x.data_as<float>(), w.data_as<float>(), w.numel() == d ? 0 : d, eps, x.numel() / width, width,
                  groups, d, y.data_as<float>());
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

struct AttentionParams {
  std::string name;
  int64_t layer, hq, hkv, d, rotary_dim;
  float scale;
  bool causal;
  int64_t window;  // sliding window in keys; 0: none
  float softcap;   // scores s -> softcap tanh(s / softcap); 0: none
};

// Attention over contiguous q [T, hq*d], k and v [T, hkv*d].
void run_attention(OpContext& c, const AttentionParams& p, const float* q, const float* k,
                   const float* v, int64_t t) {
  const StepInfo& step = *c.step;
  if (step.num_tokens() != t)
    throw_error(ErrorCode::kInvalidArgument, "attention '", p.name, "': the step lays out ",
                step.num_tokens(), " tokens but q has ", t, " rows");
  Tensor& y = c.out(0, {t, p.hq * p.d});
  std::vector<AttentionSeq> seqs(step.seqs.size());
  std::vector<int32_t> identity;
  if (c.kv) {
    // Decoder: append this step's K/V to the pool, then attend through block tables.
    CpuKv& kv = *c.kv;
    const int64_t l = p.layer;
    const bool rotate = kv.layout().k_rotated();
    if (kv.is_int8())
      kv_cache_write_int8(k, v, step.slot_mapping.data(), t, p.hkv, p.d, kv.k_codes(l), kv.k_scales(l),
                          kv.v_codes(l), kv.v_scales(l), kv.k_shift(l), rotate);
    else if (kv.is_fp8())
      kv_cache_write_fp8(k, v, step.slot_mapping.data(), t, p.hkv, p.d, kv.k_fp8(l), kv.k_scales(l), kv.v_fp8(l),
                         kv.v_scales(l), kv.k_shift(l), rotate);
    else
      kv_cache_write(k, v, step.slot_mapping.data(), t, p.hkv, p.d, kv.k(l), kv.v(l));
    for (size_t s = 0; s < seqs.size(); ++s) {
      auto& ss = step.seqs[s];
      seqs[s] = {ss.q_start, ss.q_len, ss.ctx_len, ss.block_table.data()};
    }
    thread_local std::vector<float> q_rotated;  // keys stored rotated: the queries take the transform too
    if (rotate) {
      q_rotated.resize(size_t(t * p.hq * p.d));
      kv_rotate_queries(q, t * p.hq, p.d, q_rotated.data());
      q = q_rotated.data();
    }
    if (kv.is_int8())
      paged_attention_int8(q, kv.k_codes(l), kv.k_scales(l), kv.v_codes(l), kv.v_scales(l),
                           kv.layout().block_size, p.hq, p.hkv, p.d, p.scale, p.causal, seqs.data(),
                           int64_t(seqs.size()), y.data_as<float>(), p.window, p.softcap);
    else if (kv.is_fp8())
      paged_attention_fp8(q, kv.k_fp8(l), kv.k_scales(l), kv.v_fp8(l), kv.v_scales(l), kv.layout().block_size,
                          p.hq, p.hkv, p.d, p.scale, p.causal, seqs.data(), int64_t(seqs.size()),
                          y.data_as<float>(), p.window, p.softcap);
    else
      paged_attention(q, kv.k(l), kv.v(l), kv.layout().block_size, p.hq, p.hkv, p.d, p.scale, p.causal,
                      seqs.data(), int64_t(seqs.size()), y.data_as<float>(), p.window, p.softcap);
  } else {
    // No cache (encoders): read K/V in place as a pool of one-token blocks, so
    // sequence s's "block table" is just its own rows.
    identity.resize(size_t(t));
    for (int64_t i = 0; i < t; ++i) identity[size_t(i)] = int32_t(i);
    for (size_t s = 0; s < seqs.size(); ++s) {
      auto& ss = step.seqs[s];
      if (ss.ctx_len != ss.q_len)
        throw_error(ErrorCode::kInvalidArgument, "attention '", p.name,
                    "' has no KV cache, so a sequence's context must be its new tokens");
      seqs[s] = {ss.q_start, ss.q_len, ss.ctx_len, identity.data() + ss.q_start};
    }
    paged_attention(q, k, v, 1, p.hq, p.hkv, p.d, p.scale, p.causal, seqs.data(),
                    int64_t(seqs.size()), y.data_as<float>(), p.window, p.softcap);
  }
}

OpRun prepare_attention(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  AttentionParams p{n.name, n.attr_int("layer"), n.attr_int("num_heads"), n.attr_int("num_kv_heads"),
                    n.attr_int("head_dim"), 0, float(n.attr_float("scale")), n.attr_int("causal") != 0,
                    n.attr_int("window", 0), float(n.attr_float("softcap", 0.0))};
  p.rotary_dim = n.attr_int("rotary_dim", p.d);
  if (!n.attr_int("packed_qkv", 0))
    return [p](OpContext& c) {
      const Tensor& q = *c.inputs[0];
      run_attention(c, p, q.data_as<float>(), c.inputs[1]->data_as<float>(),
                    c.inputs[2]->data_as<float>(), q.dim(0));
    };
  // Packed q|k|v rows (fuse_qkv_attention): split them into contiguous scratch, rotate
  // q and k there when the node carries RoPE, and run the same kernels as above. The
  // copy is O(T * width), small next to the GEMM that produced it.
  Tensor inv_freq = n.inputs.size() > 2 ? weight_f32(g, n.inputs[2], n, "inv_freq") : Tensor();
  auto scratch = std::make_shared<std::vector<float>>();
  return [p, inv_freq, scratch](OpContext& c) {
    const Tensor& qkv = *c.inputs[0];
    const int64_t t = qkv.dim(0), qw = p.hq * p.d, kw = p.hkv * p.d, width = qw + 2 * kw;
    scratch->resize(size_t(t * width));
    float* q = scratch->data();
    float* k = q + t * qw;
    float* v = k + t * kw;
    const float* src = qkv.data_as<float>();
    ThreadPool::global().parallel_for(t, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        const float* row = src + r * width;
        std::memcpy(q + r * qw, row, size_t(qw) * 4);
        std::memcpy(k + r * kw, row + qw, size_t(kw) * 4);
        std::memcpy(v + r * kw, row + qw + kw, size_t(kw) * 4);
      }
    }, 16);
    if (!inv_freq.empty()) {
      const int32_t* pos = c.inputs[1]->data_as<int32_t>();
      rope(q, t, p.hq, p.d, p.rotary_dim, pos, inv_freq.data_as<float>());
      rope(k, t, p.hkv, p.d, p.rotary_dim, pos, inv_freq.data_as<float>());
    }
    run_attention(c, p, q, k, v, t);
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

// TopKLogits: values f32, ids i32, logprobs f32, each [R, k] (see kernels.h).
OpRun prepare_topk_logits(const ir::Node& n, const ir::Graph&, const CompileOptions&) {
  const int64_t k = n.attr_int("k");
  return [k](OpContext& c) {
    const Tensor& x = *c.inputs[0];
    const int64_t r = x.dim(0), v = x.dim(1);
    float* values = c.out(0, {r, k}).data_as<float>();
    int32_t* ids = c.out(1, {r, k}, DType::kI32).data_as<int32_t>();
    float* logprobs = c.out(2, {r, k}).data_as<float>();
    topk_logits(x.data_as<float>(), r, v, k, values, ids, logprobs);
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
      {"EmbeddingLayerNorm", prepare_embedding_layer_norm},
      {"LayerNorm", prepare_layer_norm},
      {"RMSNorm", prepare_rms_norm},
      {"HeadRMSNorm", prepare_head_rms_norm},
      {"AddLayerNorm", prepare_add_norm},
      {"AddRMSNorm", prepare_add_norm},
      {"SwiGLU", prepare_swiglu},
      {"GeGLU", prepare_geglu},
      {"Linear", prepare_linear},
      {"Gelu", prepare_gelu},
      {"Silu", prepare_unary<&silu>},
      {"Tanh", prepare_unary<&kiln::cpu::tanh>},
      {"Rope", prepare_rope},
      {"Attention", prepare_attention},
      {"GatherRows", prepare_gather_rows},
      {"TopKLogits", prepare_topk_logits},
      {"SeqMeanPool", prepare_seq_mean_pool},
      {"AllReduce", prepare_all_reduce},
  };
  return table;
}

}  // namespace

const OpPrepare* find_cpu_op(const std::string& op) {
  auto it = op_table().find(op);
  if (it != op_table().end()) return &it->second;
  auto g = generic_cpu_ops().find(op);
  if (g != generic_cpu_ops().end()) return &g->second;
  static const OpPrepare plugin = prepare_plugin;
  return op == "Plugin" ? &plugin : nullptr;
}

CpuKv::CpuKv(const KvLayout& layout) : layout_(layout) {
  kv_check_k_shift(layout);
  const DType elem = is_quantized() ? DType::kI8 : DType::kF32;
  k_ = Tensor(elem, {layout.num_layers * layer_elems()});
  v_ = Tensor(elem, {layout.num_layers * layer_elems()});
  if (is_quantized()) {
    k_scale_ = Tensor(DType::kF32, {layout.num_layers * layer_rows()});
    v_scale_ = Tensor(DType::kF32, {layout.num_layers * layer_rows()});
  }
}

void CpuKv::read_keys(int64_t layer, std::span<const int64_t> slots, float* out) const {
  kv_check_read_keys(layout_, layer, slots);
  const int64_t row = layout_.num_kv_heads * layout_.head_dim;
  const float* k = k_.data_as<float>() + layer * layer_elems();
  for (size_t i = 0; i < slots.size(); ++i) std::memcpy(out + int64_t(i) * row, k + slots[i] * row, size_t(row) * 4);
}

size_t CpuKv::block_bytes_of(const KvLayout& layout) {
  if (!kv_dtype_quantized(layout.dtype)) return layout.block_bytes(4);
  const int64_t scales = 2 * layout.num_layers * layout.block_size * layout.num_kv_heads;
  return layout.block_bytes(1) + size_t(scales) * 4;
}

std::array<std::span<uint8_t>, 4> CpuKv::block_parts(int64_t l, int64_t block) {
  const size_t esz = is_quantized() ? 1 : 4;
  const size_t elems = size_t(layout_.block_elems()) * esz;
  auto* kb = static_cast<uint8_t*>(k_.data()) + (size_t(l * layer_elems()) + size_t(block * layout_.block_elems())) * esz;
  auto* vb = static_cast<uint8_t*>(v_.data()) + (size_t(l * layer_elems()) + size_t(block * layout_.block_elems())) * esz;
  if (!is_quantized()) return {std::span<uint8_t>(kb, elems), std::span<uint8_t>(vb, elems), {}, {}};
  const int64_t rows = layout_.block_size * layout_.num_kv_heads;
  auto* ks = reinterpret_cast<uint8_t*>(k_scales(l) + block * rows);
  auto* vs = reinterpret_cast<uint8_t*>(v_scales(l) + block * rows);
  return {std::span<uint8_t>(kb, elems), std::span<uint8_t>(vb, elems), std::span<uint8_t>(ks, size_t(rows) * 4),
          std::span<uint8_t>(vs, size_t(rows) * 4)};
}

void CpuKv::copy_block(int32_t src, int32_t dst) {
  KILN_THROW_IF(src < 0 || src >= layout_.num_blocks || dst < 0 || dst >= layout_.num_blocks, kOutOfRange,
                "KV block copy ", src, " -> ", dst, " outside [0, ", layout_.num_blocks, ")");
  for (int64_t l = 0; l < layout_.num_layers; ++l) {
    auto from = block_parts(l, src), to = block_parts(l, dst);
    for (size_t i = 0; i < from.size(); ++i)
      if (!from[i].empty()) std::memcpy(to[i].data(), from[i].data(), from[i].size());
  }
}

void CpuKv::host_reserve(int32_t num_blocks) {
  KILN_THROW_IF(num_blocks < 0, kInvalidArgument, "KV host swap space of ", num_blocks, " blocks");
  host_.reset();
  host_blocks_ = 0;
  if (num_blocks == 0) return;
  host_.reset(new uint8_t[size_t(num_blocks) * block_bytes()]);
  host_blocks_ = num_blocks;
}

void CpuKv::check_copy(const KvSwapCopy& c) const {
  KILN_THROW_IF(c.block < 0 || c.block >= layout_.num_blocks || c.host < 0 || c.host >= host_blocks_,
                kOutOfRange, "KV swap of block ", c.block, " <-> host slot ", c.host, " outside [0, ",
                layout_.num_blocks, ") x [0, ", host_blocks_, ")");
}

void CpuKv::swap_out(std::span<const KvSwapCopy> copies) {
  for (const KvSwapCopy& c : copies) {
    check_copy(c);
    uint8_t* h = host_.get() + size_t(c.host) * block_bytes();
    for (int64_t l = 0; l < layout_.num_layers; ++l)
      for (std::span<uint8_t> part : block_parts(l, c.block)) {
        if (!part.empty()) std::memcpy(h, part.data(), part.size());
        h += part.size();
      }
  }
}

void CpuKv::swap_in(std::span<const KvSwapCopy> copies) {
  for (const KvSwapCopy& c : copies) {
    check_copy(c);
    const uint8_t* h = host_.get() + size_t(c.host) * block_bytes();
    for (int64_t l = 0; l < layout_.num_layers; ++l)
      for (std::span<uint8_t> part : block_parts(l, c.block)) {
        if (!part.empty()) std::memcpy(part.data(), h, part.size());
        h += part.size();
      }
  }
}

}  // namespace kiln::cpu

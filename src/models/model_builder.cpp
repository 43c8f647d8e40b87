// Declared-weight loading, config helpers and the family registry (see model_builder.h).
#include "models/model_builder.h"

#include <cstdint>

#include "core/log.h"
#include "core/status.h"
#include "core/weight_quant.h"
#include "frontends/hf_dir.h"
#include "models/random_weights.h"

namespace kiln {

std::map<std::string, Tensor> load_declared_weights(const std::vector<WeightSpec>& specs,
                                                    const WeightSource& source) {
  std::map<std::string, Tensor> out;
  Progress progress("loading weights", int64_t(specs.size()));
  int64_t done = 0;
  auto* random = dynamic_cast<const RandomWeightSource*>(&source);
  for (const WeightSpec& spec : specs) {
    std::string name = spec.name;
    // A Linear weight or lookup table the source keeps quantized: its own codes; a tied
    // Linear (an LM head over the token embedding) shares the table's image when the table
    // was kept in the same format, else loads the embedding's codes itself (the table then
    // loads as f32 rows for the lookup).
    // A transposed weight (GPT-2's Conv1D, HF [in, out]) qualifies where the file stores its
    // [out, in] rows (stored_transposed: a GGUF's), which its image then holds.
    if ((spec.linear || spec.table) && !random) {
      const std::string from = source.has(name) ? name : spec.tied_to;
      std::vector<int64_t> hf_shape = spec.shape;
      if (spec.transpose && hf_shape.size() == 2) std::swap(hf_shape[0], hf_shape[1]);
      const bool ok = !from.empty() && source.has(from) && source.info(from).shape == hf_shape &&
                      spec.transpose == source.stored_transposed(from);  // else the checks below
      const std::optional<QuantFormat> f = ok ? source.keep_format_for(from) : std::nullopt;
      // A head tied to a table kept in the same format shares the table's image.
      if (auto t = out.find(from); f && from != name && t != out.end() && t->second.dtype() == DType::kU8 &&
                                   t->second.rank() == 2 && t->second.dim(0) == spec.shape[0] &&
                                   size_t(t->second.dim(1)) == quant_image_row_bytes(*f, spec.shape[1])) {
        out.emplace(spec.name, t->second);
        progress.update(++done);
        continue;
      }
      if (std::optional<Tensor> q = f ? source.load_quantized(from, *f) : std::nullopt) {
        out.emplace(spec.name, std::move(*q));
        progress.update(++done);
        continue;
      }
    }
    if (random) {
      if (!spec.tied_to.empty() && out.count(spec.tied_to))
        out.emplace(spec.name, out.at(spec.tied_to));
      else if (spec.required)
        out.emplace(spec.name, random->make(spec.name, spec.shape));
      progress.update(++done);
      continue;
    }
    if (!source.has(name)) {
      if (!spec.tied_to.empty() && out.count(spec.tied_to)) {
        out.emplace(spec.name, out.at(spec.tied_to));  // shares the buffer
        progress.update(++done);
        continue;
      }
      if (!spec.tied_to.empty() && source.has(spec.tied_to)) {
        name = spec.tied_to;
      } else if (!spec.required) {
        progress.update(++done);
        continue;
      } else {
        throw_error(ErrorCode::kNotFound, "missing tensor '", spec.name, "' (expected shape ",
                    shape_to_string(spec.shape), ") in ", source.describe());
      }
    }
    TensorInfo info = source.info(name);
    std::vector<int64_t> want = spec.shape;
    if (spec.transpose && want.size() == 2) std::swap(want[0], want[1]);
    if (info.shape != want)
      throw_error(ErrorCode::kInvalidFile, "tensor '", name, "' has shape ",
                  shape_to_string(info.shape), " but the config implies ", shape_to_string(want),
                  " in ", source.describe());
    // A 16-bit matrix stays in its dtype when the source keeps 16-bit weights (the values
    // are the same: bf16 and f16 widen to f32 exactly), as a view of the file's mapping
    // where its bytes lie usable (no copy until the backend packs or uploads it).
    const bool keep16 = source.keeps_16bit() && (spec.linear || spec.table) && info.storage.empty() &&
                        (info.dtype == DType::kBF16 || info.dtype == DType::kF16);
    std::optional<Tensor> mapped = keep16 ? source.view(name) : std::nullopt;
    Tensor t = mapped ? std::move(*mapped) : source.load(name, keep16 ? info.dtype : DType::kF32);
    if (spec.transpose) {
      Tensor tt(t.dtype(), spec.shape);
      const int64_t rows = want[0], cols = want[1];
      auto transpose = [&]<typename E>(E) {
        const E* s = static_cast<const E*>(t.data());
        E* d = static_cast<E*>(tt.data());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) d[c * rows + r] = s[r * cols + c];
      };
      if (dtype_size(t.dtype()) == 2)
        transpose(uint16_t{});
      else
        transpose(float{});
      t = std::move(tt);
    }
    out.emplace(spec.name, std::move(t));
    progress.update(++done);
  }
  return out;
}

namespace {
QuantFormat image_format(const Tensor& w, int64_t k) {
  return w.dim(1) == int64_t(quant_image_row_bytes(QuantFormat::kQ8, k)) ? QuantFormat::kQ8 : QuantFormat::kQ4;
}
}  // namespace

std::map<std::string, ir::Attr> kept_quant_linear_attrs(const Tensor& w, int64_t k) {
  std::map<std::string, ir::Attr> attrs;
  if (w.dtype() != DType::kU8 || w.rank() != 2) return attrs;
  const std::string f = quant_format_name(image_format(w, k));
  attrs["weight_quant"] = f;
  attrs["precision"] = f;
  attrs["weight_k"] = k;
  return attrs;
}

std::map<std::string, ir::Attr> kept_quant_table_attrs(const Tensor& table, int64_t dim) {
  std::map<std::string, ir::Attr> attrs;
  if (table.dtype() != DType::kU8 || table.rank() != 2) return attrs;
  attrs["weight_quant"] = std::string(quant_format_name(image_format(table, dim)));
  attrs["weight_k"] = dim;
  return attrs;
}

namespace {
const nlohmann::json& config_get(const nlohmann::json& c, const std::string& key) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null())
    throw_error(ErrorCode::kInvalidFile, "config.json: missing key '", key, "'");
  return *it;
}
}  // namespace

int64_t config_int(const nlohmann::json& c, const std::string& key) {
  const auto& v = config_get(c, key);
  if (!v.is_number_integer())
    throw_error(ErrorCode::kInvalidFile, "config.json: '", key, "' must be an integer, got ", v.dump());
  return v.get<int64_t>();
}
int64_t config_int(const nlohmann::json& c, const std::string& key, int64_t fallback) {
  auto it = c.find(key);
  return it == c.end() || it->is_null() ? fallback : config_int(c, key);
}
double config_float(const nlohmann::json& c, const std::string& key) {
  const auto& v = config_get(c, key);
  if (!v.is_number())
    throw_error(ErrorCode::kInvalidFile, "config.json: '", key, "' must be a number, got ", v.dump());
  return v.get<double>();
}
double config_float(const nlohmann::json& c, const std::string& key, double fallback) {
  auto it = c.find(key);
  return it == c.end() || it->is_null() ? fallback : config_float(c, key);
}
std::string config_str(const nlohmann::json& c, const std::string& key, const std::string& fallback) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_string())
    throw_error(ErrorCode::kInvalidFile, "config.json: '", key, "' must be a string, got ", it->dump());
  return it->get<std::string>();
}

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {
      {"gpt2", {"gpt2"}, build_gpt2},
      {"llama", {"llama", "mistral", "qwen2", "qwen3", "phi3", "smollm", "smollm3", "granite",
                 "ministral", "olmo2", "glm4"},
       build_llama},
      {"gemma", {"gemma"}, build_gemma1},
      {"gemma2", {"gemma2"}, build_gemma2},
      {"gemma3", {"gemma3_text"}, build_gemma3},
      {"gemma3_multimodal", {"gemma3"}, build_gemma3_multimodal},
      {"bert", {"bert"}, build_bert},
  };
  return families;
}

BuiltModel build_model(const nlohmann::json& config, const WeightSource& weights) {
  std::string type = config_str(config, "model_type", "");
  for (const auto& f : model_families())
    for (const auto& t : f.model_types)
      if (t == type) {
        BuiltModel m = f.build(config, weights);
        m.info.model_type = type;
        if (m.info.is_decoder) {
          // A decoder is an embedding model when its checkpoint says how to pool.
          m.info.pooling = config_str(config, kPoolingConfigKey, "");
          if (m.info.pooling != "" && m.info.pooling != "last")
            throw_error(ErrorCode::kUnsupported, type, ": sentence-embedding pooling '", m.info.pooling,
                        "' (kiln's decoder embedding models pool their last token)");
        }
        ir::verify(m.graph);
        return m;
      }
  std::string known;
  for (const auto& f : model_families())
    for (const auto& t : f.model_types) known += (known.empty() ? "" : ", ") + t;
  throw_error(ErrorCode::kUnsupported, "unsupported model_type '", type,
              "' in config.json (supported: ", known, ")");
}

}  // namespace kiln

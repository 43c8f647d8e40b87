// Finding and checking the past_key_values / present tensors of a decoder export (see
// onnx_kv.h).
#include "frontends/onnx/onnx_kv.h"

#include <map>
#include <optional>

#include "core/status.h"

namespace kiln::onnx {

namespace {

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

bool is_kv_input(const std::string& name) { return starts_with(name, "past"); }
bool is_kv_output(const std::string& name) { return starts_with(name, "present"); }

// "<prefix><layer>.key" / ".value" -> (layer, is_value); nullopt for any other name.
std::optional<std::pair<int64_t, bool>> parse_kv_name(const std::string& name, const std::string& prefix) {
  if (!starts_with(name, prefix.c_str())) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 6 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return std::nullopt;
  const std::string rest = name.substr(j + 1);
  if (rest != "key" && rest != "value") return std::nullopt;
  return std::make_pair(std::stoll(name.substr(i, j - i)), rest == "value");
}

std::string shape_str(const OnnxValueInfo& v) {
  if (!v.has_shape) return "of unknown shape";
  std::string s = "[";
  for (size_t i = 0; i < v.shape.size(); ++i) s += (i ? ", " : "") + v.shape[i].str();
  return s + "]";
}

std::string shorten(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names.size() > 6 && i == 3) {
      s += ", ..., " + names.back() + " (" + std::to_string(names.size()) + " in all)";
      break;
    }
    s += (i ? ", " : "") + names[i];
  }
  return s;
}

}  // namespace

std::string OnnxKvCache::describe() const {
  if (layers.empty()) return "no KV-cache tensors";
  const std::string n = std::to_string(layers.size() - 1);
  std::string present = "present.{0.." + n + "}.key/value";
  if (layers[0].past_key.empty()) return present + " (no past inputs)";
  return "past_key_values.{0.." + n + "}.key/value -> " + present;
}

bool onnx_has_kv_io(const OnnxModel& m) {
  for (auto& v : m.graph.inputs)
    if (is_kv_input(v.name)) return true;
  for (auto& v : m.graph.outputs)
    if (is_kv_output(v.name)) return true;
  return false;
}

std::string onnx_kv_io_names(const OnnxModel& m) {
  std::vector<std::string> in, out;
  for (auto& v : m.graph.inputs)
    if (is_kv_input(v.name)) in.push_back(v.name);
  for (auto& v : m.graph.outputs)
    if (is_kv_output(v.name)) out.push_back(v.name);
  std::string s;
  if (!in.empty()) s += "inputs " + shorten(in);
  if (!out.empty()) s += std::string(s.empty() ? "" : "; ") + "outputs " + shorten(out);
  return s;
}

OnnxKvCache onnx_kv_cache(const OnnxModel& m, const std::string& label) {
  struct Slot {
    const OnnxValueInfo* past[2] = {nullptr, nullptr};
    const OnnxValueInfo* present[2] = {nullptr, nullptr};
  };
  std::map<int64_t, Slot> slots;
  bool any_past = false;
  auto layout_hint = [] {
    return std::string("; kiln maps the layout optimum writes: inputs past_key_values.{layer}.key / .value and "
                       "outputs present.{layer}.key / .value, each [batch, kv_heads, sequence, head_dim]");
  };
  for (auto& v : m.graph.inputs) {
    if (!is_kv_input(v.name)) continue;
    auto p = parse_kv_name(v.name, "past_key_values.");
    if (!p)
      throw_error(ErrorCode::kUnsupported, label, ": input '", v.name, "' ", shape_str(v),
                  " looks like a KV-cache input but is not named past_key_values.{layer}.key or .value", layout_hint());
    Slot& s = slots[p->first];
    if (s.past[p->second])
      throw_error(ErrorCode::kInvalidFile, label, ": input '", v.name, "' is declared twice");
    s.past[p->second] = &v;
    any_past = true;
  }
  for (auto& v : m.graph.outputs) {
    if (!is_kv_output(v.name)) continue;
    auto p = parse_kv_name(v.name, "present.");
    if (!p)
      throw_error(ErrorCode::kUnsupported, label, ": output '", v.name, "' ", shape_str(v),
                  " looks like a KV-cache output but is not named present.{layer}.key or .value", layout_hint());
    Slot& s = slots[p->first];
    if (s.present[p->second])
      throw_error(ErrorCode::kInvalidFile, label, ": output '", v.name, "' is declared twice");
    s.present[p->second] = &v;
  }
  OnnxKvCache kv;
  if (slots.empty()) return kv;
  // Every tensor [batch, kv_heads, sequence, head_dim] float32, with one kv_heads and one
  // head_dim throughout (taken from the first tensor that states them).
  const OnnxValueInfo* heads_from = nullptr;
  const OnnxValueInfo* dim_from = nullptr;
  auto check = [&](const OnnxValueInfo& v, const char* role) {
    if (v.elem_type != kOnnxFloat)
      throw_error(ErrorCode::kUnsupported, label, ": ", role, " '", v.name, "' holds ", onnx_dtype_name(v.elem_type),
                  "; kiln maps float32 KV-cache tensors (export in float32; kiln's own --weight-dtype and "
                  "--kv-cache-dtype choose the storage)");
    if (!v.has_shape || v.shape.size() != 4)
      throw_error(ErrorCode::kUnsupported, label, ": ", role, " '", v.name, "' is ", shape_str(v),
                  ", expected [batch, kv_heads, sequence, head_dim]", layout_hint());
    const Dim& h = v.shape[1];
    const Dim& d = v.shape[3];
    if (h.is_concrete() && h.value >= 0) {
      if (!heads_from) heads_from = &v, kv.kv_heads = h.value;
      else if (h.value != kv.kv_heads)
        throw_error(ErrorCode::kInvalidFile, label, ": ", role, " '", v.name, "' is ", shape_str(v), " with ", h.value,
                    " KV heads (dim 1), but '", heads_from->name, "' is ", shape_str(*heads_from), " with ",
                    kv.kv_heads, "; every KV-cache tensor must be [batch, kv_heads, sequence, head_dim] alike");
    }
    if (d.is_concrete() && d.value >= 0) {
      if (!dim_from) dim_from = &v, kv.head_dim = d.value;
      else if (d.value != kv.head_dim)
        throw_error(ErrorCode::kInvalidFile, label, ": ", role, " '", v.name, "' is ", shape_str(v), " with head_dim ",
                    d.value, " (dim 3), but '", dim_from->name, "' is ", shape_str(*dim_from), " with ",
                    kv.head_dim, "; every KV-cache tensor must be [batch, kv_heads, sequence, head_dim] alike");
    }
  };
  int64_t expect = 0;
  for (auto& [layer, s] : slots) {
    if (layer != expect)
      throw_error(ErrorCode::kInvalidFile, label, ": KV-cache tensors for layer ", layer, " but none for layer ",
                  expect, " (layers must be numbered 0..N-1)");
    ++expect;
    const std::string l = std::to_string(layer);
    for (int k = 0; k < 2; ++k) {
      const char* kv_name = k ? "value" : "key";
      if (any_past && !s.past[k])
        throw_error(ErrorCode::kInvalidFile, label, ": no input past_key_values.", l, ".", kv_name, " for layer ", l,
                    " (the graph has other past_key_values inputs; each layer needs its key and value)");
      if (!s.present[k])
        throw_error(ErrorCode::kInvalidFile, label, ": no output present.", l, ".", kv_name, " for layer ", l,
                    any_past ? " (past_key_values inputs need their present outputs)"
                             : " (each layer needs its present key and value)");
      if (s.past[k]) check(*s.past[k], "past input");
      check(*s.present[k], "present output");
    }
    kv.layers.push_back({s.past[0] ? s.past[0]->name : "", s.past[1] ? s.past[1]->name : "", s.present[0]->name,
                         s.present[1]->name});
  }
  return kv;
}

}  // namespace kiln::onnx

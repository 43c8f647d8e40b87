// Writing an engine file (see engine.h): the graph (or each rank's graph of a
// tensor-parallel engine) is flattened into definition order (inputs, weights, node
// outputs), weights are laid out 64-byte aligned in one blob (tensors sharing memory,
// like a tied LM head, or replicated on every rank, are stored once), then the header's
// checksums are filled in from the written bytes. Tested in tests/engine/engine_file_test.cpp.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/engine_format.h"
#include "engine_generated.h"
#include "ir/plugin.h"

namespace kiln {

namespace {

using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

Offset<fb::Attr> write_attr(FlatBufferBuilder& fb, const std::string& key, const ir::Attr& a) {
  auto k = fb.CreateString(key);
  if (auto p = std::get_if<int64_t>(&a)) return fb::CreateAttr(fb, k, fb::AttrKind_Int, *p);
  if (auto p = std::get_if<double>(&a)) return fb::CreateAttr(fb, k, fb::AttrKind_Float, 0, *p);
  if (auto p = std::get_if<std::string>(&a))
    return fb::CreateAttr(fb, k, fb::AttrKind_String, 0, 0, fb.CreateString(*p));
  if (auto p = std::get_if<std::vector<int64_t>>(&a))
    return fb::CreateAttr(fb, k, fb::AttrKind_Ints, 0, 0, 0, fb.CreateVector(*p));
  return fb::CreateAttr(fb, k, fb::AttrKind_Floats, 0, 0, 0, 0,
                        fb.CreateVector(std::get<std::vector<double>>(a)));
}

auto write_attrs(FlatBufferBuilder& fb, const std::map<std::string, ir::Attr>& attrs) {
  std::vector<Offset<fb::Attr>> v;
  for (auto& [k, a] : attrs) v.push_back(write_attr(fb, k, a));
  return fb.CreateVector(v);
}

auto write_strings(FlatBufferBuilder& fb, const std::vector<std::string>& s) {
  std::vector<Offset<flatbuffers::String>> v;
  for (auto& x : s) v.push_back(fb.CreateString(x));
  return fb.CreateVector(v);
}

struct BlobEntry {
  const Tensor* tensor;
  uint64_t offset;
};

// The weight blob being laid out: each tensor gets a 64-byte-aligned offset, and a
// tensor already placed is not stored again. Within one graph, sharing is by buffer
// (a tied LM head). Across the ranks of a tensor-parallel engine, replicated tensors
// were converted or packed per rank into separate buffers of equal bytes, so they are
// also found by their contents (hash, then a byte compare).
class BlobLayout {
 public:
  explicit BlobLayout(bool by_contents) : by_contents_(by_contents) {}

  uint64_t place(const Tensor& t) {
    auto key = std::make_tuple(t.data(), t.nbytes(), t.dtype());
    auto it = stored_.find(key);
    if (it != stored_.end()) return it->second;
    if (by_contents_) {
      auto ckey = std::make_tuple(t.nbytes(), t.dtype(), xxhash64(t.data(), t.nbytes()));
      for (auto& [other, offset] : by_contents_map_[ckey])
        if (std::memcmp(other->data(), t.data(), t.nbytes()) == 0) return stored_[key] = offset;
      by_contents_map_[ckey].push_back({&t, size_});
    }
    stored_.emplace(key, size_);
    entries_.push_back({&t, size_});
    const uint64_t at = size_;
    size_ = align_up(size_ + t.nbytes(), kEngineBlobAlignment);
    return at;
  }
  const std::vector<BlobEntry>& entries() const { return entries_; }
  uint64_t size() const { return size_; }

 private:
  bool by_contents_;
  std::map<std::tuple<const void*, size_t, DType>, uint64_t> stored_;
  std::map<std::tuple<size_t, DType, uint64_t>, std::vector<BlobEntry>> by_contents_map_;
  std::vector<BlobEntry> entries_;
  uint64_t size_ = 0;
};

// Flattens the graph; places its weights in `blob`.
Offset<fb::Graph> write_graph(FlatBufferBuilder& fb, const ir::Graph& g, BlobLayout& blob) {
  std::vector<int32_t> index(g.num_values(), -1);
  int32_t next = 0;
  std::vector<Offset<fb::Input>> inputs;
  for (ir::ValueId v : g.inputs()) {
    const ir::Value& val = g.value(v);
    std::vector<Offset<fb::Dim>> dims;
    for (auto& d : val.shape.dims())
      dims.push_back(fb::CreateDim(fb, d.is_concrete() ? d.value : -1, d.is_concrete() ? 0 : fb.CreateString(d.sym)));
    inputs.push_back(fb::CreateInput(fb, fb.CreateString(val.name), uint8_t(val.dtype), fb.CreateVector(dims)));
    index[size_t(v)] = next++;
  }
  std::vector<Offset<fb::Weight>> weights;
  for (size_t v = 0; v < g.num_values(); ++v) {
    if (!g.is_weight(ir::ValueId(v))) continue;
    const Tensor& t = g.weight(ir::ValueId(v));
    const uint64_t offset = blob.place(t);
    weights.push_back(fb::CreateWeight(fb, fb.CreateString(g.value(ir::ValueId(v)).name), uint8_t(t.dtype()),
                                       fb.CreateVector(t.shape()), offset, t.nbytes()));
    index[v] = next++;
  }
  std::vector<Offset<fb::Node>> nodes;
  for (const ir::Node& n : g.nodes()) {
    std::vector<int32_t> in;
    for (ir::ValueId v : n.inputs) {
      KILN_CHECK(v == ir::kNoValue || index[size_t(v)] >= 0, "node ", n.name, " reads an undefined value");
      in.push_back(v == ir::kNoValue ? -1 : index[size_t(v)]);
    }
    nodes.push_back(fb::CreateNode(fb, fb.CreateString(n.op), fb.CreateString(n.name), fb.CreateVector(in),
                                   write_attrs(fb, n.attrs)));
    for (ir::ValueId o : n.outputs) index[size_t(o)] = next++;
  }
  std::vector<Offset<fb::Output>> outputs;
  for (auto& [name, v] : g.outputs()) outputs.push_back(fb::CreateOutput(fb, fb.CreateString(name), index[size_t(v)]));
  return fb::CreateGraph(fb, fb.CreateVector(inputs), fb.CreateVector(weights), fb.CreateVector(nodes),
                         fb.CreateVector(outputs), write_attrs(fb, g.meta));
}

Offset<flatbuffers::Vector<Offset<fb::TacticTable>>> write_tactic_tables(FlatBufferBuilder& fb,
                                                                         const std::vector<EngineTacticTable>& tables) {
  std::vector<Offset<fb::TacticTable>> out;
  for (auto& t : tables) {
    std::vector<Offset<fb::Tactic>> ts;
    for (auto& x : t.tactics)
      ts.push_back(fb::CreateTactic(fb, fb.CreateString(x.node), fb.CreateString(x.tactic), x.seconds));
    out.push_back(fb::CreateTacticTable(fb, fb.CreateString(t.device), fb.CreateVector(ts)));
  }
  return fb.CreateVector(out);
}

void write_all(std::FILE* f, const void* data, size_t n, const std::string& path) {
  if (n && std::fwrite(data, 1, n, f) != n) throw_error(ErrorCode::kIo, "cannot write '", path, "'");
}

}  // namespace

std::vector<const ir::Graph*> engine_graphs(const EngineContents& e) {
  std::vector<const ir::Graph*> out;
  if (e.tp_world > 1)
    for (auto& r : e.ranks) out.push_back(&r.graph);
  else
    out.push_back(&e.graph);
  return out;
}

std::vector<EnginePlugin> engine_plugins_of(const ir::Graph& g) {
  std::vector<EnginePlugin> out;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::kPluginOp) continue;
    const ir::PluginOp& op = ir::plugin_op_of(n);
    auto it = std::find_if(out.begin(), out.end(), [&](const EnginePlugin& p) { return p.name == op.library->name; });
    if (it == out.end()) it = out.insert(out.end(), {op.library->name, op.library->version, op.library->file, {}});
    if (std::find(it->ops.begin(), it->ops.end(), op.qualified_name()) == it->ops.end())
      it->ops.push_back(op.qualified_name());
  }
  return out;
}

size_t engine_write(const std::string& path, const EngineContents& e) {
  const bool tp = e.tp_world > 1;
  KILN_CHECK(e.tp_world >= 1 && e.tp_world <= kEngineMaxTensorParallel, "engine tp_world ", e.tp_world);
  KILN_CHECK(tp ? int(e.ranks.size()) == e.tp_world && e.graph.nodes().empty() && e.tactic_tables.empty()
                : e.ranks.empty(),
             "a tensor-parallel engine holds one graph per rank and no unsharded graph (tp_world ", e.tp_world, ", ",
             e.ranks.size(), " ranks)");
  for (const ir::Graph* g : engine_graphs(e)) ir::verify(*g);
  FlatBufferBuilder fb(1 << 20);
  BlobLayout blob(/*by_contents=*/tp);
  Offset<fb::Graph> graph = 0;
  Offset<flatbuffers::Vector<Offset<fb::Rank>>> ranks = 0;
  std::vector<EnginePlugin> plugin_list;
  if (tp) {
    std::vector<Offset<fb::Rank>> rs;
    for (const EngineRank& r : e.ranks) {
      auto info = fb.CreateString(model_info_to_json(r.info).dump());
      auto g = write_graph(fb, r.graph, blob);
      auto shift = r.kv_key_shift.empty() ? 0 : fb.CreateVector(r.kv_key_shift);
      rs.push_back(fb::CreateRank(fb, info, g, write_tactic_tables(fb, r.tactic_tables), shift));
      for (auto& p : engine_plugins_of(r.graph))
        if (std::none_of(plugin_list.begin(), plugin_list.end(), [&](auto& q) { return q.name == p.name; }))
          plugin_list.push_back(p);
    }
    ranks = fb.CreateVector(rs);
  } else {
    graph = write_graph(fb, e.graph, blob);
    plugin_list = engine_plugins_of(e.graph);
  }
  std::vector<Offset<fb::File>> files;
  for (auto& [name, bytes] : e.tokenizer.files)
    files.push_back(fb::CreateFile(fb, fb.CreateString(name),
                                   fb.CreateVector(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())));
  const EngineBuildInfo& b = e.build;
  auto build = fb::CreateBuild(fb, fb.CreateString(b.source), fb.CreateString(b.kiln_version),
                               fb.CreateString(b.weight_dtype), b.opt_level, write_strings(fb, b.disabled_passes),
                               write_strings(fb, b.pass_report), b.build_seconds,
                               write_strings(fb, b.pin_precision), b.workspace_bytes);
  std::vector<Offset<fb::Profile>> profs;
  for (auto& p : e.profiles) {
    std::vector<Offset<fb::ProfileDim>> dims;
    for (auto& d : p.dims) dims.push_back(fb::CreateProfileDim(fb, fb.CreateString(d.dim), d.min, d.opt, d.max));
    profs.push_back(fb::CreateProfile(fb, fb.CreateString(p.name), fb.CreateVector(dims), p.activation_bytes,
                                      p.activation_slots));
  }
  Offset<flatbuffers::Vector<Offset<fb::TacticTable>>> tables = 0;
  if (!tp) tables = write_tactic_tables(fb, e.tactic_tables);
  std::vector<Offset<fb::PluginRef>> plugins;
  for (auto& p : plugin_list)
    plugins.push_back(fb::CreatePluginRef(fb, fb.CreateString(p.name), fb.CreateString(p.version),
                                          fb.CreateString(p.library), write_strings(fb, p.ops)));
  Offset<fb::KvKeyShift> kv_key_shift = 0;
  if (const EngineKvKeyShift& k = e.kv_key_shift; k.recorded)
    kv_key_shift = fb::CreateKvKeyShift(fb, fb.CreateString(k.source), k.tokens,
                                        k.values.empty() ? 0 : fb.CreateVector(k.values));
  auto root = fb::CreateEngine(fb, kEngineSchemaVersion, fb.CreateString(model_info_to_json(e.info).dump()),
                               fb.CreateString(e.config.dump()), graph, fb.CreateString(e.tokenizer.kind),
                               fb.CreateVector(files), build, fb.CreateVector(profs), tables,
                               kEngineSchemaMinor, fb.CreateVector(plugins), uint32_t(e.tp_world), ranks,
                               kv_key_shift);
  fb.Finish(root, fb::EngineIdentifier());

  EngineHeader h;
  std::memcpy(h.magic, kEngineMagic, 8);
  h.format_version = kEngineFormatVersion;
  h.header_size = kEngineHeaderSize;
  h.meta_offset = kEngineHeaderSize;
  h.meta_size = fb.GetSize();
  h.blob_offset = align_up(h.meta_offset + h.meta_size, kEngineBlobAlignment);
  h.blob_size = blob.size();
  h.meta_hash = engine_meta_hash(h, fb.GetBufferPointer());

  // Written to a temp file and renamed, so a failed build never leaves a half file.
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw_error(ErrorCode::kIo, "cannot create '", tmp, "'");
  try {
    write_all(f, &h, sizeof h, tmp);
    write_all(f, fb.GetBufferPointer(), fb.GetSize(), tmp);
    static const uint8_t zeros[kEngineBlobAlignment] = {};
    write_all(f, zeros, h.blob_offset - h.meta_offset - h.meta_size, tmp);
    // The blob hash is computed as we write, one tensor (and its padding) at a time.
    EngineBlobHasher hasher;
    uint64_t at = 0;
    for (auto& [t, offset] : blob.entries()) {
      KILN_CHECK(offset == at, "blob layout");
      write_all(f, t->data(), t->nbytes(), tmp);
      hasher.update(t->data(), t->nbytes());
      size_t pad = align_up(t->nbytes(), kEngineBlobAlignment) - t->nbytes();
      write_all(f, zeros, pad, tmp);
      hasher.update(zeros, pad);
      at += t->nbytes() + pad;
    }
    h.blob_hash = hasher.digest();
    if (std::fseek(f, 0, SEEK_SET) != 0) throw_error(ErrorCode::kIo, "cannot seek in '", tmp, "'");
    write_all(f, &h, sizeof h, tmp);
    if (std::fclose(f) != 0) throw_error(ErrorCode::kIo, "cannot write '", tmp, "'");
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw_error(ErrorCode::kIo, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  return size_t(h.blob_offset + h.blob_size);
}

}  // namespace kiln

// Loading an engine file (see engine.h): header checks, checksums, FlatBuffers
// verification, then the graph (each rank's, for a tensor-parallel engine, checked to
// be a share of the model) is rebuilt node by node through the op registry, so shape
// inference re-checks every node; weights become views into the mapping after
// their offset, size, dtype and shape agree. Every failure is kInvalidFile naming the
// file and the part. Tested in tests/engine/engine_file_test.cpp; fuzzed by
// fuzz/engine_load_fuzz.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/log.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/engine_format.h"
#include "engine_generated.h"
#include "ir/plugin.h"

namespace kiln {

namespace {

template <typename... Args>
[[noreturn]] void bad(const std::string& where, const Args&... what) {
  throw_error(ErrorCode::kInvalidFile, "engine '", where, "': ", what...);
}

std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

uint64_t blob_hash(const uint8_t* p, uint64_t n) {
  const uint64_t chunks = (n + kEngineHashChunk - 1) / kEngineHashChunk;
  std::vector<uint64_t> h(chunks);
  ThreadPool::global().parallel_for(int64_t(chunks), [&](int64_t b, int64_t e, int) {
    for (int64_t c = b; c < e; ++c) {
      uint64_t off = uint64_t(c) * kEngineHashChunk;
      h[size_t(c)] = xxhash64(p + off, std::min<uint64_t>(kEngineHashChunk, n - off));
    }
  });
  return xxhash64(h.data(), h.size() * 8);
}

ir::Attr read_attr(const fb::Attr& a, const std::string& where) {
  switch (a.kind()) {
    case fb::AttrKind_Int: return a.i();
    case fb::AttrKind_Float: return a.f();
    case fb::AttrKind_String: return str(a.s());
    case fb::AttrKind_Ints:
      return a.ints() ? std::vector<int64_t>(a.ints()->begin(), a.ints()->end()) : std::vector<int64_t>();
    case fb::AttrKind_Floats:
      return a.floats() ? std::vector<double>(a.floats()->begin(), a.floats()->end()) : std::vector<double>();
  }
  bad(where, "attribute '", str(a.key()), "' has unknown kind ", int(a.kind()));
}

std::map<std::string, ir::Attr> read_attrs(const flatbuffers::Vector<flatbuffers::Offset<fb::Attr>>* v,
                                           const std::string& where) {
  std::map<std::string, ir::Attr> m;
  if (v)
    for (const fb::Attr* a : *v) m[str(a->key())] = read_attr(*a, where);
  return m;
}

DType read_dtype(uint8_t d, const std::string& where, const std::string& what) {
  if (d > uint8_t(DType::kU8)) bad(where, what, " has unknown dtype code ", int(d));
  return DType(d);
}

ir::Graph read_graph(const fb::Graph* fg, const uint8_t* blob, uint64_t blob_size,
                     const std::shared_ptr<const void>& owner, const std::string& where,
                     const std::string& part = "") {
  if (!fg || !fg->inputs() || !fg->weights() || !fg->nodes() || !fg->outputs()) bad(where, part, "the graph is missing");
  ir::Graph g;
  std::vector<ir::ValueId> ids;  // file value index -> graph value id
  for (const fb::Input* in : *fg->inputs()) {
    Shape shape;
    if (in->dims())
      for (const fb::Dim* d : *in->dims()) {
        if (d->sym() && d->sym()->size()) shape.push_back(Dim(d->sym()->str()));
        else if (d->value() >= 0 && d->value() < (int64_t(1) << 40)) shape.push_back(Dim(d->value()));
        else bad(where, part, "input '", str(in->name()), "' has a bad dim ", d->value());
      }
    ids.push_back(g.add_input(str(in->name()), read_dtype(in->dtype(), where, "input " + str(in->name())), shape));
  }
  for (const fb::Weight* w : *fg->weights()) {
    const std::string name = str(w->name());
    DType dt = read_dtype(w->dtype(), where, "weight '" + name + "'");
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    if (w->shape())
      for (int64_t d : *w->shape()) {
        if (d < 0 || d > (int64_t(1) << 40)) bad(where, part, "weight '", name, "' has a bad dim ", d);
        numel = d == 0 ? 0 : numel;
        if (d && numel > (uint64_t(1) << 48) / uint64_t(d)) bad(where, part, "weight '", name, "' is impossibly large");
        numel *= uint64_t(d);
        shape.push_back(d);
      }
    const uint64_t nbytes = numel * dtype_size(dt);
    if (nbytes != w->nbytes())
      bad(where, part, "weight '", name, "' ", dtype_name(dt), shape_to_string(shape), " needs ", nbytes,
          " bytes, the file says ", w->nbytes());
    if (w->offset() % kEngineBlobAlignment || w->offset() > blob_size || nbytes > blob_size - w->offset())
      bad(where, part, "weight '", name, "' at blob offset ", w->offset(), " + ", nbytes,
          " bytes lies outside the ", blob_size, "-byte weight blob (or is not 64-byte aligned)");
    Tensor t = Tensor::view(const_cast<uint8_t*>(blob + w->offset()), dt, shape, owner);
    ids.push_back(g.add_weight(name, std::move(t)));
  }
  for (const fb::Node* n : *fg->nodes()) {
    const std::string name = str(n->name());
    std::vector<ir::ValueId> in;
    if (n->inputs())
      for (int32_t i : *n->inputs()) {
        if (i < -1 || i >= int32_t(ids.size()))
          bad(where, part, "node '", name, "' reads value ", i, ", but only ", ids.size(), " are defined before it");
        in.push_back(i < 0 ? ir::kNoValue : ids[size_t(i)]);
      }
    try {
      for (ir::ValueId o : g.add_node(str(n->op()), in, read_attrs(n->attrs(), where), name)) ids.push_back(o);
    } catch (const Error& e) {
      bad(where, part, "node '", name, "': ", e.what());
    }
  }
  for (const fb::Output* o : *fg->outputs()) {
    if (o->value() < 0 || o->value() >= int32_t(ids.size()))
      bad(where, part, "output '", str(o->name()), "' names value ", o->value(), " of ", ids.size());
    g.add_output(str(o->name()), ids[size_t(o->value())]);
  }
  g.meta = read_attrs(fg->meta(), where);
  try {
    ir::verify(g);
  } catch (const Error& e) {
    bad(where, part, e.what());
  }
  return g;
}

std::vector<std::string> read_strings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v) {
  std::vector<std::string> out;
  if (v)
    for (auto* s : *v) out.push_back(s->str());
  return out;
}

// The record of the plugin that provides `qualified` ("domain::op"), or null.
const EnginePlugin* recorded_plugin(const std::vector<EnginePlugin>& plugins, const std::string& qualified) {
  for (const EnginePlugin& p : plugins)
    if (std::find(p.ops.begin(), p.ops.end(), qualified) != p.ops.end()) return &p;
  return nullptr;
}

// Before the graph is rebuilt: every Plugin node's op must come from a loaded plugin,
// else a message naming the node, op, domain and the plugin the engine was built with.
// A plugin of another version than the recorded one loads with a warning.
void check_plugins_loaded(const fb::Graph* fg, const std::vector<EnginePlugin>& plugins, const std::string& where) {
  if (!fg || !fg->nodes()) return;
  for (const fb::Node* n : *fg->nodes()) {
    if (str(n->op()) != ir::kPluginOp || !n->attrs()) continue;
    std::string op, domain;
    for (const fb::Attr* a : *n->attrs()) {
      if (a->kind() != fb::AttrKind_String) continue;
      if (str(a->key()) == ir::kPluginOpAttr) op = str(a->s());
      if (str(a->key()) == ir::kPluginDomainAttr) domain = ir::plugin_domain_normalize(str(a->s()));
    }
    if (op.empty()) continue;  // read_graph names the missing attribute
    const std::string qualified = domain.empty() ? op : domain + "::" + op;
    const EnginePlugin* rec = recorded_plugin(plugins, qualified);
    const ir::PluginOp* loaded = ir::plugin_find_op(domain, op);
    if (!loaded)
      throw_error(ErrorCode::kUnsupported, "engine '", where, "': node '", str(n->name()), "': ",
                  ir::plugin_missing_message(domain, op),
                  rec ? str_cat("; the engine was built with plugin '", rec->name, "' ", rec->version, " (",
                                rec->library, ")")
                      : std::string());
    if (rec && rec->name == loaded->library->name && rec->version != loaded->library->version)
      log_warn("engine '", where, "' was built with plugin '", rec->name, "' ", rec->version, ", loaded is ",
               loaded->library->version, " (", loaded->library->path, ")");
  }
}

std::vector<EngineTacticTable> read_tactic_tables(
    const flatbuffers::Vector<flatbuffers::Offset<fb::TacticTable>>* v) {
  std::vector<EngineTacticTable> out;
  if (v)
    for (const fb::TacticTable* t : *v) {
      EngineTacticTable table{str(t->device()), {}};
      if (t->tactics())
        for (const fb::Tactic* x : *t->tactics()) table.tactics.push_back({str(x->node()), str(x->tactic()), x->seconds()});
      out.push_back(std::move(table));
    }
  return out;
}

ModelInfo read_model_info(const flatbuffers::String* s, const std::string& where, const std::string& what) {
  try {
    return model_info_from_json(nlohmann::json::parse(str(s)));
  } catch (const nlohmann::json::exception& x) {
    bad(where, what, ": ", x.what());
  } catch (const Error& x) {  // its message starts "model info: "
    bad(where, what == "model info" ? std::string() : what + ": ", x.what());
  }
}

// A rank's shard must be a share of the model it claims to be: the same layers and
// widths, 1/world of the attention heads, its K/V heads split or (more ranks than K/V
// heads) one per rank, and its Attention nodes agreeing with its info, since the
// runtime sizes that rank's KV cache from the info.
void check_rank(const EngineRank& r, int rank, int world, const ModelInfo& model, const std::string& where) {
  const ModelInfo& i = r.info;
  const std::string what = str_cat("rank ", rank, " of ", world);
  if (i.family != model.family || i.vocab_size != model.vocab_size || i.hidden_size != model.hidden_size ||
      i.num_layers != model.num_layers || i.head_dim != model.head_dim || i.is_decoder != model.is_decoder)
    bad(where, what, " is a shard of another model (", i.family, ", ", i.num_layers, " layers, hidden ", i.hidden_size,
        ") than the engine's (", model.family, ", ", model.num_layers, " layers, hidden ", model.hidden_size, ")");
  const bool kv_ok = i.num_kv_heads >= 1 && (i.num_kv_heads * world == model.num_kv_heads ||
                                             (i.num_kv_heads == 1 && model.num_kv_heads >= 1 &&
                                              world % model.num_kv_heads == 0));
  if (i.num_heads * world != model.num_heads || !kv_ok)
    bad(where, what, " holds ", i.num_heads, " attention and ", i.num_kv_heads, " K/V heads, not a 1/", world,
        " share of the model's ", model.num_heads, " and ", model.num_kv_heads);
  for (const ir::Node& n : r.graph.nodes())
    if (n.op == "Attention" &&
        (n.attr_int("num_heads", -1) != i.num_heads || n.attr_int("num_kv_heads", -1) != i.num_kv_heads))
      bad(where, what, ": node '", n.name, "' has ", n.attr_int("num_heads", -1), " attention and ",
          n.attr_int("num_kv_heads", -1), " K/V heads, its rank info says ", i.num_heads, " and ", i.num_kv_heads);
}

// A recorded key shift must fit the KV pool it shifts ([layers, kv heads, head_dim] of
// `info`) and be finite. `v` absent: none.
std::vector<float> read_kv_key_shift(const flatbuffers::Vector<float>* v, const ModelInfo& info,
                                     const std::string& where, const std::string& what) {
  std::vector<float> out;
  if (!v) return out;
  const uint64_t want = uint64_t(info.num_layers) * uint64_t(info.num_kv_heads) * uint64_t(info.head_dim);
  if (v->size() != want)
    bad(where, what, "KV key shift holds ", v->size(), " values, but ", info.num_layers, " layers x ",
        info.num_kv_heads, " K/V heads x head_dim ", info.head_dim, " need ", want);
  out.resize(v->size());
  for (uint32_t i = 0; i < v->size(); ++i) {
    out[i] = v->Get(i);
    if (!std::isfinite(out[i])) bad(where, what, "KV key shift value ", i, " is not finite");
  }
  return out;
}

// Engine.kv_key_shift (schema 1.4) and the ranks' shares, checked against each other:
// "none" holds no values; a measured shift is in the engine (tp_world 1) or in every rank.
void read_kv_key_shift(const fb::Engine* e, EngineContents& out, const std::string& where) {
  const fb::KvKeyShift* k = e->kv_key_shift();
  for (uint32_t r = 0; r < out.ranks.size(); ++r) {
    const std::string what = str_cat("rank ", r, ": ");
    out.ranks[r].kv_key_shift = read_kv_key_shift(e->ranks()->Get(r)->kv_key_shift(), out.ranks[r].info, where, what);
    const bool want = k && str(k->source()) != "none";
    if (out.ranks[r].kv_key_shift.empty() == want)
      bad(where, what, want ? "no KV key shift, though the engine records one" : "a KV key shift the engine does not record");
  }
  if (!k) return;
  EngineKvKeyShift& s = out.kv_key_shift;
  s.recorded = true;
  s.source = str(k->source());
  s.tokens = k->tokens();
  if (!out.info.is_decoder) bad(where, "an encoder (", out.info.family, ") records a KV key shift");
  s.values = read_kv_key_shift(k->values(), out.info, where, "");
  const bool want = s.source != "none" && out.tp_world == 1;
  if (want && s.values.empty()) bad(where, "KV key shift '", s.source, "' holds no values");
  if (!want && !s.values.empty())
    bad(where, "KV key shift '", s.source, "' holds values, which ",
        s.source == "none" ? "an engine built with --kv-calib none" : "a tensor-parallel engine (its ranks hold them)",
        " does not");
}

}  // namespace

EngineContents engine_parse(const uint8_t* data, size_t size, std::shared_ptr<const void> owner,
                            const std::string& where, const EngineLoadOptions& options) {
  if (std::memcmp(data, kEngineMagic, std::min<size_t>(size, 8)) != 0 || size == 0)
    bad(where, "not a kiln engine file (no KILNENG magic); build one with `kiln build -m MODEL -o FILE.kiln`");
  if (size < kEngineHeaderSize)
    bad(where, "truncated: ", size, " bytes, shorter than the ", kEngineHeaderSize, "-byte header");
  EngineHeader h;
  std::memcpy(&h, data, sizeof h);
  if (h.format_version != kEngineFormatVersion)
    bad(where, "engine format version ", h.format_version, ", but this kiln reads version ", kEngineFormatVersion,
        "; rebuild the engine with this kiln's `kiln build`");
  if (h.header_size != kEngineHeaderSize || h.meta_offset != kEngineHeaderSize || h.meta_size == 0 ||
      h.meta_size > (uint64_t(1) << 40) || h.blob_offset % kEngineBlobAlignment ||
      h.blob_offset < h.meta_offset + h.meta_size || h.blob_size > (uint64_t(1) << 50))
    bad(where, "corrupt header (metadata at ", h.meta_offset, "+", h.meta_size, ", weights at ", h.blob_offset,
        "+", h.blob_size, ")");
  if (h.blob_offset + h.blob_size > size)
    bad(where, "truncated: the header says ", h.blob_offset + h.blob_size, " bytes, the file has ", size);
  if (h.blob_offset + h.blob_size < size)
    bad(where, "corrupt header: the weights end at ", h.blob_offset + h.blob_size, " but the file has ", size,
        " bytes");
  const uint8_t* meta = data + h.meta_offset;
  if (options.verify_checksum) {
    if (engine_meta_hash(h, meta) != h.meta_hash)
      bad(where, "metadata checksum mismatch: the file is corrupt (rebuild it)");
    if (blob_hash(data + h.blob_offset, h.blob_size) != h.blob_hash)
      bad(where, "weight checksum mismatch: the file is corrupt (rebuild it)");
  }
  // FlatBuffers wants its buffer aligned; a memory image (fuzzer) may not be.
  std::vector<uint64_t> aligned;
  if (reinterpret_cast<uintptr_t>(meta) % 8) {
    aligned.resize((h.meta_size + 7) / 8);
    std::memcpy(aligned.data(), meta, h.meta_size);
    meta = reinterpret_cast<const uint8_t*>(aligned.data());
  }
  flatbuffers::Verifier verifier(meta, h.meta_size);
  if (!fb::VerifyEngineBuffer(verifier)) bad(where, "metadata fails FlatBuffers verification (corrupt)");
  const fb::Engine* e = fb::GetEngine(meta);
  if (e->schema_version() != kEngineSchemaVersion)
    bad(where, "engine schema version ", e->schema_version(), ".", e->schema_minor(), ", this kiln reads ",
        kEngineSchemaVersion, ".x; rebuild the engine with this kiln's `kiln build`");
  // A newer minor only added fields this reader does not know; they are ignored.
  if (e->schema_minor() > kEngineSchemaMinor)
    log_info("engine '", where, "' has schema ", kEngineSchemaVersion, ".", e->schema_minor(), ", newer than this kiln's ",
             kEngineSchemaVersion, ".", kEngineSchemaMinor, ": fields added since are ignored");

  EngineContents out;
  out.schema_minor = e->schema_minor();
  out.info = read_model_info(e->model_info_json(), where, "model info");
  try {
    out.config = nlohmann::json::parse(str(e->config_json()));
  } catch (const nlohmann::json::exception& x) {
    bad(where, "config: ", x.what());
  }
  if (e->plugins())
    for (const fb::PluginRef* p : *e->plugins())
      out.plugins.push_back({str(p->name()), str(p->version()), str(p->library()), read_strings(p->ops())});
  if (e->tp_world() < 1 || e->tp_world() > uint32_t(kEngineMaxTensorParallel))
    bad(where, "tensor parallelism over ", e->tp_world(), " ranks (1 to ", kEngineMaxTensorParallel, " are valid)");
  out.tp_world = int(e->tp_world());
  const uint32_t num_ranks = e->ranks() ? e->ranks()->size() : 0;
  if (out.tp_world == 1) {
    if (num_ranks) bad(where, "holds ", num_ranks, " rank graphs but records no tensor parallelism (tp_world 1)");
    check_plugins_loaded(e->graph(), out.plugins, where);
    out.graph = read_graph(e->graph(), data + h.blob_offset, h.blob_size, owner, where);
    out.tactic_tables = read_tactic_tables(e->tactic_tables());
  } else {
    if (num_ranks != uint32_t(out.tp_world))
      bad(where, "records tensor parallelism over ", out.tp_world, " ranks but holds ", num_ranks, " rank graphs");
    if (e->graph()) bad(where, "a tensor-parallel engine holds per-rank graphs, yet it also has an unsharded one");
    if (!out.info.is_decoder) bad(where, "a tensor-parallel engine of an encoder (", out.info.family, ")");
    for (uint32_t r = 0; r < num_ranks; ++r) {
      const fb::Rank* fr = e->ranks()->Get(r);
      EngineRank rank;
      rank.info = read_model_info(fr->model_info_json(), where, str_cat("rank ", r, " model info"));
      check_plugins_loaded(fr->graph(), out.plugins, where);
      rank.graph = read_graph(fr->graph(), data + h.blob_offset, h.blob_size, owner, where, str_cat("rank ", r, ": "));
      rank.tactic_tables = read_tactic_tables(fr->tactic_tables());
      check_rank(rank, int(r), out.tp_world, out.info, where);
      out.ranks.push_back(std::move(rank));
    }
  }
  read_kv_key_shift(e, out, where);
  out.tokenizer.kind = str(e->tokenizer_kind());
  if (e->tokenizer_files())
    for (const fb::File* f : *e->tokenizer_files())
      out.tokenizer.files.emplace_back(
          str(f->name()), f->data() ? std::string(reinterpret_cast<const char*>(f->data()->data()), f->data()->size())
                                    : std::string());
  if (const fb::Build* b = e->build()) {
    out.build = {str(b->source()),       str(b->kiln_version()),        str(b->weight_dtype()),
                 b->opt_level(),         read_strings(b->disabled_passes()), read_strings(b->pass_report()),
                 b->build_seconds(),     read_strings(b->pin_precision()),   b->workspace_bytes()};
  }
  const std::string& wd = out.build.weight_dtype;
  if (wd != "f32" && wd != "bf16" && wd != "f16" && wd != "q8" && wd != "q4" && wd != "w8a8" && wd != "fp8")
    bad(where, "unknown weight dtype '", out.build.weight_dtype, "'");
  if (e->profiles())
    for (const fb::Profile* p : *e->profiles()) {
      EngineProfile profile{str(p->name()), {}, p->activation_bytes(), p->activation_slots()};
      for (auto& other : out.profiles)
        if (other.name == profile.name) bad(where, "two profiles are named '", profile.name, "'");
      if (p->dims())
        for (const fb::ProfileDim* d : *p->dims()) {
          if (d->min() < 0 || d->min() > d->opt() || d->opt() > d->max())
            bad(where, "profile '", str(p->name()), "' dim ", str(d->dim()), " has min/opt/max ", d->min(), "/",
                d->opt(), "/", d->max());
          profile.dims.push_back({str(d->dim()), d->min(), d->opt(), d->max()});
        }
      out.profiles.push_back(std::move(profile));
    }
  return out;
}

EngineContents engine_load(const std::string& path, const EngineLoadOptions& options) {
  auto file = MappedFile::open(path);
  EngineContents e = engine_parse(file->data(), file->size(), file, path, options);
  e.file = file;
  return e;
}

bool is_engine_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  return in.read(magic, 8) && std::memcmp(magic, kEngineMagic, 8) == 0;
}

nlohmann::json model_info_to_json(const ModelInfo& i) {
  return {{"family", i.family}, {"model_type", i.model_type}, {"is_decoder", i.is_decoder},
          {"vocab_size", i.vocab_size}, {"hidden_size", i.hidden_size}, {"num_layers", i.num_layers},
          {"num_heads", i.num_heads}, {"num_kv_heads", i.num_kv_heads}, {"head_dim", i.head_dim},
          {"max_positions", i.max_positions}, {"num_labels", i.num_labels}, {"bos_token_id", i.bos_token_id},
          {"eos_token_id", i.eos_token_id}, {"labels", i.labels}, {"pooling", i.pooling}};
}

ModelInfo model_info_from_json(const nlohmann::json& j) {
  ModelInfo i;
  i.family = j.at("family").get<std::string>();
  i.model_type = j.at("model_type").get<std::string>();
  i.is_decoder = j.at("is_decoder").get<bool>();
  for (auto [k, p] : {std::pair{"vocab_size", &i.vocab_size}, {"hidden_size", &i.hidden_size},
                      {"num_layers", &i.num_layers}, {"num_heads", &i.num_heads}, {"num_kv_heads", &i.num_kv_heads},
                      {"head_dim", &i.head_dim}, {"max_positions", &i.max_positions}, {"num_labels", &i.num_labels},
                      {"bos_token_id", &i.bos_token_id}, {"eos_token_id", &i.eos_token_id}}) {
    *p = j.at(k).get<int64_t>();
    if (*p < -1 || *p > (int64_t(1) << 40))
      throw_error(ErrorCode::kInvalidFile, "model info: ", k, " = ", *p, " is out of range");
  }
  i.labels = j.at("labels").get<std::vector<std::string>>();
  i.pooling = j.value("pooling", "mean");  // engines written before it was recorded pooled by mean
  // Decoders: "last" for embedding models, else none (engines written before decoders
  // could pool recorded the encoders' default, mean).
  if (i.is_decoder && i.pooling == "mean") i.pooling = "";
  const bool known = i.is_decoder ? i.pooling == "last" || i.pooling == "" : i.pooling == "mean" || i.pooling == "cls";
  if (!known)
    throw_error(ErrorCode::kInvalidFile, "model info: pooling '", i.pooling, "' (expected ",
                i.is_decoder ? "last or none for a decoder" : "mean or cls for an encoder", ")");
  return i;
}

}  // namespace kiln

// Plugin loading, the registry and the Plugin op's shape inference (see plugin.h).
// Nothing a plugin returns is trusted: table sizes, counts, ranks, dtypes and dims are
// checked before use, and a failure names the plugin file, the op and the node.
#include "ir/plugin.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "core/log.h"
#include "core/status.h"

namespace kiln::ir {

namespace {

// The v1 tables end here; a plugin's table may be longer (a newer header of ABI 1),
// never shorter.
constexpr size_t kLibraryV1Size = offsetof(kiln_plugin_library, ops) + sizeof(const kiln_plugin_op*);
constexpr size_t kOpV1Size = offsetof(kiln_plugin_op, execute_cuda) + sizeof(kiln_plugin_execute_cuda_fn);
constexpr int32_t kMaxOps = 4096;
constexpr int32_t kMaxPluginInputs = 1 << 16;
constexpr int32_t kMaxPluginOutputs = 1024;
constexpr size_t kErrorBufferSize = 1024;

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<PluginLibrary>> libraries;  // every library ever loaded (never freed)
  std::map<std::string, PluginLibrary*> by_path;
  std::vector<const PluginLibrary*> registered;           // load order
  std::map<std::pair<std::string, std::string>, const PluginOp*> ops;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: ops must outlive static graphs
  return *r;
}

[[noreturn]] void bad_table(const std::string& path, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "plugin '", path, "': ", what,
              " (see include/kiln/plugin.h for what a plugin table must hold)");
}

std::string c_str_or(const char* s, const char* fallback) { return s ? std::string(s) : std::string(fallback); }

std::string domain_label(const std::string& domain) { return domain.empty() ? "ai.onnx" : domain; }

// Registers every op of `lib`; throws (registering nothing) on a duplicate. Caller holds mu.
void register_ops(Registry& r, PluginLibrary& lib) {
  std::set<std::pair<std::string, std::string>> mine;
  for (const PluginOp& op : lib.ops) {
    auto key = std::make_pair(op.domain, op.name);
    if (!mine.insert(key).second)
      throw_error(ErrorCode::kInvalidArgument, "plugin '", lib.path, "' declares op ", op.qualified_name(), " twice");
    auto it = r.ops.find(key);
    if (it != r.ops.end())
      throw_error(ErrorCode::kInvalidArgument, "plugin '", lib.path, "' provides op ", op.qualified_name(),
                  ", which plugin ", it->second->origin(), " already provides; load only one of them");
  }
  for (const PluginLibrary* other : r.registered)
    if (other->name == lib.name)
      throw_error(ErrorCode::kInvalidArgument, "plugin '", lib.path, "' is named '", lib.name,
                  "' like the already loaded '", other->path, "'; load only one of them");
  for (const PluginOp& op : lib.ops) r.ops[{op.domain, op.name}] = &op;
  r.registered.push_back(&lib);
}

std::unique_ptr<PluginLibrary> read_table(const kiln_plugin_library* t, const std::string& path) {
  if (t->abi_version != KILN_PLUGIN_ABI_VERSION)
    throw_error(ErrorCode::kUnsupported, "plugin '", path, "' was built for kiln plugin ABI version ", t->abi_version,
                ", but this kiln loads ABI version ", KILN_PLUGIN_ABI_VERSION,
                ": rebuild the plugin against this kiln's include/kiln/plugin.h");
  if (t->struct_size < kLibraryV1Size)
    bad_table(path, str_cat("its library table is ", t->struct_size, " bytes, ABI ", KILN_PLUGIN_ABI_VERSION,
                            " tables have at least ", kLibraryV1Size));
  auto lib = std::make_unique<PluginLibrary>();
  lib->path = path;
  lib->file = std::filesystem::path(path).filename().string();
  lib->abi_version = t->abi_version;
  lib->name = c_str_or(t->name, "");
  lib->version = c_str_or(t->version, "");
  if (lib->name.empty()) bad_table(path, "the library table has no name");
  if (t->num_ops < 1 || t->num_ops > kMaxOps)
    bad_table(path, str_cat("num_ops is ", t->num_ops, ", expected 1..", kMaxOps));
  if (!t->ops) bad_table(path, "ops is NULL");
  if (t->op_size < kOpV1Size)
    bad_table(path, str_cat("op_size is ", t->op_size, ", ABI ", KILN_PLUGIN_ABI_VERSION, " ops have at least ",
                            kOpV1Size, " bytes"));
  for (int32_t i = 0; i < t->num_ops; ++i) {
    PluginOp op;
    // Read by the plugin's stride; fields this kiln does not know are ignored, fields
    // an older plugin lacks stay zero.
    std::memcpy(&op.table, reinterpret_cast<const char*>(t->ops) + size_t(i) * t->op_size,
                std::min<size_t>(t->op_size, sizeof(kiln_plugin_op)));
    const kiln_plugin_op& o = op.table;
    op.name = c_str_or(o.name, "");
    op.domain = plugin_domain_normalize(c_str_or(o.domain, ""));
    op.doc = c_str_or(o.doc, "");
    const std::string where = str_cat("op #", i, " (", op.name.empty() ? "unnamed" : op.name, ")");
    if (op.name.empty()) bad_table(path, where + " has no name");
    if (o.min_inputs < 0 || o.max_inputs < o.min_inputs || o.max_inputs > kMaxPluginInputs)
      bad_table(path, str_cat(where, " takes ", o.min_inputs, "..", o.max_inputs, " inputs"));
    if (o.max_outputs < 1 || o.max_outputs > kMaxPluginOutputs)
      bad_table(path, str_cat(where, " has max_outputs ", o.max_outputs, ", expected 1..", kMaxPluginOutputs));
    if (!o.infer) bad_table(path, where + " has no infer callback");
    if (!o.execute_cpu && !o.execute_cuda) bad_table(path, where + " has neither a CPU nor a CUDA execute callback");
    lib->ops.push_back(std::move(op));
  }
  for (PluginOp& op : lib->ops) op.library = lib.get();
  return lib;
}

const Attr* find_plugin_attr(const kiln_plugin_attrs* a, const char* name) noexcept {
  if (!a || !a->impl || !name) return nullptr;
  if (!std::strcmp(name, kPluginOpAttr) || !std::strcmp(name, kPluginDomainAttr)) return nullptr;
  try {
    const Node& n = *static_cast<const Node*>(a->impl);
    auto it = n.attrs.find(name);
    return it == n.attrs.end() ? nullptr : &it->second;
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

// The attribute lookups a plugin calls: C linkage, never throw.
extern "C" {
static int32_t kiln_attr_get_int(const kiln_plugin_attrs* a, const char* name, int64_t* out) {
  const Attr* v = find_plugin_attr(a, name);
  if (!v) return KILN_PLUGIN_ATTR_ABSENT;
  auto p = std::get_if<int64_t>(v);
  if (!p) return KILN_PLUGIN_ATTR_WRONG_TYPE;
  if (out) *out = *p;
  return KILN_PLUGIN_ATTR_FOUND;
}
static int32_t kiln_attr_get_float(const kiln_plugin_attrs* a, const char* name, double* out) {
  const Attr* v = find_plugin_attr(a, name);
  if (!v) return KILN_PLUGIN_ATTR_ABSENT;
  if (auto p = std::get_if<double>(v)) {
    if (out) *out = *p;
  } else if (auto q = std::get_if<int64_t>(v)) {
    if (out) *out = double(*q);
  } else {
    return KILN_PLUGIN_ATTR_WRONG_TYPE;
  }
  return KILN_PLUGIN_ATTR_FOUND;
}
static int32_t kiln_attr_get_string(const kiln_plugin_attrs* a, const char* name, const char** s, size_t* len) {
  const Attr* v = find_plugin_attr(a, name);
  if (!v) return KILN_PLUGIN_ATTR_ABSENT;
  auto p = std::get_if<std::string>(v);
  if (!p) return KILN_PLUGIN_ATTR_WRONG_TYPE;
  if (s) *s = p->c_str();
  if (len) *len = p->size();
  return KILN_PLUGIN_ATTR_FOUND;
}
static int32_t kiln_attr_get_ints(const kiln_plugin_attrs* a, const char* name, const int64_t** out, size_t* count) {
  const Attr* v = find_plugin_attr(a, name);
  if (!v) return KILN_PLUGIN_ATTR_ABSENT;
  auto p = std::get_if<std::vector<int64_t>>(v);
  if (!p) return KILN_PLUGIN_ATTR_WRONG_TYPE;
  if (out) *out = p->data();
  if (count) *count = p->size();
  return KILN_PLUGIN_ATTR_FOUND;
}
static int32_t kiln_attr_get_floats(const kiln_plugin_attrs* a, const char* name, const double** out, size_t* count) {
  const Attr* v = find_plugin_attr(a, name);
  if (!v) return KILN_PLUGIN_ATTR_ABSENT;
  auto p = std::get_if<std::vector<double>>(v);
  if (!p) return KILN_PLUGIN_ATTR_WRONG_TYPE;
  if (out) *out = p->data();
  if (count) *count = p->size();
  return KILN_PLUGIN_ATTR_FOUND;
}
}  // extern "C"

std::string PluginOp::qualified_name() const { return domain.empty() ? name : domain + "::" + name; }

std::string PluginOp::origin() const {
  return library ? str_cat("'", library->name, "' ", library->version, " (", library->file, ")") : "(none)";
}

std::string plugin_domain_normalize(std::string_view domain) {
  return domain == "ai.onnx" ? std::string() : std::string(domain);
}

const PluginLibrary& plugin_load(const std::string& path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec))
    throw_error(ErrorCode::kNotFound, "plugin '", path, "': no such file (--plugin FILE / KILN_PLUGINS name the "
                "plugin's shared library, e.g. libexample_ops.so)");
  if (std::filesystem::is_directory(path, ec))
    throw_error(ErrorCode::kInvalidArgument, "plugin '", path, "' is a directory, not a shared library");
  const std::string canon = std::filesystem::canonical(path, ec).string();
  const std::string key = ec ? path : canon;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (auto it = r.by_path.find(key); it != r.by_path.end()) {
    PluginLibrary& lib = *it->second;
    if (std::find(r.registered.begin(), r.registered.end(), &lib) == r.registered.end()) register_ops(r, lib);
    return lib;
  }
  void* handle = dlopen(key.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw_error(ErrorCode::kInvalidFile, "plugin '", path, "' cannot be loaded: ", why ? why : "dlopen failed");
  }
  std::unique_ptr<PluginLibrary> lib;
  try {
    dlerror();
    auto get = reinterpret_cast<kiln_plugin_get_fn>(dlsym(handle, KILN_PLUGIN_ENTRY_POINT));
    if (!get)
      throw_error(ErrorCode::kInvalidFile, "plugin '", path, "' does not export ", KILN_PLUGIN_ENTRY_POINT,
                  "(): not a kiln plugin. A plugin defines `KILN_PLUGIN_EXPORT const kiln_plugin_library* ",
                  KILN_PLUGIN_ENTRY_POINT, "(uint32_t host_abi_version)` with C linkage (include/kiln/plugin.h)");
    const kiln_plugin_library* table = get(KILN_PLUGIN_ABI_VERSION);
    if (!table)
      throw_error(ErrorCode::kUnsupported, "plugin '", path, "' declines kiln plugin ABI version ",
                  KILN_PLUGIN_ABI_VERSION, " (", KILN_PLUGIN_ENTRY_POINT,
                  " returned NULL): rebuild it against this kiln's include/kiln/plugin.h");
    lib = read_table(table, key);
    register_ops(r, *lib);
  } catch (...) {
    // Nothing refers to a library that failed to load.
    if (lib) {
      for (auto it = r.registered.begin(); it != r.registered.end(); ++it)
        if (*it == lib.get()) {
          r.registered.erase(it);
          break;
        }
    }
    dlclose(handle);
    throw;
  }
  std::string names;
  for (auto& op : lib->ops) names += (names.empty() ? "" : ", ") + op.qualified_name();
  log_info("plugin: loaded '", lib->name, "' ", lib->version, " from ", key, ": ", names);
  PluginLibrary& out = *lib;
  r.by_path[key] = lib.get();
  r.libraries.push_back(std::move(lib));
  return out;
}

std::vector<std::string> plugin_paths_from_env() {
  std::vector<std::string> paths;
  const char* env = std::getenv("KILN_PLUGINS");
  if (!env) return paths;
  std::string s = env;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(':', pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) paths.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return paths;
}

std::vector<const PluginLibrary*> plugin_load_all(const std::vector<std::string>& paths) {
  std::vector<const PluginLibrary*> out;
  for (auto& p : paths) out.push_back(&plugin_load(p));
  for (auto& p : plugin_paths_from_env()) {
    try {
      out.push_back(&plugin_load(p));
    } catch (const Error& e) {
      throw Error(e.code(), str_cat("KILN_PLUGINS: ", e.what()));
    }
  }
  return out;
}

bool plugin_unregister(const std::string& library_name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.registered.begin(); it != r.registered.end(); ++it) {
    if ((*it)->name != library_name) continue;
    for (const PluginOp& op : (*it)->ops) r.ops.erase({op.domain, op.name});
    r.registered.erase(it);
    return true;
  }
  return false;
}

const PluginOp* plugin_find_op(std::string_view domain, std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ops.find({plugin_domain_normalize(domain), std::string(name)});
  return it == r.ops.end() ? nullptr : it->second;
}

std::vector<const PluginLibrary*> plugin_libraries() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.registered;
}

std::string plugin_missing_message(const std::string& domain, const std::string& op) {
  std::string loaded;
  for (const PluginLibrary* lib : plugin_libraries())
    loaded += str_cat(loaded.empty() ? "" : ", ", "'", lib->name, "' (", lib->file, ")");
  const std::string d = plugin_domain_normalize(domain);
  return str_cat("op ", d.empty() ? op : d + "::" + op, " (domain '", domain_label(d),
                 "') comes from a plugin that is not loaded: pass --plugin FILE (or set KILN_PLUGINS=path1:path2) "
                 "with the plugin library that provides it (loaded plugins: ",
                 loaded.empty() ? "none" : loaded, ")");
}

const PluginOp& plugin_op_of(const Node& n) {
  const std::string op = n.attr_str(kPluginOpAttr);
  const std::string domain = n.attr_str(kPluginDomainAttr, "");
  if (const PluginOp* p = plugin_find_op(domain, op)) return *p;
  throw_error(ErrorCode::kUnsupported, "node '", n.name, "': ", plugin_missing_message(domain, op));
}

PluginAttrs::PluginAttrs(const Node& node) : node_(&node) {
  attrs_.impl = node_;
  attrs_.get_int = kiln_attr_get_int;
  attrs_.get_float = kiln_attr_get_float;
  attrs_.get_string = kiln_attr_get_string;
  attrs_.get_ints = kiln_attr_get_ints;
  attrs_.get_floats = kiln_attr_get_floats;
}

uint32_t plugin_dtype(DType t) {
  switch (t) {
    case DType::kF32: return KILN_PLUGIN_F32;
    case DType::kF16: return KILN_PLUGIN_F16;
    case DType::kBF16: return KILN_PLUGIN_BF16;
    case DType::kI8: return KILN_PLUGIN_I8;
    case DType::kFP8E4M3: return KILN_PLUGIN_FP8E4M3;
    case DType::kI32: return KILN_PLUGIN_I32;
    case DType::kI64: return KILN_PLUGIN_I64;
    case DType::kU8: return KILN_PLUGIN_U8;
  }
  KILN_CHECK(false, "unknown dtype ", int(t));
}

std::optional<DType> dtype_from_plugin(uint32_t code) {
  switch (code) {
    case KILN_PLUGIN_F32: return DType::kF32;
    case KILN_PLUGIN_F16: return DType::kF16;
    case KILN_PLUGIN_BF16: return DType::kBF16;
    case KILN_PLUGIN_I8: return DType::kI8;
    case KILN_PLUGIN_FP8E4M3: return DType::kFP8E4M3;
    case KILN_PLUGIN_I32: return DType::kI32;
    case KILN_PLUGIN_I64: return DType::kI64;
    case KILN_PLUGIN_U8: return DType::kU8;
    default: return std::nullopt;
  }
}

namespace {

std::string node_label(const PluginOp& op, const Node& n) {
  return str_cat("node '", n.name, "' (Plugin ", op.qualified_name(), " of plugin ", op.origin(), ")");
}

[[noreturn]] void infer_error(const PluginOp& op, const Node& n, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, node_label(op, n), ": ", what);
}

void check_input_count(const PluginOp& op, const Node& n, size_t count) {
  if (int64_t(count) < op.table.min_inputs || int64_t(count) > op.table.max_inputs)
    infer_error(op, n, str_cat("takes ", op.table.min_inputs, "..", op.table.max_inputs, " inputs, got ", count));
}

// Calls the plugin's infer and checks its answer: an output count in [1, max_outputs]
// (and, once the node exists, its own count), ranks, dtypes, and dims that are known
// or one of the inputs' symbols.
std::vector<kiln_plugin_type> call_infer(const PluginOp& op, const Node& n, const PluginAttrs& attrs,
                                         const std::vector<kiln_plugin_type>& in, const std::set<int64_t>& symbols) {
  const int32_t max_out = op.table.max_outputs;
  std::vector<kiln_plugin_type> out(static_cast<size_t>(max_out));
  for (auto& t : out) std::memset(&t, 0, sizeof t);
  int32_t count = max_out;
  char err[kErrorBufferSize] = {};
  const int32_t st = op.table.infer(op.table.user, in.empty() ? nullptr : in.data(), int32_t(in.size()), attrs.get(),
                                    out.data(), &count, err, sizeof err);
  err[sizeof err - 1] = '\0';
  if (st != KILN_PLUGIN_OK) plugin_callback_failed(op, n, "shape inference", st, err);
  if (count < 1 || count > max_out)
    infer_error(op, n, str_cat("shape inference returned ", count, " outputs, the op declares 1..", max_out,
                               " (a plugin bug)"));
  if (!n.outputs.empty() && size_t(count) != n.outputs.size())
    infer_error(op, n, str_cat("shape inference returned ", count, " outputs, the node has ", n.outputs.size(),
                               " (a plugin bug: the count must depend on attributes only)"));
  out.resize(size_t(count));
  for (size_t o = 0; o < out.size(); ++o) {
    const kiln_plugin_type& t = out[o];
    if (!dtype_from_plugin(t.dtype))
      infer_error(op, n, str_cat("shape inference gave output ", o, " the unknown dtype code ", t.dtype,
                                 " (a plugin bug)"));
    if (t.rank > KILN_PLUGIN_MAX_RANK)
      infer_error(op, n, str_cat("shape inference gave output ", o, " rank ", t.rank, ", more than ",
                                 KILN_PLUGIN_MAX_RANK, " (a plugin bug)"));
    for (uint32_t d = 0; d < t.rank; ++d)
      if (t.dims[d] < 0 && !symbols.count(t.dims[d]))
        infer_error(op, n, str_cat("shape inference gave output ", o, " dim ", d, " = ", t.dims[d],
                                   symbols.empty() ? ", negative while every input dim is known"
                                                   : ", negative but not one of the inputs' symbolic dims",
                                   " (a plugin bug)"));
  }
  return out;
}

kiln_plugin_type absent_type() {
  kiln_plugin_type t;
  std::memset(&t, 0, sizeof t);
  t.dtype = KILN_PLUGIN_ABSENT;
  return t;
}

// Graph-time inference: symbolic dims travel as negative ids (equal symbols, equal
// ids; every unknown "?" its own id) and come back as the same Dim.
std::vector<ValueType> infer_plugin(const Node& n, const std::vector<const Value*>& in) {
  const PluginOp& op = plugin_op_of(n);
  check_input_count(op, n, in.size());
  std::map<std::string, int64_t> sym_ids;
  std::map<int64_t, Dim> sym_dims;
  std::set<int64_t> symbols;
  std::vector<kiln_plugin_type> types;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i]) {
      types.push_back(absent_type());
      continue;
    }
    const Value& v = *in[i];
    if (v.shape.rank() > KILN_PLUGIN_MAX_RANK)
      infer_error(op, n, str_cat("input ", i, " %", v.name, " has rank ", v.shape.rank(), "; plugins take at most ",
                                 KILN_PLUGIN_MAX_RANK));
    kiln_plugin_type t = absent_type();
    t.dtype = plugin_dtype(v.dtype);
    t.rank = uint32_t(v.shape.rank());
    for (size_t d = 0; d < v.shape.rank(); ++d) {
      const Dim& dim = v.shape[d];
      if (dim.is_concrete()) {
        t.dims[d] = dim.value;
        continue;
      }
      int64_t id;
      if (dim.sym == "?") {
        id = -int64_t(sym_dims.size()) - 1;
      } else {
        auto it = sym_ids.find(dim.sym);
        id = it != sym_ids.end() ? it->second : -int64_t(sym_dims.size()) - 1;
        sym_ids[dim.sym] = id;
      }
      sym_dims.emplace(id, dim);
      symbols.insert(id);
      t.dims[d] = id;
    }
    types.push_back(t);
  }
  PluginAttrs attrs(n);
  std::vector<ValueType> out;
  for (const kiln_plugin_type& t : call_infer(op, n, attrs, types, symbols)) {
    Shape s;
    for (uint32_t d = 0; d < t.rank; ++d) s.push_back(t.dims[d] < 0 ? sym_dims.at(t.dims[d]) : Dim(t.dims[d]));
    out.push_back({*dtype_from_plugin(t.dtype), s});
  }
  return out;
}

}  // namespace

std::vector<PluginTensorType> plugin_infer_concrete(const PluginOp& op, const Node& n, const PluginAttrs& attrs,
                                                    const std::vector<std::optional<PluginTensorType>>& inputs) {
  check_input_count(op, n, inputs.size());
  std::vector<kiln_plugin_type> types;
  for (size_t i = 0; i < inputs.size(); ++i) {
    kiln_plugin_type t = absent_type();
    if (inputs[i]) {
      if (inputs[i]->dims.size() > KILN_PLUGIN_MAX_RANK)
        infer_error(op, n, str_cat("input ", i, " has rank ", inputs[i]->dims.size(), "; plugins take at most ",
                                   KILN_PLUGIN_MAX_RANK));
      t.dtype = plugin_dtype(inputs[i]->dtype);
      t.rank = uint32_t(inputs[i]->dims.size());
      std::copy(inputs[i]->dims.begin(), inputs[i]->dims.end(), t.dims);
    }
    types.push_back(t);
  }
  std::vector<PluginTensorType> out;
  for (const kiln_plugin_type& t : call_infer(op, n, attrs, types, {}))
    out.push_back({*dtype_from_plugin(t.dtype), std::vector<int64_t>(t.dims, t.dims + t.rank)});
  return out;
}

void plugin_callback_failed(const PluginOp& op, const Node& n, const char* callback, int32_t status,
                            const char* message) {
  const std::string msg = message && *message ? message : "(the plugin gave no message)";
  const char* kind = status == KILN_PLUGIN_UNSUPPORTED ? "unsupported" : status == KILN_PLUGIN_ERROR ? "error"
                                                                                                   : "failed";
  throw_error(status == KILN_PLUGIN_UNSUPPORTED ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument,
              node_label(op, n), ": ", callback, " ", kind, " (status ", status, "): ", msg);
}

OpSchema plugin_op_schema() {
  return {kPluginOp, 0, kMaxPluginInputs, {kPluginOpAttr},
          "a custom op from a plugin library (attrs plugin_op, plugin_domain and the ONNX node's own); shapes "
          "and execution come from the plugin (include/kiln/plugin.h)",
          infer_plugin};
}

}  // namespace kiln::ir

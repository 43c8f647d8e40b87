// Custom ops from plugin libraries (the C ABI in include/kiln/plugin.h): loading with
// dlopen and checking the table, one process-wide registry of (domain, op) -> op, and
// the generic `Plugin` IR op whose shape inference calls the plugin. Backends run
// Plugin nodes through the callbacks (backends/cpu/cpu_plugin_op.cpp). Libraries stay
// mapped for the life of the process (graphs and compiled graphs refer to their ops).
// Tested in tests/plugins/plugin_test.cpp with examples/plugins/ and test plugins.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/op_registry.h"
#include "kiln/plugin.h"

namespace kiln::ir {

// The IR op of every plugin node and its reserved attributes; every other attribute
// is the ONNX node's own, handed to the plugin.
constexpr const char* kPluginOp = "Plugin";
constexpr const char* kPluginOpAttr = "plugin_op";
constexpr const char* kPluginDomainAttr = "plugin_domain";

struct PluginLibrary;

// One op a loaded plugin provides.
struct PluginOp {
  std::string domain;  // normalized: "" is ONNX's default domain
  std::string name;    // the ONNX op_type
  std::string doc;
  kiln_plugin_op table{};  // the library's entry, zero-extended to this kiln's struct
  const PluginLibrary* library = nullptr;
  // "com.example::ScaledSoftplus" ("ScaledSoftplus" in the default domain).
  std::string qualified_name() const;
  // "'example-ops' 1.0.0 (libexample_ops.so)", for messages.
  std::string origin() const;
};

struct PluginLibrary {
  std::string path;  // canonical path as loaded
  std::string file;  // its file name, as engines record it
  std::string name, version;
  uint32_t abi_version = 0;
  std::vector<PluginOp> ops;
};

// "ai.onnx" -> "": both name ONNX's default domain.
std::string plugin_domain_normalize(std::string_view domain);

// Loads a plugin library and registers its ops; loading a path already loaded returns
// the same library. Throws kiln::Error: kNotFound for a missing file, kInvalidFile for
// a file dlopen refuses or without the kiln_plugin_get entry point, kUnsupported for
// another ABI version (or a plugin that declines this kiln), kInvalidArgument for a
// malformed table or an op another loaded plugin already provides. Thread-safe.
const PluginLibrary& plugin_load(const std::string& path);
// The entries of KILN_PLUGINS (':'-separated paths; empty entries skipped).
std::vector<std::string> plugin_paths_from_env();
// Loads `paths`, then KILN_PLUGINS' paths (the CLI's --plugin and the environment).
std::vector<const PluginLibrary*> plugin_load_all(const std::vector<std::string>& paths);
// Takes a library's ops out of the registry (graphs built since no longer find them);
// the library stays mapped and plugin_load(path) registers it again. False when no
// library of that name is registered.
bool plugin_unregister(const std::string& library_name);

// The registered op, or null.
const PluginOp* plugin_find_op(std::string_view domain, std::string_view name);
// The loaded (registered) libraries, in load order.
std::vector<const PluginLibrary*> plugin_libraries();
// The op a Plugin node calls; throws kUnsupported naming the node, op and domain and
// saying to pass --plugin FILE (or KILN_PLUGINS) when no loaded plugin provides it.
const PluginOp& plugin_op_of(const Node& n);
// The message of a plugin op that is not loaded ("op X (domain D) ... --plugin FILE").
std::string plugin_missing_message(const std::string& domain, const std::string& op);

// A node's attributes as the plugin sees them (reserved ones hidden); valid while the
// node lives and is not modified.
class PluginAttrs {
 public:
  explicit PluginAttrs(const Node& node);
  PluginAttrs(const PluginAttrs&) = delete;
  PluginAttrs& operator=(const PluginAttrs&) = delete;
  const kiln_plugin_attrs* get() const { return &attrs_; }

 private:
  kiln_plugin_attrs attrs_{};
  const Node* node_;
};

uint32_t plugin_dtype(DType t);
// kiln's dtype of an ABI dtype code; nullopt for an unknown code.
std::optional<DType> dtype_from_plugin(uint32_t code);

// A concrete tensor type at run time; nullopt input = absent optional input.
struct PluginTensorType {
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;
};
// Runs the op's inference on known shapes (before every execution) with the checks of
// graph-time inference; throws kInvalidArgument naming the node and plugin on a
// failure or a bad answer.
std::vector<PluginTensorType> plugin_infer_concrete(const PluginOp& op, const Node& n, const PluginAttrs& attrs,
                                                    const std::vector<std::optional<PluginTensorType>>& inputs);
// Turns a callback's non-OK status into a kiln::Error naming the node, op, plugin and
// callback, with the plugin's message.
[[noreturn]] void plugin_callback_failed(const PluginOp& op, const Node& n, const char* callback, int32_t status,
                                         const char* message);

// The Plugin op's schema (registered in op_registry.cpp).
OpSchema plugin_op_schema();

}  // namespace kiln::ir

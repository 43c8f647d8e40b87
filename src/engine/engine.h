// The engine file: everything needed to run a model, built once by `kiln build`.
// Layout: a 64-byte header (magic, format version, section offsets, checksums), the
// FlatBuffers metadata (engine.fbs: the optimized graph, or one sharded graph per rank
// for a tensor-parallel engine; model config and info, the tokenizer, build options,
// profiles, per-device tactic tables), then one 64-byte-aligned weight blob. Loading
// is an mmap; weights are used in place. Nothing read is trusted: every offset, size,
// index and shape is checked and a bad file is a kiln::Error (kInvalidFile) saying
// what is wrong. Tested in tests/engine/ (tensor-parallel engines in
// tp_engine_test.cpp) and fuzzed by fuzz/engine_load_fuzz.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/mapped_file.h"
#include "ir/graph.h"
#include "models/model_builder.h"

namespace kiln {

constexpr char kEngineMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};
constexpr uint32_t kEngineFormatVersion = 1;  // the header layout
constexpr uint32_t kEngineSchemaVersion = 1;  // the FlatBuffers contents (major: incompatible changes)
// Additive changes a 1.x reader may ignore. 1: several named profiles, each with its
// planned activation arena; precision pins and the workspace limit in the build info.
// 2: the plugin libraries the graph's Plugin nodes need. 3: tensor-parallel engines
// (every rank's sharded graph in one file; see EngineContents::ranks). 4: the KV cache's
// key shift measured at build (EngineKvKeyShift).
constexpr uint32_t kEngineSchemaMinor = 4;
// The most ranks an engine may record (a sanity bound on untrusted files; `--tp`'s range).
constexpr int kEngineMaxTensorParallel = 64;
constexpr size_t kEngineHeaderSize = 64;
constexpr size_t kEngineBlobAlignment = 64;

struct EngineProfileDim {
  std::string dim;  // symbolic dim ("T")
  int64_t min = 1, opt = 1, max = 1;
};

// An optimization profile (TensorRT's min/opt/max per dynamic dim).
struct EngineProfile {
  std::string name;
  std::vector<EngineProfileDim> dims;
  // The activation arena at the max shapes (0 in engines older than schema 1.1).
  uint64_t activation_bytes = 0;
  uint32_t activation_slots = 0;
};

struct EngineTactic {
  std::string node, tactic;
  double seconds = 0;
};

struct EngineTacticTable {
  std::string device;
  std::vector<EngineTactic> tactics;
};

struct EngineBuildInfo {
  std::string source, kiln_version, weight_dtype = "f32";
  int opt_level = 2;
  std::vector<std::string> disabled_passes, pass_report;
  double build_seconds = 0;
  std::vector<std::string> pin_precision;  // "lm_head=f32", as given
  uint64_t workspace_bytes = 0;            // 0: no limit
};

// A plugin library an engine needs (its Plugin nodes call these ops).
struct EnginePlugin {
  std::string name, version;
  std::string library;  // file name at build time
  std::vector<std::string> ops;  // "com.example::ScaledSoftplus"
};

struct EngineTokenizer {
  std::string kind;  // "" | "hf" | "gguf"
  std::vector<std::pair<std::string, std::string>> files;  // name -> bytes
};

// The int8/fp8 KV cache's key shift measured at build (schema 1.4; KvLayout::k_shift,
// runtime/kv_calibration.h). Not recorded: the build measured none (an older engine, or
// no tokenizer to read calibration text), and a quantized cache measures it at load.
struct EngineKvKeyShift {
  bool recorded = false;
  std::string source;   // what it was measured on; "none": built with --kv-calib none
  uint32_t tokens = 0;  // calibration tokens
  // [layers, kv heads, head_dim]; empty for "none" and in a tensor-parallel engine,
  // whose ranks hold their own (EngineRank::kv_key_shift).
  std::vector<float> values;
};

// One rank of a tensor-parallel engine (schema 1.3): its shard, already sharded and
// optimized (parallel/tensor_parallel.h, then the passes), with its AllReduce nodes.
struct EngineRank {
  ModelInfo info;  // this rank's share: num_heads and num_kv_heads per rank
  ir::Graph graph;
  std::vector<EngineTacticTable> tactic_tables;
  std::vector<float> kv_key_shift;  // this rank's [layers, kv heads, head_dim] (when recorded and not "none")
};

// What an engine holds; the builder fills it, the loader returns it.
struct EngineContents {
  uint32_t schema_minor = kEngineSchemaMinor;  // as read (loaded engines); written: always ours
  // tp_world == 1: `graph` (and `tactic_tables`) are the model. tp_world > 1: `ranks`
  // holds every rank's graph, rank r at index r, `graph` and `tactic_tables` are empty,
  // and `info` is the unsharded model's. Profiles (their activation arena: the largest
  // of any rank's), config, tokenizer and build info are shared by the ranks.
  int tp_world = 1;
  std::vector<EngineRank> ranks;
  ir::Graph graph;
  ModelInfo info;
  nlohmann::json config;
  EngineTokenizer tokenizer;
  EngineBuildInfo build;
  std::vector<EngineProfile> profiles;
  std::vector<EngineTacticTable> tactic_tables;
  // As read (loaded engines). The writer ignores it and records the plugins of the
  // graph's own Plugin nodes (engine_plugins_of).
  std::vector<EnginePlugin> plugins;
  EngineKvKeyShift kv_key_shift;
  std::shared_ptr<const MappedFile> file;  // keeps mmap'd weights alive (loaded engines)
};

// The loaded plugin libraries the graph's Plugin nodes call, with the ops each provides
// to it; throws kUnsupported when a node's plugin is not loaded.
std::vector<EnginePlugin> engine_plugins_of(const ir::Graph& g);
// The graphs an engine runs: `graph`, or every rank's for a tensor-parallel engine.
std::vector<const ir::Graph*> engine_graphs(const EngineContents& e);

// Writes `e` to `path` (atomically: a temp file renamed into place). Returns bytes written.
// A tensor-parallel engine's ranks share one blob: a tensor replicated on every rank
// (embeddings, norms, LM head) is stored once, found by its contents.
size_t engine_write(const std::string& path, const EngineContents& e);

struct EngineLoadOptions {
  bool verify_checksum = true;  // the fuzzer turns this off to reach the parser
};
// A Plugin node whose plugin is not loaded is kUnsupported naming the node, op, domain
// and the plugin the engine was built with, and saying to pass --plugin FILE.
EngineContents engine_load(const std::string& path, const EngineLoadOptions& options = {});
// Parses an engine image already in memory; `owner` keeps `data` alive for the weight views.
EngineContents engine_parse(const uint8_t* data, size_t size, std::shared_ptr<const void> owner,
                            const std::string& where, const EngineLoadOptions& options = {});
// True when `path` starts with the engine magic (a cheap sniff for Model::load).
bool is_engine_file(const std::string& path);

// ModelInfo <-> JSON, as stored in the engine.
nlohmann::json model_info_to_json(const ModelInfo& info);
ModelInfo model_info_from_json(const nlohmann::json& j);

}  // namespace kiln

// The host-side half of the GEMM tactic search (gemm.h: Gemm::set_search): a cuBLASLt
// algorithm configuration as plain numbers with a text form, and the tactic cache file
// that keeps what a search chose, so later processes on the same device and cuBLASLt
// take it without timing anything. No CUDA in here: tested without a GPU
// (tests/backends/cuda/gemm_search_test.cpp).
//
// What it found on the H200 (bench/cuda_gemm_search_bench.cpp; bench/RESULTS.md,
// 2026-12-02 session 27): timed alone, configurations outside the heuristic's first 8 ran
// Llama-3.1-8B's batch-256 decode GEMMs 5-9% faster (gate|up 256 x 28672 x 4096: a
// 224 x 128 tile, 128 + 128 CTAs, 92.6 -> 87.8 us) and BERT-base's batch-32 ones 2-8%. Inside
// the model's steps the gain did not hold (the 8B batch-256 decode step 9.25 vs 9.31 ms,
// BERT-base batch 32 1.79 vs 1.86 ms: the down projection's pick was 6% slower there than
// the heuristic's), so the search stays off by default.
//
// The cache: a JSON file, {"version": 1, "devices": {DEVICE: {KEY: {"algo": CONFIG, "us":
// t}}}} with DEVICE naming the GPU, its SM count and the cuBLASLt version (a choice is only
// reused where it was timed), KEY a plan's types, row count and shape (gemm_cache_key) and
// CONFIG GemmAlgoConfig's text. A file that does not parse is set aside with a warning and
// a new one started; an entry that does not parse, or that cuBLASLt no longer accepts, is
// ignored (the plan is timed again and the entry replaced).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "backends/cuda/ops/gemm_row_tuning.h"

namespace kiln::cuda {

// cuBLASLt's CUBLASLT_ALGO_CONFIG_* attributes of one algorithm.
struct GemmAlgoConfig {
  int32_t id = 0;
  uint32_t tile = 0, stages = 0;
  int32_t splitk = 1;
  uint32_t reduction = 0, swizzle = 0, custom = 0;
  uint16_t cluster = 0, inner = 0;
  bool operator==(const GemmAlgoConfig&) const = default;
  // "algo=66 tile=221 stages=35 splitk=1 reduction=0 swizzle=0 custom=4 cluster=3 inner=0"
  std::string str() const;
  // The inverse of str(); nullopt unless every field is there once, in range, and nothing else is.
  static std::optional<GemmAlgoConfig> parse(std::string_view s);
};

// KILN_CUDA_GEMM_SEARCH's value: unset, empty or "0" keeps the heuristic's candidates
// (the default: a search costs ~0.1-2 s per shape and row count), "1" adds a search's;
// anything else is an error naming the variable.
bool gemm_search_from_value(const char* v);

// A plan's cache key: "bf16>bf16 m=256 n=28672 k=4096 ldy=28672" (+ " bias", + " fast-accum"
// for FP8 plans that use it).
std::string gemm_cache_key(const GemmShape& shape, int64_t m, bool fp8_fast_accum);

class GemmTacticCache {
 public:
  struct Entry {
    GemmAlgoConfig algo;
    double us = 0;
  };
  // Reads `path` if it exists (empty: no file, nothing is kept); device: this process's
  // DEVICE string.
  GemmTacticCache(std::string path, std::string device);
  const std::string& path() const { return path_; }
  std::optional<Entry> find(const std::string& key) const;
  // The entries for `device` in a cache file's text, the whole document in *doc (may be
  // null); throws kiln::Error (kInvalidArgument) when the text is not a version-1 cache.
  // Malformed entries are skipped and counted in *bad (may be null).
  static std::map<std::string, Entry> parse(std::string_view text, const std::string& device, nlohmann::json* doc,
                                            size_t* bad);
  // Records an entry and rewrites the file (through a temporary file and a rename, so a
  // reader never sees half of it). A write that fails is a warning, not an error.
  void put(const std::string& key, const Entry& e);
  size_t size() const { return entries_.size(); }

 private:
  void save() const;
  std::string path_, device_;
  std::map<std::string, Entry> entries_;  // this device's, as parsed
  nlohmann::json doc_;                    // the whole file (other devices' entries kept as they were)
};

}  // namespace kiln::cuda

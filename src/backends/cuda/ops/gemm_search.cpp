// GEMM tactic search, host side (see gemm_search.h).
#include "backends/cuda/ops/gemm_search.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>
#include <type_traits>

#include <unistd.h>

#include "core/dtype.h"
#include "core/env_switch.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace kiln::cuda {

std::string GemmAlgoConfig::str() const {
  char b[192];
  std::snprintf(b, sizeof b, "algo=%d tile=%u stages=%u splitk=%d reduction=%u swizzle=%u custom=%u cluster=%u inner=%u",
                id, tile, stages, splitk, reduction, swizzle, custom, unsigned(cluster), unsigned(inner));
  return b;
}

std::optional<GemmAlgoConfig> GemmAlgoConfig::parse(std::string_view s) {
  GemmAlgoConfig c;
  int seen = 0;
  // Each field: its name, where it goes, and its range.
  auto field = [&](std::string_view name, std::string_view value) -> bool {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size()) return false;
    auto put = [&](auto& dst, int bit, int64_t lo, int64_t hi) {
      if (v < lo || v > hi || (seen & (1 << bit))) return false;
      seen |= 1 << bit;
      dst = static_cast<std::remove_reference_t<decltype(dst)>>(v);
      return true;
    };
    constexpr int64_t u32 = std::numeric_limits<uint32_t>::max(), u16 = std::numeric_limits<uint16_t>::max();
    if (name == "algo") return put(c.id, 0, 0, std::numeric_limits<int32_t>::max());
    if (name == "tile") return put(c.tile, 1, 0, u32);
    if (name == "stages") return put(c.stages, 2, 0, u32);
    if (name == "splitk") return put(c.splitk, 3, 1, 1024);
    if (name == "reduction") return put(c.reduction, 4, 0, u32);
    if (name == "swizzle") return put(c.swizzle, 5, 0, u32);
    if (name == "custom") return put(c.custom, 6, 0, u32);
    if (name == "cluster") return put(c.cluster, 7, 0, u16);
    if (name == "inner") return put(c.inner, 8, 0, u16);
    return false;
  };
  size_t pos = 0;
  while (pos < s.size()) {
    if (s[pos] == ' ') {
      ++pos;
      continue;
    }
    size_t end = s.find(' ', pos);
    if (end == std::string_view::npos) end = s.size();
    const std::string_view item = s.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || !field(item.substr(0, eq), item.substr(eq + 1))) return std::nullopt;
    pos = end;
  }
  if (seen != (1 << 9) - 1) return std::nullopt;
  return c;
}

bool gemm_search_from_value(const char* v) {
  return env_switch_off_value("KILN_CUDA_GEMM_SEARCH", v, "the heuristic's candidates only",
                              "a search of cuBLASLt's configurations timed beside them");
}

std::string gemm_cache_key(const GemmShape& shape, int64_t m, bool fp8_fast_accum) {
  return str_cat(dtype_name(DType(shape.in)), ">", dtype_name(DType(shape.out)), " m=", m, " n=", shape.n,
                 " k=", shape.k, " ldy=", shape.ldy, shape.bias ? " bias" : "",
                 fp8_fast_accum && shape.in == int(DType::kFP8E4M3) ? " fast-accum" : "");
}

std::map<std::string, GemmTacticCache::Entry> GemmTacticCache::parse(std::string_view text, const std::string& device,
                                                                     nlohmann::json* doc, size_t* bad) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "not JSON: ", e.what());
  }
  const auto ver = j.is_object() ? j.find("version") : j.end();
  const auto devs = j.is_object() ? j.find("devices") : j.end();
  if (ver == j.end() || !ver->is_number_integer() || ver->get<int64_t>() != 1 || devs == j.end() || !devs->is_object())
    throw_error(ErrorCode::kInvalidArgument, "not a version-1 tactic cache");
  std::map<std::string, Entry> out;
  size_t skipped = 0;
  const auto d = devs->find(device);
  if (d != devs->end() && d->is_object())
    for (auto it = d->begin(); it != d->end(); ++it) {
      const nlohmann::json& e = it.value();
      const auto algo = e.is_object() ? e.find("algo") : e.end();
      const auto us = e.is_object() ? e.find("us") : e.end();
      std::optional<GemmAlgoConfig> c;
      if (algo != e.end() && algo->is_string()) c = GemmAlgoConfig::parse(algo->get<std::string>());
      if (!c || us == e.end() || !us->is_number()) {
        ++skipped;
        continue;
      }
      out[it.key()] = {*c, us->get<double>()};
    }
  if (bad) *bad = skipped;
  if (doc) *doc = std::move(j);
  return out;
}

GemmTacticCache::GemmTacticCache(std::string path, std::string device)
    : path_(std::move(path)), device_(std::move(device)), doc_(nlohmann::json::object()) {
  if (path_.empty()) return;
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) return;
  size_t bad = 0;
  try {
    entries_ = parse(read_text_file(path_), device_, &doc_, &bad);
  } catch (const Error& e) {
    const std::string aside = path_ + ".bad";
    std::filesystem::rename(path_, aside, ec);
    log_warn("cuda: GEMM tactic cache '", path_, "' is unreadable (", e.what(), "); ",
             ec ? "starting a new one" : "moved to '" + aside + "', starting a new one");
    doc_ = nlohmann::json::object();
    return;
  }
  if (bad) log_warn("cuda: GEMM tactic cache '", path_, "': ", bad, " malformed entries for this device ignored");
}

std::optional<GemmTacticCache::Entry> GemmTacticCache::find(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void GemmTacticCache::put(const std::string& key, const Entry& e) {
  entries_[key] = e;
  if (path_.empty()) return;
  doc_["version"] = 1;
  doc_["devices"][device_][key] = {{"algo", e.algo.str()}, {"us", e.us}};
  save();
}

void GemmTacticCache::save() const {
  // A temporary name of this process's own: two processes sharing a cache never write into
  // one file; the later rename wins whole.
  const std::string tmp = str_cat(path_, ".tmp.", ::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << doc_.dump(1) << "\n";
    if (!f.good()) {
      log_warn("cuda: cannot write the GEMM tactic cache '", tmp, "': ", std::strerror(errno));
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) log_warn("cuda: cannot replace the GEMM tactic cache '", path_, "': ", ec.message());
}

}  // namespace kiln::cuda

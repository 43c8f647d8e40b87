// Test helpers: paths, JSON fixtures and a small GGUF metadata reader used only by
// the tokenizer tests.
#include "test_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/status.h"

namespace kiln::tok::test {

namespace fs = std::filesystem;

fs::path fixtures_dir() { return fs::path(KILN_FIXTURES_DIR) / "tokenizer"; }

fs::path models_dir() {
  if (const char* env = std::getenv("KILN_MODELS_DIR"); env && *env) return env;
  return fs::path(KILN_SOURCE_DIR) / ".cache" / "models";
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kIo, "cannot open ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json load_json(const fs::path& path) { return nlohmann::json::parse(read_text(path)); }

std::optional<fs::path> smollm2_gguf() {
  auto p = models_dir() / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (fs::exists(p)) return p;
  return std::nullopt;
}

std::optional<fs::path> minilm_dir() {
  auto p = models_dir() / "all-minilm-l6-v2";
  if (fs::exists(p / "tokenizer.json")) return p;
  return std::nullopt;
}

namespace {

class Reader {
 public:
  explicit Reader(const fs::path& path) : in_(path, std::ios::binary) {
    if (!in_) throw_error(ErrorCode::kIo, "cannot open ", path.string());
  }
  template <typename T>
  T pod() {
    T v{};
    in_.read(reinterpret_cast<char*>(&v), sizeof(T));
    if (!in_) throw_error(ErrorCode::kInvalidFile, "GGUF truncated");
    return v;
  }
  std::string str() {
    const auto n = pod<uint64_t>();
    if (n > (1u << 30)) throw_error(ErrorCode::kInvalidFile, "GGUF string too long");
    std::string s(n, '\0');
    in_.read(s.data(), static_cast<std::streamsize>(n));
    if (!in_) throw_error(ErrorCode::kInvalidFile, "GGUF truncated");
    return s;
  }
  void skip(uint64_t n) { in_.seekg(static_cast<std::streamoff>(n), std::ios::cur); }

 private:
  std::ifstream in_;
};

constexpr uint32_t kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
                   kStr = 8, kArr = 9, kU64 = 10, kI64 = 11, kF64 = 12;

size_t scalar_size(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: return 8;
    default: throw_error(ErrorCode::kInvalidFile, "GGUF bad value type ", t);
  }
}

int64_t read_int(Reader& r, uint32_t t) {
  switch (t) {
    case kU8: return r.pod<uint8_t>();
    case kI8: return r.pod<int8_t>();
    case kU16: return r.pod<uint16_t>();
    case kI16: return r.pod<int16_t>();
    case kU32: return r.pod<uint32_t>();
    case kI32: return r.pod<int32_t>();
    case kU64: return static_cast<int64_t>(r.pod<uint64_t>());
    case kI64: return r.pod<int64_t>();
    case kBool: return r.pod<uint8_t>();
    default: throw_error(ErrorCode::kInvalidFile, "GGUF expected an integer, type ", t);
  }
}

void skip_value(Reader& r, uint32_t t) {
  if (t == kStr) {
    r.str();
  } else if (t == kArr) {
    const auto et = r.pod<uint32_t>();
    const auto n = r.pod<uint64_t>();
    for (uint64_t i = 0; i < n; ++i) skip_value(r, et);
  } else {
    r.skip(scalar_size(t));
  }
}

}  // namespace

GgufTokenizerData read_gguf_tokenizer(const fs::path& path) {
  Reader r(path);
  if (r.pod<uint32_t>() != 0x46554747) throw_error(ErrorCode::kInvalidFile, "not a GGUF file");
  const auto version = r.pod<uint32_t>();
  if (version < 2) throw_error(ErrorCode::kUnsupported, "GGUF version ", version);
  r.pod<uint64_t>();  // tensor count
  const auto n_kv = r.pod<uint64_t>();
  GgufTokenizerData d;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key = r.str();
    const auto type = r.pod<uint32_t>();
    auto int_key = [&](const char* name, int32_t& out) {
      if (key != name) return false;
      out = static_cast<int32_t>(read_int(r, type));
      return true;
    };
    auto bool_key = [&](const char* name, std::optional<bool>& out) {
      if (key != name) return false;
      out = read_int(r, type) != 0;
      return true;
    };
    if (key == "tokenizer.ggml.model" && type == kStr) {
      d.model = r.str();
    } else if (key == "tokenizer.ggml.pre" && type == kStr) {
      d.pre = r.str();
    } else if (key == "tokenizer.chat_template" && type == kStr) {
      d.chat_template = r.str();
    } else if ((key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.merges") && type == kArr) {
      const auto et = r.pod<uint32_t>();
      const auto n = r.pod<uint64_t>();
      if (et != kStr) throw_error(ErrorCode::kInvalidFile, key, " is not a string array");
      auto& out = key == "tokenizer.ggml.tokens" ? d.tokens : d.merges;
      out.reserve(n);
      for (uint64_t i = 0; i < n; ++i) out.push_back(r.str());
    } else if (key == "tokenizer.ggml.scores" && type == kArr) {
      const auto et = r.pod<uint32_t>();
      const auto n = r.pod<uint64_t>();
      if (et != kF32) throw_error(ErrorCode::kInvalidFile, key, " is not a float array");
      for (uint64_t i = 0; i < n; ++i) d.scores.push_back(r.pod<float>());
    } else if (key == "tokenizer.ggml.token_type" && type == kArr) {
      const auto et = r.pod<uint32_t>();
      const auto n = r.pod<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) d.token_type.push_back(static_cast<int32_t>(read_int(r, et)));
    } else if (int_key("tokenizer.ggml.bos_token_id", d.bos_id) ||
               int_key("tokenizer.ggml.eos_token_id", d.eos_id) ||
               int_key("tokenizer.ggml.unknown_token_id", d.unk_id) ||
               int_key("tokenizer.ggml.padding_token_id", d.pad_id) ||
               int_key("tokenizer.ggml.seperator_token_id", d.sep_id) ||
               int_key("tokenizer.ggml.cls_token_id", d.cls_id) ||
               int_key("tokenizer.ggml.mask_token_id", d.mask_id) ||
               bool_key("tokenizer.ggml.add_bos_token", d.add_bos) ||
               bool_key("tokenizer.ggml.add_eos_token", d.add_eos) ||
               bool_key("tokenizer.ggml.add_space_prefix", d.add_space_prefix)) {
    } else {
      skip_value(r, type);
    }
  }
  return d;
}

}  // namespace kiln::tok::test

// Reader for GGUF v2/v3 files (llama.cpp's format): metadata key/values, tensor infos
// and the data section, over an mmap or a memory buffer. Every count, length and offset
// is checked against the file size before anything is allocated. Tested in
// tests/frontends/gguf_test.cpp; fuzzed by fuzz/frontends_gguf_fuzz.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "frontends/gguf_quants.h"

namespace kiln {

// GGUF metadata value types (gguf_type on disk).
enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::kU8;
  // Scalars: integers and bools widen into u or i (both set when representable),
  // floats into f.
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  // Arrays: elem_type and count; numbers stay as raw little-endian bytes, strings
  // and nested arrays are decoded.
  GgufType elem_type = GgufType::kU8;
  uint64_t count = 0;
  std::vector<uint8_t> raw;
  std::vector<std::string> strs;
  std::vector<GgufValue> items;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;          // ggml type id (GgmlType)
  std::vector<int64_t> ne;    // GGUF order: innermost (contiguous) dimension first
  std::vector<int64_t> shape; // PyTorch order: ne reversed
  int64_t numel = 0;
  uint64_t offset = 0;        // into the data section
  size_t nbytes = 0;
};

class GgufFile {
 public:
  static constexpr int kMaxDims = 4;
  static constexpr int kMaxArrayNesting = 8;

  // Throws kiln::Error (kNotFound/kIo/kInvalidFile/kUnsupported) naming the file.
  static GgufFile open(const std::string& path);
  static GgufFile from_memory(const uint8_t* data, size_t size, std::string label,
                              std::shared_ptr<const void> keepalive = nullptr);

  const std::string& path() const { return label_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  // Metadata. The typed getters throw kNotFound for a missing key and kInvalidFile for
  // a value of another type (integer getters accept any integer type that fits).
  bool has_key(const std::string& key) const { return kv_.count(key) != 0; }
  std::vector<std::string> keys() const;  // sorted
  const GgufValue& value(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  uint32_t get_u32(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_array_strings(const std::string& key) const;
  std::vector<int32_t> get_array_i32(const std::string& key) const;
  std::vector<float> get_array_f32(const std::string& key) const;
  uint64_t get_array_size(const std::string& key) const;

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  const GgufTensorInfo& tensor_info(const std::string& name) const;  // throws kNotFound
  const uint8_t* tensor_data(const GgufTensorInfo& t) const { return data_section_ + t.offset; }
  // An owned, aligned tensor in PyTorch shape: F32/F16/BF16 convert directly, quantized
  // types dequantize to f32 (in parallel over rows) and then convert to `want`.
  Tensor load(const std::string& name, DType want) const;
  // The dtype load() gives without conversion: F16/BF16 stay, the rest become F32.
  static DType natural_dtype(uint32_t ggml_type);

 private:
  void parse();

  std::string label_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> keepalive_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  const uint8_t* data_section_ = nullptr;
};

}  // namespace kiln

// Reader for the safetensors format (8-byte LE header length, JSON header, raw data),
// over an mmap or a memory buffer. Every field is untrusted and validated at open().
// Tested in tests/frontends/safetensors_test.cpp; fuzzed by fuzz/frontends_safetensors_fuzz.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "frontends/weight_source.h"

namespace kiln {

class SafetensorsFile {
 public:
  static constexpr size_t kMaxHeaderBytes = 100u << 20;

  // Throws kiln::Error (kNotFound/kIo/kInvalidFile/kUnsupported) naming the file.
  static SafetensorsFile open(const std::string& path);
  // Parses bytes someone else owns; `keepalive` (optional) is held by every view.
  // `label` names the buffer in error messages.
  static SafetensorsFile from_memory(const uint8_t* data, size_t size, std::string label,
                                     std::shared_ptr<const void> keepalive = nullptr);

  const std::string& path() const { return label_; }
  const std::vector<std::string>& names() const { return names_; }  // sorted
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws kNotFound naming the file and the tensor.
  const TensorInfo& info(const std::string& name) const;
  // The string -> string `__metadata__` map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Zero-copy, read-only view into the file. The data section starts at 8 + header
  // length, which the format lets be any number, so the view may be unaligned for its
  // dtype: use it only with code that tolerates that (memcpy), or use tensor_copy.
  Tensor tensor(const std::string& name) const;
  // An owned, 64-byte aligned copy converted to `want`.
  Tensor tensor_copy(const std::string& name, DType want) const;

 private:
  struct Entry {
    TensorInfo info;
    size_t offset = 0;  // into the data section
  };
  const Entry& entry(const std::string& name) const;
  void parse();

  std::string label_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  const uint8_t* tensor_data_ = nullptr;  // start of the data section
  std::shared_ptr<const void> keepalive_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace kiln

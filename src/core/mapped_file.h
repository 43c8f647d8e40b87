// A read-only memory-mapped file. Weights are used straight from the mapping (no copy)
// when their dtype and layout already match. Tested in tests/core/mapped_file_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kiln {

class MappedFile {
 public:
  // Throws kiln::Error (kNotFound / kIo) naming the path.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) file into a string; throws kiln::Error naming the path.
std::string read_text_file(const std::string& path);

}  // namespace kiln

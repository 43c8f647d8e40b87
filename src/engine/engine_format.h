// The engine file's fixed header and its checksums (internal to src/engine). The
// metadata hash also covers the header's first 48 bytes, so a flipped bit in an offset
// or size is caught even when it still points inside the file. The blob hash is XXH64
// over the XXH64s of consecutive 1 MiB chunks, so the writer can stream it and the
// loader can hash chunks in parallel. Tested in tests/engine/engine_file_test.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/xxhash64.h"

namespace kiln {

struct EngineHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t header_size;
  uint64_t meta_offset, meta_size;
  uint64_t blob_offset, blob_size;
  uint64_t meta_hash;  // XXH64(meta, seed = XXH64(header bytes [0, 48)))
  uint64_t blob_hash;
};
static_assert(sizeof(EngineHeader) == 64, "the header is 64 bytes on disk");

inline uint64_t engine_meta_hash(const EngineHeader& h, const void* meta) {
  return xxhash64(meta, h.meta_size, xxhash64(&h, 48));
}

constexpr size_t kEngineHashChunk = size_t(1) << 20;

class EngineBlobHasher {
 public:
  void update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    while (n) {
      size_t take = std::min(n, kEngineHashChunk - buf_.size());
      buf_.insert(buf_.end(), p, p + take);
      p += take;
      n -= take;
      if (buf_.size() == kEngineHashChunk) flush();
    }
  }
  uint64_t digest() {
    if (!buf_.empty()) flush();
    return xxhash64(chunks_.data(), chunks_.size() * 8);
  }

 private:
  void flush() {
    chunks_.push_back(xxhash64(buf_.data(), buf_.size()));
    buf_.clear();
  }
  std::vector<uint8_t> buf_;
  std::vector<uint64_t> chunks_;
};

}  // namespace kiln

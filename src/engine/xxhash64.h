// XXH64 (Yann Collet's xxHash, 64-bit), written from the published spec: the engine
// file's checksum. Fast enough to check a multi-GB weight blob at load (several GB/s).
// Tested in tests/engine/engine_file_test.cpp against the reference test vectors.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln {

uint64_t xxhash64(const void* data, size_t size, uint64_t seed = 0);

}  // namespace kiln

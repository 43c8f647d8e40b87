// Token embedding lookup: row copies after a bounds check of every id (a bad id is a
// user-visible kiln::Error, not an abort). Tested in tests/backends/cpu/misc_test.cpp.
#include <cstring>

#include "backends/cpu/kernels/kernels.h"
#include "core/status.h"

namespace kiln::cpu {

void embedding(const float* table, int64_t vocab, const int32_t* ids, int64_t t, int64_t dim,
               float* out) {
  for (int64_t i = 0; i < t; ++i)
    KILN_THROW_IF(ids[i] < 0 || ids[i] >= vocab, kOutOfRange, "embedding: token id ", ids[i],
                  " at position ", i, " is outside the vocabulary of size ", vocab);
  for (int64_t i = 0; i < t; ++i)
    std::memcpy(out + i * dim, table + int64_t(ids[i]) * dim, size_t(dim) * sizeof(float));
}

}  // namespace kiln::cpu

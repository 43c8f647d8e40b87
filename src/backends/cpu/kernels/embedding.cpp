// Token embedding lookup: row copies after a bounds check of every id (a bad id is a
// user-visible kiln::Error, not an abort); and BERT's summed embeddings + LayerNorm.
// Tested in tests/backends/cpu/misc_test.cpp.
#include <cstring>
#include <vector>

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

void embedding_layer_norm(const EmbeddingLookup* lookups, int64_t num_lookups, int64_t t, int64_t dim,
                          const float* gamma, const float* beta, float eps, float* out) {
  KILN_CHECK(num_lookups >= 1, "embedding_layer_norm needs at least one lookup");
  for (int64_t j = 0; j < num_lookups; ++j)
    for (int64_t i = 0; i < t; ++i)
      KILN_THROW_IF(lookups[j].ids[i] < 0 || lookups[j].ids[i] >= lookups[j].vocab, kOutOfRange,
                    "embedding: id ", lookups[j].ids[i], " at position ", i, " of lookup ", j,
                    " is outside the table of size ", lookups[j].vocab);
  // The sum is written straight into `out` (no [T, dim] temporaries per lookup), in
  // the order the unfused graph adds (((a + b) + c)), so results match it bit for bit;
  // the norm then runs in place over rows that are still in cache for small T.
  for (int64_t i = 0; i < t; ++i) {
    float* row = out + i * dim;
    std::memcpy(row, lookups[0].table + int64_t(lookups[0].ids[i]) * dim, size_t(dim) * sizeof(float));
    for (int64_t j = 1; j < num_lookups; ++j) {
      const float* src = lookups[j].table + int64_t(lookups[j].ids[i]) * dim;
      for (int64_t d = 0; d < dim; ++d) row[d] += src[d];
    }
  }
  if (beta) {
    layer_norm(out, gamma, beta, eps, t, dim, out);
  } else {
    std::vector<float> zeros(size_t(dim), 0.0f);
    layer_norm(out, gamma, zeros.data(), eps, t, dim, out);
  }
}

}  // namespace kiln::cpu

// Internal: the pieces the blocked prompt-attention paths share (attention_avx2.cpp's ymm
// rows, attention_avx512.cpp's zmm rows): the work units and a key chunk gathered from the
// paged cache, transposed. Included by both; each compiles it with its own ISA flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {
namespace {

// Keys per chunk of the blocked paths.
constexpr int64_t kBlockedKeys = 64;

// Up to row_block query rows [j0, j1) of sequence seq and q head h.
struct BlockedUnit {
  int64_t seq, h, j0, j1;
};
inline std::vector<BlockedUnit> blocked_units(const AttentionSeq* seqs, int64_t num_seqs, int64_t hq,
                                              int64_t row_block) {
  std::vector<BlockedUnit> units;
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t j0 = 0; j0 < seqs[s].q_len; j0 += row_block)
        units.push_back({s, h, j0, std::min<int64_t>(seqs[s].q_len, j0 + row_block)});
  return units;
}

// Keys [c0, c0 + n) of KV head kvh of sequence sq (n <= kBlockedKeys): transposed into
// kt [D][kBlockedKeys] (columns past n zero), and the addresses of their value rows.
template <int D>
void gather_key_chunk(const AttentionSeq& sq, const float* k_cache, const float* v_cache, int64_t block_size,
                      int64_t kv_row, int64_t kvh, int64_t c0, int64_t n, float* kt, const float** vrow) {
  for (int64_t c = 0; c < kBlockedKeys; ++c) {
    if (c >= n) {
      for (int64_t i = 0; i < D; ++i) kt[i * kBlockedKeys + c] = 0.0f;
      continue;
    }
    const int64_t pos = c0 + c, b = pos / block_size;
    const int64_t slot = int64_t(sq.block_table[b]) * block_size + (pos - b * block_size);
    const float* kr = k_cache + slot * kv_row + kvh * D;
    for (int64_t i = 0; i < D; ++i) kt[i * kBlockedKeys + c] = kr[i];
    vrow[c] = v_cache + slot * kv_row + kvh * D;
  }
}

}  // namespace
}  // namespace kiln::cpu

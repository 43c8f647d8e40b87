// embedding (copies and bounds errors) and kv_cache_write (slot placement, -1 skips).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backends/cpu/kernels/kernels.h"
#include "core/status.h"
#include "test_util.h"

namespace kiln::cpu {
namespace {

using testing::random_floats;

TEST(Embedding, CopiesRows) {
  const int64_t vocab = 50, dim = 13;
  auto table = random_floats(vocab * dim, 1);
  const int32_t ids[] = {0, 49, 7, 7};
  std::vector<float> out(4 * dim);
  embedding(table.data(), vocab, ids, 4, dim, out.data());
  for (int i = 0; i < 4; ++i)
    for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(out[i * dim + j], table[ids[i] * dim + j]);
}

TEST(Embedding, OutOfRangeNamesIdAndVocab) {
  std::vector<float> table(10 * 4), out(8);
  const int32_t ids[] = {3, 10};
  try {
    embedding(table.data(), 10, ids, 2, 4, out.data());
    FAIL() << "expected kiln::Error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("10"), std::string::npos) << msg;
    EXPECT_NE(msg.find("vocabulary of size 10"), std::string::npos) << msg;
  }
  const int32_t neg[] = {-1};
  EXPECT_THROW(embedding(table.data(), 10, neg, 1, 4, out.data()), kiln::Error);
}

TEST(KvCacheWrite, PlacesTokensBySlot) {
  const int64_t hkv = 2, d = 8, block_size = 4, blocks = 3, t = 4;
  auto k = random_floats(t * hkv * d, 1), v = random_floats(t * hkv * d, 2);
  std::vector<float> kc(blocks * block_size * hkv * d, NAN), vc = kc;
  const int64_t slots[] = {9, -1, 0, 11};
  kv_cache_write(k.data(), v.data(), slots, t, hkv, d, kc.data(), vc.data());
  for (int64_t i = 0; i < t; ++i) {
    if (slots[i] < 0) continue;
    for (int64_t j = 0; j < hkv * d; ++j) {
      EXPECT_EQ(kc[slots[i] * hkv * d + j], k[i * hkv * d + j]);
      EXPECT_EQ(vc[slots[i] * hkv * d + j], v[i * hkv * d + j]);
    }
  }
  EXPECT_TRUE(std::isnan(kc[1 * hkv * d]));  // untouched slot
}

}  // namespace
}  // namespace kiln::cpu

// GEMM tactic search and the tactic cache (gemm_search.h, Gemm::set_search /
// set_tactic_cache). Without a GPU: the configuration's text form, KILN_CUDA_GEMM_SEARCH's
// parsing, cache keys, and the cache file (round trip, other devices' entries kept, a
// corrupt file set aside, malformed entries ignored, an unwritable path only warned about).
// The device tests are in gemm_tune_test.cpp (CudaGemmSearch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "backends/cuda/ops/gemm_search.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/status.h"

namespace kiln::cuda {
namespace {

std::string temp_path(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("kiln_gemm_search_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

TEST(GemmAlgoConfig, TextRoundTripAndMalformedText) {
  GemmAlgoConfig c;
  c.id = 66;
  c.tile = 221;
  c.stages = 35;
  c.splitk = 2;
  c.reduction = 4;
  c.swizzle = 1;
  c.custom = 7;
  c.cluster = 3;
  c.inner = 0;
  const std::string s = c.str();
  EXPECT_EQ(s, "algo=66 tile=221 stages=35 splitk=2 reduction=4 swizzle=1 custom=7 cluster=3 inner=0");
  const auto back = GemmAlgoConfig::parse(s);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, c);
  EXPECT_TRUE(GemmAlgoConfig::parse("  " + s + "  ").has_value());  // spaces around are fine
  for (const char* bad : {"", "algo=66", "algo=66 tile=221 stages=35 splitk=2 reduction=4 swizzle=1 custom=7 cluster=3",
                          "algo=66 tile=221 stages=35 splitk=2 reduction=4 swizzle=1 custom=7 cluster=3 inner=0 tile=1",
                          "algo=66 tile=221 stages=35 splitk=0 reduction=4 swizzle=1 custom=7 cluster=3 inner=0",
                          "algo=-1 tile=221 stages=35 splitk=1 reduction=4 swizzle=1 custom=7 cluster=3 inner=0",
                          "algo=66 tile=221 stages=35 splitk=1 reduction=4 swizzle=1 custom=7 cluster=70000 inner=0",
                          "algo=66 tile=2x1 stages=35 splitk=1 reduction=4 swizzle=1 custom=7 cluster=3 inner=0",
                          "algo=66 tile=221 stages=35 splitk=1 reduction=4 swizzle=1 custom=7 cluster=3 inner=0 x=1",
                          "algo=66 tile=221 stages=35 splitk=1 reduction=4 swizzle=1 custom=7 cluster=3 inner=",
                          "algo 66 tile 221"})
    EXPECT_FALSE(GemmAlgoConfig::parse(bad).has_value()) << bad;
}

TEST(GemmSearch, EnvironmentValueAndCacheKeys) {
  EXPECT_FALSE(gemm_search_from_value(nullptr));
  EXPECT_FALSE(gemm_search_from_value(""));
  EXPECT_FALSE(gemm_search_from_value("0"));
  EXPECT_TRUE(gemm_search_from_value("1"));
  try {
    gemm_search_from_value("yes");
    ADD_FAILURE() << "accepted 'yes'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KILN_CUDA_GEMM_SEARCH='yes'"), std::string::npos) << e.what();
  }
  const GemmShape bf16{int(DType::kBF16), int(DType::kBF16), 28672, 4096, false, 28672};
  GemmShape fp8 = bf16, biased = bf16;
  fp8.in = int(DType::kFP8E4M3);
  biased.bias = true;
  EXPECT_EQ(gemm_cache_key(bf16, 256, false), "bf16>bf16 m=256 n=28672 k=4096 ldy=28672");
  EXPECT_EQ(gemm_cache_key(bf16, 256, true), gemm_cache_key(bf16, 256, false));  // only FP8 plans accumulate fast
  EXPECT_NE(gemm_cache_key(fp8, 256, true), gemm_cache_key(fp8, 256, false));
  EXPECT_NE(gemm_cache_key(biased, 256, false), gemm_cache_key(bf16, 256, false));
  EXPECT_NE(gemm_cache_key(bf16, 128, false), gemm_cache_key(bf16, 256, false));
}

TEST(GemmTacticCache, RoundTripKeepsOtherDevicesAndSetsCorruptFilesAside) {
  const std::string path = temp_path("cache.json");
  std::filesystem::remove(path);
  GemmAlgoConfig a;
  a.id = 66;
  a.tile = 24;
  a.stages = 35;
  {
    GemmTacticCache none("", "dev A");  // no path: keeps entries in memory only
    none.put("k", {a, 1.0});
    EXPECT_TRUE(none.find("k").has_value());
  }
  {
    GemmTacticCache c(path, "dev A");
    EXPECT_EQ(c.size(), 0u);
    c.put("bf16>bf16 m=256 n=4096 k=4096 ldy=4096", {a, 17.5});
  }
  {
    GemmTacticCache c(path, "dev B");  // another device sees nothing of A's
    EXPECT_EQ(c.size(), 0u);
    GemmAlgoConfig b = a;
    b.tile = 20;
    c.put("bf16>bf16 m=256 n=4096 k=4096 ldy=4096", {b, 19.0});
  }
  {
    GemmTacticCache c(path, "dev A");
    const auto e = c.find("bf16>bf16 m=256 n=4096 k=4096 ldy=4096");
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->algo, a);
    EXPECT_DOUBLE_EQ(e->us, 17.5);
    EXPECT_FALSE(c.find("bf16>bf16 m=128 n=4096 k=4096 ldy=4096").has_value());
  }
  {
    GemmTacticCache c(path, "dev B");
    ASSERT_TRUE(c.find("bf16>bf16 m=256 n=4096 k=4096 ldy=4096").has_value());
    EXPECT_EQ(c.find("bf16>bf16 m=256 n=4096 k=4096 ldy=4096")->algo.tile, 20u);
  }
  // Malformed entries of this device are skipped, the others kept.
  {
    std::ofstream(path) << R"({"version": 1, "devices": {"dev A": {
        "good": {"algo": "algo=1 tile=2 stages=3 splitk=1 reduction=0 swizzle=0 custom=0 cluster=0 inner=0", "us": 2},
        "no us": {"algo": "algo=1 tile=2 stages=3 splitk=1 reduction=0 swizzle=0 custom=0 cluster=0 inner=0"},
        "bad algo": {"algo": "algo=1", "us": 2}, "not an object": 3}}})";
    GemmTacticCache c(path, "dev A");
    EXPECT_EQ(c.size(), 1u);
    EXPECT_TRUE(c.find("good").has_value());
  }
  // A file that is not a cache is moved aside, and a new cache starts in its place.
  for (const char* text : {"{not json", "[1, 2]", R"({"version": 2, "devices": {}})", R"({"version": 1})"}) {
    std::filesystem::remove(path + ".bad");
    std::ofstream(path) << text;
    GemmTacticCache c(path, "dev A");
    EXPECT_EQ(c.size(), 0u) << text;
    EXPECT_TRUE(std::filesystem::exists(path + ".bad")) << text;
    EXPECT_EQ(read_text_file(path + ".bad"), text);
    c.put("k", {a, 1.0});
    GemmTacticCache again(path, "dev A");
    EXPECT_TRUE(again.find("k").has_value()) << text;
  }
  // A cache whose file cannot be written still works in memory.
  GemmTacticCache unwritable(temp_path("no/such/dir/cache.json"), "dev A");
  unwritable.put("k", {a, 1.0});
  EXPECT_TRUE(unwritable.find("k").has_value());
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

}  // namespace
}  // namespace kiln::cuda

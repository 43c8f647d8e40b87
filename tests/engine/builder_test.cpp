// The builder: the timing cache makes a rebuild time nothing; a tactic table from
// another device is ignored (heuristics), never a refusal; tensors shared by two
// weights are stored once; HF tokenizer files and GGUF-free models round-trip.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_ops.h"
#include "engine_test_util.h"
#include "runtime/model_tokenizer.h"

namespace kiln {
namespace {

using testing::scratch_dir;

TEST(Builder, TimingCacheMakesRebuildsSkipTiming) {
  auto dir = scratch_dir();
  BuildOptions o;
  o.model = testing::fixture_dir("gpt2");
  o.output = (dir / "a.kiln").string();
  o.timing_cache = (dir / "cache.json").string();
  BuildReport first = build_engine(o);
  EXPECT_GT(first.shapes_timed, 0u);
  EXPECT_EQ(first.cache_hits, 0u);
  ASSERT_TRUE(std::filesystem::exists(o.timing_cache));
  o.output = (dir / "b.kiln").string();
  BuildReport second = build_engine(o);
  EXPECT_EQ(second.shapes_timed, 0u);
  EXPECT_EQ(second.cache_hits, first.shapes_timed);
  EXPECT_EQ(second.tactics_chosen, first.tactics_chosen);
}

TEST(Builder, TacticsFromAnotherDeviceAreIgnoredNotRefused) {
  auto dir = scratch_dir();
  BuildOptions o;
  o.model = testing::fixture_dir("llama");
  o.output = (dir / "a.kiln").string();
  build_engine(o);
  EngineContents e = engine_load(o.output);
  ASSERT_EQ(e.tactic_tables.size(), 1u);
  e.tactic_tables[0].device = "NVIDIA H200";
  e.graph = Model::load(o.output)->graph();
  engine_write((dir / "foreign.kiln").string(), e);
  auto m = Model::load((dir / "foreign.kiln").string());
  EXPECT_TRUE(m->compile_options().tactics.empty());
  EXPECT_FALSE(Model::load(o.output)->compile_options().tactics.empty());
}

TEST(Builder, TiedWeightsAreStoredOnce) {
  auto dir = scratch_dir();
  auto r = testing::build_fixture("gpt2", dir / "g.kiln");
  auto m = Model::load(testing::fixture_dir("gpt2"));
  // GPT-2's LM head is the token embedding: the file holds it once.
  EXPECT_LT(double(r.bytes), double(m->graph().weight_bytes()) * 0.95);
}

TEST(Builder, EmbedsHfTokenizerFiles) {
  auto dir = scratch_dir();
  std::filesystem::copy(testing::fixture_dir("gpt2"), dir / "model");
  std::filesystem::copy_file(std::string(KILN_FIXTURES_DIR) + "/tokenizer/trained/gpt2_bpe.tokenizer.json",
                             dir / "model" / "tokenizer.json");
  BuildOptions o;
  o.model = (dir / "model").string();
  o.output = (dir / "g.kiln").string();
  o.tune = false;
  build_engine(o);
  std::filesystem::remove_all(dir / "model");  // the engine must not need the source
  auto m = Model::load(o.output);
  auto tok = load_model_tokenizer(*m);
  ASSERT_TRUE(tok.has_value());
  auto want = tok::Tokenizer::from_hf_json(
      testing::read_bytes(std::string(KILN_FIXTURES_DIR) + "/tokenizer/trained/gpt2_bpe.tokenizer.json"));
  EXPECT_EQ(tok->encode("hello engine world"), want.encode("hello engine world"));
  // Without tokenizer files there is none (token ids in and out).
  testing::build_fixture("llama", dir / "l.kiln");
  EXPECT_FALSE(load_model_tokenizer(*Model::load((dir / "l.kiln").string())).has_value());
}

TEST(Builder, RejectsBadOptions) {
  auto dir = scratch_dir();
  BuildOptions o;
  o.model = testing::fixture_dir("gpt2");
  o.output = (dir / "g.kiln").string();
  o.disabled_passes = {"no_such_pass"};
  EXPECT_THROW(build_engine(o), Error);
  o.disabled_passes = {};
  o.output = "";
  EXPECT_THROW(build_engine(o), Error);
  o.output = (dir / "g.kiln").string();
  build_engine(o);
  o.model = o.output;
  o.output = (dir / "again.kiln").string();
  EXPECT_THROW(build_engine(o), Error) << "an engine is not a build input";
}

// The CPU GEMM tactics an engine stores: the string form round-trips (the panel count
// only where set, so engines built before that field read back as auto), and a bad
// field is an error naming it.
TEST(Builder, CpuLinearTacticStringsRoundTrip) {
  using cpu::LinearSplit;
  for (const cpu::LinearTactic& t : {cpu::LinearTactic{6, 0, LinearSplit::kPanels, 0, 0},
                                     cpu::LinearTactic{4, 256, LinearSplit::kRows, 2, 1},
                                     cpu::LinearTactic{6, 768, LinearSplit::kAuto, 0, 2}}) {
    const std::string s = cpu::linear_tactic_str(t);
    const cpu::LinearTactic back = cpu::linear_tactic_parse(s);
    EXPECT_EQ(back.mr, t.mr) << s;
    EXPECT_EQ(back.kc, t.kc) << s;
    EXPECT_EQ(back.split, t.split) << s;
    EXPECT_EQ(back.threads, t.threads) << s;
    EXPECT_EQ(back.panels, t.panels) << s;
  }
  EXPECT_EQ(cpu::linear_tactic_parse("mr=6,kc=0,split=panels,threads=0").panels, 0);
  for (const char* bad : {"mr=6,panels=3", "panels=", "mr=5", "pannels=2"}) {
    try {
      cpu::linear_tactic_parse(bad);
      ADD_FAILURE() << bad << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("linear tactic"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln

// Tensor-parallel engines (`kiln build --tp N`, schema 1.3): for the tiny golden
// decoders a TP=2 engine loads sharded over its two ranks with no --tp and no
// checkpoint, and gives the unsharded model's logits and the same greedy tokens as the
// unsharded model, the `--tp 2` checkpoint load and transformers; replicated weights
// are stored once; --tp other than the engine's is an error naming both numbers; a
// file whose rank records disagree (counts, heads, model) is rejected by the loader.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "core/tensor.h"
#include "engine_generated.h"
#include "engine_test_util.h"
#include "runtime/llm_runner.h"
#include "runtime/quantize.h"

namespace kiln {
namespace {

using testing::read_bytes;
using testing::scratch_dir;
using testing::write_bytes;

BuildReport build_tp(const std::string& model, const std::filesystem::path& out, int world, bool tune = false,
                     const std::string& precision = "f32") {
  BuildOptions o;
  o.model = testing::fixture_dir(model);
  o.output = out.string();
  o.tune = tune;
  o.weight_dtype = precision;
  o.tensor_parallel = world;
  return build_engine(o);
}

std::string load_error(const std::string& path, int tp) {
  ModelOptions mo;
  mo.tensor_parallel = tp;
  try {
    Model::load(path, mo);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& msg, const std::string& want) {
  EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' should say '" << want << "'";
}

class TpEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(TpEngine, RunsShardedWithTheUnshardedModelsTokens) {
  const std::string name = GetParam();
  auto path = scratch_dir() / "tp2.kiln";
  BuildReport report = build_tp(name, path, 2, /*tune=*/name == "llama");
  EXPECT_EQ(report.tp_world, 2);
  ASSERT_EQ(report.rank_weight_bytes.size(), 2u);

  EngineContents e = engine_load(path.string());
  EXPECT_EQ(e.schema_minor, kEngineSchemaMinor);
  EXPECT_EQ(e.tp_world, 2);
  ASSERT_EQ(e.ranks.size(), 2u);
  EXPECT_TRUE(e.graph.nodes().empty());

  auto direct = Model::load(testing::fixture_dir(name));
  ModelOptions tp2;
  tp2.tensor_parallel = 2;
  auto checkpoint_tp = Model::load(testing::fixture_dir(name), tp2);
  auto engine = Model::load(path.string());  // no --tp: the engine's own two ranks
  ASSERT_EQ(engine->tp_world(), 2);
  EXPECT_EQ(engine->info().num_heads * 2, direct->info().num_heads);
  EXPECT_EQ(engine->model_info().num_heads, direct->info().num_heads);
  EXPECT_EQ(engine->model_info().num_kv_heads, direct->info().num_kv_heads);
  EXPECT_EQ(engine->config(), direct->config());
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(engine->tp_rank(r).engine());
    EXPECT_EQ(engine->tp_rank(r).graph().nodes().size(), checkpoint_tp->tp_rank(r).graph().nodes().size());
    size_t allreduce = 0;
    for (auto& n : engine->tp_rank(r).graph().nodes()) allreduce += n.op == "AllReduce";
    EXPECT_EQ(allreduce, size_t(2 * direct->info().num_layers)) << "rank " << r << ": attention and MLP sums";
    if (name == "llama") {
      EXPECT_FALSE(engine->tp_rank(r).compile_options().tactics.empty()) << "rank " << r;
    }
  }
  // --tp equal to the engine's is accepted too.
  EXPECT_EQ(Model::load(path.string(), tp2)->tp_world(), 2);

  // Prefill logits of the sharded engine equal the unsharded model's.
  testing::Reference ref(name);
  auto prompts = ref.prompts();
  {
    LlmRunner single(*direct), sharded(*engine);
    for (auto& p : prompts) {
      single.add_sequence(p);
      sharded.add_sequence(p);
    }
    auto want = single.step(true), got = sharded.step(true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s)
      KILN_EXPECT_CLOSE(got[s].logits.data(), want[s].logits.data(), want[s].logits.size(), 1e-5,
                        name + " TP=2 engine prefill logits, seq " + std::to_string(s));
  }
  // Greedy tokens: the engine, the unsharded model, the --tp 2 checkpoint load and
  // transformers agree.
  auto from_engine = LlmRunner(*engine).generate_greedy(prompts, 20);
  auto from_direct = LlmRunner(*direct).generate_greedy(prompts, 20);
  auto from_checkpoint_tp = LlmRunner(*checkpoint_tp).generate_greedy(prompts, 20);
  auto greedy = ref.ids("greedy");
  for (size_t b = 0; b < prompts.size(); ++b) {
    EXPECT_EQ(from_engine[b], from_direct[b]) << name << " prompt " << b;
    EXPECT_EQ(from_engine[b], from_checkpoint_tp[b]) << name << " prompt " << b;
    EXPECT_EQ(from_engine[b],
              std::vector<int32_t>(greedy.begin() + int64_t(b) * 20, greedy.begin() + int64_t(b + 1) * 20))
        << name << " prompt " << b << " vs transformers";
  }
}

INSTANTIATE_TEST_SUITE_P(Decoders, TpEngine, ::testing::Values("gpt2", "llama", "qwen2", "qwen3", "phi3", "gemma3", "mistral", "gemma2"));

// `kiln build --tp 2 --quant`: the model is calibrated and quantized unsharded, then
// sharded (docs/tensor_parallel.md). The engine runs over its two ranks with the greedy
// tokens of the unsharded quantized model and of the --tp 2 checkpoint load under the same
// calibration, and the unsharded quantized model's logits within tp_quant_test.cpp's
// bounds (f32 summation order; 2e-4, or 1e-2 where the q4 GEMV rounds its activations
// at run time); the file keeps each rank's unsharded scales (W8A8 weight_amax, E4M3 codes
// under the tensor's weight_scale, q4 row images).
class TpQuantEngine : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(TpQuantEngine, RunsWithTheUnshardedQuantizedModelsTokens) {
  const auto [name, mode] = GetParam();
  const std::string model = testing::fixture_dir(name);
  auto dir = scratch_dir();
  QuantOptions q;
  q.mode = mode;
  q.method = "max";
  ModelOptions base;
  if (mode == "awq") base.weight_dtype = "q4";
  std::vector<std::vector<int32_t>> seqs(4);
  std::mt19937 rng(3);
  for (auto& sq : seqs)
    for (int i = 0; i < 24; ++i) sq.push_back(int32_t(3 + rng() % 500));
  // The fixtures have no tokenizer: the calibration is made here and handed over as a cache.
  const std::string calib = (dir / "calib.json").string();
  (mode == "awq" ? calibrate_awq(model, base, q, QuantFormat::kQ4, &seqs)
                 : calibrate_model(model, base, q, &seqs))
      .save(calib);
  q.calib = calib;
  BuildOptions o;
  o.model = model;
  o.output = (dir / "q.kiln").string();
  o.tune = false;
  o.tensor_parallel = 2;
  o.quant = q;
  EXPECT_EQ(build_engine(o).tp_world, 2);

  auto engine = Model::load(o.output);  // no --tp
  ASSERT_EQ(engine->tp_world(), 2);
  ModelOptions mo = quant_model_options(base, quant::CalibrationTable::load(calib), q);
  auto unsharded = Model::load(model, mo);
  mo.tensor_parallel = 2;
  auto runtime_tp = Model::load(model, mo);
  for (int r = 0; r < 2; ++r) {
    int scaled = 0;
    for (const ir::Node& n : engine->tp_rank(r).graph().nodes()) {
      if (n.op != "Linear") continue;
      scaled += n.has_attr("weight_amax");
      if (n.attr_str("quant", "") == "fp8") {
        EXPECT_EQ(engine->tp_rank(r).graph().weight(n.inputs[1]).dtype(), DType::kFP8E4M3)
            << n.name;
        EXPECT_TRUE(n.has_attr("weight_scale")) << n.name;
      }
      if (mode == "awq" && n.name.find("down_proj") != std::string::npos)
        EXPECT_EQ(n.attr_str("weight_quant", ""), "q4");
    }
    EXPECT_EQ(scaled, mode == "w8a8" ? 2 * int(unsharded->info().num_layers) : 0) << "rank " << r;
  }
  auto prompts = testing::Reference(name).prompts();
  {
    LlmRunner single(*unsharded), sharded(*engine);
    for (auto& p : prompts) {
      single.add_sequence(p);
      sharded.add_sequence(p);
    }
    auto want = single.step(true), got = sharded.step(true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      ASSERT_EQ(got[s].logits.size(), want[s].logits.size()) << name << " " << mode << " seq " << s;
      for (size_t i = 0; i < want[s].logits.size(); ++i)
        ASSERT_NEAR(got[s].logits[i], want[s].logits[i], mode == "awq" ? 1e-2 : 2e-4)
            << name << " " << mode << " TP=2 engine prefill logits, seq " << s << " logit " << i;
    }
  }
  // The unsharded model's greedy tokens, the TP models teacher-forced along them: every
  // step's logits within the bound above, and the same argmax except where the unsharded
  // logits' top two lie within twice that bound (a near-tie their difference can flip; the
  // ranks hold the same weights, so only f32 summation order and AWQ's Muls differ).
  const double tol = mode == "awq" ? 1e-2 : 2e-4;
  const auto want = LlmRunner(*unsharded).generate_greedy(prompts, 16);
  for (Model* m : {engine.get(), runtime_tp.get()}) {
    const std::string which =
        name + " " + mode + (m == engine.get() ? ": engine" : ": --tp 2 load");
    for (size_t p = 0; p < prompts.size(); ++p) {
      LlmRunner a(*unsharded), b(*m);
      const int32_t sa = a.add_sequence(prompts[p]), sb = b.add_sequence(prompts[p]);
      for (size_t i = 0; i < want[p].size(); ++i) {
        const auto oa = a.step(), ob = b.step();
        ASSERT_EQ(oa.size(), 1u);
        ASSERT_EQ(ob.size(), 1u);
        const std::vector<float>&la = oa[0].logits, &lb = ob[0].logits;
        ASSERT_EQ(la.size(), lb.size());
        size_t aa = 0, ab = 0;
        for (size_t j = 0; j < la.size(); ++j) {
          ASSERT_NEAR(lb[j], la[j], tol)
              << which << " prompt " << p << " step " << i << " logit " << j;
          if (la[j] > la[aa]) aa = j;
          if (lb[j] > lb[ab]) ab = j;
        }
        EXPECT_EQ(int32_t(aa), want[p][i])
            << which << ": the teacher-forced unsharded model's own token";
        if (aa != ab)
          EXPECT_LE(double(la[aa]) - la[ab], 2 * tol)
              << which << " prompt " << p << " step " << i << ": token " << ab
              << " is not a near-tie of " << aa;
        a.append_tokens(sa, {want[p][i]});
        b.append_tokens(sb, {want[p][i]});
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Decoders, TpQuantEngine,
                         ::testing::Combine(::testing::Values("gpt2", "llama", "qwen2"),
                                            ::testing::Values("w8a8", "fp8", "awq")));

TEST(TpEngineFile, ReplicatedWeightsAreStoredOnceEvenWhenConvertedPerRank) {
  // A bf16-pinned LM head (Llama's is tied to the f32 embedding) and packed weights:
  // every rank converts or packs its copy of a replicated tensor into a buffer of its
  // own; the writer finds them equal by content. Column and row shards of a weight add
  // up to the weight, so the TP=2 file is about the size of the TP=1 file (the 64-byte
  // alignment of more tensors aside), though each rank holds the replicated weights.
  auto dir = scratch_dir();
  for (bool pack : {false, true}) {
    SCOPED_TRACE(pack ? "packed" : "bf16 LM head");
    BuildOptions o;
    o.model = testing::fixture_dir("llama");
    o.tune = false;
    o.pack_weights = pack;
    if (!pack) o.pin_precision = passes::parse_precision_pins("lm_head=bf16");
    o.output = (dir / "tp1.kiln").string();
    BuildReport one = build_engine(o);
    o.output = (dir / "tp2.kiln").string();
    o.tensor_parallel = 2;
    BuildReport two = build_engine(o);
    const uint64_t replicated = two.rank_weight_bytes[0] + two.rank_weight_bytes[1] - one.bytes;
    EXPECT_GT(double(replicated), 0.25 * double(one.bytes)) << "the ranks' weights overlap";
    EXPECT_LT(double(two.bytes), double(one.bytes) * 1.05) << one.bytes << " vs " << two.bytes;
    auto tokens = [](const std::string& path) {
      return LlmRunner(*Model::load(path)).generate_greedy({{5, 6, 7, 300}}, 8);
    };
    EXPECT_EQ(tokens((dir / "tp2.kiln").string()), tokens((dir / "tp1.kiln").string()));
  }
}

TEST(TpEngineFile, TpOtherThanTheEnginesIsAnErrorNamingBoth) {
  auto dir = scratch_dir();
  const std::string tp2 = (dir / "tp2.kiln").string(), tp1 = (dir / "tp1.kiln").string();
  build_tp("llama", tp2, 2);
  build_tp("llama", tp1, 1);
  std::string msg = load_error(tp2, 1);
  expect_has(msg, "built for tensor parallelism over 2 ranks");
  expect_has(msg, "--tp 1 was asked");
  expect_has(load_error(tp2, 4), "--tp 4 was asked");
  msg = load_error(tp1, 2);
  expect_has(msg, "holds one unsharded graph");
  expect_has(msg, "--tp 2 was asked");
  EXPECT_EQ(load_error(tp1, 1), "");
  EXPECT_EQ(load_error(tp1, 0), "");
}

TEST(TpEngineFile, BuildErrorsAreNamed) {
  auto dir = scratch_dir();
  auto build_error = [&](const std::string& model, int world, const std::string& quant = "") {
    BuildOptions o;
    o.model = testing::fixture_dir(model);
    o.output = (dir / "x.kiln").string();
    o.tune = false;
    o.tensor_parallel = world;
    o.quant.mode = quant;
    try {
      build_engine(o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  expect_has(build_error("llama", 3), "4 attention heads do not split over 3 ranks");
  expect_has(build_error("bert", 2), "decoders only");
  // Quantized builds shard the unsharded quantized model; what that cannot keep exact is
  // refused (tests/parallel/tp_quant_test.cpp has every case).
  {
    BuildOptions o;
    o.model = testing::fixture_dir("llama");
    o.output = (dir / "x.kiln").string();
    o.tune = false;
    o.tensor_parallel = 2;
    o.quant.mode = "w8a8";
    o.quant.act_scale = "per-token";
    const std::vector<std::vector<int32_t>> seqs = {{5, 6, 7, 8, 9, 10}, {11, 12, 13, 14}};
    o.quant.calib = (dir / "calib.json").string();
    calibrate_model(o.model, {}, o.quant, &seqs).save(o.quant.calib);
    try {
      build_engine(o);
      ADD_FAILURE() << "per-token scales on row-parallel Linears were built";
    } catch (const Error& e) {
      expect_has(e.what(),
                 "row-parallel W8A8 Linear 'layers.0.o_proj' uses per-token activation scales");
    }
  }
  expect_has(build_error("llama", 0), "--tp must be in [1, 64], got 0");
  EXPECT_FALSE(std::filesystem::exists(dir / "x.kiln"));
  // An engine is not rebuilt (with or without --tp).
  build_tp("llama", dir / "tp2.kiln", 2);
  BuildOptions o;
  o.model = (dir / "tp2.kiln").string();
  o.output = (dir / "y.kiln").string();
  o.tensor_parallel = 2;
  try {
    build_engine(o);
    ADD_FAILURE() << "an engine was rebuilt";
  } catch (const Error& e) {
    expect_has(e.what(), "is already an engine");
  }
}

// Rank records that disagree with the file's tp_world or with the model: the loader
// refuses them. The writer cannot produce a count mismatch, so the scalar is patched
// in the metadata (checksums off, as the fuzzer runs).
class TpEngineCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir();
    build_tp("llama", dir_ / "tp2.kiln", 2);
    good_ = read_bytes(dir_ / "tp2.kiln");
  }
  std::string parse_error(const std::string& bytes) {
    // An aligned copy, as an mmap'd file would be.
    std::shared_ptr<uint8_t> buf(static_cast<uint8_t*>(aligned_alloc_bytes(bytes.size())), std::free);
    std::memcpy(buf.get(), bytes.data(), bytes.size());
    try {
      engine_parse(buf.get(), bytes.size(), buf, "bad.kiln", {/*verify_checksum=*/false});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // good_ with the metadata's tp_world set to `world`.
  std::string with_tp_world(uint32_t world) {
    std::string bytes = good_;
    const uint8_t* meta = reinterpret_cast<const uint8_t*>(bytes.data()) + kEngineHeaderSize;
    const fb::Engine* e = fb::GetEngine(meta);
    // Engine derives privately from flatbuffers::Table (as FlatBuffers' reflection reads it).
    const uint8_t* field = reinterpret_cast<const flatbuffers::Table*>(e)->GetAddressOf(fb::Engine::VT_TP_WORLD);
    EXPECT_NE(field, nullptr);
    EXPECT_EQ(e->tp_world(), 2u);
    std::memcpy(bytes.data() + (field - reinterpret_cast<const uint8_t*>(bytes.data())), &world, 4);
    return bytes;
  }
  // Loads, edits the contents and writes them back: what a buggy or hostile writer could store.
  std::string rewritten(const std::function<void(EngineContents&)>& edit) {
    EngineContents e = engine_load((dir_ / "tp2.kiln").string());
    edit(e);
    engine_write((dir_ / "edited.kiln").string(), e);
    return (dir_ / "edited.kiln").string();
  }
  std::filesystem::path dir_;
  std::string good_;
};

TEST_F(TpEngineCorruption, RankCountsThatDisagreeAreRefused) {
  EXPECT_EQ(parse_error(good_), "");
  expect_has(parse_error(with_tp_world(3)), "records tensor parallelism over 3 ranks but holds 2 rank graphs");
  expect_has(parse_error(with_tp_world(1)), "holds 2 rank graphs but records no tensor parallelism");
  expect_has(parse_error(with_tp_world(0)), "tensor parallelism over 0 ranks");
  expect_has(parse_error(with_tp_world(1000)), "tensor parallelism over 1000 ranks");
  // With the checksum on, any patch is caught first.
  write_bytes(dir_ / "patched.kiln", with_tp_world(3));
  expect_has(load_error((dir_ / "patched.kiln").string(), 0), "checksum mismatch");
}

TEST_F(TpEngineCorruption, RanksThatAreNotAShareOfTheModelAreRefused) {
  expect_has(load_error(rewritten([](EngineContents& e) { e.ranks[1].info.num_heads = 4; }), 0),
             "rank 1 of 2 holds 4 attention and 1 K/V heads, not a 1/2 share of the model's 4 and 2");
  expect_has(load_error(rewritten([](EngineContents& e) { e.ranks[0].info.num_layers += 1; }), 0),
             "rank 0 of 2 is a shard of another model");
  // The info agrees with the model but not with the rank's own Attention nodes.
  expect_has(load_error(rewritten([](EngineContents& e) {
                          e.info.num_heads = 2;
                          for (auto& r : e.ranks) r.info.num_heads = 1;
                        }),
                        0),
             "attention and 1 K/V heads, its rank info says 1 and 1");
}

TEST_F(TpEngineCorruption, RandomDamageWithoutChecksumIsAnErrorOrALoadNeverACrash) {
  std::mt19937 rng(7);
  uint64_t meta_size;
  std::memcpy(&meta_size, good_.data() + 24, 8);
  size_t errors = 0;
  for (int i = 0; i < 200; ++i) {
    std::string bad = good_;
    for (int f = 0; f < 1 + i % 4; ++f) bad[64 + rng() % meta_size] = char(rng());
    errors += !parse_error(bad).empty();
  }
  EXPECT_GT(errors, 50u);
}

}  // namespace
}  // namespace kiln

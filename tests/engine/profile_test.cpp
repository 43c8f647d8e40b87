// The builder's per-engine decisions that the runtime must honor: per-node GEMM weight
// precision (assign_precision pins reach the CPU backend's packed weights), several
// named optimization profiles (picked by name or first fit, clear errors outside them),
// the activation memory plan per profile (equal to what the CPU backend allocates at
// the max shapes) with a --workspace limit, and engines of schema 1.0 still loading.
#include <gtest/gtest.h>

#include <map>

#include "../models/gguf_quant_llama.h"
#include "backends/memory_plan.h"
#include "engine_test_util.h"
#include "runtime/encoder_runner.h"
#include "runtime/llm_runner.h"

namespace kiln {
namespace {

using testing::scratch_dir;

std::vector<float> decode_logits(Model& m) {
  LlmRunner r(m);
  r.add_sequence({3, 1, 4, 1, 5, 9, 2, 6});
  r.add_sequence({2, 7});
  std::vector<float> all;
  for (int step = 0; step < 3; ++step)
    for (auto& o : r.step()) {
      all.insert(all.end(), o.logits.begin(), o.logits.end());
      r.append_tokens(o.seq, {argmax(o.logits.data(), int64_t(o.logits.size()))});
    }
  return all;
}

BuildOptions options(const std::string& model, const std::filesystem::path& out) {
  BuildOptions o;
  o.model = testing::fixture_dir(model);
  o.output = out.string();
  o.tune = false;
  return o;
}

TEST(EnginePrecision, PinnedLayersKeepF32WeightsOthersGetBf16) {
  auto dir = scratch_dir();
  BuildOptions o = options("llama", dir / "f32.kiln");
  build_engine(o);
  o.output = (dir / "mixed.kiln").string();
  o.weight_dtype = "bf16";
  o.pin_precision = passes::parse_precision_pins("layers.0.*=f32");
  build_engine(o);
  auto f32 = Model::load((dir / "f32.kiln").string()), mixed = Model::load(o.output);
  ASSERT_EQ(mixed->engine()->build.pin_precision, std::vector<std::string>{"layers.0.*=f32"});
  size_t bf16 = 0, kept = 0;
  for (auto& n : mixed->graph().nodes()) {
    if (n.op != "Linear") continue;
    const DType stored = mixed->graph().weight(n.inputs[1]).dtype();
    const bool pinned = n.name.rfind("layers.0.", 0) == 0 || n.name == "lm_head";
    SCOPED_TRACE(n.name);
    EXPECT_EQ(n.attr_str("precision"), pinned ? "f32" : "bf16");
    EXPECT_EQ(stored, pinned ? DType::kF32 : DType::kBF16) << "the engine stores the node's precision";
    (pinned ? kept : bf16) += 1;
  }
  EXPECT_EQ(kept, 5u);  // layer 0's four GEMMs and the LM head
  EXPECT_EQ(bf16, 4u);
  // The backend packs each GEMM at its node's precision: between all-f32 and all-bf16.
  const size_t all_f32 = f32->compiled().weight_bytes(), got = mixed->compiled().weight_bytes();
  EXPECT_LT(got, all_f32);
  EXPECT_GT(got, all_f32 / 2);
  auto want = decode_logits(*f32), out = decode_logits(*mixed);
  ASSERT_EQ(want.size(), out.size());
  KILN_EXPECT_CLOSE(out.data(), want.data(), out.size(), 2e-2, "bf16 with layer 0 pinned f32 vs f32");
  // Without the pin every block is bf16: the backend must have run layer 0 in f32 for
  // the pinned engine's outputs to differ from this one's.
  o.output = (dir / "bf16.kiln").string();
  o.pin_precision = {};
  build_engine(o);
  auto all_bf16 = Model::load(o.output);
  auto unpinned = decode_logits(*all_bf16);
  KILN_EXPECT_CLOSE(unpinned.data(), want.data(), unpinned.size(), 3e-2, "bf16, nothing pinned, vs f32");
  EXPECT_NE(unpinned, out) << "the pins changed nothing the backend computed";
  EXPECT_LT(mixed->compiled().weight_bytes(), all_f32);
  EXPECT_GT(mixed->compiled().weight_bytes(), all_bf16->compiled().weight_bytes());
}

TEST(EngineProfiles, SeveralNamedProfilesFirstFitOrByName) {
  auto dir = scratch_dir();
  BuildOptions o = options("bert", dir / "bert.kiln");
  o.profiles = {parse_profile("small:T=1,4,8"), parse_profile("large:T=16,32,64")};
  build_engine(o);
  EngineContents e = engine_load(o.output);
  ASSERT_EQ(e.profiles.size(), 2u);
  EXPECT_EQ(e.profiles[0].name, "small");  // in the order given, not sorted
  EXPECT_EQ(e.profiles[1].dims.at(0).max, 64);
  EXPECT_EQ(e.schema_minor, kEngineSchemaMinor);

  auto m = Model::load(o.output);
  auto tokens = [](size_t n) { return std::vector<int32_t>(n, 5); };
  EXPECT_NO_THROW(encode(*m, {{tokens(6), {}}}));   // small
  EXPECT_NO_THROW(encode(*m, {{tokens(40), {}}}));  // large
  try {
    encode(*m, {{tokens(12), {}}});
    FAIL() << "12 tokens ran between the profiles";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(msg.find("input 'tokens' has shape [12]: T = 12 is outside every engine profile"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("'small': T in [1, 8]; 'large': T in [16, 64]"), std::string::npos) << msg;
  }
  // An execution context pinned to one profile rejects shapes only another allows.
  ModelOptions mo;
  mo.profile = "large";
  auto large = Model::load(o.output, mo);
  EXPECT_NO_THROW(encode(*large, {{tokens(20), {}}}));
  try {
    encode(*large, {{tokens(6), {}}});
    FAIL() << "6 tokens ran in the 'large' profile";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the selected engine profile 'large': T in [16, 64]"),
              std::string::npos)
        << e.what();
  }
  mo.profile = "huge";
  try {
    Model::load(o.output, mo);
    FAIL() << "an unknown profile name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no optimization profile named 'huge' (the engine has 'small', 'large')"),
              std::string::npos)
        << e.what();
  }
}

TEST(EngineProfiles, ProfileSpecsAndTheirErrors) {
  EngineProfile p = parse_profile("chat:T=1,64,512;R=1,1,8");
  EXPECT_EQ(p.name, "chat");
  ASSERT_EQ(p.dims.size(), 2u);
  EXPECT_EQ(p.dims[1].dim, "R");
  EXPECT_EQ(p.dims[1].max, 8);
  EngineProfile legacy = parse_profile("T:1,8,16");
  EXPECT_EQ(legacy.name, "default");
  EXPECT_EQ(legacy.dims.at(0).opt, 8);
  for (const char* bad : {"chat:T=1,64", "chat:T=8,4,16", "chat:=1,2,3", "chat:T=1,2,3;T=1,2,3", ":T=1,2,3", "T"})
    EXPECT_THROW(parse_profile(bad), Error) << bad;
  auto dir = scratch_dir();
  BuildOptions o = options("bert", dir / "b.kiln");
  o.profiles = {parse_profile("T:1,2,3"), parse_profile("T:4,5,6")};
  try {
    build_engine(o);
    FAIL() << "two profiles named 'default' were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two profiles are named 'default'"), std::string::npos) << e.what();
  }
}

TEST(EngineMemory, PlannedPeakIsWhatTheCpuBackendAllocatesAtTheMaxShapes) {
  auto dir = scratch_dir();
  BuildOptions o = options("bert", dir / "bert.kiln");
  o.profiles = {parse_profile("small:T=1,4,8"), parse_profile("large:T=9,16,24")};
  BuildReport r = build_engine(o);
  ASSERT_EQ(r.profiles.size(), 2u);
  EngineContents e = engine_load(o.output);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(e.profiles[i].activation_bytes, r.profiles[i].activation_bytes);
    EXPECT_GT(e.profiles[i].activation_slots, 0u);
  }
  EXPECT_LT(e.profiles[0].activation_bytes, e.profiles[1].activation_bytes);
  // T tokens as T one-token sequences: T, B (sequences) and R all reach the max.
  auto m = Model::load(o.output);
  std::vector<EncoderInput> batch(24, EncoderInput{{7}, {}});
  encode(*m, batch);
  EXPECT_EQ(m->compiled().activation_bytes(), e.profiles[1].activation_bytes);
  std::printf("  bert profiles: %llu and %llu bytes planned, %zu allocated at T = 24\n",
              (unsigned long long)e.profiles[0].activation_bytes, (unsigned long long)e.profiles[1].activation_bytes,
              m->compiled().activation_bytes());
}

TEST(EngineMemory, WorkspaceLimitFailsTheBuildSayingWhatFits) {
  auto dir = scratch_dir();
  BuildOptions o = options("llama", dir / "l.kiln");
  o.profiles = {parse_profile("T:1,128,4096")};
  const uint64_t full = build_engine(o).profiles.at(0).activation_bytes;
  o.workspace_bytes = full / 4;
  std::string hint;
  try {
    build_engine(o);
    FAIL() << "a plan over the workspace limit built";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(msg.find("profile 'default' needs a " + format_bytes(full)), std::string::npos) << msg;
    EXPECT_NE(msg.find("more than --workspace " + format_bytes(full / 4)), std::string::npos) << msg;
    size_t at = msg.find("--profile ");
    ASSERT_NE(at, std::string::npos) << msg;
    hint = msg.substr(at + 10, msg.find(';', at) - at - 10);
  }
  // The suggested profile fits; one token more would not.
  o.profiles = {parse_profile(hint)};
  BuildReport r = build_engine(o);
  EXPECT_LE(r.profiles.at(0).activation_bytes, o.workspace_bytes);
  EXPECT_EQ(engine_load(o.output).build.workspace_bytes, o.workspace_bytes);
  EngineProfile wider = o.profiles[0];
  wider.dims[0].max += 1;
  o.profiles = {wider};
  EXPECT_THROW(build_engine(o), Error);
  EXPECT_EQ(parse_bytes("64MiB"), uint64_t(64) << 20);
  EXPECT_EQ(parse_bytes("1.5KiB"), 1536u);
  EXPECT_THROW(parse_bytes("12 parsecs"), Error);
  EXPECT_THROW(parse_bytes("-5"), Error);
}

// --pack-weights: GEMM weights stored as the CPU backend's panels are used in place
// (same outputs, bit for bit, as packing at load), for f32, bf16 with pins, and q8.
TEST(EnginePackedWeights, SameOutputsAsPackingAtLoad) {
  auto dir = scratch_dir();
  for (const char* dtype : {"f32", "bf16", "q8"}) {
    SCOPED_TRACE(dtype);
    BuildOptions o = options("llama", dir / "portable.kiln");
    o.weight_dtype = dtype;
    if (std::string(dtype) == "bf16") o.pin_precision = passes::parse_precision_pins("layers.1.*=f32");
    build_engine(o);
    o.output = (dir / "packed.kiln").string();
    o.pack_weights = true;
    BuildReport r = build_engine(o);
    EXPECT_EQ(r.packed_gemms, 9u);
    auto portable = Model::load((dir / "portable.kiln").string()), packed = Model::load(o.output);
    size_t layouts = 0;
    for (auto& n : packed->graph().nodes())
      if (n.op == "Linear") {
        EXPECT_EQ(n.attr_str("weight_layout", ""), "cpu_panels16_v3") << n.name;
        EXPECT_EQ(packed->graph().weight(n.inputs[1]).dtype(), DType::kU8);
        ++layouts;
      }
    EXPECT_EQ(layouts, 9u);
    EXPECT_EQ(packed->compiled().weight_bytes() > 0, true);
    auto want = decode_logits(*portable), got = decode_logits(*packed);
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(want, got) << "the packed bytes are exactly what packing at load produces";
  }
}

// Layout v2 changed only bf16 panels (rows in pairs), v3 only q8/q4 ones (f16 scales and
// exponents): an engine of an older layout still loads and runs the same where its panels'
// bytes are unchanged (f32 of v1 and v2, bf16 of v2), and the others are refused by name.
TEST(EnginePackedWeights, OlderLayoutEnginesLoadWhereTheirBytesAreUnchanged) {
  auto dir = scratch_dir();
  struct Case {
    const char* layout;
    const char* dtype;
    bool loads;
  };
  for (const Case& c : {Case{"cpu_panels16_v1", "f32", true}, Case{"cpu_panels16_v1", "q8", false},
                        Case{"cpu_panels16_v1", "bf16", false}, Case{"cpu_panels16_v2", "f32", true},
                        Case{"cpu_panels16_v2", "bf16", true}, Case{"cpu_panels16_v2", "q4", false}}) {
    SCOPED_TRACE(std::string(c.layout) + " " + c.dtype);
    BuildOptions o = options("llama", dir / "packed.kiln");
    o.weight_dtype = c.dtype;
    o.pack_weights = true;
    build_engine(o);
    EngineContents e = engine_load(o.output);
    size_t relabeled = 0;
    for (auto& n : e.graph.nodes())
      if (n.attr_str("weight_layout", "") == "cpu_panels16_v3") {
        n.attrs["weight_layout"] = std::string(c.layout);
        ++relabeled;
      }
    ASSERT_GE(relabeled, 9u);  // the Linears (and an embedding tied to an f32 head)
    const std::string old = (dir / "old.kiln").string();
    engine_write(old, e);
    if (!c.loads) {
      try {
        Model::load(old);
        ADD_FAILURE() << "an older engine's panels were read as the current layout";
      } catch (const Error& err) {
        const std::string msg = err.what();
        EXPECT_NE(msg.find(std::string(c.dtype) + " weights packed for layout '" + c.layout + "'"), std::string::npos)
            << msg;
        EXPECT_NE(msg.find("rebuild the engine"), std::string::npos) << msg;
      }
      continue;
    }
    auto want = decode_logits(*Model::load(o.output)), got = decode_logits(*Model::load(old));
    EXPECT_EQ(want, got);
  }
}

// `kiln build --precision auto` (the CLI's default) stores what `generate` runs from the
// same checkpoint: a GGUF's Q4_K Linears as q4 codes and its Q6_K ones requantized to q8,
// the rest f32 on the CPU; the engine records the resolved dtype (f32), runs those same
// formats and gives the checkpoint's logits bit for bit, portable or packed. An f32 HF
// checkpoint stays f32.
TEST(EngineAutoPrecision, GgufQuantizedLinearsStayQuantized) {
  auto dir = scratch_dir();
  const std::string gguf = (dir / "mixed.gguf").string();
  kiln::test::write_file(gguf, kiln::test::quant_llama(GgmlType::kQ4_K, GgmlType::kQ6_K));
  ModelOptions mo;
  mo.weight_dtype = "auto";
  auto direct = Model::load(gguf, mo);
  const std::vector<float> want = decode_logits(*direct);
  for (bool pack : {false, true}) {
    SCOPED_TRACE(pack ? "packed" : "portable");
    BuildOptions o;
    o.model = gguf;
    o.output = (dir / "auto.kiln").string();
    o.tune = false;
    o.weight_dtype = "auto";
    o.pack_weights = pack;
    BuildReport r = build_engine(o);
    EXPECT_EQ(r.weights, "f32 (4 q4, 4 q8 Linears kept from the file)");
    auto engine = Model::load(o.output);
    EXPECT_EQ(engine->compile_options().weight_dtype, "f32");
    std::map<std::string, int> formats;
    for (const ir::Node& n : engine->graph().nodes())
      if (n.op == "Linear") ++formats[n.attr_str("precision", "f32")];
    EXPECT_EQ(formats["q4"], 4);  // 2 layers x (qkv, o)
    EXPECT_EQ(formats["q8"], 4);  // 2 layers x (gate_up, down)
    EXPECT_EQ(decode_logits(*engine), want);
  }
  BuildOptions hf = options("llama", dir / "hf.kiln");
  hf.weight_dtype = "auto";
  EXPECT_EQ(build_engine(hf).weights, "f32");
  EXPECT_EQ(Model::load(hf.output)->compile_options().weight_dtype, "f32");
}

// GPT-2's token embedding is tied to its (f32) LM head: packed, the embedding reads the
// head's panels, so the tensor is stored once, as in the portable engine.
TEST(EnginePackedWeights, TiedEmbeddingReadsTheLmHeadPanels) {
  auto dir = scratch_dir();
  BuildOptions o = options("gpt2", dir / "portable.kiln");
  build_engine(o);
  o.output = (dir / "packed.kiln").string();
  o.pack_weights = true;
  build_engine(o);
  auto portable = Model::load((dir / "portable.kiln").string()), packed = Model::load(o.output);
  size_t shared = 0;
  for (auto& n : packed->graph().nodes())
    if (n.op == "Embedding" && n.has_attr("weight_layout")) {
      ++shared;
      EXPECT_EQ(packed->graph().weight(n.inputs[0]).dtype(), DType::kU8);
    }
  EXPECT_EQ(shared, 1u) << "wte reads lm_head's panels; wpe stays a plain table";
  const double a = double(std::filesystem::file_size(dir / "portable.kiln")), b = double(std::filesystem::file_size(o.output));
  std::printf("  gpt2 engine: portable %.0f KiB, packed %.0f KiB\n", a / 1024, b / 1024);
  EXPECT_LT(b, a * 1.1) << "the tied tensor is stored once";
  auto want = decode_logits(*portable), got = decode_logits(*packed);
  EXPECT_EQ(want, got);
  // An out-of-vocabulary id through the packed table is still a clear error.
  LlmRunner r(*packed);
  r.add_sequence({int32_t(packed->info().vocab_size)});
  EXPECT_THROW(r.step(), Error);
}

// tests/fixtures/engine/bert_schema1.0.kiln was written by kiln 5325311 (engine schema
// 1.0: profiles without memory plans, no precision attributes, no schema_minor).
TEST(EngineCompat, Schema10EnginesStillLoadAndRun) {
  const std::string path = std::string(KILN_FIXTURES_DIR) + "/engine/bert_schema1.0.kiln";
  EngineContents e = engine_load(path);
  EXPECT_EQ(e.schema_minor, 0u);
  ASSERT_EQ(e.profiles.size(), 1u);
  EXPECT_EQ(e.profiles[0].name, "default");
  EXPECT_EQ(e.profiles[0].dims.at(0).max, 64);
  EXPECT_EQ(e.profiles[0].activation_slots, 0u) << "not recorded before 1.1";
  auto old = Model::load(path);
  auto fresh = Model::load(testing::fixture_dir("bert"));
  std::vector<EncoderInput> batch = {{{2, 5, 7, 9, 3}, {}}, {{2, 8, 3}, {0, 0, 1}}};
  auto want = encode(*fresh, batch), got = encode(*old, batch);
  for (size_t b = 0; b < batch.size(); ++b)
    KILN_EXPECT_CLOSE(got[b].hidden.data(), want[b].hidden.data(), got[b].hidden.size(), 1e-5,
                      "schema 1.0 engine vs direct load");
  EXPECT_THROW(encode(*old, {{std::vector<int32_t>(65, 5), {}}}), Error) << "its profile still applies";
}

}  // namespace
}  // namespace kiln

// A GGUF llama written here with Q4_0 / Q4_K attention and Q4_1 / Q8_0 / Q4_K MLP
// weights, loaded with --weight-dtype q4 / q8: the Linears whose type maps onto the format
// keep the file's codes, and the model computes the file's values (logits as the f32 path
// on the dequantized weights, up to summation order; Q4_K up to its f16-rounded scales);
// with --weight-dtype auto each Linear keeps its own format. These compare weight values,
// so x is multiplied as given (the int8-activation path off, see F32Activations). Also:
// auto keeps a 16-bit (bf16/f16) checkpoint's own dtype on the CPU (HalfCheckpoint).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "backends/cpu/kernels/kernels.h"
#include "frontends/weight_source.h"
#include "golden_util.h"
#include "gguf_quant_llama.h"
#include "runtime/encoder_runner.h"
#include "runtime/llm_runner.h"

namespace kiln {
namespace {

using test::quant_llama;
using test::TempDir;
using test::write_file;

// On CPUs with AVX-512 VNNI q8/q4 Linears round x to int8 per group of 32 (at every row
// count); that moves these logits by ~1e-2 of max|logit| and would hide what is checked
// here (kept codes = the file's values, up to summation order). The switch as
// KILN_CPU_QGEMV=f32 sets it; the rounding itself is tested in
// tests/backends/cpu/quant_linear_test.cpp and tests/models/real_decoder_test.cpp.
struct F32Activations {
  cpu::QGemvActs saved = cpu::cpu_qgemv_acts();
  F32Activations() { cpu::cpu_qgemv_acts_set(cpu::QGemvActs::kF32); }
  ~F32Activations() { cpu::cpu_qgemv_acts_set(saved); }
};

struct Result {
  std::vector<float> logits;
  size_t kept = 0;
};

Result run_model(const std::string& path, const std::string& dtype, bool keep) {
  ModelOptions o;
  o.weight_dtype = dtype;
  o.precision = dtype;  // as `kiln build`: the logits GEMM (the tied f32 embedding) stays f32
  o.keep_file_quant = keep;
  auto model = Model::load(path, o);
  Result r;
  for (const ir::Node& n : model->graph().nodes()) r.kept += n.has_attr("weight_quant");
  LlmRunner runner(*model, {.max_total_tokens = 64});
  runner.add_sequence({1, 5, 9, 3, 14, 2, 7});
  auto outs = runner.step();
  EXPECT_EQ(outs.size(), 1u);
  if (!outs.empty()) r.logits = outs[0].logits;
  return r;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// The test prompt's prefill logits through `model`, beside those of the same file loaded
// with f32 weights (the file's values) and their max |logit|.
struct VsF32 {
  std::vector<float> got, want;
  double scale = 0;
};
VsF32 prefill_vs_f32(Model& model, const std::string& path) {
  VsF32 r;
  LlmRunner runner(model, {.max_total_tokens = 64});
  runner.add_sequence({1, 5, 9, 3, 14, 2, 7});
  auto outs = runner.step();
  EXPECT_EQ(outs.size(), 1u);
  if (!outs.empty()) r.got = outs[0].logits;
  r.want = run_model(path, "f32", true).logits;
  for (float v : r.want) r.scale = std::max(r.scale, double(std::fabs(v)));
  return r;
}

// Kept Q4_K weights differ from the file's by at most (2^-11 + 2^-22) * (|d sc q| +
// |dmin m|) per element (frontends/gguf_quants.h), each rounding independent, so each
// Linear's output moves by well under 2^-11 of the size of its terms; through 2 layers
// (norms renormalize in between) and the f32 LM head the stated bound is 4 x 2^-11 of
// max|logit|, far below requantizing, which re-rounds codes (~1% of max|logit| here).
// Measured: 2.4e-4 of max|logit| kept vs 9e-3 requantized.
constexpr double kQ4KLogitBound = 4.0 / 2048;

TEST(GgufQuantModel, KeptCodesComputeTheFilesValues) {
  const F32Activations f32_x;
  TempDir dir;
  struct Case {
    GgmlType attn, mlp;
    const char* dtype;
    size_t kept;  // Linears that keep their codes: 2 layers x (qkv, o) and/or (gate_up, down)
  };
  // All kept: the model runs exactly the file's values (Q4_K: up to its scales and mins
  // rounded to f16). Mixed (the other type is requantized to the format asked for): only
  // which Linears keep their codes is checked. Q4_K has no q8 image.
  for (const Case& c : {Case{GgmlType::kQ4_0, GgmlType::kQ4_1, "q4", 8}, Case{GgmlType::kQ8_0, GgmlType::kQ8_0, "q8", 8},
                        Case{GgmlType::kQ4_0, GgmlType::kQ8_0, "q4", 4}, Case{GgmlType::kQ4_0, GgmlType::kQ8_0, "q8", 4},
                        Case{GgmlType::kQ4_K, GgmlType::kQ4_K, "q4", 8}, Case{GgmlType::kQ4_K, GgmlType::kQ8_0, "q4", 4},
                        Case{GgmlType::kQ4_K, GgmlType::kQ4_K, "q8", 0}}) {
    const std::string what = std::string(ggml_type_name(uint32_t(c.attn))) + "/" + ggml_type_name(uint32_t(c.mlp)) +
                             " --weight-dtype " + c.dtype;
    const std::string path = dir.file("quant.gguf");
    write_file(path, quant_llama(c.attn, c.mlp));
    const Result f32 = run_model(path, "f32", true), kept = run_model(path, c.dtype, true),
                 requant = run_model(path, c.dtype, false);
    EXPECT_EQ(f32.kept, 0u) << what;
    EXPECT_EQ(requant.kept, 0u) << what;
    EXPECT_EQ(kept.kept, c.kept) << what;
    const bool q4k = c.attn == GgmlType::kQ4_K && c.mlp == GgmlType::kQ4_K;
    double scale = 0;
    for (float v : f32.logits) scale = std::max(scale, double(std::fabs(v)));
    ASSERT_GT(scale, 0.1) << what;
    // Every Linear either keeps the file's values exactly or (requant) re-rounds them;
    // kept ones differ from f32 only by summation order.
    const double dk = max_abs_diff(kept.logits, f32.logits), dr = max_abs_diff(requant.logits, f32.logits);
    if (c.kept == 8 && !q4k) {
      EXPECT_LT(dk, 1e-4 * scale) << what << ": kept vs f32 (requantized: " << dr << ")";
    } else if (c.kept == 8) {
      EXPECT_LT(dk, kQ4KLogitBound * scale) << what << ": kept vs f32";
      EXPECT_LT(dk, dr) << what << ": kept Q4_K codes should be closer to the file's values than requantizing";
    }
    std::printf("  %-32s max|logit| %.3g  kept-f32 %.3g  requantized-f32 %.3g  kept-requantized %.3g\n", what.c_str(),
                scale, dk, dr, max_abs_diff(kept.logits, requant.logits));
  }
}

// --weight-dtype auto (the CLI's default): each Linear keeps its file's codes in its own
// format - Q4_0 attention as q4, Q8_0 MLP as q8 in the same model - tagged with that
// precision; the tied logits GEMM stays f32 over an f32 embedding; a Q8_0 embedding
// stays q8 (the lookup dequantizes its rows: WeightSpec::table) and the tied head shares
// its image; the model computes the file's values.
TEST(GgufQuantModel, AutoKeepsEachLinearInItsOwnFormat) {
  const F32Activations f32_x;
  TempDir dir;
  for (GgmlType embd : {GgmlType::kF32, GgmlType::kQ8_0}) {
    const bool q8_head = embd == GgmlType::kQ8_0;
    const std::string what = std::string("token_embd ") + ggml_type_name(uint32_t(embd));
    const std::string path = dir.file("mixed.gguf");
    write_file(path, quant_llama(GgmlType::kQ4_0, GgmlType::kQ8_0, embd));
    ModelOptions o;
    o.weight_dtype = "auto";
    auto model = Model::load(path, o);
    const ir::Graph& g = model->graph();
    const ir::Node* embed = nullptr;
    const ir::Node* head = nullptr;
    for (const ir::Node& n : g.nodes()) {
      if (n.op == "Embedding") embed = &n;
      if (n.name == "lm_head") head = &n;
    }
    ASSERT_TRUE(embed && head) << what;
    EXPECT_EQ(embed->attr_str("weight_quant", "f32"), q8_head ? "q8" : "f32") << what;
    if (q8_head) {  // one image for the table and the tied head
      EXPECT_EQ(g.weight(embed->inputs[0]).data(), g.weight(head->inputs[1]).data()) << what;
    }
    std::map<std::string, size_t> formats;  // weight_quant -> Linears
    size_t f32_linears = 0;
    for (const ir::Node& n : model->graph().nodes()) {
      if (n.op != "Linear") continue;
      if (!n.has_attr("weight_quant")) {
        ++f32_linears;
        continue;
      }
      ++formats[n.attr_str("weight_quant")];
      EXPECT_EQ(n.attr_str("precision", ""), n.attr_str("weight_quant")) << what << ": " << n.name;
    }
    EXPECT_EQ(formats["q4"], 4u) << what;                  // 2 layers x (qkv, o)
    EXPECT_EQ(formats["q8"], q8_head ? 5u : 4u) << what;   // 2 layers x (gate_up, down) (+ the head)
    EXPECT_EQ(f32_linears, q8_head ? 0u : 1u) << what;     // the tied LM head
    const VsF32 r = prefill_vs_f32(*model, path);
    ASSERT_GT(r.scale, 0.1) << what;
    EXPECT_LT(max_abs_diff(r.got, r.want), 1e-4 * r.scale) << what << ": auto vs f32 on the file's values";
  }
}

// --weight-dtype auto over the types with no q8/q4 image of their codes: a Q6_K MLP is
// requantized to q8 beside Q4_K attention kept as q4 (a Q4_K_M file's mix), so no Linear
// expands to f32; a Q5_0 one keeps its codes as q8 (d * (q - 16)) and computes the file's
// values. Requantizing moves each Q6_K weight by at most half a q8 step (~1/8 of its Q6_K
// step; the unit bound is in tests/frontends/gguf_test.cpp); through 2 layers that moves
// these random models' logits by 2.5e-4 of max|logit| (measured), bound 4e-3.
TEST(GgufQuantModel, AutoRequantizesSixBitLinearsToQ8AndKeepsQ5_0) {
  const F32Activations f32_x;
  TempDir dir;
  struct Case {
    GgmlType attn, mlp, embd;
    size_t q4, q8;
    double bound;  // of max|logit|, auto vs f32 on the file's values
  };
  // The third: a Q4_K token embedding (Q4_K_M's) stays a q4 table, the tied head shares it.
  for (const Case& c : {Case{GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kF32, 4, 4, 4e-3},
                        Case{GgmlType::kQ5_0, GgmlType::kQ8_0, GgmlType::kF32, 0, 8, 1e-4},
                        Case{GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ4_K, 5, 4, 4e-3}}) {
    const std::string what = std::string(ggml_type_name(uint32_t(c.attn))) + "/" + ggml_type_name(uint32_t(c.mlp)) +
                             "/" + ggml_type_name(uint32_t(c.embd));
    const std::string path = dir.file("mixed.gguf");
    write_file(path, quant_llama(c.attn, c.mlp, c.embd));
    ModelOptions o;
    o.weight_dtype = "auto";
    auto model = Model::load(path, o);
    std::map<std::string, size_t> formats;
    for (const ir::Node& n : model->graph().nodes()) {
      if (n.op == "Linear") ++formats[n.attr_str("weight_quant", "f32")];
      if (n.op == "Embedding") {
        EXPECT_EQ(n.attr_str("weight_quant", "f32"), c.embd == GgmlType::kQ4_K ? "q4" : "f32") << what;
      }
    }
    EXPECT_EQ(formats["q4"], c.q4) << what;
    EXPECT_EQ(formats["q8"], c.q8) << what;
    EXPECT_EQ(formats["f32"], c.embd == GgmlType::kF32 ? 1u : 0u) << what << ": only the tied head over the f32 embedding";
    const VsF32 r = prefill_vs_f32(*model, path);
    ASSERT_GT(r.scale, 0.1) << what;
    const double d = max_abs_diff(r.got, r.want);
    std::printf("  %-12s auto vs f32: max|logit| %.3g, max diff %.3g (%.2g of it)\n", what.c_str(), r.scale, d,
                d / r.scale);
    EXPECT_LT(d, c.bound * r.scale) << what;
  }
}

// A small GGUF llama whose matrices are all F16 or BF16 (GGML types 1 / 30), norms f32;
// `f32_head` stores the LM head (output.weight) as f32 instead, making the file mixed.
std::string half_llama(GgmlType t, bool f32_head = false) {
  const int64_t h = 64, inter = 96, vocab = 16, kv = h / 2;
  test::GgufWriter w;
  test::small_llama_header(w, h, inter, vocab);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 0.5f);
  auto matrix = [&](const std::string& name, int64_t n, int64_t k, bool f32 = false) {
    std::vector<float> v(size_t(n * k));
    for (float& x : v) x = nd(rng);
    if (f32) return w.tensor(name, 0, {uint64_t(k), uint64_t(n)}, test::raw_bytes(v));
    std::vector<uint16_t> c(v.size());
    for (size_t i = 0; i < v.size(); ++i) c[i] = t == GgmlType::kBF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    w.tensor(name, uint32_t(t), {uint64_t(k), uint64_t(n)}, test::raw_bytes(c));
  };
  std::vector<float> ones(size_t(h), 1.f);
  matrix("token_embd.weight", vocab, h);
  matrix("output.weight", vocab, h, f32_head);
  w.tensor("output_norm.weight", 0, {uint64_t(h)}, test::raw_bytes(ones));
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    w.tensor(b + "attn_norm.weight", 0, {uint64_t(h)}, test::raw_bytes(ones));
    w.tensor(b + "ffn_norm.weight", 0, {uint64_t(h)}, test::raw_bytes(ones));
    matrix(b + "attn_q.weight", h, h);
    matrix(b + "attn_k.weight", kv, h);
    matrix(b + "attn_v.weight", kv, h);
    matrix(b + "attn_output.weight", h, h);
    matrix(b + "ffn_gate.weight", inter, h);
    matrix(b + "ffn_up.weight", inter, h);
    matrix(b + "ffn_down.weight", h, inter);
  }
  return w.bytes();
}

std::vector<float> prompt_logits(Model& model, size_t tokens) {
  LlmRunner runner(model, {.max_total_tokens = 64});
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens; ++i) ids.push_back(int32_t((i * 7 + 3) % 16));
  runner.add_sequence(ids);
  auto outs = runner.step();
  EXPECT_EQ(outs.size(), 1u);
  return outs.empty() ? std::vector<float>{} : outs[0].logits;
}

// --weight-dtype auto on the CPU keeps a 16-bit checkpoint's GEMM weights in its own dtype
// (the same values as f32, half the bytes): the logits are f32 weights' to the bit, for a
// short prompt (the 16-bit tiles) and one of 40 tokens (16-bit panels widened once per row
// block). A file with one f32 matrix keeps f32; so does auto on a rewrite (w8a8 etc. read
// f32 weights), covered by the quantization tests' own runs.
TEST(HalfCheckpoint, GgufAutoKeepsItsDtypeOnTheCpu) {
  TempDir dir;
  for (GgmlType t : {GgmlType::kBF16, GgmlType::kF16}) {
    const std::string want = t == GgmlType::kBF16 ? "bf16" : "f16";
    const std::string path = dir.file(want + ".gguf");
    write_file(path, half_llama(t));
    ModelOptions o;
    o.weight_dtype = "auto";
    auto model = Model::load(path, o);
    EXPECT_EQ(model->compile_options().weight_dtype, want);
    o.weight_dtype = "f32";
    auto f32 = Model::load(path, o);
    EXPECT_EQ(f32->compile_options().weight_dtype, "f32");
    EXPECT_LT(model->compiled().weight_bytes(), f32->compiled().weight_bytes() * 6 / 10) << want;
    for (size_t tokens : {size_t(3), size_t(40)}) {
      const std::vector<float> a = prompt_logits(*model, tokens), b = prompt_logits(*f32, tokens);
      ASSERT_EQ(a.size(), b.size());
      ASSERT_FALSE(a.empty());
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(f32_bits(a[i]), f32_bits(b[i])) << want << ", " << tokens << " tokens, logit " << i;
    }
    const std::string mixed = dir.file(want + "-f32-head.gguf");
    write_file(mixed, half_llama(t, /*f32_head=*/true));
    o.weight_dtype = "auto";
    EXPECT_EQ(Model::load(mixed, o)->compile_options().weight_dtype, "f32") << want;
  }
}

std::string half_checkpoint_dir(const TempDir& dir, const std::string& name, DType half, bool position_ids = false,
                                bool odd_header = false) {
  return testing::write_half_checkpoint(
      name, dir.file(name + "-" + dtype_name(half) + (odd_header ? "-odd" : "")), half, position_ids, odd_header);
}

// The same for an HF directory: the llama fixture rewritten with bf16 matrices (f32 norms)
// and an int64 2-D buffer beside them, which the rule skips.
TEST(HalfCheckpoint, SafetensorsAutoKeepsItsDtypeOnTheCpu) {
  TempDir dir;
  const std::string model_dir = half_checkpoint_dir(dir, "llama", DType::kBF16, /*position_ids=*/true);
  ModelOptions o;
  o.weight_dtype = "auto";
  auto model = Model::load(model_dir, o);
  EXPECT_EQ(model->compile_options().weight_dtype, "bf16");
  o.weight_dtype = "f32";
  auto f32 = Model::load(model_dir, o);
  for (size_t tokens : {size_t(3), size_t(40)}) {
    const std::vector<float> a = prompt_logits(*model, tokens), b = prompt_logits(*f32, tokens);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_FALSE(a.empty());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(f32_bits(a[i]), f32_bits(b[i])) << tokens << " tokens, logit " << i;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Prefill logits of 7 tokens and 3 decode steps.
std::vector<float> logits_of(Model& m) {
  LlmRunner runner(m, {.max_total_tokens = 64});
  const int32_t id = runner.add_sequence({1, 5, 9, 3, 14, 2, 7});
  std::vector<float> out;
  while (runner.has_pending())
    for (auto& o : runner.step(true)) out.insert(out.end(), o.logits.begin(), o.logits.end());
  for (int32_t tok : {4, 11, 0}) {
    runner.append_tokens(id, {tok});
    for (auto& o : runner.step(false)) out.insert(out.end(), o.logits.begin(), o.logits.end());
  }
  return out;
}

// The model at `path` loaded as the library does by default and with lean_host_weights.
std::pair<std::unique_ptr<Model>, std::unique_ptr<Model>> load_plain_and_lean(const std::string& path,
                                                                              const std::string& weight_dtype) {
  ModelOptions o;
  o.weight_dtype = weight_dtype;
  auto plain = Model::load(path, o);
  o.lean_host_weights = true;
  return {std::move(plain), Model::load(path, o)};
}

// A Q8_0 GPT-2 GGUF runs on its own codes under auto: every Linear (Conv1D weights read
// as the file's [out, in] rows) and the token table stay q8 images, the tied LM head
// shares the table's, and the logits are the file's values' (its f32 expansion) up to
// summation order; the f32 load keeps nothing.
TEST(GgufQuantModel, Gpt2KeepsItsQ8LinearsAndTokenTable) {
  const F32Activations f32_x;
  TempDir dir;
  const std::string path = dir.file("gpt2_q8.gguf");
  write_file(path, test::q8_gpt2(testing::fixture_dir("gpt2")));
  ModelOptions o;
  o.weight_dtype = "auto";
  auto model = Model::load(path, o);
  size_t linears = 0, kept = 0;
  const void* table = nullptr;
  const void* head = nullptr;
  for (const ir::Node& n : model->graph().nodes()) {
    if (n.op == "Embedding" && n.name == "embed_tokens") {
      EXPECT_EQ(n.attr_str("weight_quant", ""), "q8");
      table = model->graph().weight(n.inputs[0]).data();
    }
    if (n.op != "Linear") continue;
    ++linears;
    kept += n.attr_str("weight_quant", "") == "q8";
    if (n.name == "lm_head") head = model->graph().weight(n.inputs[1]).data();
  }
  EXPECT_GT(linears, 0u);
  EXPECT_EQ(kept, linears) << "every Linear keeps the file's Q8_0 codes";
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(head, table) << "the tied head shares the table's image";
  const VsF32 r = prefill_vs_f32(*model, path);
  ASSERT_GT(r.scale, 0.01);
  EXPECT_LT(max_abs_diff(r.got, r.want), 1e-4 * r.scale);
  EXPECT_EQ(run_model(path, "f32", true).kept, 0u);
}

// ModelOptions::lean_host_weights on the CPU: the model's graph holds the Linears'
// panels (weight_layout, no [N, K] weight left beside them) and computes the bits the
// unpacked load computes, which packs the same weights inside the backend: GGUF q4/q8
// images with a requantized Q6_K MLP (auto), a bf16 checkpoint (auto keeps bf16), a
// model whose LM head is tied to its token embedding (GPT-2, and its Q8_0 GGUF whose head
// shares the table's image), and --weight-dtype q4.
TEST(PackAtLoad, TheGraphHoldsThePanelsAndComputesTheSameBits) {
  TempDir dir;
  const std::string kquant = dir.file("kquant.gguf"), half = dir.file("bf16.gguf");
  write_file(kquant, quant_llama(GgmlType::kQ4_K, GgmlType::kQ6_K));
  write_file(half, half_llama(GgmlType::kBF16));
  const std::string gpt2_q8 = dir.file("gpt2_q8.gguf");
  write_file(gpt2_q8, test::q8_gpt2(testing::fixture_dir("gpt2")));
  struct Case {
    std::string path, dtype;
  };
  for (const Case& c : {Case{kquant, "auto"}, Case{half, "auto"}, Case{testing::fixture_dir("gpt2"), "f32"},
                        Case{testing::fixture_dir("llama"), "q4"}, Case{gpt2_q8, "auto"}}) {
    const std::string what = c.path + " " + c.dtype;
    auto [plain, packed] = load_plain_and_lean(c.path, c.dtype);
    // Model::load_times: packing into the graph is a phase of the lean load only.
    EXPECT_GT(packed->load_times().pack, 0.0) << what;
    EXPECT_EQ(plain->load_times().pack, 0.0) << what;
    EXPECT_GT(plain->load_times().read, 0.0) << what;
    EXPECT_GT(plain->load_times().compile, 0.0) << what;
    size_t linears = 0;
    for (const ir::Node& n : packed->graph().nodes()) {
      if (n.op != "Linear") continue;
      ++linears;
      EXPECT_TRUE(n.has_attr("weight_layout")) << what << ": " << n.name;
      EXPECT_EQ(packed->graph().weight(n.inputs[1]).dtype(), DType::kU8) << what << ": " << n.name;
    }
    EXPECT_GT(linears, 0u) << what;
    const std::vector<float> want = logits_of(*plain), got = logits_of(*packed);
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_EQ(max_abs_diff(got, want), 0.0) << what;
  }
}

// WeightSource::keep_16bit (on under lean_host_weights): a 16-bit checkpoint's Linear
// weights and token table load in their own dtype, as views of the file's mapping where
// its bytes lie aligned and as aligned copies where they do not; norms still load f32.
TEST(Keep16Bit, HalfMatricesLoadAsTheFilesOwnBytes) {
  TempDir dir;
  const std::string aligned = half_checkpoint_dir(dir, "llama", DType::kBF16);
  const std::string odd = half_checkpoint_dir(dir, "llama", DType::kBF16, /*position_ids=*/false, /*odd_header=*/true);
  const std::string q = "model.layers.0.self_attn.q_proj.weight", table = "model.embed_tokens.weight",
                    norm = "model.norm.weight";
  for (const std::string& d : {aligned, odd}) {
    auto src = open_safetensors_source(d + "/model.safetensors");
    const std::vector<WeightSpec> specs = {{.name = q, .shape = src->info(q).shape, .linear = true},
                                           {.name = table, .shape = src->info(table).shape, .table = true},
                                           {.name = norm, .shape = src->info(norm).shape}};
    const auto f32 = load_declared_weights(specs, *src);
    src->keep_16bit(true);
    const auto half = load_declared_weights(specs, *src);
    EXPECT_EQ(f32.at(q).dtype(), DType::kF32);
    EXPECT_EQ(half.at(norm).dtype(), DType::kF32);
    for (const std::string& name : {q, table}) {
      const Tensor& t = half.at(name);
      ASSERT_EQ(t.dtype(), DType::kBF16) << d << " " << name;
      const std::optional<Tensor> view = src->view(name);
      if (d == aligned) {
        ASSERT_TRUE(view) << name;
        EXPECT_EQ(t.data(), view->data()) << name << ": not the file's own bytes";
      } else {
        EXPECT_FALSE(view) << name << ": a misaligned view";
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u) << name;
      }
      const Tensor wide = t.to(DType::kF32);
      ASSERT_EQ(wide.numel(), f32.at(name).numel());
      for (int64_t i = 0; i < wide.numel(); ++i)
        ASSERT_EQ(f32_bits(wide.data_as<float>()[i]), f32_bits(f32.at(name).data_as<float>()[i])) << name << " " << i;
    }
  }
}

// A model loaded with 16-bit weights computes the bits of the f32 load (bf16 and f16 widen
// exactly): bf16 and f16 HF directories (aligned and not, GPT-2's transposed Conv1D
// weights) and GGUF files (permuted q/k rows), with auto, f32 and q4 GEMM weights.
TEST(Keep16Bit, HalfWeightsComputeTheBitsOfTheF32Load) {
  TempDir dir;
  const std::string bf16_gguf = dir.file("bf16.gguf"), f16_gguf = dir.file("f16.gguf");
  write_file(bf16_gguf, half_llama(GgmlType::kBF16));
  write_file(f16_gguf, half_llama(GgmlType::kF16));
  struct Case {
    std::string path, dtype;
  };
  for (const Case& c : {Case{half_checkpoint_dir(dir, "llama", DType::kBF16), "auto"},
                        Case{half_checkpoint_dir(dir, "llama", DType::kBF16, false, /*odd_header=*/true), "f32"},
                        Case{half_checkpoint_dir(dir, "gpt2", DType::kF16), "auto"},
                        Case{half_checkpoint_dir(dir, "qwen2", DType::kF16), "q4"}, Case{bf16_gguf, "auto"},
                        Case{f16_gguf, "q4"}}) {
    const std::string what = c.path + " " + c.dtype;
    auto [plain, lean] = load_plain_and_lean(c.path, c.dtype);
    // The token table (WeightSpec::table) stays in the file's dtype.
    auto table_dtype = [](const Model& m) {
      for (const ir::Node& n : m.graph().nodes())
        if (n.op == "Embedding" && n.name == "embed_tokens") return m.graph().weight(n.inputs[0]).dtype();
      return DType::kU8;
    };
    EXPECT_EQ(table_dtype(*plain), DType::kF32) << what;
    EXPECT_EQ(dtype_size(table_dtype(*lean)), 2u) << what;
    const std::vector<float> want = logits_of(*plain), got = logits_of(*lean);
    ASSERT_EQ(got.size(), want.size()) << what;
    ASSERT_FALSE(got.empty()) << what;
    EXPECT_EQ(max_abs_diff(got, want), 0.0) << what;
  }
  // An encoder (BERT's Linears; its tables stay f32 for the fused embedding norm).
  const std::string bert = half_checkpoint_dir(dir, "bert", DType::kF16);
  auto [plain_bert, lean_bert] = load_plain_and_lean(bert, "auto");
  const std::vector<EncoderInput> batch = {{{2, 7, 4, 9, 3}, {0, 0, 0, 1, 1}}, {{5, 1}, {}}};
  const auto want = encode(*plain_bert, batch), got = encode(*lean_bert, batch);
  ASSERT_EQ(got.size(), want.size());
  for (size_t b = 0; b < got.size(); ++b) {
    ASSERT_FALSE(want[b].hidden.empty());
    EXPECT_EQ(max_abs_diff(got[b].hidden, want[b].hidden), 0.0) << "bert sequence " << b;
    EXPECT_EQ(max_abs_diff(got[b].logits, want[b].logits), 0.0) << "bert sequence " << b;
  }
}

}  // namespace
}  // namespace kiln

// The attention writing a W8A8 o projection's int8 codes (cuda_int8_fuse.h: static scales
// only): the flash kernel's epilogue against the same kernel's T output followed by
// launch_int8_quantize (and by core/int8.h on the host), code for code, in bf16 and f16,
// head dims 64 and 128, causal and bidirectional ragged (BERT's padding) sequences, CTAs
// of every width; its
// E4M3 codes as well (the epilogue shared with the FP8 path); which attentions the
// backend decides to write as codes (no GPU needed); and graphs of an attention feeding a
// static W8A8 Linear, run with the fusion and with KILN_CUDA_INT8_FUSE=0, flash forced on
// and off and one-token sequences (the grouped decode kernel), whose outputs must agree
// bit for bit, eager and replayed. Skips the device parts without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_int8_fuse.h"
#include "backends/cuda/ops/attention.h"
#include "backends/cuda/ops/fp8.h"
#include "backends/cuda/ops/int8.h"
#include "core/dtype.h"
#include "core/int8.h"
#include "core/status.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;


// Random values in `dt` (f16 / bf16 storage).
Tensor random_act(std::vector<int64_t> shape, std::mt19937_64& rng, DType dt, float lo, float hi) {
  return random_tensor(std::move(shape), rng, dt == DType::kF16 ? "f16" : "bf16", lo, hi).to(dt);
}

// The flash kernel's epilogue codes against its own T output quantized by
// launch_int8_quantize and by core/int8.h on the host: bit-identical. Ragged sequences
// off every CTA width (128, 64, 32 items) and the 64-key tile (one a single token), GQA and
// MHA; the scale clips at 0.6 of the output's max, so codes saturate.
TEST(CudaAttentionInt8, FlashEpilogueWritesTheQuantizeKernelsCodes) {
  KILN_SKIP_WITHOUT_CUDA();
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Case {
    int64_t hq, hkv, d;
    std::vector<int32_t> lens;
    bool causal;
  };
  for (const Case& c : {Case{8, 2, 64, {200, 37, 130}, true}, Case{8, 2, 64, {200, 37, 130}, false},
                        Case{4, 4, 128, {150, 1, 64}, false}, Case{4, 2, 128, {300}, true}, Case{12, 12, 64, {128, 77}, false}})
    for (int width : kFlashCtaWidths)
    for (int rows : {16, 32})
    for (DType dt : {DType::kBF16, DType::kF16})
    for (int items : {256, 384}) {
      // 384 items per SM: the kernel's form for short CTAs at head dim 64 (32-key softmax
      // steps); its T output must also match the 256 form's within rounding. 32-row warps
      // exist in 128-item CTAs at 256 items per SM only.
      if (items == 384 && c.d != 64) continue;
      if (rows == 32 && (width != 128 || items == 384)) continue;
      const std::string what = str_cat(dtype_name(dt), " hq=", c.hq, " hkv=", c.hkv, " d=", c.d,
                                       c.causal ? " causal" : " bidirectional", " seqs=", c.lens.size(), " width=", width,
                                       " rows=", rows, " items/SM=", items);
      ASSERT_TRUE(attention_flash_supported(dt, c.d)) << what;
      std::vector<AttnSeq> seqs;
      std::vector<int32_t> tables;  // without a cache each sequence's keys are its own rows
      int32_t t = 0, max_len = 0;
      for (int32_t n : c.lens) {
        seqs.push_back({t, n, n, int32_t(tables.size())});
        for (int32_t i = 0; i < n; ++i) tables.push_back(t + i);
        t += n;
        max_len = std::max(max_len, n);
      }
      // Unsplit (split_chunk -1): a key-split plan's combine writes T, then the quantize pass.
      const AttentionPlan plan = attention_plan(seqs, c.hq, c.hkv, c.causal, sms, -1, 1, width);
      ASSERT_EQ(plan.flash_width, width) << what;
      ASSERT_EQ(plan.num_partials, 0) << what;
      std::mt19937_64 rng(uint64_t(c.d * 131 + c.hq * 7 + t + int(dt)));
      const int64_t qw = c.hq * c.d, kw = c.hkv * c.d, n = t * qw;
      const Tensor q = random_act({t, qw}, rng, dt, -2, 2), k = random_act({t, kw}, rng, dt, -2, 2),
                   v = random_act({t, kw}, rng, dt, -2, 2);
      Dev dq(q.data(), q.nbytes()), dk(k.data(), k.nbytes()), dv(v.data(), v.nbytes()),
          dseqs(seqs.data(), seqs.size() * sizeof(AttnSeq)), dtab(tables.data(), tables.size() * 4),
          dwork(plan.work.data(), plan.work.size() * sizeof(AttnWork));
      Dev out{size_t(n) * 2}, q_ref{size_t(n)}, q_fused{size_t(n)}, e_ref{size_t(n)}, e_fused{size_t(n)};
      AttentionArgs a;
      a.dtype = dt;
      a.q = dq.get();
      a.k_cache = dk.get();
      a.v_cache = dv.get();
      a.block_size = 1;
      a.hq = c.hq;
      a.hkv = c.hkv;
      a.d = c.d;
      a.scale = float(1.0 / std::sqrt(double(c.d)));
      a.causal = c.causal;
      a.max_q_len = max_len;
      a.seqs = dseqs.as<AttnSeq>();
      a.block_tables = dtab.as<int32_t>();
      a.work = dwork.as<AttnWork>();
      a.num_work = int32_t(plan.work.size());
      a.flash_width = plan.flash_width;
      a.flash_items_per_sm = items;
      a.flash_warp_rows = rows;
      a.out = out.get();
      launch_attention(a, nullptr);
      // The T output on the host, as f32: it sets the clip, and core/int8.h quantizes it.
      std::vector<uint16_t> raw = out.host<uint16_t>(size_t(n));
      std::vector<float> y(raw.size());
      float ymax = 0;
      for (size_t i = 0; i < raw.size(); ++i) {
        y[i] = dt == DType::kBF16 ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
        ymax = std::max(ymax, std::fabs(y[i]));
      }
      ASSERT_GT(ymax, 0.0f) << what;
      static std::vector<float> y256;  // the 256 form's output of this case (the loop's previous pass)
      if (items == 256) {
        y256 = y;
      } else {
        ASSERT_EQ(y256.size(), y.size()) << what;
        float dmax = 0;
        for (size_t i = 0; i < y.size(); ++i) dmax = std::max(dmax, std::fabs(y[i] - y256[i]));
        EXPECT_LE(dmax, 0.02f * ymax) << what << ": the 384 form against the 256 form";
      }
      const float inv = 1.0f / int8_act_scale(0.6 * ymax);
      launch_int8_quantize(dt, out.get(), t, qw, inv, q_ref.as<int8_t>(), nullptr, nullptr);

      AttentionArgs b = a;
      b.out = nullptr;  // the codes replace the output
      b.out_codes = q_fused.as<uint8_t>();
      b.out_code = AttnOutCode::kInt8;
      b.out_code_inv = inv;
      launch_attention(b, nullptr);
      // The E4M3 codes through the same epilogue (the FP8 o projection's input).
      const float inv8 = 448.0f / ymax;
      launch_fp8_quantize(dt, out.get(), n, inv8, e_ref.as<uint8_t>(), nullptr);
      b.out_codes = e_fused.as<uint8_t>();
      b.out_code = AttnOutCode::kFp8;
      b.out_code_inv = inv8;
      launch_attention(b, nullptr);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());

      const auto fused = q_fused.host<int8_t>(size_t(n)), unfused = q_ref.host<int8_t>(size_t(n));
      size_t bad = 0, bad_host = 0, saturated = 0;
      std::set<int8_t> distinct;
      for (size_t i = 0; i < size_t(n); ++i) {
        distinct.insert(unfused[i]);
        saturated += unfused[i] == 127 || unfused[i] == -127;
        bad_host += unfused[i] != int8_quantize(y[i], inv);
        if (fused[i] != unfused[i] && bad++ < 5)
          ADD_FAILURE() << what << ": element " << i << " fused " << int(fused[i]) << ", unfused " << int(unfused[i]);
      }
      EXPECT_EQ(bad, 0u) << what << " (" << n << " codes)";
      EXPECT_EQ(bad_host, 0u) << what << ": the quantize kernel against core/int8.h";
      EXPECT_GE(distinct.size(), 200u) << what << ": too few distinct codes to test";
      EXPECT_GT(saturated, 0u) << what << ": no code saturated";
      const auto f8 = e_fused.host(size_t(n)), r8 = e_ref.host(size_t(n));
      size_t bad8 = 0;
      for (size_t i = 0; i < size_t(n); ++i) bad8 += f8[i] != r8[i];
      EXPECT_EQ(bad8, 0u) << what << " (E4M3 codes)";
      std::printf("  %s: %lld int8 codes, %zu differ (%zu distinct, %zu saturated); E4M3 %zu differ\n", what.c_str(),
                  (long long)n, bad, distinct.size(), saturated, bad8);
    }
}

// Attention -> Linear(s): `readers` says which Linears read the attention's output.
enum class Readers { kStatic, kTwoStatic, kPerToken, kTwoScales, kStaticAndPerToken, kStaticAndAdd, kStaticAndBf16 };

ir::Graph attention_graph(std::mt19937_64& rng, int64_t hq, int64_t hkv, int64_t d, bool causal, Readers readers,
                          bool tap = false) {
  ir::Graph g;
  const int64_t qw = hq * d, kw = hkv * d;
  auto q = g.add_input("q", DType::kF32, Shape{"T", qw});
  auto k = g.add_input("k", DType::kF32, Shape{"T", kw});
  auto v = g.add_input("v", DType::kF32, Shape{"T", kw});
  auto a = g.add("Attention", {q, k, v},
                 {{"layer", int64_t(0)}, {"num_heads", hq}, {"num_kv_heads", hkv}, {"head_dim", d},
                  {"scale", 1.0 / std::sqrt(double(d))}, {"causal", int64_t(causal)}},
                 "attn");
  if (tap) g.add_output("attn", a);
  int wi = 0;
  auto linear = [&](double amax, bool dynamic, const std::string& quant, const std::string& name) {
    std::map<std::string, ir::Attr> at;
    if (!quant.empty()) at = {{"quant", quant}, {"act_amax", amax}};
    if (dynamic) at["act_dynamic"] = int64_t(1);
    auto w = g.add_weight(str_cat("w", wi), random_tensor({96, qw}, rng, "f32", -0.1f, 0.1f));
    auto b = g.add_weight(str_cat("b", wi++), random_tensor({96}, rng, "f32", -0.2f, 0.2f));
    g.add_output(name, g.add("Linear", {a, w, b}, at, name));
  };
  // The clip sits inside the output range (|attention| reaches ~2): some codes saturate.
  const bool pt = readers == Readers::kPerToken;
  linear(0.8, pt, "w8a8", "o_proj");
  switch (readers) {
    case Readers::kTwoStatic: linear(0.8, false, "w8a8", "o_proj2"); break;
    case Readers::kPerToken: linear(3.0, true, "w8a8", "o_proj2"); break;
    case Readers::kTwoScales: linear(1.5, false, "w8a8", "o_proj2"); break;
    case Readers::kStaticAndPerToken: linear(0.8, true, "w8a8", "o_proj2"); break;
    case Readers::kStaticAndAdd: g.add_output("sum", g.add("Add", {a, a})); break;
    case Readers::kStaticAndBf16: linear(0.8, false, "", "o_proj2"); break;
    case Readers::kStatic: break;
  }
  ir::verify(g);
  return g;
}

TEST(CudaAttentionInt8, WhichAttentionsWriteCodes) {
  ScopedEnv env("KILN_CUDA_INT8_FUSE", "1");
  std::mt19937_64 rng(11);
  auto codes = [](const ir::Graph& g, DType act = DType::kBF16) {
    return int8_fused_output(node_named(g, "attn"), 0, g, act);
  };
  const ir::Graph one = attention_graph(rng, 4, 2, 64, true, Readers::kStatic);
  ASSERT_TRUE(codes(one).has_value()) << "one static W8A8 o projection";
  EXPECT_FALSE(codes(one)->per_token);
  EXPECT_EQ(codes(one)->inv, 1.0f / int8_act_scale(0.8)) << "the reader's scale";
  EXPECT_TRUE(codes(one, DType::kF16).has_value());
  EXPECT_FALSE(codes(one, DType::kF32).has_value()) << "f32 activations keep the separate pass";
  EXPECT_EQ(int8_profile_tag(node_named(one, "attn"), one, DType::kBF16), "{+int8 quantize}");
  EXPECT_EQ(int8_profile_tag(node_named(one, "o_proj"), one, DType::kBF16), "{int8 in}");
  EXPECT_TRUE(codes(attention_graph(rng, 4, 2, 64, true, Readers::kTwoStatic)).has_value())
      << "two static readers of one scale";
  EXPECT_TRUE(codes(attention_graph(rng, 2, 2, 128, false, Readers::kStatic)).has_value());

  // Per token (no attention CTA sees a whole row), mixed readers, a graph output: no codes.
  for (Readers r : {Readers::kPerToken, Readers::kTwoScales, Readers::kStaticAndPerToken, Readers::kStaticAndAdd,
                    Readers::kStaticAndBf16}) {
    const ir::Graph g = attention_graph(rng, 4, 2, 64, true, r);
    EXPECT_FALSE(codes(g).has_value()) << "readers " << int(r);
    EXPECT_EQ(int8_profile_tag(node_named(g, "attn"), g, DType::kBF16), "") << "readers " << int(r);
    EXPECT_EQ(int8_profile_tag(node_named(g, "o_proj"), g, DType::kBF16), "") << "readers " << int(r);
  }
  const ir::Graph tapped = attention_graph(rng, 4, 2, 64, true, Readers::kStatic, true);
  EXPECT_FALSE(codes(tapped).has_value()) << "also a graph output";

  ScopedEnv off("KILN_CUDA_INT8_FUSE", "0");
  EXPECT_FALSE(codes(one).has_value()) << "switched off";
  EXPECT_EQ(int8_profile_tag(node_named(one, "o_proj"), one, DType::kBF16), "");
}

// Attention -> static W8A8 Linear(s), fused and not: the same codes reach the same GEMM,
// so the outputs agree bit for bit; the fused graph also run twice more (captured and
// replayed). Flash forced on (head dims 64/128: the epilogue writes the codes) and off
// (the tile kernel, then the quantize pass); one-token sequences take the grouped
// decode kernel; bf16 and f16 activations.
TEST(CudaAttentionInt8, GraphIsBitIdenticalToUnfused) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t hq, hkv, d;
    std::vector<int32_t> lens;
    bool causal;
    Readers readers;
  };
  const std::vector<Case> cases = {{8, 2, 64, {200, 37}, true, Readers::kStatic},
                                   {4, 4, 128, {150, 3, 90}, false, Readers::kTwoStatic},
                                   {12, 12, 64, {128, 128, 60}, false, Readers::kStatic},
                                   {8, 4, 128, {1, 1, 1, 1, 1}, true, Readers::kStatic}};
  for (const Case& c : cases)
    for (const char* flash : {"0", "1"})
      for (const char* wd : {"w8a8", "f16"}) {
        const std::string what = str_cat(wd, " hq=", c.hq, " d=", c.d, c.causal ? " causal" : " bidirectional",
                                         " seqs=", c.lens.size(), " flash=", flash);
        std::mt19937_64 rng(uint64_t(c.d * 31 + c.hq + c.lens.size()));
        const ir::Graph g = attention_graph(rng, c.hq, c.hkv, c.d, c.causal, c.readers);
        const StepInfo step = cacheless_step(c.lens);
        const int32_t t = int32_t(step.slot_mapping.size());
        const int64_t qw = c.hq * c.d, kw = c.hkv * c.d;
        const TensorMap in = {{"q", random_tensor({t, qw}, rng, "bf16", -2, 2)},
                              {"k", random_tensor({t, kw}, rng, "bf16", -2, 2)},
                              {"v", random_tensor({t, kw}, rng, "bf16", -2, 2)}};
        const ScopedEnv flash_env("KILN_CUDA_FLASH", flash);  // read while compiling
        auto compile = [&](const char* fuse) {
          ScopedEnv env("KILN_CUDA_INT8_FUSE", fuse);
          EXPECT_EQ(int8_fused_output(node_named(g, "attn"), 0, g, DType::kBF16).has_value(), fuse[0] == '1') << what;
          return create_backend("cuda")->compile(g, {.weight_dtype = wd});
        };
        auto copy = [](const TensorMap& out) {  // outputs are views of the compiled graph's buffer
          TensorMap m;
          for (auto& [name, x] : out) m[name] = x.to(DType::kF32);
          return m;
        };
        auto on = compile("1"), off = compile("0");
        const TensorMap ref = copy(off->run(in, step, nullptr));
        for (int rep = 0; rep < 3; ++rep) {
          const TensorMap got = copy(on->run(in, step, nullptr));
          expect_outputs_bit_identical(got, ref, str_cat("attention codes ", what, " run ", rep));
        }
      }
}

}  // namespace
}  // namespace kiln::cuda

// Paged attention conformance: the CUDA Attention op against the CPU backend's over
// multi-step scenarios (prefill, decode, mixed chunk+decode steps) through shuffled
// block tables, GQA/MQA/MHA, head dims 16/32/64/128, short and long (3000+) contexts,
// with split-KV automatic, forced (64-key chunks) and off; and the encoder path (no
// cache, bidirectional); the tensor-core prefill kernel automatic and forced; the int8
// and fp8 caches (--kv-cache-dtype) against the CPU backend with the same cache dtype,
// through the decode, tile and tensor-core kernels, split and unsplit, and the packed
// RoPE path with its quantizing cache write, with and without a key shift
// (KvLayout::k_shift); the pool's codes and scales equal the CPU pool's bit for bit; decode steps over directly filled pools (batch 1/3/64, contexts to
// 4096, GQA groups 1-8) through the cluster decode kernel (unsplit and 2/8 splits) and
// the fused grouped-query decode kernel; steps without a cache whose sequences are one
// token each (the grouped kernel reading the rows in place); the packed q|k|v front end's
// 16-byte-chunk kernel against its element kernel, bit for bit. The tensor-core kernel also
// over chunked prefills after a cached prefix, at each CTA width (128, 64, 32 items), and
// its plan's coverage, order and width choice (host only); the decode switches read once
// per compiled graph. Skips without a GPU (the plan
// test runs anywhere).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "backends/cpu/cpu_ops.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/ops/attention.h"
#include "cuda_test_util.h"

namespace kiln::cuda {
namespace {

using namespace testing;

struct Config {
  int64_t hq, hkv, d, block_size;
  std::vector<int32_t> prompts;  // prompt length per sequence
};

// window > 0: a sliding-window attention node (each query sees its last `window` keys);
// softcap > 0: its scores soft-capped (Gemma 2).
ir::Graph attention_graph(const Config& c, bool causal, int64_t window = 0, double softcap = 0.0) {
  ir::Graph g;
  ir::ValueId q = g.add_input("q", DType::kF32, Shape{"T", c.hq * c.d});
  ir::ValueId k = g.add_input("k", DType::kF32, Shape{"T", c.hkv * c.d});
  ir::ValueId v = g.add_input("v", DType::kF32, Shape{"T", c.hkv * c.d});
  std::map<std::string, ir::Attr> attrs = {{"layer", int64_t(0)},
                                           {"num_heads", c.hq},
                                           {"num_kv_heads", c.hkv},
                                           {"head_dim", c.d},
                                           {"scale", 1.0 / std::sqrt(double(c.d))},
                                           {"causal", int64_t(causal)}};
  if (window > 0) attrs["window"] = window;
  if (softcap > 0.0) attrs["softcap"] = softcap;
  g.add_output("y", g.add("Attention", {q, k, v}, std::move(attrs), "attn"));
  return g;
}

// Chunked prefill through the tensor-core kernel: every sequence's prompt arrives in
// chunks, one per step, whose queries see the cached prefix and causally each other;
// chunk starts and contexts off the 64-key tile and the block size (including a block
// size that is not a power of two), GQA groups that split a 16-item MMA tile across rows
// (3), a whole tile of one row's heads (16), MHA; decode-like 1-token chunks beside long
// ones in the same step.
std::vector<StepCase> chunked_steps(const Config& c, const std::vector<std::vector<int32_t>>& chunks,
                                    const std::string& dt, int64_t num_blocks, std::mt19937_64& rng) {
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next_block = 0, steps_n = 0;
  for (const auto& ch : chunks) steps_n = std::max(steps_n, ch.size());
  std::vector<std::vector<int32_t>> tables(chunks.size());
  std::vector<int32_t> len(chunks.size(), 0);
  std::vector<StepCase> steps;
  for (size_t step = 0; step < steps_n; ++step) {
    StepCase sc;
    int32_t t = 0;
    for (size_t s = 0; s < chunks.size(); ++s) {
      if (step >= chunks[s].size()) continue;
      const int32_t n = chunks[s][step];
      for (int32_t i = 0; i < n; ++i) {
        const int32_t p = len[s] + i;
        if (p / c.block_size >= int64_t(tables[s].size())) tables[s].push_back(pool.at(next_block++));
        sc.step.slot_mapping.push_back(int64_t(tables[s][size_t(p / c.block_size)]) * c.block_size + p % c.block_size);
      }
      len[s] += n;
      sc.step.seqs.push_back({t, n, len[s], tables[s]});
      t += n;
    }
    sc.inputs["q"] = random_tensor({t, c.hq * c.d}, rng, dt, -2, 2);
    sc.inputs["k"] = random_tensor({t, c.hkv * c.d}, rng, dt, -2, 2);
    sc.inputs["v"] = random_tensor({t, c.hkv * c.d}, rng, dt);
    steps.push_back(std::move(sc));
  }
  return steps;
}

// Steps of a decoder: (1) every prompt prefilled, (2) one decode token each, (3) a
// 5-token chunk for even sequences and a decode token for odd ones.
std::vector<StepCase> decoder_steps(const Config& c, const std::string& dt, int64_t num_blocks, std::mt19937_64& rng) {
  std::vector<std::vector<int32_t>> chunks;
  for (size_t s = 0; s < c.prompts.size(); ++s) chunks.push_back({c.prompts[s], 1, s % 2 == 0 ? 5 : 1});
  return chunked_steps(c, chunks, dt, num_blocks, rng);
}

// Bound on max|cuda - cpu| / max|cpu| with an int8/fp8 cache. Both backends store the
// same codes and scales (the K/V inputs are exact in the dtype under test, and both
// quantize with the same f32 operations), so what remains is the kernels' arithmetic as
// for the 16/32-bit caches, plus, in the tensor-core kernel, the dequantized tiles
// rounded to f16/bf16 (2^-12 / 2^-9 relative).
double quantized_tolerance(const std::string& dtype) {
  if (dtype == "f32") return 1e-4;
  if (dtype == "f16") return 3e-3;
  return 1e-2;
}

// flash "1" plans the tensor-core kernel for every non-decode step it supports (16-bit,
// head dims 64/128): prefills and the mixed chunk + decode steps.
void check_decoder(const Config& c, const std::string& split_chunk, const std::string& flash = "",
                   KvDType kv_dtype = KvDType::kAuto, int64_t window = 0, double softcap = 0.0,
                   bool k_rotate = false) {
  setenv("KILN_CUDA_SPLIT_CHUNK", split_chunk.c_str(), 1);
  setenv("KILN_CUDA_FLASH", flash.c_str(), 1);
  int64_t tokens = 0;
  for (int32_t p : c.prompts) tokens += p + 6;
  const int64_t blocks = tokens / c.block_size + int64_t(c.prompts.size()) * 2 + 4;
  for (const auto& dt : all_dtypes()) {
    std::mt19937_64 rng(uint64_t(c.hq * 1000 + c.d + c.prompts.size()));
    auto steps = decoder_steps(c, dt, blocks, rng);
    KvLayout kv{.num_layers = 1, .num_blocks = blocks, .block_size = c.block_size, .num_kv_heads = c.hkv, .head_dim = c.d,
                .dtype = kv_dtype, .k_rotate = k_rotate};
    std::string what = str_cat("attn hq=", c.hq, " hkv=", c.hkv, " d=", c.d, " bs=", c.block_size, " seqs=", c.prompts.size(),
                               " max_prompt=", *std::max_element(c.prompts.begin(), c.prompts.end()), " split=", split_chunk, " flash=", flash,
                               " kv=", kv_dtype_name(kv_dtype), " window=", window, " softcap=", softcap,
                               k_rotate ? " rotated keys" : "");
    const double tol = kv_dtype == KvDType::kAuto ? op_tolerance(dt) : quantized_tolerance(dt);
    expect_backends_match(attention_graph(c, true, window, softcap), steps, dt, tol, what, kv);
  }
  unsetenv("KILN_CUDA_SPLIT_CHUNK");
  unsetenv("KILN_CUDA_FLASH");
}

TEST(CudaAttention, DecoderShortContexts) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Config& c : {Config{4, 4, 16, 16, {5, 1, 17}}, Config{4, 2, 16, 4, {13, 2}}, Config{4, 1, 32, 16, {40, 3, 1}},
                          Config{9, 3, 64, 16, {33, 7}}, Config{32, 8, 128, 16, {50, 16, 1}}, Config{8, 8, 64, 32, {100}},
                          Config{32, 32, 96, 16, {40, 3, 1}}, Config{8, 2, 96, 16, {70}}})
    for (const char* split : {"0", "-1", "16"}) check_decoder(c, split, split[0] == '0' ? "1" : "");
}

TEST(CudaAttention, DecoderLongContexts) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const char* split : {"0", "64", "-1"}) {
    check_decoder(Config{4, 2, 64, 16, {3000, 700}}, split);
    check_decoder(Config{8, 1, 128, 16, {1500}}, split);
  }
  // Tensor-core prefill forced on (auto already picks it for these prefills) and off.
  for (const char* flash : {"1", "0"}) {
    check_decoder(Config{4, 2, 64, 16, {3000, 700}}, "0", flash);
    check_decoder(Config{32, 8, 128, 16, {1100, 37, 1}}, "0", flash);
  }
}

// Sliding windows (Mistral, Gemma's local layers, Phi-3-mini) on the tile and decode
// kernels: a window of one key, windows shorter than a 32-key tile, across tiles and
// splits, and longer than some contexts; prefill, decode and chunk steps; plans split and
// not, the tensor-core kernel asked for (the window keeps nodes of head dims 16-128 off
// it; at 96, Phi-3-mini's heads, it takes them); int8 / fp8 caches.
TEST(CudaAttention, SlidingWindowMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (int64_t window : {1, 7, 40, 100})
    for (const Config& c : {Config{4, 2, 16, 16, {5, 1, 17}}, Config{9, 3, 64, 16, {133, 7}},
                            Config{32, 8, 128, 16, {300, 16, 1}}, Config{32, 32, 96, 16, {300, 16, 1}}})
      for (const char* split : {"0", "-1", "16"}) check_decoder(c, split, "1", KvDType::kAuto, window);
  for (KvDType kv : {KvDType::kInt8, KvDType::kFp8})
    check_decoder(Config{8, 2, 64, 16, {200, 9, 1}}, "0", "", kv, 50);
}

// Head dim 256 (Gemma 2 and 3) on the tile kernel (dynamic shared memory past 48 KiB),
// the tensor-core kernel (windows and soft caps included) and the decode kernels:
// prefill, decode and chunk steps, split and not, GQA groups of 2 and 8 (Gemma 3 1B: 4 q
// heads over 1 KV head); Gemma 2's soft-capped scores, alone and with a sliding window,
// on every head dim; quantized caches at 256.
TEST(CudaAttention, HeadDim256AndSoftCapMatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Config& c : {Config{4, 2, 256, 16, {5, 1, 17}}, Config{8, 1, 256, 16, {150, 16, 1}}})
    for (const char* split : {"0", "-1", "16"})
      for (const char* flash : {"", "0", "1"}) {  // the tensor-core kernel takes 256 and windows too
        check_decoder(c, split, flash);
        check_decoder(c, split, flash, KvDType::kAuto, 40);
      }
  // Windows across the tensor-core kernel's 64-key tiles and 32-key steps, prompts of
  // several CTAs, with and without a soft cap.
  for (int64_t window : {1, 33, 64, 130})
    for (const char* flash : {"0", "1"}) {
      check_decoder(Config{4, 1, 256, 16, {300, 70}}, "0", flash, KvDType::kAuto, window, window == 33 ? 3.0 : 0.0);
      check_decoder(Config{16, 8, 256, 16, {200}}, "0", flash, KvDType::kAuto, window, 0.0);
    }
  for (const Config& c : {Config{4, 2, 16, 16, {5, 1, 17}}, Config{9, 3, 64, 16, {133, 7}},
                          Config{32, 8, 128, 16, {300, 16, 1}}, Config{8, 2, 256, 16, {70, 3}},
                          Config{8, 8, 96, 16, {70, 3}}})
    for (int64_t window : {0, 9}) check_decoder(c, "0", "1", KvDType::kAuto, window, 1.5);
  for (KvDType kv : {KvDType::kInt8, KvDType::kFp8}) check_decoder(Config{4, 1, 256, 16, {90, 2, 1}}, "0", "", kv, 20, 2.0);
}

void check_chunked(const Config& c, const std::vector<std::vector<int32_t>>& chunks, KvDType kv_dtype,
                   const std::vector<std::string>& dtypes, bool causal = true) {
  int64_t blocks = 4;
  for (const auto& ch : chunks) blocks += (std::accumulate(ch.begin(), ch.end(), int64_t(0)) + c.block_size - 1) / c.block_size;
  for (const std::string& dt : dtypes) {
    std::mt19937_64 rng(uint64_t(c.hq * 31 + c.d + c.block_size));
    auto steps = chunked_steps(c, chunks, dt, blocks, rng);
    KvLayout kv{.num_layers = 1, .num_blocks = blocks, .block_size = c.block_size, .num_kv_heads = c.hkv,
                .head_dim = c.d, .dtype = kv_dtype};
    const double tol = kv_dtype == KvDType::kAuto ? op_tolerance(dt) : quantized_tolerance(dt);
    const ScopedEnv flash("KILN_CUDA_FLASH", "1");
    expect_backends_match(attention_graph(c, causal), steps, dt, tol,
                          str_cat("chunked hq=", c.hq, " hkv=", c.hkv, " d=", c.d, " bs=", c.block_size,
                                  " kv=", kv_dtype_name(kv_dtype), causal ? "" : " bidirectional"),
                          kv);
  }
}

TEST(CudaAttention, ChunkedPrefillTensorCore) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<std::string> half{"f16", "bf16"};
  check_chunked(Config{32, 8, 128, 16, {}}, {{700, 333, 1}, {64, 129, 2}, {1, 1, 200}}, KvDType::kAuto, half);
  check_chunked(Config{8, 2, 64, 5, {}}, {{150, 91}, {37, 64, 3}}, KvDType::kAuto, half);
  check_chunked(Config{12, 12, 64, 32, {}}, {{129, 130}}, KvDType::kAuto, {"bf16"});
  check_chunked(Config{16, 1, 128, 16, {}}, {{70, 45}, {5, 9}}, KvDType::kAuto, {"f16"});
  check_chunked(Config{9, 3, 64, 16, {}}, {{100, 57}}, KvDType::kAuto, {"bf16"});
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8})
    check_chunked(Config{32, 8, 128, 16, {}}, {{300, 77}, {45, 130}}, kd, {"bf16"});
}

// A mistyped decode switch is an error naming the variable when the graph compiles, not
// silently a kernel.
TEST(CudaAttention, BadDecodeSwitchesAreErrors) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const auto& [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"KILN_CUDA_DECODE_ATTN", "fast"},
           {"KILN_CUDA_DECODE_SPLITS", "3"},
           {"KILN_CUDA_DECODE_SPLITS", "4x"},
           {"KILN_CUDA_DECODE_WARP", "4"},
           {"KILN_CUDA_DECODE_WARP", "1x"}}) {
    const ScopedEnv env(name, value);
    auto be = create_backend("cuda");
    try {
      be->compile(attention_graph(Config{4, 2, 64, 16, {}}, true), {.weight_dtype = "bf16"});
      ADD_FAILURE() << "compile accepted " << name << "=" << value;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// The tensor-core kernel's plan (host only, no GPU): every (row, head) item of every
// sequence in exactly one CTA of the plan's width (picked, and each width forced), the
// CTAs that read the most keys first.
TEST(CudaAttentionPlan, FlashPlanCoversEveryItemLongestFirst) {
  const std::vector<AttnSeq> seqs = {{0, 300, 1000, 0}, {300, 37, 37, 0}, {337, 1, 500, 0}, {338, 1024, 1024, 0}};
  const int64_t hq = 12, hkv = 4, group = 3;
  for (int forced : {0, 128, 64, 32})
    for (bool causal : {true, false}) {
      SCOPED_TRACE(str_cat("width ", forced, causal ? " causal" : " bidirectional"));
      // Unsplit (split_chunk -1; key splits: FlashKeySplitsTileEachCtasKeys).
      const AttentionPlan plan = attention_plan(seqs, hq, hkv, causal, 132, -1, 1, forced);
      const int64_t width = forced ? forced : 128;  // 34 CTAs x 4 KV heads of 128 fill 132 SMs
      ASSERT_EQ(plan.flash_width, width);
      int64_t ctas = 0;
      for (const AttnSeq& s : seqs) ctas += (s.q_len * group + width - 1) / width;
      EXPECT_EQ(plan.work.size(), size_t(ctas));
      std::vector<std::vector<int>> seen(seqs.size());
      for (size_t i = 0; i < seqs.size(); ++i) seen[i].assign(size_t(seqs[i].q_len * group), 0);
      int64_t prev_keys = INT64_MAX;
      for (const AttnWork& w : plan.work) {
        const AttnSeq& s = seqs[size_t(w.seq)];
        const int64_t n = int64_t(s.q_len) * group, last = std::min<int64_t>(n, w.item_begin + width) - 1;
        EXPECT_EQ(w.item_begin % width, 0);
        EXPECT_EQ(w.kv_begin, 0);
        EXPECT_EQ(w.kv_end, s.ctx_len);
        EXPECT_EQ(w.partial, -1);
        for (int64_t it = w.item_begin; it <= last; ++it) ++seen[size_t(w.seq)][size_t(it)];
        const int64_t keys = causal ? s.ctx_len - s.q_len + last / group + 1 : s.ctx_len;
        EXPECT_LE(keys, prev_keys) << "CTAs ordered by the keys they read";
        prev_keys = keys;
      }
      for (const auto& v : seen)
        for (int x : v) EXPECT_EQ(x, 1);
    }
}

// Tensor-core key splits (host only, no GPU): a short causal grid cuts its longer CTAs'
// keys into chunks of at least kFlashMinSplitKeys that tile [0, ctx_len) exactly (the last
// one ends where the unsplit item did), one partial each, combined per work item; pieces
// listed with the most keys they read first; a full grid, an encoder batch of 128 tokens
// and split_chunk < 0 stay unsplit; a forced chunk is kept.
TEST(CudaAttentionPlan, FlashKeySplitsTileEachCtasKeys) {
  auto check_tiling = [](const AttentionPlan& p, const std::vector<AttnSeq>& seqs, int64_t group,
                         const std::string& what) {
    std::map<int32_t, std::vector<std::pair<int32_t, int32_t>>> pieces;  // combine -> key ranges
    int32_t prev = INT32_MAX;
    for (const AttnWork& w : p.work) {
      if (w.partial < 0) {
        EXPECT_EQ(w.kv_begin, 0) << what;
        continue;
      }
      const AttnSeq& sq = seqs[size_t(w.seq)];
      const int32_t last = std::min<int32_t>(w.item_begin + p.flash_width, sq.q_len * int32_t(group)) - 1;
      const int32_t len = std::min(w.kv_end, sq.ctx_len - sq.q_len + last / int32_t(group) + 1) - w.kv_begin;
      EXPECT_LE(len, prev) << what << ": pieces not longest first";
      prev = len;
      ASSERT_GE(w.combine, 0) << what;
      ASSERT_LT(size_t(w.combine), p.combine.size()) << what;
      const AttnCombine& cb = p.combine[size_t(w.combine)];
      EXPECT_EQ(cb.seq, w.seq) << what;
      EXPECT_EQ(cb.item_begin, w.item_begin) << what;
      EXPECT_GE(w.partial, cb.partial_begin) << what;
      EXPECT_LT(w.partial, cb.partial_begin + cb.num_splits) << what;
      pieces[w.combine].push_back({w.kv_begin, w.kv_end});
    }
    int32_t partials = 0;
    for (size_t c = 0; c < p.combine.size(); ++c) {
      auto& v = pieces[int32_t(c)];
      std::sort(v.begin(), v.end());
      const AttnCombine& cb = p.combine[c];
      ASSERT_EQ(int32_t(v.size()), cb.num_splits) << what;
      EXPECT_GE(cb.num_splits, 2) << what;
      partials += cb.num_splits;
      const AttnSeq& s = seqs[size_t(cb.seq)];
      const int32_t last_row = std::min<int32_t>(cb.item_begin + p.flash_width, s.q_len * int32_t(group)) - 1;
      const int32_t keys = s.ctx_len - s.q_len + last_row / int32_t(group) + 1;  // causal
      int32_t at = 0;
      for (const auto& [b, e] : v) {
        EXPECT_EQ(b, at) << what << ": a gap or overlap";
        EXPECT_GT(e, b) << what;
        EXPECT_LT(b, keys) << what << ": a chunk past the causal keys";
        at = e;
      }
      EXPECT_EQ(at, s.ctx_len) << what;
    }
    EXPECT_EQ(partials, p.num_partials) << what;
  };
  auto seqs_of = [](int n, int32_t len) {
    std::vector<AttnSeq> v;
    for (int i = 0; i < n; ++i) v.push_back({i * len, len, len, 0});
    return v;
  };
  // Gemma 3 1B (4 / 1): a prompt of 512 (64 CTAs of 32 items) and a chunk of 128 after
  // 2,000 cached tokens (16 CTAs, 2,001-2,128 keys each).
  std::vector<AttnSeq> after = seqs_of(1, 128);
  after[0].ctx_len += 2000;
  for (const std::vector<AttnSeq>& seqs : {seqs_of(1, 512), after}) {
    const int64_t hq = 4, hkv = 1;
    const AttentionPlan p = attention_plan(seqs, hq, hkv, true, 132, 0, 1);
    const std::string what = str_cat(hq, "/", hkv, " ", seqs[0].q_len, " tokens of ", seqs[0].ctx_len);
    EXPECT_GT(p.num_partials, 0) << what;
    for (const AttnWork& w : p.work) EXPECT_GE(w.kv_end - w.kv_begin, w.partial >= 0 ? 1 : 0) << what;
    for (const AttnCombine& cb : p.combine) EXPECT_GE(cb.num_splits, 2) << what;
    check_tiling(p, seqs, hq / hkv, what);
    // Chunks of at least kFlashMinSplitKeys, but the last of a CTA's.
    for (const AttnWork& w : p.work) {
      if (w.partial >= 0 && w.kv_begin == 0) {
        EXPECT_GE(w.kv_end, kFlashMinSplitKeys) << what;
      }
    }
    EXPECT_EQ(attention_plan(seqs, hq, hkv, true, 132, -1, 1).num_partials, 0) << what << ": never split";
  }
  // Forced chunks (tests): 64 keys over two sequences with cached tokens.
  std::vector<AttnSeq> chunked = seqs_of(2, 100);
  chunked[1].ctx_len += 300;
  const AttentionPlan forced = attention_plan(chunked, 8, 2, true, 132, 64, 1);
  EXPECT_GT(forced.num_partials, 0);
  check_tiling(forced, chunked, 4, "forced 64-key chunks");
  // Grids that fill half the SMs (Qwen3-0.6B and Llama-3.2-1B at pp512: 256 CTAs; 8B
  // pp2048) and BERT-base at 1 x 128 tokens: no splits.
  EXPECT_EQ(attention_plan(seqs_of(1, 512), 16, 8, true, 132, 0, 1).num_partials, 0);
  EXPECT_EQ(attention_plan(seqs_of(1, 512), 32, 8, true, 132, 0, 1).num_partials, 0);
  EXPECT_EQ(attention_plan(seqs_of(1, 2048), 32, 8, true, 132, 0, 1).num_partials, 0);
  EXPECT_EQ(attention_plan(seqs_of(1, 128), 12, 12, false, 132, 0, 1).num_partials, 0);
}

// The tensor-core CTAs' width (host only, no GPU): the widest whose grid (CTAs x KV heads)
// reaches the SMs, else the narrowest; forced widths kept, others an error; the items per
// SM; the flash decision itself as before (a decode step keeps the split plans).
TEST(CudaAttentionPlan, FlashWidthFillsTheSms) {
  auto seqs_of = [](int n, int32_t len) {
    std::vector<AttnSeq> v;
    for (int i = 0; i < n; ++i) v.push_back({i * len, len, len, 0});
    return v;
  };
  struct Want {
    const char* what;
    std::vector<AttnSeq> seqs;
    int64_t hq, hkv;
    int sms, width;
  };
  const std::vector<Want> wants = {
      {"BERT-base batch 1: 12 / 24 / 48 CTAs", seqs_of(1, 128), 12, 12, 132, 32},
      {"BERT-base batch 8: 96 CTAs of 128, 192 of 64", seqs_of(8, 128), 12, 12, 132, 64},
      {"BERT-base batch 32: 384 CTAs of 128", seqs_of(32, 128), 12, 12, 132, 128},
      {"BERT-base batch 1 on 12 SMs", seqs_of(1, 128), 12, 12, 12, 128},
      {"BERT-base batch 1 on 24 SMs", seqs_of(1, 128), 12, 12, 24, 64},
      {"Llama 32/8 one prompt of 512: 128 CTAs of 128", seqs_of(1, 512), 32, 8, 132, 64},
      {"Llama 32/8 one prompt of 2048", seqs_of(1, 2048), 32, 8, 132, 128},
      {"ragged: 3 x 20 tokens, 8/8: 24 CTAs at any width", seqs_of(3, 20), 8, 8, 132, 32},
      {"exactly num_sms CTAs of 128", seqs_of(11, 128), 12, 12, 132, 128},
  };
  for (const Want& w : wants) {
    EXPECT_EQ(attention_flash_pick_width(w.seqs, w.hq, w.hkv, w.sms), w.width) << w.what;
    EXPECT_EQ(attention_plan(w.seqs, w.hq, w.hkv, false, w.sms, 0, 1).flash_width, w.width) << w.what;
    // Automatic: the same width where a sequence fills 64 items (the ragged case does not).
    const bool full = w.seqs[0].q_len * (w.hq / w.hkv) >= 64;
    EXPECT_EQ(attention_plan(w.seqs, w.hq, w.hkv, true, w.sms, 0, -1).flash_width, full ? w.width : 0) << w.what;
  }
  // Items per SM: 384 only where every CTA reads at most kFlashShortKeys keys and 256 a SM
  // would take more than one wave.
  struct Items {
    const char* what;
    std::vector<AttnSeq> seqs;
    int64_t hq, hkv;
    bool causal;
    int items;
  };
  std::vector<AttnSeq> chunk = seqs_of(32, 128);  // 128 new tokens after 200 cached: 328 keys
  for (AttnSeq& s : chunk) s.ctx_len += 200;
  const std::vector<Items> items = {
      {"BERT-base batch 32: 49,152 items, 128 keys", seqs_of(32, 128), 12, 12, false, 384},
      {"BERT-base batch 8: one wave", seqs_of(8, 128), 12, 12, false, 256},
      {"BERT-base batch 22: 33,792 items, exactly one wave", seqs_of(22, 128), 12, 12, false, 256},
      {"BERT-base batch 32 of 256 tokens", seqs_of(32, 256), 12, 12, false, 384},
      {"BERT-base batch 32 of 320 tokens: 320 keys", seqs_of(32, 320), 12, 12, false, 256},
      {"Llama 32/8 one prompt of 2048", seqs_of(1, 2048), 32, 8, true, 256},
      {"32 causal chunks of 128 after 200 cached tokens", chunk, 12, 12, true, 256},
  };
  for (const Items& w : items)
    EXPECT_EQ(attention_plan(w.seqs, w.hq, w.hkv, w.causal, 132, 0, 1).flash_items_per_sm, w.items) << w.what;

  const std::vector<AttnSeq> bert = seqs_of(1, 128);
  for (int forced : kFlashCtaWidths) EXPECT_EQ(attention_plan(bert, 12, 12, false, 132, 0, 1, forced).flash_width, forced);
  for (int bad : {16, 48, 256, -64}) EXPECT_THROW(attention_plan(bert, 12, 12, false, 132, 0, 1, bad), Error) << bad;
  // Not a tensor-core step: decode rows (automatic) and flash off, whatever the width.
  const std::vector<AttnSeq> decode = {{0, 1, 300, 0}, {1, 1, 40, 0}};
  EXPECT_EQ(attention_plan(decode, 32, 8, true, 132, 0, -1).flash_width, 0);
  EXPECT_EQ(attention_plan(bert, 12, 12, false, 132, 0, 0, 64).flash_width, 0);
  {
    const ScopedEnv e("KILN_CUDA_FLASH_WIDTH", "");
    EXPECT_EQ(attention_flash_width_from_env(), 0);
  }
  for (const char* ok : {"128", "64", "32"}) {
    const ScopedEnv e("KILN_CUDA_FLASH_WIDTH", ok);
    EXPECT_EQ(attention_flash_width_from_env(), std::atoi(ok));
  }
  for (const char* bad : {"48", "64x", "0", "-32", "99999999999"}) {
    const ScopedEnv e("KILN_CUDA_FLASH_WIDTH", bad);
    try {
      (void)attention_flash_width_from_env();
      ADD_FAILURE() << "KILN_CUDA_FLASH_WIDTH=" << bad << " accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("KILN_CUDA_FLASH_WIDTH"), std::string::npos) << err.what();
    }
  }
}

// The rows a tensor-core warp takes (host only, no GPU): in 128-item CTAs 32 for head
// dim 128 over a 16-bit cache, else 16, unless forced; always 16 in narrower ones; the
// switch's parsing.
TEST(CudaAttentionPlan, FlashWarpRows) {
  AttentionArgs a;
  for (int64_t d : {64, 128})
    for (KvCode code : {KvCode::kNone, KvCode::kFp8})
      for (int width : kFlashCtaWidths)
        for (int forced : {0, 16, 32}) {
          a.d = d;
          a.kv_code = code;
          a.flash_width = width;
          a.flash_warp_rows = forced;
          const int picked = d == 128 && code == KvCode::kNone ? 32 : 16;
          EXPECT_EQ(attention_flash_warp_rows(a), width == 128 ? (forced ? forced : picked) : 16)
              << d << " " << int(code) << " " << width << " " << forced;
        }
  a.flash_warp_rows = 64;
  EXPECT_THROW((void)attention_flash_warp_rows(a), Error);
  {
    const ScopedEnv e("KILN_CUDA_FLASH_WARP_ROWS", "");
    EXPECT_EQ(attention_flash_warp_rows_from_env(), 0);
  }
  for (const char* ok : {"16", "32"}) {
    const ScopedEnv e("KILN_CUDA_FLASH_WARP_ROWS", ok);
    EXPECT_EQ(attention_flash_warp_rows_from_env(), std::atoi(ok));
  }
  for (const char* bad : {"8", "32x", "0", "64"}) {
    const ScopedEnv e("KILN_CUDA_FLASH_WARP_ROWS", bad);
    try {
      (void)attention_flash_warp_rows_from_env();
      ADD_FAILURE() << "KILN_CUDA_FLASH_WARP_ROWS=" << bad << " accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("KILN_CUDA_FLASH_WARP_ROWS"), std::string::npos) << err.what();
    }
  }
}

// The decode switches' parsing and the cluster plan's forced splits (host only, no GPU).
TEST(CudaAttentionPlan, DecodeSwitchesAndForcedSplits) {
  {
    const ScopedEnv attn("KILN_CUDA_DECODE_ATTN", ""), splits("KILN_CUDA_DECODE_SPLITS", "");
    EXPECT_TRUE(attention_decode_cluster_from_env());
    EXPECT_EQ(attention_decode_splits_from_env(), 0);
  }
  {
    const ScopedEnv attn("KILN_CUDA_DECODE_ATTN", "old"), splits("KILN_CUDA_DECODE_SPLITS", "8");
    EXPECT_FALSE(attention_decode_cluster_from_env());
    EXPECT_EQ(attention_decode_splits_from_env(), 8);
  }
  {
    const ScopedEnv attn("KILN_CUDA_DECODE_ATTN", "cluster"), splits("KILN_CUDA_DECODE_SPLITS", "0");
    EXPECT_TRUE(attention_decode_cluster_from_env());
    EXPECT_THROW(attention_decode_splits_from_env(), Error);
  }
  const std::vector<AttnSeq> seqs = {{0, 1, 100, 0}, {1, 1, 20, 0}};
  // 2 sequences x 8 KV heads on 132 SMs, short contexts: one split unless forced.
  EXPECT_EQ(attention_plan_decode_cluster(seqs, 32, 8, 64, 132).decode_splits, 1);
  for (int forced : {1, 2, 4, 8})
    EXPECT_EQ(attention_plan_decode_cluster(seqs, 32, 8, 64, 132, forced).decode_splits, forced);
  EXPECT_THROW(attention_plan_decode_cluster(seqs, 32, 8, 64, 132, 3), Error);
  for (const char* bad : {"4", "-1", "1x", "warp"}) {
    const ScopedEnv warp("KILN_CUDA_DECODE_WARP", bad);
    EXPECT_THROW(attention_decode_warp_from_env(), Error) << bad;
  }
  for (const char* good : {"0", "1", "2", "3"}) {
    const ScopedEnv warp("KILN_CUDA_DECODE_WARP", good);
    EXPECT_EQ(attention_decode_warp_from_env(), good[0] - '0');
  }
  {
    const ScopedEnv warp("KILN_CUDA_DECODE_WARP", "");
    EXPECT_EQ(attention_decode_warp_from_env(), -1);
  }
  // The warp decode kernel: planned for an unsplit grid of >= 3 (head dim 128) or 4 (64)
  // (sequence, KV head) items an SM, 2 stages at 128 up to 12 items an SM, 3 beyond, 1 at
  // 64; never with 0; always (1 split) when forced.
  EXPECT_EQ(attention_plan_decode_cluster(seqs, 32, 8, 64, 132).decode_warp, 0);
  auto warp_for = [](int64_t batch, int64_t d, int32_t ctx) {
    return attention_plan_decode_cluster(std::vector<AttnSeq>(size_t(batch), AttnSeq{0, 1, ctx, 0}), 32, 8, d, 132)
        .decode_warp;
  };
  EXPECT_EQ(warp_for(49, 128, 160), 0);  // 392 items < 3 x 132
  EXPECT_EQ(warp_for(50, 128, 160), 2);  // 400
  EXPECT_EQ(warp_for(198, 128, 160), 2);  // 1584 = 12 x 132
  EXPECT_EQ(warp_for(199, 128, 160), 3);
  EXPECT_EQ(warp_for(256, 128, 8192), 3);  // long contexts too: batch decode is unsplit
  EXPECT_EQ(warp_for(65, 64, 160), 0);   // 520 < 4 x 132
  EXPECT_EQ(warp_for(66, 64, 160), 1);
  EXPECT_EQ(warp_for(256, 64, 1024), 1);
  const std::vector<AttnSeq> batch(256, AttnSeq{0, 1, 160, 0});
  EXPECT_EQ(attention_plan_decode_cluster(batch, 32, 8, 128, 132).decode_splits, 1);
  EXPECT_EQ(attention_plan_decode_cluster(batch, 32, 8, 128, 132, 0, 0).decode_warp, 0);
  const AttentionPlan forced = attention_plan_decode_cluster({{0, 1, 8192, 0}}, 32, 8, 128, 132, 0, 3);
  EXPECT_EQ(forced.decode_splits, 1);
  EXPECT_EQ(forced.decode_warp, 3);
  EXPECT_THROW(attention_plan_decode_cluster(seqs, 32, 8, 64, 132, 0, 4), Error);
}

// int8 and fp8 caches: decode steps through the decode kernel (GQA groups 1-4) and split
// plans (tile kernel + combine), prefills and mixed steps through the tile kernel and
// the tensor-core one, head dims 16-128, long contexts.
TEST(CudaAttention, QuantizedCachesMatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8}) {
    for (const Config& c : {Config{4, 4, 16, 16, {5, 1, 17}}, Config{8, 2, 32, 16, {40, 3}}, Config{9, 3, 64, 16, {33, 7}},
                            Config{32, 8, 128, 16, {50, 16, 1}}, Config{32, 32, 96, 16, {20, 3}}})
      for (const char* split : {"0", "-1", "16"}) check_decoder(c, split, split[0] == '0' ? "1" : "", kd);
    for (const char* split : {"0", "64", "-1"}) check_decoder(Config{4, 2, 64, 16, {3000, 700}}, split, "", kd);
    for (const char* flash : {"1", "0"}) check_decoder(Config{32, 8, 128, 16, {1100, 37, 1}}, "0", flash, kd);
  }
}

// Keys stored rotated (KvLayout::k_rotate): the quantizing writes rotate the keys as the
// CPU does, and every kernel reading the cache rotates its queries - the decode kernel,
// split plans (tile kernel + combine), the tile kernel's prefills and the tensor-core
// kernel, head dims 16 (blocks of 16), 64, 96 (blocks of 32), 128 and 256.
TEST(CudaAttention, RotatedKeysMatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8}) {
    for (const Config& c : {Config{4, 4, 16, 16, {5, 1, 17}}, Config{9, 3, 64, 16, {33, 7}},
                            Config{32, 8, 128, 16, {50, 16, 1}}, Config{32, 32, 96, 16, {20, 3}}})
      for (const char* split : {"0", "-1", "16"}) check_decoder(c, split, split[0] == '0' ? "1" : "", kd, 0, 0.0, true);
    for (const char* flash : {"1", "0"}) check_decoder(Config{32, 8, 128, 16, {1100, 37, 1}}, "0", flash, kd, 0, 0.0, true);
    check_decoder(Config{8, 4, 256, 16, {100, 30}}, "0", "1", kd, 0, 0.0, true);
  }
}

// A key shift (KvLayout::k_shift) of [layers, hkv, d] random values.
std::shared_ptr<const std::vector<float>> random_key_shift(int64_t layers, int64_t hkv, int64_t d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  auto s = std::make_shared<std::vector<float>>(size_t(layers * hkv * d));
  for (float& x : *s) x = u(rng);
  return s;
}

// After a prefill step and a decode step (whose new K/V the fused decode kernel
// quantizes itself), the CUDA pool's codes and scales are the CPU pool's, bit for bit
// (both backends quantize the same f32 values with the same operations), with and
// without a key shift; one token's K rows are all zeros (scale 0, codes 0, unless the
// keys are shifted).
TEST(CudaAttention, QuantizedPoolHoldsTheCpuCodesAndScales) {
  KILN_SKIP_WITHOUT_CUDA();
  const Config c{8, 2, 64, 16, {37, 5}};
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8})
    for (const std::string dt : {"f32", "bf16"})
    for (bool shifted : {false, true})
    for (bool rotated : {false, true}) {
      SCOPED_TRACE(str_cat(kv_dtype_name(kd), " ", dt, shifted ? " key shift" : "", rotated ? " rotated" : ""));
      std::mt19937_64 rng(17);
      const int64_t blocks = 8;
      auto steps = decoder_steps(c, dt, blocks, rng);
      Tensor& k = steps[0].inputs["k"];
      std::fill_n(k.data_as<float>() + 3 * c.hkv * c.d, c.hkv * c.d, 0.0f);
      KvLayout layout{.num_layers = 1, .num_blocks = blocks, .block_size = c.block_size, .num_kv_heads = c.hkv,
                      .head_dim = c.d, .dtype = kd};
      if (shifted) layout.k_shift = random_key_shift(1, c.hkv, c.d, 23);
      layout.k_rotate = rotated;
      auto cpu = create_backend("cpu");
      auto gpu = create_backend("cuda");
      ir::Graph g = attention_graph(c, true);
      auto cg = cpu->compile(g, {.weight_dtype = "f32"});
      auto gg = gpu->compile(g, {.weight_dtype = dt});
      auto ckv = cpu->allocate_kv(layout);
      auto gkv = gpu->allocate_kv(layout);
      for (size_t i = 0; i < 2; ++i) {
        cg->run(steps[i].inputs, steps[i].step, ckv.get());
        gg->run(steps[i].inputs, steps[i].step, gkv.get());
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto* cp = dynamic_cast<cpu::CpuKv*>(ckv.get());
      auto* gp = dynamic_cast<CudaKv*>(gkv.get());
      ASSERT_TRUE(cp && gp);
      const size_t codes = size_t(layout.num_blocks * layout.block_elems()), rows = codes / size_t(c.d);
      std::vector<int8_t> gk(codes), gv(codes);
      std::vector<float> gks(rows), gvs(rows);
      ASSERT_EQ(cudaMemcpy(gk.data(), gp->k(0), codes, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gv.data(), gp->v(0), codes, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gks.data(), gp->k_scales(0), rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gvs.data(), gp->v_scales(0), rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      size_t written = 0, zero_rows = 0, code_diff = 0, scale_diff = 0;
      std::vector<int64_t> slots = steps[0].step.slot_mapping;
      slots.insert(slots.end(), steps[1].step.slot_mapping.begin(), steps[1].step.slot_mapping.end());
      for (int64_t slot : slots)
        for (int64_t h = 0; h < c.hkv; ++h) {
          const size_t r = size_t(slot * c.hkv + h);
          ++written;
          zero_rows += gks[r] == 0.0f;
          scale_diff += gks[r] != cp->k_scales(0)[r];
          scale_diff += gvs[r] != cp->v_scales(0)[r];
          for (int64_t i = 0; i < c.d; ++i) {
            code_diff += gk[r * size_t(c.d) + size_t(i)] != cp->k_codes(0)[r * size_t(c.d) + size_t(i)];
            code_diff += gv[r * size_t(c.d) + size_t(i)] != cp->v_codes(0)[r * size_t(c.d) + size_t(i)];
          }
        }
      EXPECT_EQ(written, size_t((42 + 2) * c.hkv));
      EXPECT_EQ(zero_rows, shifted ? 0 : size_t(c.hkv)) << "token 3's all-zero K rows have scale 0 when unshifted";
      EXPECT_EQ(code_diff, 0u);
      EXPECT_EQ(scale_diff, 0u);
    }
}

// One step without a KV cache: each prompt a sequence whose context is its own rows.
StepCase cacheless_step(const Config& c, const std::string& dt, std::mt19937_64& rng) {
  StepCase sc;
  int32_t t = 0;
  for (int32_t n : c.prompts) {
    sc.step.seqs.push_back({t, n, n, {}});
    t += n;
  }
  sc.step.slot_mapping.assign(size_t(t), -1);
  sc.inputs["q"] = random_tensor({t, c.hq * c.d}, rng, dt, -2, 2);
  sc.inputs["k"] = random_tensor({t, c.hkv * c.d}, rng, dt, -2, 2);
  sc.inputs["v"] = random_tensor({t, c.hkv * c.d}, rng, dt);
  return sc;
}

TEST(CudaAttention, EncoderBidirectionalWithoutCache) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Config& c : {Config{4, 4, 16, 1, {5, 12, 1}}, Config{12, 12, 32, 1, {128, 37}}, Config{16, 16, 64, 1, {384}},
                          Config{12, 12, 64, 1, {128, 77, 3}}, Config{4, 4, 128, 1, {200}}})
    for (const char* flash : {"", "1"})
    for (const auto& dt : all_dtypes()) {
      setenv("KILN_CUDA_FLASH", flash, 1);
      std::mt19937_64 rng(uint64_t(c.d));
      const StepCase sc = cacheless_step(c, dt, rng);
      expect_backends_match(attention_graph(c, false), {sc}, dt, op_tolerance(dt),
                            str_cat("encoder attn h=", c.hq, " d=", c.d, " seqs=", c.prompts.size(), " flash=", flash));
      unsetenv("KILN_CUDA_FLASH");
    }
}

// The tensor-core kernel at each CTA width (KILN_CUDA_FLASH_WIDTH, read when the graph
// compiles) and, at 128 items, with 16- and 32-row warps (KILN_CUDA_FLASH_WARP_ROWS)
// against the CPU backend: one-token blocks (the encoder path: K/V rows read in
// place) bidirectional and causal, 16-token paged blocks causal (prompts of different
// lengths, then chunks after the cached prefix, 1-token chunks beside long ones) and
// bidirectional, int8/fp8 caches; head dims 64, 96 (Phi-3-mini's 32/32: a tile's copies
// dealt out chunk by chunk), 128 and 256, MHA (12/12, 32/32) and GQA (32/8, 8/4, 4/1); item
// counts off every width (3, 45, 77, 308, ...).
TEST(CudaAttention, TensorCoreWidthsMatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  const std::vector<std::string> half{"f16", "bf16"};
  for (const auto& [width, rows] :
       std::vector<std::pair<int, const char*>>{{128, "32"}, {128, "16"}, {64, ""}, {32, ""}}) {
    const ScopedEnv width_env("KILN_CUDA_FLASH_WIDTH", std::to_string(width)),
        rows_env("KILN_CUDA_FLASH_WARP_ROWS", rows);
    for (const Config& c : {Config{12, 12, 64, 1, {128, 77, 3}}, Config{32, 8, 128, 1, {45, 200}},
                            Config{8, 4, 256, 1, {100, 30}}, Config{32, 32, 96, 1, {70, 130}}})
      for (bool causal : {false, true})
        for (const std::string& dt : half) {
          const ScopedEnv flash("KILN_CUDA_FLASH", "1");
          std::mt19937_64 rng(uint64_t(c.d + width + causal));
          const StepCase sc = cacheless_step(c, dt, rng);
          expect_backends_match(attention_graph(c, causal), {sc}, dt, op_tolerance(dt),
                                str_cat("encoder attn h=", c.hq, "/", c.hkv, " d=", c.d, causal ? " causal" : "",
                                        " width=", width, " rows=", rows));
        }
    check_chunked(Config{32, 8, 128, 16, {}}, {{77, 150}, {200, 1}, {5, 64}}, KvDType::kAuto, half);
    check_chunked(Config{12, 12, 64, 16, {}}, {{129, 60}, {45}, {1, 100}}, KvDType::kAuto, half);
    check_chunked(Config{12, 12, 64, 16, {}}, {{100, 37}, {13}}, KvDType::kAuto, {"bf16"}, false);
    check_chunked(Config{32, 8, 128, 16, {}}, {{90}, {33, 20}}, KvDType::kAuto, {"bf16"}, false);
    check_chunked(Config{4, 1, 256, 16, {}}, {{150, 40}, {20, 1}}, KvDType::kAuto, half);
    check_chunked(Config{32, 32, 96, 16, {}}, {{100, 30}, {7, 1}}, KvDType::kAuto, half);  // Phi-3-mini's heads
    for (KvDType kd : {KvDType::kInt8, KvDType::kFp8}) {
      check_chunked(Config{32, 32, 96, 16, {}}, {{80, 20}}, kd, {"bf16"});
      check_chunked(Config{4, 1, 256, 16, {}}, {{90, 30}}, kd, {"bf16"});
      check_chunked(Config{32, 8, 128, 16, {}}, {{150, 40}, {37}}, kd, {"bf16"});
      check_chunked(Config{12, 12, 64, 16, {}}, {{70}, {19, 3}}, kd, {"f16"});
    }
  }
}

// Packed q|k|v rows (pass fuse_qkv_attention) with RoPE inside (full and partial rotary
// dims) and without: RoPE, the KV write and attention against the CPU backend's.
ir::Graph packed_graph(const Config& c, bool causal, int64_t rotary_dim) {
  ir::Graph g;
  ir::ValueId qkv = g.add_input("qkv", DType::kF32, Shape{"T", (c.hq + 2 * c.hkv) * c.d});
  std::map<std::string, ir::Attr> attrs{{"layer", int64_t(0)}, {"num_heads", c.hq}, {"num_kv_heads", c.hkv}, {"head_dim", c.d},
                  {"scale", 1.0 / std::sqrt(double(c.d))}, {"causal", int64_t(causal)}, {"packed_qkv", int64_t(1)}};
  std::vector<ir::ValueId> ins{qkv};
  if (rotary_dim > 0) {
    Tensor inv(DType::kF32, {rotary_dim / 2});
    for (int64_t i = 0; i < rotary_dim / 2; ++i)
      inv.data_as<float>()[i] = float(std::pow(10000.0, -2.0 * double(i) / double(rotary_dim)));
    ins.push_back(g.add_input("positions", DType::kI32, Shape{"T"}));
    ins.push_back(g.add_weight("inv_freq", inv));
    attrs["rotary_dim"] = rotary_dim;
  }
  g.add_output("y", g.add("Attention", ins, attrs, "attn"));
  return g;
}

// decoder_steps with q, k, v packed into one qkv input and positions for RoPE (none
// when rot is 0).
std::vector<StepCase> pack_steps(const Config& c, std::vector<StepCase> steps, int64_t rot);

std::vector<StepCase> packed_steps(const Config& c, const std::string& dt, int64_t blocks, int64_t rot,
                                   std::mt19937_64& rng) {
  return pack_steps(c, decoder_steps(c, dt, blocks, rng), rot);
}

// Steps with separate q, k, v inputs as packed qkv rows, with positions (none when rot is 0).
std::vector<StepCase> pack_steps(const Config& c, std::vector<StepCase> steps, int64_t rot) {
  for (StepCase& sc : steps) {
    const int64_t t = sc.inputs["q"].dim(0), qw = c.hq * c.d, kw = c.hkv * c.d;
    Tensor qkv(DType::kF32, {t, qw + 2 * kw}), pos(DType::kI32, {t});
    for (int64_t r = 0; r < t; ++r) {
      float* row = qkv.data_as<float>() + r * (qw + 2 * kw);
      std::copy_n(sc.inputs["q"].data_as<float>() + r * qw, qw, row);
      std::copy_n(sc.inputs["k"].data_as<float>() + r * kw, kw, row + qw);
      std::copy_n(sc.inputs["v"].data_as<float>() + r * kw, kw, row + qw + kw);
    }
    for (const StepSequence& ss : sc.step.seqs)
      for (int32_t i = 0; i < ss.q_len; ++i) pos.data_as<int32_t>()[ss.q_start + i] = ss.ctx_len - ss.q_len + i;
    sc.inputs = {{"qkv", qkv}, {"positions", pos}};
    if (rot == 0) sc.inputs.erase("positions");  // no RoPE: no positions input
  }
  return steps;
}

int64_t blocks_for(const Config& c) {
  int64_t tokens = 0;
  for (int32_t p : c.prompts) tokens += p + 6;
  return tokens / c.block_size + int64_t(c.prompts.size()) * 2 + 4;
}

// Steps without a KV cache whose sequences are all one token long take the grouped-query
// kernel, reading K/V from the rows in place (no new rows to write): MHA and GQA groups
// 2-8, every head dim, separate q/k/v and packed rows rotated first (qkv_prep).
TEST(CudaAttention, OneTokenSequencesWithoutCache) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Config& c : {Config{4, 4, 16, 1, {1, 1, 1}}, Config{8, 2, 32, 1, {1}}, Config{6, 2, 64, 1, {1, 1, 1}},
                          Config{8, 1, 64, 1, {1, 1, 1, 1, 1}}, Config{16, 2, 128, 1, {1, 1}}})
    for (bool causal : {false, true})
      for (const auto& dt : all_dtypes()) {
        std::mt19937_64 rng(uint64_t(c.hq * 131 + c.d));
        const StepCase sc = cacheless_step(c, dt, rng);
        const std::string what = str_cat("1-token seqs, no cache, hq=", c.hq, " hkv=", c.hkv, " d=", c.d,
                                         " seqs=", c.prompts.size(), " causal=", causal);
        expect_backends_match(attention_graph(c, causal), {sc}, dt, op_tolerance(dt), what);
        expect_backends_match(packed_graph(c, causal, c.d), pack_steps(c, {sc}, c.d), dt, op_tolerance(dt),
                              what + " packed rope");
      }
}

TEST(CudaAttention, PackedQkvWithRopeMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Config& c : {Config{8, 2, 64, 16, {5, 40, 130}}, Config{4, 4, 32, 16, {17, 1}}, Config{8, 1, 128, 16, {70}}})
    for (int64_t rot : {c.d, c.d / 2, int64_t(0)})
      for (const auto& dt : all_dtypes()) {
        std::mt19937_64 rng(uint64_t(c.hq * 100 + rot));
        const int64_t blocks = blocks_for(c);
        auto steps = packed_steps(c, dt, blocks, rot, rng);
        KvLayout kv{.num_layers = 1, .num_blocks = blocks, .block_size = c.block_size, .num_kv_heads = c.hkv,
                    .head_dim = c.d};
        for (const char* flash : {"", "1"}) {  // the rows q_stride apart also through the tensor-core kernel
          setenv("KILN_CUDA_FLASH", flash, 1);
          expect_backends_match(packed_graph(c, true, rot), steps, dt, op_tolerance(dt),
                                str_cat("packed attn hq=", c.hq, " hkv=", c.hkv, " d=", c.d, " rot=", rot,
                                        " flash=", flash), kv);
          unsetenv("KILN_CUDA_FLASH");
        }
      }
}

// The packed path with an int8/fp8 cache: RoPE in place, then the quantizing write from
// the packed rows (row stride = the q|k|v width). The rotated K rows are rounded to the
// activation dtype on the GPU and computed with a different sin/cos, so a code may land
// one step away from the CPU's (int8: amax/127; E4M3: 2^-3 of the value): bounds 2e-2
// and 4e-2 of max|ref| instead of the exact-codes ones.
// launch_qkv_prep's 16-byte-chunk kernel against the one-thread-per-element kernel, bit
// for bit (rotated q|k rows in place and both caches): bf16 and f16; Llama-3.1-8B's heads
// (32 / 8 of 128), SmolLM2's (9 / 3 of 64: a group of 8 heads spanning q, k and v), a
// partial rotary half (64 dims, 32 rotated), no RoPE (cache writes only), head dim 16,
// rotation without caches; 1, 5 and 300 tokens (blocks of several tokens, a partial
// last block), positions to 40,000 and some slots -1 (not written).
TEST(CudaAttention, QkvPrepChunkKernelMatchesElementKernel) {
  KILN_SKIP_WITHOUT_CUDA();
  struct Case {
    int64_t hq, hkv, d, rot;
    bool rope, cache;
  };
  const std::vector<Case> cases = {{32, 8, 128, 128, true, true}, {9, 3, 64, 64, true, true},
                                   {4, 2, 64, 32, true, true},    {12, 12, 64, 64, false, true},
                                   {2, 1, 16, 16, true, true},    {8, 2, 128, 128, true, false}};
  std::mt19937 rng(11);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const Case& c : cases) {
      for (int64_t tokens : {1, 5, 300}) {
        const std::string what = str_cat(dtype_name(dt), " hq ", c.hq, " hkv ", c.hkv, " d ", c.d, " rot ", c.rot,
                                          c.rope ? "" : " (no rope)", c.cache ? "" : " (no cache)", " tokens ", tokens);
        const int64_t width = (c.hq + 2 * c.hkv) * c.d, slots = tokens + 7, cache_elems = slots * c.hkv * c.d;
        std::normal_distribution<float> nd(0.f, 2.f);
        std::vector<uint16_t> qkv(size_t(tokens * width));
        for (uint16_t& v : qkv) v = dt == DType::kBF16 ? f32_to_bf16(nd(rng)) : f32_to_f16(nd(rng));
        std::vector<int32_t> pos(static_cast<size_t>(tokens));
        for (int32_t& p : pos) p = int32_t(rng() % 40000);
        std::vector<float> inv(size_t(c.rot / 2));
        for (size_t i = 0; i < inv.size(); ++i) inv[i] = std::pow(500000.f, -2.f * float(i) / float(c.rot));
        std::vector<int64_t> slot(static_cast<size_t>(tokens));
        std::vector<int64_t> order(static_cast<size_t>(slots));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (int64_t t = 0; t < tokens; ++t) slot[size_t(t)] = t % 4 == 3 ? -1 : order[size_t(t)];
        Dev dpos(pos.data(), pos.size() * 4), dinv(inv.data(), inv.size() * 4), dslot(slot.data(), slot.size() * 8);
        std::vector<uint16_t> got[3], want[3];
        for (int way = 0; way < 2; ++way) {
          Dev dq(qkv.data(), qkv.size() * 2), dk(size_t(cache_elems) * 2), dv(size_t(cache_elems) * 2);
          KILN_CUDA_CHECK(cudaMemset(dk.get(), 0, size_t(cache_elems) * 2));
          KILN_CUDA_CHECK(cudaMemset(dv.get(), 0, size_t(cache_elems) * 2));
          QkvPrepArgs a{dt, dq.get(), tokens, c.hq, c.hkv, c.d, c.rope ? c.rot : 0,
                        c.rope ? dpos.as<int32_t>() : nullptr, c.rope ? dinv.as<float>() : nullptr,
                        c.cache ? dslot.as<int64_t>() : nullptr, c.cache ? dk.get() : nullptr,
                        c.cache ? dv.get() : nullptr};
          if (way == 0) {
            ASSERT_TRUE(qkv_prep_vectorized(a)) << what;
            launch_qkv_prep(a, nullptr);
          } else {
            launch_qkv_prep_elements(a, nullptr);
          }
          KILN_CUDA_CHECK(cudaDeviceSynchronize());
          auto& out = way == 0 ? got : want;
          out[0] = dq.host<uint16_t>(qkv.size());
          out[1] = dk.host<uint16_t>(size_t(cache_elems));
          out[2] = dv.host<uint16_t>(size_t(cache_elems));
        }
        EXPECT_EQ(got[0], want[0]) << what << ": q|k|v rows";
        EXPECT_EQ(got[1], want[1]) << what << ": k cache";
        EXPECT_EQ(got[2], want[2]) << what << ": v cache";
        if (c.rope) {
          EXPECT_NE(got[0], qkv) << what << ": rotated";
        }
      }
    }
  }
}

TEST(CudaAttention, PackedQkvQuantizedCachesMatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8})
    for (const Config& c : {Config{8, 2, 64, 16, {5, 40, 130}}, Config{8, 1, 128, 16, {70}}})
      for (int64_t rot : {c.d, c.d / 2, int64_t(0)})
        for (const auto& dt : all_dtypes()) {
          std::mt19937_64 rng(uint64_t(c.hq * 100 + rot));
          const int64_t blocks = blocks_for(c);
          auto steps = packed_steps(c, dt, blocks, rot, rng);
          KvLayout kv{.num_layers = 1, .num_blocks = blocks, .block_size = c.block_size, .num_kv_heads = c.hkv,
                      .head_dim = c.d, .dtype = kd};
          // Rotated in the kernel: a key whose f32 rotation differs from the CPU's in the last
          // bit can round to the neighbouring code, one E4M3 step (2^-4 relative) for fp8;
          // with 16-bit inputs that gave up to 0.041 on the H100 (2026-12-06).
          const double tol = rot == 0 ? quantized_tolerance(dt) : kd == KvDType::kInt8 ? 2e-2 : 5e-2;
          // Without and with a key shift, and with the shift and the key rotation: the
          // rotated keys' quantizing writes (prefill and the fused decode kernels) subtract
          // and rotate as the CPU does.
          for (int mode : {0, 1, 2})
          for (const char* flash : {"", "1"}) {
            const bool shifted = mode > 0;
            kv.k_shift = shifted ? random_key_shift(1, c.hkv, c.d, uint64_t(rot + 7)) : nullptr;
            kv.k_rotate = mode == 2;
            // Rotated keys in bf16: the tensor-core kernels hold q as 16-bit MMA operands, so
            // the rotated q rounds once more (unrotated, the bf16 inputs were exact), and each
            // rotated key element sums every element of the row, so a last-bit difference in
            // the kernel's RoPE reaches every code: up to 1.4x the unrotated error was seen
            // (H100, 2026-12-06: 0.052 at fp8 rot 32, 0.0102 at rot 0).
            const double mode_tol = mode == 2 && dt == "bf16" ? 1.5 * tol : tol;
            setenv("KILN_CUDA_FLASH", flash, 1);
            expect_backends_match(packed_graph(c, true, rot), steps, dt, mode_tol,
                                  str_cat("packed attn hq=", c.hq, " hkv=", c.hkv, " d=", c.d, " rot=", rot,
                                          " flash=", flash, " kv=", kv_dtype_name(kd), shifted ? " key shift" : "",
                                          kv.k_rotate ? " rotated" : ""),
                                  kv);
            unsetenv("KILN_CUDA_FLASH");
          }
        }
}

// The CUDA runs of one scenario under several (KILN_CUDA_SPLIT_CHUNK, KILN_CUDA_DECODE_ATTN
// / KILN_CUDA_DECODE_SPLITS) settings against one CPU run: the cluster decode kernel
// (16-bit, head dims 64/128; decode "": its automatic splits, "s1" / "s2" / "s8": 1, 2 or
// 8 splits merged through the cluster, empty splits included), the warp decode kernel
// (16-bit caches; "w1" / "w2" / "w3": forced, with 1, 2 or 3 copy stages) and the fused grouped
// decode kernel (decode "old"; split "0": the decode plan's automatic splits, "64":
// forced 64-key splits, "-1": none). Every setting runs all the steps in order on a fresh
// pool, which `fill` (if set) fills before the first step as it filled the CPU pool. The
// variables are read when a graph compiles: the steps run with values that would be
// errors if a step read them.
using PoolFill = std::function<void(KvStorage& cpu, KvStorage& gpu)>;
struct DecodeVariant {
  std::string split, decode;
};
const std::vector<DecodeVariant> kDecodeVariants = {{"0", ""},   {"0", "s1"}, {"0", "s2"}, {"0", "s8"},
                                                    {"0", "w1"}, {"0", "w2"}, {"0", "w3"}, {"0", "old"},
                                                    {"64", ""},  {"-1", ""}};

// A variant's graph on a fresh CUDA backend, compiled under its variables.
std::unique_ptr<CompiledGraph> compile_variant(Backend& gpu, const ir::Graph& g, const std::string& dt,
                                               const DecodeVariant& v) {
  const ScopedEnv split("KILN_CUDA_SPLIT_CHUNK", v.split);
  const ScopedEnv attn("KILN_CUDA_DECODE_ATTN", v.decode == "old" ? "old" : "");
  const bool forced = v.decode.size() == 2 && v.decode[0] == 's';
  const ScopedEnv splits("KILN_CUDA_DECODE_SPLITS", forced ? v.decode.substr(1) : "");
  const bool warp = v.decode.size() == 2 && v.decode[0] == 'w';
  const ScopedEnv warps("KILN_CUDA_DECODE_WARP", warp ? v.decode.substr(1) : "");
  return gpu.compile(g, {.weight_dtype = dt});
}

void expect_variants_match(const ir::Graph& g, const std::vector<StepCase>& cases, const std::string& dt, double tol,
                           const std::string& what, const KvLayout& layout, const PoolFill& fill = nullptr) {
  auto cpu = create_backend("cpu");
  auto cg = cpu->compile(g, {.weight_dtype = "f32"});
  auto ckv = cpu->allocate_kv(layout);
  std::vector<std::unique_ptr<Backend>> gpus;  // declared first: outlives its graphs and pools
  std::vector<std::unique_ptr<CompiledGraph>> ggs;
  std::vector<std::unique_ptr<KvStorage>> gkvs;
  for (const DecodeVariant& dv : kDecodeVariants) {
    gpus.push_back(create_backend("cuda"));
    ggs.push_back(compile_variant(*gpus.back(), g, dt, dv));
    gkvs.push_back(gpus.back()->allocate_kv(layout));
    if (fill) fill(*ckv, *gkvs.back());
  }
  const ScopedEnv bad_attn("KILN_CUDA_DECODE_ATTN", "bad"), bad_splits("KILN_CUDA_DECODE_SPLITS", "3"),
      bad_warp("KILN_CUDA_DECODE_WARP", "9");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Tensor want = cg->run(cases[i].inputs, cases[i].step, ckv.get()).at("y").clone();
    for (size_t v = 0; v < kDecodeVariants.size(); ++v) {
      const DecodeVariant& dv = kDecodeVariants[v];
      TensorMap got = ggs[v]->run(cases[i].inputs, cases[i].step, gkvs[v].get());
      ASSERT_TRUE(got.count("y"));
      const Diff d = diff(got.at("y"), want);
      const std::string w = str_cat(what, " split=", dv.split, " decode=", dv.decode.empty() ? "cluster" : dv.decode);
      std::printf("  %-86s %-4s step %zu max|err| %.3g  max|ref| %.3g  rel %.3g\n", w.c_str(), dt.c_str(), i, d.max_err,
                  d.max_ref, d.rel());
      EXPECT_LE(d.rel(), tol) << w << " (" << dt << ") step " << i;
    }
  }
}

// Decode steps (one query row per sequence) over a pool filled directly, the same values
// - or int8/fp8 codes and scales - in the CPU and the CUDA pool, so that long contexts
// need no long prefill on the CPU. Each case runs `steps` decode steps: the new token's
// K/V is written by its step and read again by the next, and the fused kernel's split
// counters must have been reset by the previous launch.
struct DecodeCase {
  int64_t hq, hkv, d;
  std::vector<int32_t> ctx;  // context length of the first decode step, its new token included
};

void check_prefilled_decode(const DecodeCase& c, KvDType kd, const std::vector<std::string>& dtypes, int steps = 4,
                            int64_t window = 0, double softcap = 0.0, bool k_rotate = false) {
  constexpr int64_t bs = 16;
  int64_t blocks = 4;
  for (int32_t L : c.ctx) blocks += (L + steps + bs - 1) / bs;
  const KvLayout layout{.num_layers = 1, .num_blocks = blocks, .block_size = bs, .num_kv_heads = c.hkv,
                        .head_dim = c.d, .dtype = kd, .k_rotate = k_rotate};
  const int64_t rows = blocks * bs * c.hkv, elems = rows * c.d;
  for (const std::string& dt : dtypes) {
    std::mt19937_64 rng(uint64_t(c.hq * 7919 + c.d * 31 + c.ctx.size() * 3 + int(kd)));
    std::vector<int32_t> pool(static_cast<size_t>(blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    std::vector<std::vector<int32_t>> tables;
    size_t next = 0;
    for (int32_t L : c.ctx) {
      tables.emplace_back();
      for (int64_t b = 0; b < (L + steps + bs - 1) / bs; ++b) tables.back().push_back(pool.at(next++));
    }
    // The pool's contents: values exact in dt (f32 pools), or codes and scales.
    Tensor kf, vf;
    std::vector<int8_t> kc, vc;
    std::vector<float> ks, vs;
    if (kd == KvDType::kAuto) {
      kf = random_tensor({elems}, rng, dt, -2, 2);
      vf = random_tensor({elems}, rng, dt);
    } else {
      auto codes = [&](std::vector<int8_t>& out) {
        out.resize(size_t(elems));
        for (int8_t& x : out) {
          auto b = uint8_t(rng());
          if (kd == KvDType::kInt8 && b == 0x80) b = 0;           // int8 codes are in [-127, 127]
          if (kd == KvDType::kFp8 && (b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
          x = int8_t(b);
        }
      };
      codes(kc);
      codes(vc);
      std::uniform_real_distribution<float> u(0.5f, 1.5f);
      const float unit = kd == KvDType::kInt8 ? 1.0f / 64 : 1.0f / 224;
      ks.resize(size_t(rows));
      vs.resize(size_t(rows));
      for (float& x : ks) x = u(rng) * unit;
      for (float& x : vs) x = u(rng) * unit;
    }
    std::vector<StepCase> cases;
    for (int i = 0; i < steps; ++i) {
      StepCase sc;
      const auto b = int32_t(c.ctx.size());
      for (int32_t s = 0; s < b; ++s) {
        const int32_t p = c.ctx[size_t(s)] - 1 + i;
        sc.step.slot_mapping.push_back(int64_t(tables[size_t(s)][size_t(p / bs)]) * bs + p % bs);
        sc.step.seqs.push_back({s, 1, p + 1, tables[size_t(s)]});
      }
      sc.inputs["q"] = random_tensor({b, c.hq * c.d}, rng, dt, -2, 2);
      sc.inputs["k"] = random_tensor({b, c.hkv * c.d}, rng, dt, -2, 2);
      sc.inputs["v"] = random_tensor({b, c.hkv * c.d}, rng, dt);
      cases.push_back(std::move(sc));
    }
    const Tensor kt = kd == KvDType::kAuto ? kf.to(storage_dtype(dt)) : Tensor();
    const Tensor vt = kd == KvDType::kAuto ? vf.to(storage_dtype(dt)) : Tensor();
    const PoolFill fill = [&](KvStorage& cpu_kv, KvStorage& gpu_kv) {
      auto* cp = dynamic_cast<cpu::CpuKv*>(&cpu_kv);
      auto* gp = dynamic_cast<CudaKv*>(&gpu_kv);
      ASSERT_TRUE(cp && gp);
      if (kd == KvDType::kAuto) {
        std::copy_n(kf.data_as<float>(), elems, cp->k(0));
        std::copy_n(vf.data_as<float>(), elems, cp->v(0));
        ASSERT_EQ(cudaMemcpy(gp->k(0), kt.data(), kt.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(gp->v(0), vt.data(), vt.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
      } else {
        std::copy(kc.begin(), kc.end(), cp->k_codes(0));
        std::copy(vc.begin(), vc.end(), cp->v_codes(0));
        std::copy(ks.begin(), ks.end(), cp->k_scales(0));
        std::copy(vs.begin(), vs.end(), cp->v_scales(0));
        ASSERT_EQ(cudaMemcpy(gp->k(0), kc.data(), kc.size(), cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(gp->v(0), vc.data(), vc.size(), cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(gp->k_scales(0), ks.data(), ks.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(gp->v_scales(0), vs.data(), vs.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      }
    };
    const std::string what = str_cat("decode hq=", c.hq, " hkv=", c.hkv, " d=", c.d, " batch=", c.ctx.size(),
                                     " max_ctx=", *std::max_element(c.ctx.begin(), c.ctx.end()), " kv=",
                                     kv_dtype_name(kd), " window=", window, " softcap=", softcap,
                                     k_rotate ? " rotated keys" : "");
    expect_variants_match(attention_graph({c.hq, c.hkv, c.d, bs, {}}, true, window, softcap), cases, dt,
                          kd == KvDType::kAuto ? op_tolerance(dt) : quantized_tolerance(dt), what, layout, fill);
  }
}

// n context lengths drawn from [1, max_len].
std::vector<int32_t> random_lengths(size_t n, int32_t max_len, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> len(1, max_len);
  std::vector<int32_t> out(n);
  for (int32_t& x : out) x = len(rng);
  return out;
}

// Batch 1 / 3 / 64, contexts 1..4096, GQA groups 1 / 2 / 4 / 8 (and 3, padded to 4), head
// dims 64 / 128 (and 16 / 32 for the 16/32-bit cache).
TEST(CudaAttention, GroupedDecodeMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(5);
  const std::vector<int32_t> b64 = random_lengths(64, 300, rng);
  check_prefilled_decode({8, 1, 128, {4096}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({8, 1, 128, {1}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({32, 8, 64, {1, 150, 2049}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({4, 4, 128, {17, 4000, 2}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({9, 3, 64, {33, 1, 700}}, KvDType::kAuto, {"bf16"});
  check_prefilled_decode({4, 2, 32, {100, 65}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({4, 1, 16, {3, 64, 129}}, KvDType::kAuto, {"f32", "bf16"});
  check_prefilled_decode({32, 8, 64, b64}, KvDType::kAuto, {"bf16", "f32"});
  check_prefilled_decode({16, 2, 128, b64}, KvDType::kAuto, {"f16"});
  // 80 x 8 = 640 (sequence, KV head) items at head dim 128: the plan's own pick is the
  // warp decode kernel (2 stages) on a device of up to 213 SMs (kDecodeWarpMinItemsPerSm128).
  check_prefilled_decode({32, 8, 128, random_lengths(80, 300, rng)}, KvDType::kAuto, {"bf16"});
}

TEST(CudaAttention, GroupedDecodeQuantizedMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(6);
  const std::vector<int32_t> b64 = random_lengths(64, 200, rng);
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8}) {
    check_prefilled_decode({8, 1, 128, {4096}}, kd, {"bf16"});
    check_prefilled_decode({32, 8, 64, {1, 150, 2049}}, kd, all_dtypes());
    check_prefilled_decode({8, 8, 128, {5, 300}}, kd, {"f16"});
    check_prefilled_decode({32, 8, 64, b64}, kd, {"bf16"});
    check_prefilled_decode({4, 2, 32, {100, 3}}, kd, {"bf16"});  // head dim 32: today's kernels
    // Keys stored rotated (KvLayout::k_rotate): every decode variant rotates its queries
    // (the pool's random codes stand for rotated keys; the new keys are rotated as written).
    check_prefilled_decode({32, 8, 64, {1, 150, 2049}}, kd, {"bf16", "f32"}, 4, 0, 0.0, true);
    check_prefilled_decode({8, 1, 128, {700}}, kd, {"f16"}, 4, 0, 0.0, true);
    check_prefilled_decode({8, 2, 256, {190, 3}}, kd, {"bf16"}, 4, 33, 30.0, true);
  }
}

// Head dim 256 (Gemma 2 and 3) on the cluster decode kernel, with sliding windows (of one
// key, shorter than a warp's 16-key tile, across splits) and soft-capped scores, batch 1
// to 64, GQA groups 1 / 2 / 4 / 8, 16-bit and int8 / fp8 caches; head dims 64 / 128 with a
// window and a soft cap too. The warp decode variants keep such nodes on the cluster kernel.
TEST(CudaAttention, ClusterDecodeWindowsSoftCapAndHeadDim256MatchCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(7);
  const std::vector<int32_t> b64 = random_lengths(64, 700, rng);
  check_prefilled_decode({4, 1, 256, {190}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({8, 4, 256, {1, 37, 2000}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({8, 1, 256, {600}}, KvDType::kAuto, {"bf16"});
  check_prefilled_decode({4, 4, 256, b64}, KvDType::kAuto, {"bf16"});
  for (int64_t window : {1, 9, 100})
    check_prefilled_decode({4, 1, 256, {1, 50, 1500}}, KvDType::kAuto, {"bf16", "f16"}, 4, window);
  check_prefilled_decode({8, 4, 256, {3, 700}}, KvDType::kAuto, {"bf16"}, 4, 0, 1.5);
  check_prefilled_decode({8, 4, 256, b64}, KvDType::kAuto, {"bf16"}, 4, 512, 2.0);
  check_prefilled_decode({32, 8, 128, {5, 3000}}, KvDType::kAuto, {"bf16"}, 4, 300, 1.5);
  // Contexts growing past the window between steps (62..65 keys, window 64): the steps
  // that hide no key run the plain kernels (the warp variants too), the later ones the
  // window's, each through its own captured graph.
  check_prefilled_decode({32, 8, 128, {62, 5}}, KvDType::kAuto, {"bf16", "f16"}, 4, 64);
  check_prefilled_decode({4, 1, 256, {62}}, KvDType::kAuto, {"bf16"}, 4, 64);
  // Head dim 96 (Phi-3-mini: 32 heads, MHA, window 2047) on the cluster decode kernel.
  check_prefilled_decode({32, 32, 96, {1, 150, 2049}}, KvDType::kAuto, all_dtypes());
  check_prefilled_decode({12, 4, 96, b64}, KvDType::kAuto, {"bf16"});
  check_prefilled_decode({32, 32, 96, {62, 5}}, KvDType::kAuto, {"bf16"}, 4, 64);
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8}) check_prefilled_decode({32, 32, 96, {3, 300}}, kd, {"bf16"});
  check_prefilled_decode({9, 3, 64, {33, 1, 700}}, KvDType::kAuto, {"f16"}, 4, 40, 0.5);
  for (KvDType kd : {KvDType::kInt8, KvDType::kFp8}) {
    check_prefilled_decode({4, 1, 256, {1, 300}}, kd, {"bf16"});
    check_prefilled_decode({8, 4, 256, {40, 900}}, kd, {"bf16"}, 4, 64, 2.0);
  }
}

// A prefill of every prompt, then `decodes` decode steps (one token per sequence).
std::vector<StepCase> prefill_then_decode(const Config& c, const std::string& dt, int64_t num_blocks, int decodes,
                                          std::mt19937_64& rng) {
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next_block = 0;
  std::vector<std::vector<int32_t>> tables(c.prompts.size());
  std::vector<int32_t> len(c.prompts.size(), 0);
  std::vector<StepCase> steps;
  for (int phase = 0; phase <= decodes; ++phase) {
    StepCase sc;
    int32_t t = 0;
    for (size_t s = 0; s < c.prompts.size(); ++s) {
      const int32_t n = phase == 0 ? c.prompts[s] : 1;
      for (int32_t i = 0; i < n; ++i) {
        const int32_t p = len[s] + i;
        if (p / c.block_size >= int64_t(tables[s].size())) tables[s].push_back(pool.at(next_block++));
        sc.step.slot_mapping.push_back(int64_t(tables[s][size_t(p / c.block_size)]) * c.block_size + p % c.block_size);
      }
      len[s] += n;
      sc.step.seqs.push_back({t, n, len[s], tables[s]});
      t += n;
    }
    sc.inputs["q"] = random_tensor({t, c.hq * c.d}, rng, dt, -2, 2);
    sc.inputs["k"] = random_tensor({t, c.hkv * c.d}, rng, dt, -2, 2);
    sc.inputs["v"] = random_tensor({t, c.hkv * c.d}, rng, dt);
    steps.push_back(std::move(sc));
  }
  return steps;
}

// The fused decode kernel on packed q|k|v rows: RoPE (full and partial rotary dims, and
// none as GPT-2) of q and the new key inside the kernel, the new K/V written to the
// cache by the kernel and read back by the next steps: a prefill, then four decode
// steps, GQA groups 1/2/4/8, head dims 64/96/128/256, batch 1 to 3.
TEST(CudaAttention, FusedDecodeWithRopeMatchesCpu) {
  KILN_SKIP_WITHOUT_CUDA();
  for (const Config& c : {Config{8, 8, 64, 16, {300}}, Config{32, 4, 64, 16, {1, 40, 130}},
                          Config{16, 4, 128, 16, {70, 3, 257}}, Config{8, 1, 128, 16, {500}},
                          Config{4, 1, 256, 16, {200}}, Config{8, 4, 256, 16, {3, 90}}, Config{32, 32, 96, 16, {70, 3}}})
    for (int64_t rot : {c.d, c.d / 2, int64_t(0)})
      for (const auto& dt : all_dtypes()) {
        if (dt == "f16" && rot == c.d / 2) continue;  // the partial rotary dims in f32 and bf16 only
        std::mt19937_64 rng(uint64_t(c.hq * 100 + rot + c.d));
        const int64_t blocks = blocks_for(c);
        std::vector<StepCase> raw = prefill_then_decode(c, dt, blocks, 4, rng);
        std::vector<StepCase> steps_packed = pack_steps(c, std::move(raw), rot);
        KvLayout kv{.num_layers = 1, .num_blocks = blocks, .block_size = c.block_size, .num_kv_heads = c.hkv,
                    .head_dim = c.d};
        expect_variants_match(packed_graph(c, true, rot), steps_packed, dt, op_tolerance(dt),
                              str_cat("fused packed hq=", c.hq, " hkv=", c.hkv, " d=", c.d, " rot=", rot, " batch=",
                                      c.prompts.size()),
                              kv);
      }
}

TEST(CudaAttention, BadBlockTableIsAnError) {
  KILN_SKIP_WITHOUT_CUDA();
  Config c{4, 2, 16, 4, {3}};
  ir::Graph g = attention_graph(c, true);
  auto be = create_backend("cuda");
  auto cg = be->compile(g, {.weight_dtype = "bf16"});
  auto kv = be->allocate_kv({.num_layers = 1, .num_blocks = 2, .block_size = 4, .num_kv_heads = 2, .head_dim = 16});
  std::mt19937_64 rng(1);
  StepCase sc;
  sc.step.seqs = {{0, 3, 3, {7}}};  // block 7 of a 2-block pool
  sc.step.slot_mapping = {28, 29, 30};
  sc.inputs["q"] = random_tensor({3, 64}, rng, "bf16");
  sc.inputs["k"] = random_tensor({3, 32}, rng, "bf16");
  sc.inputs["v"] = random_tensor({3, 32}, rng, "bf16");
  EXPECT_THROW(cg->run(sc.inputs, sc.step, kv.get()), Error);
}

}  // namespace
}  // namespace kiln::cuda

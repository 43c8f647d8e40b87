// Decode attention alone on the GPU, every kernel that can take a decode step, all with
// the step's RoPE and new-token KV write inside, over a paged cache (16-token blocks,
// shuffled): the fused grouped-query kernel (KILN_CUDA_DECODE_ATTN=old), the cluster
// decode kernel (KILN_CUDA_DECODE_WARP=0), the warp decode kernel with 1, 2 or 3 copy
// stages (16-bit caches), and the launch's own pick. Shapes: TinyLlama-1.1B (32 q / 4 KV
// heads) and GPT-2 small (12 heads, no RoPE) at batch 1 with contexts 160, 1024 and 8192;
// Llama-3.2-1B (32 q / 8 KV heads, d64) at batch 64 and 256 and Llama-3.1-8B (32 / 8,
// d128) at batch 32-256, contexts all c or uniform in [2c/3, 4c/3]. Each variant runs as
// a CUDA graph of 16 back-to-back launches (programmatic dependent launch on, as in a
// decode step); the table gives us per call (median of 30 graph replays) and the K/V
// bytes read per second as a share of a device-to-device copy measured in the same run
// (read + write bytes), the cluster plan's splits, and the largest output difference from
// the cluster kernel. KILN_CUDA_DECODE_SPLITS=1|2|4|8 forces the cluster kernel's splits,
// as in the backend.
//   cuda_decode_attention_bench [--kv int8|fp8]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/cuda_context.h"
#include "backends/cuda/ops/attention.h"
#include "backends/cuda/ops/convert.h"
#include "core/status.h"
#include "cuda_bench_util.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

struct Shape {
  const char* name;
  int64_t hq, hkv, d;
  bool rope;
};

struct Case {
  Shape m;
  int64_t batch, ctx;
  bool spread;  // contexts uniform in [2c/3, 4c/3] (else all c)
};

// Random device bf16 values in [-1, 1] (through an f32 upload and the convert kernel).
void fill_bf16(DeviceBuffer& dst, int64_t n, std::mt19937_64& rng) {
  std::vector<float> h(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : h) x = u(rng);
  DeviceBuffer tmp(size_t(n) * 4);
  KILN_CUDA_CHECK(cudaMemcpy(tmp.get(), h.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  launch_convert(tmp.get(), DType::kF32, dst.get(), DType::kBF16, n, nullptr);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

template <typename V>
DeviceBuffer upload(const std::vector<V>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(V), 1));
  KILN_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice));
  return b;
}

float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Result {
  double us = 0;
  int32_t splits = 0;
  std::vector<uint16_t> out;
};

Result run_variant(const Case& c, bool cluster, KvCode code, int num_sms, int forced_splits, int forced_warp) {
  std::mt19937_64 rng(uint64_t(c.batch * 1000 + c.ctx + c.m.hq));
  const int64_t bs = 16, hq = c.m.hq, hkv = c.m.hkv, d = c.m.d, width = (hq + 2 * hkv) * d;
  std::uniform_int_distribution<int64_t> spread(2 * c.ctx / 3, 4 * c.ctx / 3);
  std::vector<AttnSeq> seqs;
  std::vector<int32_t> tables;
  std::vector<int64_t> slots;
  std::vector<int32_t> positions;
  int64_t blocks = 0;
  std::vector<int64_t> ctxs;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t L = c.spread ? spread(rng) : c.ctx;
    ctxs.push_back(L);
    blocks += (L + bs - 1) / bs;
  }
  std::vector<int32_t> pool(static_cast<size_t>(blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t L = ctxs[size_t(b)], off = int64_t(tables.size());
    for (int64_t i = 0; i < (L + bs - 1) / bs; ++i) tables.push_back(pool[next++]);
    seqs.push_back({int32_t(b), 1, int32_t(L), int32_t(off)});
    slots.push_back(int64_t(tables[size_t(off + (L - 1) / bs)]) * bs + (L - 1) % bs);
    positions.push_back(int32_t(L - 1));
  }
  const int64_t elem = code == KvCode::kNone ? 2 : 1, cache_elems = blocks * bs * hkv * d;
  DeviceBuffer kc(size_t(cache_elems * elem)), vc(size_t(cache_elems * elem));
  DeviceBuffer ksc(size_t(blocks * bs * hkv * 4)), vsc(size_t(blocks * bs * hkv * 4));
  if (code == KvCode::kNone) {
    fill_bf16(kc, cache_elems, rng);
    fill_bf16(vc, cache_elems, rng);
  } else {
    std::vector<uint8_t> codes(static_cast<size_t>(cache_elems));
    for (uint8_t& x : codes) x = uint8_t(rng() % 120);  // valid int8 and E4M3 codes
    KILN_CUDA_CHECK(cudaMemcpy(kc.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(vc.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
    std::vector<float> sc(static_cast<size_t>(blocks * bs * hkv), 1.0f / 64);
    KILN_CUDA_CHECK(cudaMemcpy(ksc.get(), sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
    KILN_CUDA_CHECK(cudaMemcpy(vsc.get(), sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
  }
  DeviceBuffer qkv(size_t(c.batch * width * 2)), out(size_t(c.batch * hq * d * 2));
  fill_bf16(qkv, c.batch * width, rng);
  std::vector<float> inv(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) inv[size_t(i)] = float(std::pow(500000.0, -2.0 * double(i) / double(d)));
  DeviceBuffer d_seqs = upload(seqs), d_tables = upload(tables), d_slots = upload(slots),
               d_pos = upload(positions), d_inv = upload(inv);

  AttentionPlan plan = cluster ? attention_plan_decode_cluster(seqs, hq, hkv, d, num_sms, forced_splits, forced_warp)
                               : attention_plan_decode(seqs, hq, hkv, num_sms);
  DeviceBuffer d_work = upload(plan.work), d_comb = upload(plan.combine);
  DeviceBuffer ws(std::max<size_t>(attention_workspace_floats(plan, hkv, d) * 4, 4));
  DeviceBuffer ctr(std::max<size_t>(attention_counters(plan, hkv) * 4, 4));
  KILN_CUDA_CHECK(cudaMemset(ctr.get(), 0, std::max<size_t>(attention_counters(plan, hkv) * 4, 4)));

  AttentionArgs a;
  a.dtype = DType::kBF16;
  a.q = qkv.get();
  a.q_stride = width;
  a.k_cache = kc.get();
  a.v_cache = vc.get();
  a.kv_code = code;
  a.k_scales = code == KvCode::kNone ? nullptr : static_cast<float*>(ksc.get());
  a.v_scales = code == KvCode::kNone ? nullptr : static_cast<float*>(vsc.get());
  a.max_q_len = 1;
  a.out = out.get();
  a.block_size = bs;
  a.hq = hq;
  a.hkv = hkv;
  a.d = d;
  a.scale = 1.0f / std::sqrt(float(d));
  a.seqs = static_cast<const AttnSeq*>(d_seqs.get());
  a.block_tables = static_cast<const int32_t*>(d_tables.get());
  a.work = static_cast<const AttnWork*>(d_work.get());
  a.num_work = int32_t(plan.work.size());
  a.combine = static_cast<const AttnCombine*>(d_comb.get());
  a.num_combine = int32_t(plan.combine.size());
  a.num_partials = plan.num_partials;
  a.workspace = static_cast<float*>(ws.get());
  a.k_new = static_cast<const char*>(qkv.get()) + hq * d * 2;
  a.v_new = static_cast<const char*>(qkv.get()) + (hq + hkv) * d * 2;
  a.new_stride = width;
  a.positions = c.m.rope ? static_cast<const int32_t*>(d_pos.get()) : nullptr;
  a.inv_freq = c.m.rope ? static_cast<const float*>(d_inv.get()) : nullptr;
  a.rotary_dim = d;
  a.slot_mapping = static_cast<const int64_t*>(d_slots.get());
  a.counters = static_cast<int32_t*>(ctr.get());
  a.decode_splits = plan.decode_splits;
  a.decode_warp = plan.decode_warp;
  a.num_seqs = int32_t(seqs.size());

  auto launch = [&](cudaStream_t s) {
    if (cluster)
      launch_attention_decode_cluster(a, s);
    else
      launch_attention_fused_decode(a, s);
  };
  cudaStream_t s;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  set_pdl_allowed(true);
  launch(s);  // eager first (sets kernel attributes), then the captured graph
  KILN_CUDA_CHECK(cudaStreamSynchronize(s));
  Result r;
  r.splits = cluster ? plan.decode_splits
                     : int32_t(plan.combine.empty() ? 1 : plan.work.size() / std::max<size_t>(seqs.size(), 1));
  // 16 launches captured with dependent launch (as decode steps run), the graph replayed.
  r.us = double(bench::graph_ms([&] { launch(s); }, s, 16)) * 1000.0;
  set_pdl_allowed(false);
  r.out.resize(size_t(c.batch * hq * d));
  KILN_CUDA_CHECK(cudaMemcpy(r.out.data(), out.get(), r.out.size() * 2, cudaMemcpyDeviceToHost));
  cudaStreamDestroy(s);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    KvCode code = KvCode::kNone;
    for (int i = 1; i < argc; ++i) {
      const std::string v = argv[i];
      if (v == "--kv" && i + 1 < argc) {
        const std::string k = argv[++i];
        KILN_THROW_IF(k != "int8" && k != "fp8", kInvalidArgument, "--kv '", k, "': expected int8 or fp8");
        code = k == "int8" ? KvCode::kInt8 : KvCode::kFp8;
      } else {
        throw_error(ErrorCode::kInvalidArgument, "usage: cuda_decode_attention_bench [--kv int8|fp8]; got '", v, "'");
      }
    }
    int dev = 0, sms = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    KILN_THROW_IF(!attention_decode_cluster_supported(DType::kBF16, 32, 8, 64), kUnsupported,
                  "the cluster decode kernel does not run on ", prop.name, " (sm_90+)");
    const int forced_splits = attention_decode_splits_from_env();  // KILN_CUDA_DECODE_SPLITS, as the backend
    const double copy = bench::device_copy_gbs();
    std::printf("%s, %d SMs; device-to-device copy %.0f GB/s (read + write); cache %s, 16-token blocks\n", prop.name,
                sms, copy, code == KvCode::kNone ? "bf16" : code == KvCode::kInt8 ? "int8" : "fp8");
    const Shape tiny{"tinyllama-1.1b", 32, 4, 64, true}, gpt2{"gpt2", 12, 12, 64, false},
        l1b{"llama-3.2-1b", 32, 8, 64, true}, l8b{"llama-3.1-8b", 32, 8, 128, true};
    const std::vector<Case> cases = {
        {tiny, 1, 160, false},  {tiny, 1, 1024, false}, {tiny, 1, 8192, false}, {gpt2, 1, 160, false},
        {gpt2, 1, 1024, false}, {gpt2, 1, 8192, false}, {l1b, 64, 192, true},  {l1b, 64, 1024, true},
        {l1b, 256, 192, true},  {l1b, 256, 1024, true}, {l8b, 32, 160, false}, {l8b, 64, 160, false},
        {l8b, 64, 1024, true},  {l8b, 128, 160, false}, {l8b, 128, 512, false}, {l8b, 256, 160, false},
        {l8b, 256, 256, false}, {l8b, 256, 384, false}, {l8b, 256, 512, false}, {l8b, 256, 768, false},
        {l8b, 256, 1024, true}, {l1b, 256, 256, false}, {l1b, 256, 384, false}, {l1b, 256, 512, false},
        {l1b, 256, 768, false}};
    // The variants: the grouped-query kernels (KILN_CUDA_DECODE_ATTN=old), the cluster
    // kernel (KILN_CUDA_DECODE_WARP=0), the warp kernel with 1-3 stages (16-bit caches,
    // unsplit plans), and what the launch picks by itself (the default, "auto").
    struct Variant {
      const char* name;
      bool cluster;
      int warp;  // the plan's forced_warp (KILN_CUDA_DECODE_WARP), -1: planned
    };
    std::vector<Variant> variants = {{"old", false, -1}, {"cluster", true, 0}};
    if (code == KvCode::kNone) {
      variants.push_back({"warp1", true, 1});
      variants.push_back({"warp2", true, 2});
      variants.push_back({"warp3", true, 3});
    }
    variants.push_back({"auto", true, -1});
    std::printf("us per call (%% of copy); max|diff| against the cluster kernel\n%-15s %5s %6s %8s %6s", "model",
                "batch", "ctx", "KV MB", "splits");
    for (const Variant& v : variants) std::printf(" | %15s", v.name);
    std::printf(" | %9s\n", "max|diff|");
    for (const Case& c : cases) {
      double bytes = 0;
      {
        std::mt19937_64 rng(uint64_t(c.batch * 1000 + c.ctx + c.m.hq));
        std::uniform_int_distribution<int64_t> spread(2 * c.ctx / 3, 4 * c.ctx / 3);
        for (int64_t b = 0; b < c.batch; ++b)
          bytes += double(c.spread ? spread(rng) : c.ctx) * double(c.m.hkv * c.m.d) * 2.0 *
                   (code == KvCode::kNone ? 2.0 : 1.0);
      }
      std::vector<Result> rs;
      for (const Variant& v : variants) rs.push_back(run_variant(c, v.cluster, code, sms, forced_splits, v.warp));
      std::printf("%-15s %5lld %6lld %8.2f %6d", c.m.name, (long long)c.batch, (long long)c.ctx, bytes / 1e6,
                  rs[1].splits);
      double maxdiff = 0;
      for (size_t k = 0; k < rs.size(); ++k) {
        const double gbs = bytes / (rs[k].us * 1e-6) / 1e9;
        std::printf(" | %7.2f (%4.1f%%)", rs[k].us, 100.0 * gbs / copy);
        for (size_t i = 0; i < rs[1].out.size(); ++i)
          maxdiff = std::max(maxdiff,
                             double(std::fabs(bf16_bits_to_f32(rs[k].out[i]) - bf16_bits_to_f32(rs[1].out[i]))));
      }
      std::printf(" | %9.3g\n", maxdiff);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_decode_attention_bench: %s\n", e.what());
    return 1;
  }
}

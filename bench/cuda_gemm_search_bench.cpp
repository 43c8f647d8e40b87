// cuBLASLt's heuristic against a search of its configuration space, for the bf16 GEMM
// shapes of the models kiln benchmarks: does any (algorithm, tile, stages, split-k,
// reduction, swizzle, custom option, cluster shape) that cublasLtMatmulAlgoCheck accepts
// beat what kiln times today (the heuristic's first 8 candidates)?
//
//   cuda_gemm_search_bench [set ...]   sets: 8b256 8b64 1b256 bert32 bert1 (default: all)
//
// Layout and epilogue are kiln's (gemm.cpp): row-major y[m,n] = x[m,k]·w[n,k]ᵀ (+ bias) as
// the column-major yᵀ = (w as k×n)ᵀ·(x as k×m), f32 compute, bf16 in and out. Each call
// reads its own copy of the weight from a ring of copies larger than twice the L2, so the
// weight comes from HBM as in a model's forward. Timing: candidates are screened with a
// few calls each, the best 48 timed again with their split-k, reduction and swizzle
// variants, and the final best 8 (and every heuristic candidate) timed as the
// median of 7 batches of 10 calls back to back between events.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/ops/convert.h"
#include "backends/cuda/ops/gemm_lt_config.h"

namespace {

using kiln::cuda::cap_list;
using kiln::cuda::cap_value;
using kiln::cuda::config_of;
using kiln::cuda::set_config;

#define LT_CHECK(expr)                                                                          \
  do {                                                                                          \
    const cublasStatus_t st_ = (expr);                                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cublasLtGetStatusName(st_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

struct Shape {
  const char* set;
  const char* what;
  int64_t m, n, k;
  bool bias;
};

constexpr Shape kShapes[] = {
    {"8b256", "8B q|k|v", 256, 6144, 4096, false},     {"8b256", "8B o", 256, 4096, 4096, false},
    {"8b256", "8B gate|up", 256, 28672, 4096, false},  {"8b256", "8B down", 256, 4096, 14336, false},
    {"8b256", "8B lm head", 256, 128256, 4096, false}, {"8b64", "8B q|k|v", 64, 6144, 4096, false},
    {"8b64", "8B o", 64, 4096, 4096, false},           {"8b64", "8B gate|up", 64, 28672, 4096, false},
    {"8b64", "8B down", 64, 4096, 14336, false},       {"1b256", "1B q|k|v", 256, 3072, 2048, false},
    {"1b256", "1B o", 256, 2048, 2048, false},         {"1b256", "1B gate|up", 256, 16384, 2048, false},
    {"1b256", "1B down", 256, 2048, 8192, false},      {"bert32", "BERT q|k|v", 4096, 2304, 768, true},
    {"bert32", "BERT o", 4096, 768, 768, true},        {"bert32", "BERT up", 4096, 3072, 768, true},
    {"bert32", "BERT down", 4096, 768, 3072, true},    {"bert1", "BERT q|k|v", 128, 2304, 768, true},
    {"bert1", "BERT o", 128, 768, 768, true},          {"bert1", "BERT up", 128, 3072, 768, true},
    {"bert1", "BERT down", 128, 768, 3072, true},
};

constexpr size_t kWorkspace = size_t(32) << 20;  // gemm.h's default

struct Problem {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  const Shape& s;
  std::vector<void*> w;  // the ring of weight copies
  void *x = nullptr, *y = nullptr, *bias = nullptr, *ws = nullptr;
  cudaStream_t st;
  size_t next = 0;

  Problem(cublasLtHandle_t h, const Shape& sh, cudaStream_t stream) : lt(h), s(sh), st(stream) {
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const cudaDataType_t t = CUDA_R_16BF;
    if (s.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&a, t, uint64_t(s.k), uint64_t(s.n), s.k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b, t, uint64_t(s.k), uint64_t(s.m), s.k));
    LT_CHECK(cublasLtMatrixLayoutCreate(&c, t, uint64_t(s.n), uint64_t(s.m), s.n));
    int dev = 0, l2 = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    const size_t wbytes = size_t(s.n * s.k) * 2;
    const size_t copies = std::max<size_t>(1, std::min<size_t>(64, (size_t(l2) * 3 + wbytes - 1) / wbytes));
    for (size_t i = 0; i < copies; ++i) {
      void* p = nullptr;
      KILN_CUDA_CHECK(cudaMalloc(&p, wbytes));
      kiln::cuda::launch_fill_random(p, kiln::DType::kBF16, s.n * s.k, uint64_t(11 + i), st);
      w.push_back(p);
    }
    KILN_CUDA_CHECK(cudaMalloc(&x, size_t(s.m * s.k) * 2));
    KILN_CUDA_CHECK(cudaMalloc(&y, size_t(s.m * s.n) * 2));
    KILN_CUDA_CHECK(cudaMalloc(&bias, size_t(s.n) * 2));
    KILN_CUDA_CHECK(cudaMalloc(&ws, kWorkspace));
    kiln::cuda::launch_fill_random(x, kiln::DType::kBF16, s.m * s.k, 5, st);
    kiln::cuda::launch_fill_random(bias, kiln::DType::kBF16, s.n, 6, st);
    if (s.bias) LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
  }
  ~Problem() {
    for (void* p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(y);
    cudaFree(bias);
    cudaFree(ws);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }

  bool check(const cublasLtMatmulAlgo_t& algo) const {
    cublasLtMatmulHeuristicResult_t r{};
    return cublasLtMatmulAlgoCheck(lt, op, a, b, c, c, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= kWorkspace;
  }
  // Enqueues one call on the next weight copy (the first copy when `fixed`).
  bool run(const cublasLtMatmulAlgo_t& algo, bool fixed = false) {
    const float alpha = 1, beta = 0;
    void* wp = fixed ? w[0] : w[next++ % w.size()];
    return cublasLtMatmul(lt, op, &alpha, wp, a, x, b, &beta, y, c, y, c, &algo, ws, kWorkspace, st) ==
           CUBLAS_STATUS_SUCCESS;
  }
  // Median us of one call: `batches` batches of `calls` calls between events; +inf if the
  // algorithm fails to launch.
  float time_us(const cublasLtMatmulAlgo_t& algo, int batches, int calls) {
    cudaEvent_t e0, e1;
    KILN_CUDA_CHECK(cudaEventCreate(&e0));
    KILN_CUDA_CHECK(cudaEventCreate(&e1));
    float out = INFINITY;
    if (run(algo)) {
      std::vector<float> t;
      for (int bt = 0; bt < batches; ++bt) {
        KILN_CUDA_CHECK(cudaEventRecord(e0, st));
        for (int i = 0; i < calls; ++i) run(algo);
        KILN_CUDA_CHECK(cudaEventRecord(e1, st));
        KILN_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.0f / float(calls));
      }
      std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
      out = t[t.size() / 2];
    }
    if (cudaStreamSynchronize(st) != cudaSuccess) {
      std::fprintf(stderr, "a candidate failed on the device: %s\n", config_of(algo).str().c_str());
      std::exit(1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return out;
  }
  // y of one call on weight copy 0, as floats.
  std::vector<float> output(const cublasLtMatmulAlgo_t& algo) {
    run(algo, true);
    std::vector<uint16_t> h(size_t(s.m * s.n));
    KILN_CUDA_CHECK(cudaMemcpyAsync(h.data(), y, h.size() * 2, cudaMemcpyDeviceToHost, st));
    KILN_CUDA_CHECK(cudaStreamSynchronize(st));
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      const uint32_t u = uint32_t(h[i]) << 16;
      std::memcpy(&f[i], &u, 4);
    }
    return f;
  }
};

struct Timed {
  cublasLtMatmulAlgo_t algo;
  float us;
};

void by_time(std::vector<Timed>& v) {
  std::sort(v.begin(), v.end(), [](const Timed& a, const Timed& b) { return a.us < b.us; });
}

void search(cublasLtHandle_t lt, const Shape& s, cudaStream_t st) {
  Problem p(lt, s, st);
  // The heuristic's list, as kiln asks for it (8) and with 64.
  std::vector<cublasLtMatmulHeuristicResult_t> heur(64);
  cublasLtMatmulPreference_t pref = nullptr;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                sizeof kWorkspace));
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 64, heur.data(), &found));
  cublasLtMatmulPreferenceDestroy(pref);
  heur.resize(size_t(found));
  std::vector<Timed> h;
  for (auto& r : heur) h.push_back({r.algo, p.time_us(r.algo, 7, 10)});
  const float h1 = h.empty() ? INFINITY : h[0].us;
  float h8 = INFINITY, h64 = INFINITY;
  for (size_t i = 0; i < h.size(); ++i) {
    if (i < 8) h8 = std::min(h8, h[i].us);
    h64 = std::min(h64, h[i].us);
  }

  // Screen: every algorithm id x tile x stages x custom option x cluster shape (default
  // split, reduction and swizzle) that the check accepts, timed with 2 calls each (at most
  // kMaxScreened of them, spread evenly over what the check accepted).
  int ids[256];
  int nids = 0;
  LT_CHECK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                                    CUDA_R_16BF, 256, ids, &nids));
  const uint16_t screen_clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1,
                                      CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1,
                                      CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                      CUBLASLT_CLUSTER_SHAPE_1x4x1, CUBLASLT_CLUSTER_SHAPE_4x2x1,
                                      CUBLASLT_CLUSTER_SHAPE_2x4x1};
  std::vector<cublasLtMatmulAlgo_t> accepted;
  long checked = 0;
  std::string per_algo;
  for (int i = 0; i < nids; ++i) {
    cublasLtMatmulAlgo_t base{};
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF,
                               ids[i], &base) != CUBLAS_STATUS_SUCCESS)
      continue;
    auto tiles = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
    auto stages = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
    if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    const int custom_max = std::min(cap_value<int32_t>(base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX), 15);
    const size_t before = accepted.size();
    for (uint32_t tile : tiles)
      for (uint32_t stage : stages)
        for (int custom = 0; custom <= custom_max; ++custom)
          for (uint16_t cl : screen_clusters) {
            cublasLtMatmulAlgo_t a = base;
            set_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tile);
            set_config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, stage);
            set_config(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, uint32_t(custom));
            set_config(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cl);
            ++checked;
            if (p.check(a)) accepted.push_back(a);
          }
    if (accepted.size() > before) {
      char b[96];
      std::snprintf(b, sizeof b, " %d:%zu(%zut%zus%dc)", ids[i], accepted.size() - before, tiles.size(), stages.size(),
                    custom_max + 1);
      per_algo += b;
    }
  }
  constexpr size_t kMaxScreened = 4000;
  std::vector<Timed> screened;
  const size_t step = std::max<size_t>(1, (accepted.size() + kMaxScreened - 1) / kMaxScreened);
  for (size_t i = 0; i < accepted.size(); i += step) screened.push_back({accepted[i], p.time_us(accepted[i], 1, 2)});
  int tried = int(screened.size());
  std::printf("<!-- %s: %ld configurations checked, %zu accepted, %zu screened; accepted by algorithm:%s -->\n", s.what,
              checked, accepted.size(), screened.size(), per_algo.c_str());
  by_time(screened);
  if (screened.size() > 48) screened.resize(48);

  // Refine: the best 48 with their split-k, reduction and swizzle variants.
  std::vector<Timed> refined = screened;
  const int32_t splits[] = {2, 3, 4, 6, 8};
  for (const Timed& t : screened) {
    const int splitk_ok = cap_value<int32_t>(t.algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT);
    const uint32_t red_mask = cap_value<uint32_t>(t.algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
    const uint32_t swz_ok = cap_value<uint32_t>(t.algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT);
    std::vector<cublasLtMatmulAlgo_t> vars;
    if (swz_ok) {
      cublasLtMatmulAlgo_t a = t.algo;
      set_config(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, uint32_t(1));
      vars.push_back(a);
    }
    if (splitk_ok)
      for (int32_t sk : splits) {
        if (s.k / sk < 256) continue;
        for (uint32_t red : {uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE), uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                             uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
          if (!(red_mask & red)) continue;
          cublasLtMatmulAlgo_t a = t.algo;
          set_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, sk);
          set_config(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, red);
          vars.push_back(a);
        }
      }
    for (auto& a : vars)
      if (p.check(a)) {
        ++tried;
        refined.push_back({a, p.time_us(a, 1, 3)});
      }
  }
  by_time(refined);
  if (refined.size() > 8) refined.resize(8);
  for (auto& t : refined) t.us = p.time_us(t.algo, 7, 10);
  by_time(refined);
  if (refined.empty()) {
    std::printf("| %s | %lld x %lld x %lld | no candidate passed the check |\n", s.what, (long long)s.m,
                (long long)s.n, (long long)s.k);
    return;
  }
  // The search's winner against the heuristic's first: same product within bf16 rounding.
  const auto ref = p.output(heur[0].algo), got = p.output(refined[0].algo);
  double maxdiff = 0, maxref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    maxdiff = std::max(maxdiff, double(std::fabs(ref[i] - got[i])));
    maxref = std::max(maxref, double(std::fabs(ref[i])));
  }
  const double tflops = 2.0 * double(s.m) * double(s.n) * double(s.k) / (double(refined[0].us) * 1e6);
  std::printf("| %s | %lld x %lld x %lld | %.1f | %.1f | %.1f | **%.1f** (%.0f TFLOP/s) | %.3f | %d | %.2e |\n",
              s.what, (long long)s.m, (long long)s.n, (long long)s.k, h1, h8, h64, refined[0].us, tflops,
              h8 / refined[0].us, tried, maxdiff / std::max(maxref, 1e-30));
  std::printf("|  | search's best: %s |\n", config_of(refined[0].algo).str().c_str());
  std::printf("|  | heuristic's best of 8: %s |\n",
              config_of(std::min_element(h.begin(), h.begin() + std::min<size_t>(8, h.size()),
                                         [](const Timed& a, const Timed& b) { return a.us < b.us; })
                            ->algo)
                  .str()
                  .c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sets(argv + 1, argv + argc);
  cudaStream_t st;
  KILN_CUDA_CHECK(cudaStreamCreate(&st));
  cublasLtHandle_t lt;
  LT_CHECK(cublasLtCreate(&lt));
  std::printf("cuBLASLt %zu\n\n", cublasLtGetVersion());
  std::printf(
      "| shape | m x n x k | heuristic #0 us | best of heuristic 8 (kiln) | best of 64 | search's best | vs kiln's | "
      "configs timed | max |Δ| / max |y| |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : kShapes) {
    if (!sets.empty() && std::find(sets.begin(), sets.end(), std::string(s.set)) == sets.end()) continue;
    search(lt, s, st);
  }
  cublasLtDestroy(lt);
  return 0;
}

// cuBLASLt GEMMs (see gemm.h); host code only, so g++ compiles it. Row-major y = x·wᵀ is computed as the column-major
// product yᵀ[n,m] = (w as k×n)ᵀ · (x as k×m), so no operand is transposed in memory.
// One plan (descriptor, layouts, the heuristic's algorithms, the chosen one) is cached per
// shape and row count.
#include <cublasLt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "core/log.h"
#include "core/status.h"
#include "backends/cuda/ops/gemm.h"
#include "backends/cuda/ops/gemm_lt_config.h"
#include "backends/cuda/ops/gemm_search.h"
#include "backends/cuda/ops/gemm_skinny.h"
#include "backends/cuda/ops/gemm_row_tuning.h"
#include "backends/cuda/ops/l2_flush.h"

#define KILN_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                     \
    const cublasStatus_t kiln_st_ = (expr);                                                \
    if (kiln_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                    \
      ::kiln::throw_error(kiln_st_ == CUBLAS_STATUS_ALLOC_FAILED ? ::kiln::ErrorCode::kOutOfMemory \
                                                                 : ::kiln::ErrorCode::kInternal, \
                          __FILE__, ":", __LINE__, ": ", #expr, " failed: ",               \
                          cublasLtGetStatusName(kiln_st_), " (", cublasLtGetStatusString(kiln_st_), ")"); \
  } while (0)

namespace kiln::cuda {
namespace {

constexpr int kMaxTactics = 8;  // KILN_CUDA_TACTICS overrides (tuning experiments)

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kFP8E4M3: return CUDA_R_8F_E4M3;
    case DType::kI8: return CUDA_R_8I;
    case DType::kI32: return CUDA_R_32I;
    default: throw_error(ErrorCode::kUnsupported, "cuda gemm: dtype ", dtype_name(t));
  }
}

struct Plan {
  GemmShape shape;
  int64_t m = 0;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatrixLayout_t d = nullptr;  // D when its type differs from C's (E4M3 output; C bf16), else null
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  // Tactics past the heuristic's: the skinny GEMM's configurations (gemm_skinny.h),
  // tactic algos.size() + i running own[i].
  std::vector<int> own;
  bool forced = false;  // KILN_CUDA_SKINNY_GEMM=force when the plan was made: never timed
  int chosen = 0;
  std::vector<Gemm::TacticTime> times;  // the timings that chose `chosen` (none: the heuristic's first)
  bool integer = false;  // int8 operands: alpha and beta are int32
  // The types the plan's descriptors were made with (for cublasLtMatmulAlgoInit).
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale_t = CUDA_R_32F, ab_t = CUDA_R_16BF, c_t = CUDA_R_16BF, d_t = CUDA_R_16BF;
  bool fp8_fast = false;     // an FP8 plan made with fast accumulation (part of its cache key)
  bool cached = false;       // chosen from the tactic cache: never timed
  bool searched = false;     // a search has added its candidates (or found none)
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

using Key = std::pair<GemmShape, int64_t>;  // shape, m

// KILN_CUDA_SKINNY_GEMM: "1" offers the skinny GEMM's split-k configurations
// (gemm_skinny.h) as tactics of 16-bit plans of at most kSkinnyMaxRows rows, kept only where
// timed faster; "force" runs its configuration with the most splits wherever it applies
// (tests; never timed); unset, empty or "0" leaves them out: the default, since on the H200
// it beat cuBLASLt only at 16-32 rows of a few shapes, by <= 8%, and no decode step or
// encoder forward got faster with it (bench/RESULTS.md, 2026-11-30 session 11). Read when
// a plan is made, so a test can set it per Gemm.
enum class SkinnyMode : uint8_t { kOff, kTactics, kForce };
SkinnyMode skinny_mode() {
  const char* v = std::getenv("KILN_CUDA_SKINNY_GEMM");
  if (!v || !*v || std::string(v) == "0") return SkinnyMode::kOff;
  if (std::string(v) == "1") return SkinnyMode::kTactics;
  if (std::string(v) == "force") return SkinnyMode::kForce;
  throw_error(ErrorCode::kInvalidArgument, "KILN_CUDA_SKINNY_GEMM='", v,
              "' (expected 0, the default: cuBLASLt only; 1: the skinny GEMM's configurations timed beside "
              "cuBLASLt's at <= 128 rows; or force: the skinny GEMM wherever it applies)");
}

// Times every algorithm of plan p (run(t) enqueues tactic t; before(), when given, is
// enqueued ahead of every run, outside the timed span) and keeps the fastest, or with
// keep_first > 0 the heuristic's first unless another is faster by more than that fraction.
// count: the tactics to time (the heuristic's, then p.own's while the call can run them).
template <typename Run>
std::vector<Gemm::TacticTime> time_tactics(Plan& p, int count, cudaStream_t s, int reps, Run run,
                                           const std::function<void()>& before = {}, float keep_first = 0) {
  std::vector<Gemm::TacticTime> times;
  cudaEvent_t ev[2];
  KILN_CUDA_CHECK(cudaEventCreate(&ev[0]));
  KILN_CUDA_CHECK(cudaEventCreate(&ev[1]));
  for (int t = 0; t < count; ++t) {
    if (before) before();
    run(t);  // warm-up
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      if (before) before();
      KILN_CUDA_CHECK(cudaEventRecord(ev[0], s));
      run(t);
      KILN_CUDA_CHECK(cudaEventRecord(ev[1], s));
      KILN_CUDA_CHECK(cudaEventSynchronize(ev[1]));
      float v = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&v, ev[0], ev[1]));
      ms.push_back(v);
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    times.push_back({t, ms[ms.size() / 2]});
  }
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  p.chosen = std::min_element(times.begin(), times.end(), [](auto& a, auto& b) { return a.ms < b.ms; })->tactic;
  if (keep_first > 0 && times[0].ms <= times[size_t(p.chosen)].ms * (1.0f + keep_first)) p.chosen = 0;
  p.times = times;
  return times;
}

const char* gemm_kind(const GemmShape& s) {
  return s.in == int(DType::kFP8E4M3) ? "fp8 gemm" : s.in == int(DType::kI8) ? "int8 gemm" : "gemm";
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<Key, std::unique_ptr<Plan>> plans;
  bool row_buckets = false;  // Gemm::set_row_buckets
  static constexpr int64_t kRowBucketMax = int64_t(1) << 16;
  bool fp8_fast_accum = [] {
    const char* e = std::getenv("KILN_CUDA_FP8_FAST_ACCUM");
    return e && std::string(e) == "1";
  }();
  GemmRowTuning row_tuning{Gemm::tuning_enabled() && Gemm::row_tuning_from_env()};
  // Read to empty L2 between timed runs at decode row counts: allocated by the first
  // timing inside a scope, freed when the outermost scope closes (no memory held while
  // serving). Null when the allocation failed: then the runs are timed without it.
  void* flush = nullptr;
  size_t flush_bytes = 0;
  bool flush_tried = false;
  // Gemm::set_search / KILN_CUDA_GEMM_SEARCH, and the tactic cache (gemm_search.h; made by
  // the first plan when a path is set, KILN_CUDA_TACTIC_CACHE or set_tactic_cache).
  bool search = gemm_search_from_value(std::getenv("KILN_CUDA_GEMM_SEARCH"));
  std::string cache_path = [] {
    const char* e = std::getenv("KILN_CUDA_TACTIC_CACHE");
    return std::string(e ? e : "");
  }();
  std::unique_ptr<GemmTacticCache> cache;
  static constexpr int kSearchKeep = 8;  // the searched configurations timed beside the heuristic's

  // Operands x, w in `in`; y and bias in `out`; y rows ldy elements apart (0: n). FP8
  // plans take the first caller's scale pointers before the heuristic runs (as NVIDIA's
  // FP8 sample orders it); each call sets its own.
  Plan& plan(DType in, DType out, int64_t m, int64_t n, int64_t k, bool bias, const float* scales = nullptr,
             int64_t ldy = 0) {
    if (ldy == 0) ldy = n;
    const GemmShape shape{int(in), int(out), n, k, bias, ldy};
    auto& slot = plans[Key{shape, m}];
    if (slot) return *slot;
    auto p = std::make_unique<Plan>();
    p->shape = shape;
    p->m = m;
    // E4M3 output: cuBLASLt pairs an FP8 D with a bf16 C (and bias).
    const bool fp8_out = out == DType::kFP8E4M3;
    const cudaDataType_t ti = cuda_type(in), t = fp8_out ? CUDA_R_16BF : cuda_type(out);
    // INT8 (IMMA): exact int32 accumulation, int32 alpha/beta and output.
    p->integer = in == DType::kI8;
    p->compute = p->integer ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F;
    p->scale_t = p->integer ? CUDA_R_32I : CUDA_R_32F;
    p->ab_t = ti;
    p->c_t = t;
    p->d_t = fp8_out ? cuda_type(out) : t;
    p->fp8_fast = in == DType::kFP8E4M3 && fp8_fast_accum;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, p->compute, p->scale_t));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
    }
    if (scales) set_scales(p->op, scales, fp8_out);  // per-tensor f32 scales (the default scale mode)
    if (in == DType::kFP8E4M3) {
      const int8_t fast = fp8_fast_accum ? 1 : 0;
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    }
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ti, uint64_t(k), uint64_t(n), k));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ti, uint64_t(k), uint64_t(m), k));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, t, uint64_t(n), uint64_t(m), ldy));
    if (fp8_out) KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->d, cuda_type(out), uint64_t(n), uint64_t(m), ldy));
    // Row buckets: a row count between powers of two runs the algorithms of the power of
    // two above it (each checked for this m), so the changing step sizes of a server
    // (mixed decode + prefill-chunk steps) reuse that plan instead of querying the
    // heuristic at every new size.
    if (row_buckets && m > 1 && m < kRowBucketMax && (m & (m - 1)) != 0 && !p->integer && in != DType::kFP8E4M3) {
      int64_t mb = 1;
      while (mb < m) mb *= 2;
      const Plan& base = plan(in, out, mb, n, k, bias, scales, ldy);
      for (size_t i = 0; i < base.algos.size(); ++i) {
        cublasLtMatmulHeuristicResult_t r{};
        if (cublasLtMatmulAlgoCheck(handle, p->op, p->a, p->b, p->c, p->d ? p->d : p->c, &base.algos[i].algo, &r) !=
                CUBLAS_STATUS_SUCCESS ||
            r.workspaceSize > workspace_bytes)
          continue;
        if (int(i) == base.chosen) p->chosen = int(p->algos.size());
        p->algos.push_back(r);
      }
      if (!p->algos.empty()) {
        slot = std::move(p);
        return *slot;
      }
      p->chosen = 0;
    }
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes, sizeof(workspace_bytes)));
    static const int max_tactics = [] {
      const char* e = std::getenv("KILN_CUDA_TACTICS");
      return e && std::atoi(e) > 0 ? std::min(std::atoi(e), 64) : kMaxTactics;
    }();
    p->algos.resize(size_t(max_tactics));
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->d ? p->d : p->c, pref,
                                                             max_tactics, p->algos.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    KILN_CUBLAS_CHECK(st);
    KILN_THROW_IF(found == 0, kUnsupported, "cuda gemm: cuBLASLt offers no algorithm for ", dtype_name(in), " x ",
                  dtype_name(in), " -> ", dtype_name(out), " m=", m, " n=", n, " k=", k);
    p->algos.resize(size_t(found));
    from_cache(*p);
    const SkinnyMode skinny = in == DType::kBF16 || in == DType::kF16 ? skinny_mode() : SkinnyMode::kOff;
    if (skinny != SkinnyMode::kOff && out == in && m <= kSkinnyMaxRows) {
      // Timed: the configurations worth it; forced: any that leaves no split without k.
      for (int c = 0; c < kSkinnyConfigs; ++c)
        if (skinny == SkinnyMode::kForce ? kSkinnyConfigList[c].splits <= (k + 63) / 64 : gemm_skinny_config_useful(c, k))
          p->own.push_back(c);
      if (skinny == SkinnyMode::kForce && !p->own.empty()) {
        p->chosen = int(p->algos.size() + p->own.size()) - 1;
        p->forced = true;
        p->cached = false;
      }
    }
    slot = std::move(p);
    return *slot;
  }

  // The tactic cache, made at first use (null without a path).
  GemmTacticCache* tactic_cache() {
    if (cache || cache_path.empty()) return cache.get();
    cache = std::make_unique<GemmTacticCache>(cache_path, gemm_tactic_device());
    log_info("cuda: GEMM tactic cache '", cache_path, "': ", cache->size(), " choices for this device");
    return cache.get();
  }

  // Whether the algorithm with config c is valid for plan p; its heuristic-result form in *r.
  bool make_algo(const Plan& p, const GemmAlgoConfig& c, cublasLtMatmulHeuristicResult_t* r) {
    cublasLtMatmulAlgo_t a{};
    if (cublasLtMatmulAlgoInit(handle, p.compute, p.scale_t, p.ab_t, p.ab_t, p.c_t, p.d_t, c.id, &a) !=
            CUBLAS_STATUS_SUCCESS ||
        !set_configs(a, c))
      return false;
    return check_algo(p, a, r);
  }
  bool check_algo(const Plan& p, const cublasLtMatmulAlgo_t& a, cublasLtMatmulHeuristicResult_t* r) {
    *r = {};
    if (cublasLtMatmulAlgoCheck(handle, p.op, p.a, p.b, p.c, p.d ? p.d : p.c, &a, r) != CUBLAS_STATUS_SUCCESS ||
        r->workspaceSize > workspace_bytes)
      return false;
    r->algo = a;
    return true;
  }

  // A new plan takes the cache's choice for its key when cuBLASLt still accepts it: chosen
  // without timing, now and inside decode steps.
  void from_cache(Plan& p) {
    GemmTacticCache* tc = tactic_cache();
    if (!tc) return;
    const std::string key = gemm_cache_key(p.shape, p.m, p.fp8_fast);
    const auto e = tc->find(key);
    if (!e) return;
    cublasLtMatmulHeuristicResult_t r{};
    if (!make_algo(p, e->algo, &r)) {
      log_info("cuda: GEMM tactic cache: cuBLASLt no longer accepts ", e->algo.str(), " for ", key, "; timing anew");
      return;
    }
    p.chosen = -1;
    for (size_t i = 0; i < p.algos.size() && p.chosen < 0; ++i)
      if (config_of(p.algos[i].algo) == e->algo) p.chosen = int(i);
    if (p.chosen < 0) {
      p.chosen = int(p.algos.size());
      p.algos.push_back(r);
    }
    p.cached = true;
    p.searched = true;
    row_tuning.mark_timed(p.shape, p.m);
    log_debug("cuda: ", key, ": ", e->algo.str(), " from the tactic cache (", e->us, " us)");
  }

  // After timing: the cache keeps plan p's choice (not a skinny GEMM's: those are not cuBLASLt's).
  void remember(const Plan& p) {
    GemmTacticCache* tc = tactic_cache();
    if (!tc || p.chosen >= int(p.algos.size()) || size_t(p.chosen) >= p.times.size()) return;
    tc->put(gemm_cache_key(p.shape, p.m, p.fp8_fast), {config_of(p.algos[size_t(p.chosen)].algo),
                                                       double(p.times[size_t(p.chosen)].ms) * 1000.0});
  }

  // With the search on, adds to p.algos (after the heuristic's) the kSearchKeep fastest of
  // cuBLASLt's other configurations for p, by a quick timing on the caller's operands
  // (run(t) enqueues tactic t; no L2 flush; 2 calls each after a warm-up), for the regular
  // timing to choose among. Screened: every algorithm id and tile the check accepts (its
  // first accepted stages and cluster shape, custom option 0); then the 6 best with every
  // custom option and cluster shape, and the 3 best with 2-4 k splits.
  template <typename Run>
  void search_candidates(Plan& p, cudaStream_t s, Run&& run) {
    if (!search || p.searched || p.forced) return;
    p.searched = true;
    const auto t0 = std::chrono::steady_clock::now();
    const size_t heur = p.algos.size();
    std::vector<GemmAlgoConfig> seen;
    for (auto& r : p.algos) seen.push_back(config_of(r.algo));
    auto add = [&](const cublasLtMatmulAlgo_t& a) {
      const GemmAlgoConfig c = config_of(a);
      if (std::find(seen.begin(), seen.end(), c) != seen.end()) return false;
      cublasLtMatmulHeuristicResult_t r{};
      if (!check_algo(p, a, &r)) return false;
      seen.push_back(c);
      p.algos.push_back(r);
      return true;
    };
    cudaEvent_t ev[2];
    KILN_CUDA_CHECK(cudaEventCreate(&ev[0]));
    KILN_CUDA_CHECK(cudaEventCreate(&ev[1]));
    std::vector<std::pair<float, size_t>> quick;  // (us, index into p.algos)
    auto time_from = [&](size_t first) {
      for (size_t t = first; t < p.algos.size(); ++t) {
        float us = INFINITY;
        try {
          run(int(t));
          KILN_CUDA_CHECK(cudaEventRecord(ev[0], s));
          run(int(t));
          run(int(t));
          KILN_CUDA_CHECK(cudaEventRecord(ev[1], s));
          KILN_CUDA_CHECK(cudaEventSynchronize(ev[1]));
          float ms = 0;
          KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
          us = ms * 500.0f;
        } catch (const Error&) {
          KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // a launch cuBLASLt refused: not a candidate
        }
        quick.push_back({us, t});
      }
    };
    int ids[256];
    int nids = 0;
    KILN_CUBLAS_CHECK(cublasLtMatmulAlgoGetIds(handle, p.compute, p.scale_t, p.ab_t, p.ab_t, p.c_t, p.d_t, 256, ids, &nids));
    const uint16_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO,  CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1, CUBLASLT_CLUSTER_SHAPE_4x1x1,
                                 CUBLASLT_CLUSTER_SHAPE_1x4x1};
    for (int i = 0; i < nids; ++i) {
      cublasLtMatmulAlgo_t base{};
      if (cublasLtMatmulAlgoInit(handle, p.compute, p.scale_t, p.ab_t, p.ab_t, p.c_t, p.d_t, ids[i], &base) !=
          CUBLAS_STATUS_SUCCESS)
        continue;
      auto tiles = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_TILE_IDS);
      auto stages = cap_list<uint32_t>(base, CUBLASLT_ALGO_CAP_STAGES_IDS);
      if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
      stages.insert(stages.begin(), CUBLASLT_MATMUL_STAGES_UNDEFINED);
      for (uint32_t tile : tiles) {
        bool done = false;
        for (size_t st = 0; st < stages.size() && !done; ++st)
          for (size_t c = 0; c < 2 && !done; ++c) {  // AUTO, then 1x1x1
            cublasLtMatmulAlgo_t a = base;
            set_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tile);
            set_config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages[st]);
            set_config(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, clusters[c]);
            done = add(a);
          }
      }
    }
    const size_t screened = p.algos.size() - heur;
    time_from(heur);
    auto best = [&](size_t n) {
      std::sort(quick.begin(), quick.end());
      std::vector<cublasLtMatmulAlgo_t> out;
      for (size_t i = 0; i < quick.size() && out.size() < n; ++i)
        if (std::isfinite(quick[i].first)) out.push_back(p.algos[quick[i].second].algo);
      return out;
    };
    size_t first = p.algos.size();
    for (const cublasLtMatmulAlgo_t& b : best(6)) {
      const int custom_max = std::min(cap_value<int32_t>(b, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX), 15);
      for (int custom = 0; custom <= custom_max; ++custom)
        for (uint16_t cl : clusters) {
          cublasLtMatmulAlgo_t a = b;
          set_config(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, uint32_t(custom));
          set_config(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cl);
          add(a);
        }
    }
    time_from(first);
    first = p.algos.size();
    for (const cublasLtMatmulAlgo_t& b : best(3)) {
      if (!cap_value<int32_t>(b, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT)) continue;
      const uint32_t mask = cap_value<uint32_t>(b, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK);
      for (int32_t splits : {2, 3, 4}) {
        if (p.shape.k / splits < 512) continue;
        for (uint32_t red : {uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE), uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                             uint32_t(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
          if (!(mask & red)) continue;
          cublasLtMatmulAlgo_t a = b;
          set_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splits);
          set_config(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, red);
          add(a);
        }
      }
    }
    time_from(first);
    const size_t candidates = p.algos.size() - heur;
    std::vector<cublasLtMatmulHeuristicResult_t> keep;
    std::sort(quick.begin(), quick.end());
    for (size_t i = 0; i < quick.size() && keep.size() < size_t(kSearchKeep); ++i)
      if (std::isfinite(quick[i].first)) keep.push_back(p.algos[quick[i].second]);
    p.algos.resize(heur);
    p.algos.insert(p.algos.end(), keep.begin(), keep.end());
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    log_debug("cuda: ", gemm_kind(p.shape), " m=", p.m, " n=", p.shape.n, " k=", p.shape.k, ": searched ", candidates,
              " configurations (", screened, " algorithm x tile) in ",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), " ms; ",
              keep.size(), " timed beside the heuristic's ", heur, quick.empty() ? "" : ", the quickest ",
              quick.empty() ? "" : config_of(keep.empty() ? p.algos[0].algo : keep[0].algo).str());
  }

  // Times plan p's tactics (the search's too, when on) and keeps the choice in the cache.
  template <typename Run>
  std::vector<Gemm::TacticTime> search_and_time(Plan& p, bool own_ok, cudaStream_t s, int reps, Run&& run,
                                                const std::function<void()>& before = {}, float keep_first = 0) {
    search_candidates(p, s, run);
    auto times = time_tactics(p, tactic_count(p, own_ok), s, reps, run, before, keep_first);
    remember(p);
    return times;
  }

  static void set_scales(cublasLtMatmulDesc_t op, const float* scales, bool d_scale) {
    const float* a_scale = scales;
    const float* b_scale = scales + 4;  // 16 bytes further: see gemm.h
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    if (d_scale) {
      const float* dp = scales + 8;
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &dp, sizeof(dp)));
    }
  }

  // scales: {A = w scale, B = x scale} on the device, for FP8 plans only.
  // residual: C of D = A·B + beta·C with beta = 1 (same layout as y), else C = y, beta = 0.
  // Returns whether act was applied (a skinny tactic ran; cuBLASLt's ignore it).
  bool matmul(Plan& p, int tactic, const void* x, const void* w, const void* bias, void* y, cudaStream_t s,
              const float* scales = nullptr, const void* residual = nullptr, GemvEpilogue act = GemvEpilogue::kNone) {
    if (tactic >= int(p.algos.size())) {
      const auto t = DType(p.shape.in);
      if (gemm_skinny_supported(t, p.m, p.shape.n, p.shape.k, p.shape.ldy, x, w, bias, y, residual)) {
        launch_gemm_skinny(p.own[size_t(tactic) - p.algos.size()], t, x, w, bias, residual, y, p.m, p.shape.n,
                           p.shape.k, p.shape.ldy, s, act);
        return true;
      }
      tactic = 0;  // this call's operands do not suit it (alignment): cuBLASLt's first
    }
    if (bias)
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (scales) set_scales(p.op, scales, p.d != nullptr);
    const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    const int32_t ialpha = 1, ibeta = 0;
    const void* a = p.integer ? static_cast<const void*>(&ialpha) : &alpha;
    const void* b = p.integer ? static_cast<const void*>(&ibeta) : &beta;
    // cuBLASLt treats C == D as in place, which needs C's type to be D's: an E4M3 D (bf16 C)
    // passes no C, as beta is 0 there.
    const void* c = residual ? residual : p.d ? nullptr : y;
    KILN_CUBLAS_CHECK(cublasLtMatmul(handle, p.op, a, w, p.a, x, p.b, b, c, p.c, y, p.d ? p.d : p.c,
                                     &p.algos[size_t(tactic)].algo, workspace, workspace_bytes, s));
    return false;
  }

  // How many of p's tactics a call can run: the heuristic's, and the skinny GEMM's when the
  // call's operands suit it (own_ok).
  static int tactic_count(const Plan& p, bool own_ok) { return int(p.algos.size() + (own_ok ? p.own.size() : 0)); }

  // Inside a RowTuningScope, times plan p at its row count when its (shape, m) is met
  // there first (gemm.h). can_time: false when the call cannot be rerun (a residual that
  // aliases y); the (shape, m) is then decided untimed. own_ok: as tactic_count's.
  template <typename Run>
  void time_at_rows(Plan& p, cudaStream_t s, bool can_time, bool own_ok, Run run) {
    if (!row_tuning.pending(p.shape, p.m)) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KILN_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
    if (!row_tuning.claim(p.shape, p.m, can_time && capture == cudaStreamCaptureStatusNone)) return;
    const auto t0 = std::chrono::steady_clock::now();
    if (!flush_tried) alloc_flush(s);
    auto times = search_and_time(
        p, own_ok, s, Gemm::kRowTuneReps, run, [&] { if (flush) launch_l2_flush(flush, flush_bytes, s); },
        Gemm::kRowTuneMargin);
    row_tuning.add_cost(p.m, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    Gemm::log_tactics(gemm_kind(p.shape), p.m, p.shape.n, p.shape.k, times);
    log_debug("cuda: ", gemm_kind(p.shape), " m=", p.m, " n=", p.shape.n, " k=", p.shape.k, " keeps #", p.chosen,
              " of ", p.algos.size() + p.own.size());
  }

  void alloc_flush(cudaStream_t s) {
    flush_tried = true;
    int dev = 0, l2 = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&dev));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    const size_t bytes = std::max<size_t>(size_t(l2) * 2, size_t(1) << 20);
    if (cudaMalloc(&flush, bytes) != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is not sticky
      flush = nullptr;
      log_info("cuda: no ", bytes >> 20, " MiB free to empty L2 between GEMM timings: timed without");
      return;
    }
    flush_bytes = bytes;
    KILN_CUDA_CHECK(cudaMemsetAsync(flush, 0, bytes, s));  // l2_flush.h wants it zeroed
  }
  void free_flush() {
    if (flush) cudaFree(flush);  // waits for the timing runs that read it
    flush = nullptr;
    flush_bytes = 0;
    flush_tried = false;
  }
};

std::string gemm_tactic_device() {
  int dev = 0, sms = 0;
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return str_cat(prop.name, " (", sms, " SMs), cuBLASLt ", cublasLtGetVersion());
}

Gemm::Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  KILN_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace_bytes = workspace_bytes;
  KILN_CUDA_CHECK(cudaMalloc(&impl_->workspace, workspace_bytes));
}

Gemm::~Gemm() {
  impl_->free_flush();
  impl_->plans.clear();
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

bool Gemm::run(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
               int64_t k, cudaStream_t s, int64_t ldy, const void* residual, GemvEpilogue act) {
  KILN_THROW_IF(act == GemvEpilogue::kSwiGlu || (act != GemvEpilogue::kNone && residual), kInternal,
                "cuda gemm: an activation epilogue with a residual or SwiGLU");
  if (m == 0 || n == 0) return true;
  KILN_THROW_IF(ldy != 0 && ldy < n, kInternal, "cuda gemm: ldy ", ldy, " < n ", n);
  Plan& p = impl_->plan(dtype, dtype, m, n, k, bias != nullptr, nullptr, ldy);
  if (!p.forced && impl_->row_tuning.pending(p.shape, m)) {
    const bool own_ok = !p.own.empty() && gemm_skinny_supported(dtype, m, n, k, ldy, x, w, bias, y, residual);
    impl_->time_at_rows(p, s, residual != y, own_ok,
                        [&](int t) { impl_->matmul(p, t, x, w, bias, y, s, nullptr, residual, act); });
  }
  return impl_->matmul(p, p.chosen, x, w, bias, y, s, nullptr, residual, act);
}

void Gemm::run_fp8(const void* x, const void* w, const float* scales, const void* bias, void* y, int64_t m, int64_t n,
                   int64_t k, cudaStream_t s) {
  KILN_THROW_IF(k % 16 != 0, kInternal, "cuda fp8 gemm: k=", k, " is not a multiple of 16");
  if (m == 0 || n == 0) return;
  Plan& p = impl_->plan(DType::kFP8E4M3, DType::kBF16, m, n, k, bias != nullptr, scales);
  impl_->time_at_rows(p, s, true, false, [&](int t) { impl_->matmul(p, t, x, w, bias, y, s, scales); });
  impl_->matmul(p, p.chosen, x, w, bias, y, s, scales);
}

void Gemm::run_fp8_e4m3(const void* x, const void* w, const float* scales, void* y, int64_t m, int64_t n, int64_t k,
                        cudaStream_t s) {
  KILN_THROW_IF(k % 16 != 0 || n % 16 != 0, kInternal, "cuda fp8 gemm: n=", n, " k=", k, " are not multiples of 16");
  if (m == 0 || n == 0) return;
  Plan& p = impl_->plan(DType::kFP8E4M3, DType::kFP8E4M3, m, n, k, false, scales);
  impl_->time_at_rows(p, s, true, false, [&](int t) { impl_->matmul(p, t, x, w, nullptr, y, s, scales); });
  impl_->matmul(p, p.chosen, x, w, nullptr, y, s, scales);
}

void Gemm::set_fp8_fast_accum(bool on) {
  // Plans are keyed by shape: drop the FP8 ones (and what was decided for them) so the
  // next call builds them anew.
  for (auto it = impl_->plans.begin(); it != impl_->plans.end();)
    it = it->first.first.in == int(DType::kFP8E4M3) ? impl_->plans.erase(it) : std::next(it);
  impl_->row_tuning.forget_in(int(DType::kFP8E4M3));
  impl_->fp8_fast_accum = on;
}

bool Gemm::tuning_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CUDA_TUNE");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

bool Gemm::row_tuning_from_env() {
  static const bool on = gemm_row_tuning_from_value(std::getenv("KILN_CUDA_GEMM_TUNE_M"));
  return on;
}

bool Gemm::row_tuning_every_step() {
  static const bool all = gemm_tune_rows_from_value(std::getenv("KILN_CUDA_GEMM_TUNE_M")) == GemmTuneRows::kAll;
  return all && tuning_enabled();
}

void Gemm::set_row_tuning(bool on) { impl_->row_tuning.set_enabled(on); }

void Gemm::set_row_buckets(bool on) { impl_->row_buckets = on; }

void Gemm::set_search(bool on) { impl_->search = on; }

void Gemm::set_tactic_cache(const std::string& path) {
  impl_->cache.reset();
  impl_->cache_path = path;
}

Gemm::RowTuningScope::RowTuningScope(Gemm& g) : g_(g) { g_.impl_->row_tuning.open(); }

Gemm::RowTuningScope::~RowTuningScope() {
  Impl& im = *g_.impl_;
  const auto timed = im.row_tuning.close();
  if (im.row_tuning.is_open()) return;
  im.free_flush();
  for (auto& t : timed)
    log_info("cuda: GEMM tactics timed at m=", t.m, " (a step's first run at that row count): ", t.shapes,
             t.shapes == 1 ? " shape in " : " shapes in ", t.ms, " ms (KILN_CUDA_GEMM_TUNE_M=0 skips this)");
}

Gemm::Choice Gemm::choice(DType in, DType out, int64_t m, int64_t n, int64_t k, bool bias, int64_t ldy) const {
  auto it = impl_->plans.find(Key{GemmShape{int(in), int(out), n, k, bias, ldy == 0 ? n : ldy}, m});
  if (it == impl_->plans.end()) return {};
  const Plan& p = *it->second;
  return {p.chosen, int(p.algos.size() + p.own.size()), p.times,
          p.chosen < int(p.algos.size()) ? config_of(p.algos[size_t(p.chosen)].algo).str() : std::string(), p.cached};
}

void Gemm::log_tactics(const char* what, int64_t m, int64_t n, int64_t k, const std::vector<TacticTime>& times) {
  std::string line;
  for (auto& t : times) line += str_cat(" #", t.tactic, "=", t.ms * 1000.0f, "us");
  log_debug("cuda: ", what, " m=", m, " n=", n, " k=", k, " tactics:", line);
}

void Gemm::run_int8(const void* x, const void* w, int32_t* y, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  KILN_THROW_IF(k % 4 != 0 || n % 4 != 0, kInternal, "cuda int8 gemm: n=", n, " k=", k, " are not multiples of 4");
  if (m == 0 || n == 0) return;
  Plan& p = impl_->plan(DType::kI8, DType::kI32, m, n, k, false);
  impl_->time_at_rows(p, s, true, false, [&](int t) { impl_->matmul(p, t, x, w, nullptr, y, s); });
  impl_->matmul(p, p.chosen, x, w, nullptr, y, s);
}


std::vector<Gemm::TacticTime> Gemm::tune(DType dtype, const void* x, const void* w, const void* bias, void* y,
                                         int64_t m, int64_t n, int64_t k, cudaStream_t s, int reps) {
  if (m == 0 || n == 0) return {};
  Plan& p = impl_->plan(dtype, dtype, m, n, k, bias != nullptr);
  impl_->row_tuning.mark_timed(p.shape, m);
  if (p.forced || p.cached) return {};  // stays on the forced or the cache's configuration
  const bool own_ok = !p.own.empty() && gemm_skinny_supported(dtype, m, n, k, 0, x, w, bias, y, nullptr);
  return impl_->search_and_time(p, own_ok, s, reps, [&](int t) { impl_->matmul(p, t, x, w, bias, y, s); });
}

std::vector<Gemm::TacticTime> Gemm::tune_fp8(const void* x, const void* w, const float* scales, const void* bias,
                                             void* y, int64_t m, int64_t n, int64_t k, cudaStream_t s, int reps) {
  if (m == 0 || n == 0) return {};
  Plan& p = impl_->plan(DType::kFP8E4M3, DType::kBF16, m, n, k, bias != nullptr, scales);
  impl_->row_tuning.mark_timed(p.shape, m);
  if (p.cached) return {};
  return impl_->search_and_time(p, false, s, reps, [&](int t) { impl_->matmul(p, t, x, w, bias, y, s, scales); });
}

std::vector<Gemm::TacticTime> Gemm::tune_int8(const void* x, const void* w, int32_t* y, int64_t m, int64_t n,
                                              int64_t k, cudaStream_t s, int reps) {
  if (m == 0 || n == 0) return {};
  Plan& p = impl_->plan(DType::kI8, DType::kI32, m, n, k, false);
  impl_->row_tuning.mark_timed(p.shape, m);
  if (p.cached) return {};
  return impl_->search_and_time(p, false, s, reps, [&](int t) { impl_->matmul(p, t, x, w, nullptr, y, s); });
}

}  // namespace kiln::cuda

// cuBLASLt GEMMs (see gemm.h); host code only, so g++ compiles it. Row-major y = x·wᵀ is computed as the column-major
// product yᵀ[n,m] = (w as k×n)ᵀ · (x as k×m), so no operand is transposed in memory.
// One plan (descriptor, layouts, the heuristic's algorithms) is cached per shape.
#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>

#include "backends/cuda/cuda_check.h"
#include "core/log.h"
#include "core/status.h"
#include "backends/cuda/ops/gemm.h"

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
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  int chosen = 0;
  bool integer = false;  // int8 operands: alpha and beta are int32
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

using Key = std::tuple<int, int, int64_t, int64_t, int64_t, bool, int64_t>;  // in dtype, out dtype, m, n, k, bias, ldy

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<Key, std::unique_ptr<Plan>> plans;
  bool fp8_fast_accum = [] {
    const char* e = std::getenv("KILN_CUDA_FP8_FAST_ACCUM");
    return e && std::string(e) == "1";
  }();

  // Operands x, w in `in`; y and bias in `out`; y rows ldy elements apart (0: n). FP8
  // plans take the first caller's scale pointers before the heuristic runs (as NVIDIA's
  // FP8 sample orders it); each call sets its own.
  Plan& plan(DType in, DType out, int64_t m, int64_t n, int64_t k, bool bias, const float* scales = nullptr,
             int64_t ldy = 0) {
    if (ldy == 0) ldy = n;
    auto& slot = plans[Key{int(in), int(out), m, n, k, bias, ldy}];
    if (slot) return *slot;
    auto p = std::make_unique<Plan>();
    const cudaDataType_t ti = cuda_type(in), t = cuda_type(out);
    // INT8 (IMMA): exact int32 accumulation, int32 alpha/beta and output.
    p->integer = in == DType::kI8;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, p->integer ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                               p->integer ? CUDA_R_32I : CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
    }
    if (scales) set_scales(p->op, scales);  // per-tensor f32 scales (the default scale mode)
    if (in == DType::kFP8E4M3) {
      const int8_t fast = fp8_fast_accum ? 1 : 0;
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    }
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, ti, uint64_t(k), uint64_t(n), k));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, ti, uint64_t(k), uint64_t(m), k));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, t, uint64_t(n), uint64_t(m), ldy));
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
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->c, pref,
                                                             max_tactics, p->algos.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    KILN_CUBLAS_CHECK(st);
    KILN_THROW_IF(found == 0, kUnsupported, "cuda gemm: cuBLASLt offers no algorithm for ", dtype_name(in), " x ",
                  dtype_name(in), " -> ", dtype_name(out), " m=", m, " n=", n, " k=", k);
    p->algos.resize(size_t(found));
    slot = std::move(p);
    return *slot;
  }

  static void set_scales(cublasLtMatmulDesc_t op, const float* scales) {
    const float* a_scale = scales;
    const float* b_scale = scales + 4;  // 16 bytes further: see gemm.h
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  }

  // scales: {A = w scale, B = x scale} on the device, for FP8 plans only.
  // residual: C of D = A·B + beta·C with beta = 1 (same layout as y), else C = y, beta = 0.
  void matmul(Plan& p, int tactic, const void* x, const void* w, const void* bias, void* y, cudaStream_t s,
              const float* scales = nullptr, const void* residual = nullptr) {
    if (bias)
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (scales) set_scales(p.op, scales);
    const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    const int32_t ialpha = 1, ibeta = 0;
    const void* a = p.integer ? static_cast<const void*>(&ialpha) : &alpha;
    const void* b = p.integer ? static_cast<const void*>(&ibeta) : &beta;
    const void* c = residual ? residual : y;
    KILN_CUBLAS_CHECK(cublasLtMatmul(handle, p.op, a, w, p.a, x, p.b, b, c, p.c, y, p.c,
                                     &p.algos[size_t(tactic)].algo, workspace, workspace_bytes, s));
  }
};

Gemm::Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  KILN_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace_bytes = workspace_bytes;
  KILN_CUDA_CHECK(cudaMalloc(&impl_->workspace, workspace_bytes));
}

Gemm::~Gemm() {
  impl_->plans.clear();
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

void Gemm::run(DType dtype, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t n,
               int64_t k, cudaStream_t s, int64_t ldy, const void* residual) {
  if (m == 0 || n == 0) return;
  KILN_THROW_IF(ldy != 0 && ldy < n, kInternal, "cuda gemm: ldy ", ldy, " < n ", n);
  Plan& p = impl_->plan(dtype, dtype, m, n, k, bias != nullptr, nullptr, ldy);
  impl_->matmul(p, p.chosen, x, w, bias, y, s, nullptr, residual);
}

void Gemm::run_fp8(const void* x, const void* w, const float* scales, const void* bias, void* y, int64_t m, int64_t n,
                   int64_t k, cudaStream_t s) {
  KILN_THROW_IF(k % 16 != 0, kInternal, "cuda fp8 gemm: k=", k, " is not a multiple of 16");
  if (m == 0 || n == 0) return;
  Plan& p = impl_->plan(DType::kFP8E4M3, DType::kBF16, m, n, k, bias != nullptr, scales);
  impl_->matmul(p, p.chosen, x, w, bias, y, s, scales);
}

void Gemm::set_fp8_fast_accum(bool on) {
  // Plans are keyed by shape: drop the FP8 ones so the next call builds them anew.
  for (auto it = impl_->plans.begin(); it != impl_->plans.end();)
    it = std::get<0>(it->first) == int(DType::kFP8E4M3) ? impl_->plans.erase(it) : std::next(it);
  impl_->fp8_fast_accum = on;
}

bool Gemm::tuning_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_CUDA_TUNE");
    return !(e && std::string(e) == "0");
  }();
  return on;
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
  impl_->matmul(p, p.chosen, x, w, nullptr, y, s);
}

namespace {

// Times every algorithm of plan p (run(t) enqueues tactic t) and keeps the fastest.
template <typename Run>
std::vector<Gemm::TacticTime> time_tactics(Plan& p, cudaStream_t s, int reps, Run run) {
  std::vector<Gemm::TacticTime> times;
  cudaEvent_t ev[2];
  KILN_CUDA_CHECK(cudaEventCreate(&ev[0]));
  KILN_CUDA_CHECK(cudaEventCreate(&ev[1]));
  for (int t = 0; t < int(p.algos.size()); ++t) {
    run(t);  // warm-up
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
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
  return times;
}

}  // namespace

std::vector<Gemm::TacticTime> Gemm::tune(DType dtype, const void* x, const void* w, const void* bias, void* y,
                                         int64_t m, int64_t n, int64_t k, cudaStream_t s, int reps) {
  if (m == 0 || n == 0) return {};
  Plan& p = impl_->plan(dtype, dtype, m, n, k, bias != nullptr);
  return time_tactics(p, s, reps, [&](int t) { impl_->matmul(p, t, x, w, bias, y, s); });
}

std::vector<Gemm::TacticTime> Gemm::tune_fp8(const void* x, const void* w, const float* scales, const void* bias,
                                             void* y, int64_t m, int64_t n, int64_t k, cudaStream_t s, int reps) {
  if (m == 0 || n == 0) return {};
  Plan& p = impl_->plan(DType::kFP8E4M3, DType::kBF16, m, n, k, bias != nullptr, scales);
  return time_tactics(p, s, reps, [&](int t) { impl_->matmul(p, t, x, w, bias, y, s, scales); });
}

std::vector<Gemm::TacticTime> Gemm::tune_int8(const void* x, const void* w, int32_t* y, int64_t m, int64_t n,
                                              int64_t k, cudaStream_t s, int reps) {
  if (m == 0 || n == 0) return {};
  Plan& p = impl_->plan(DType::kI8, DType::kI32, m, n, k, false);
  return time_tactics(p, s, reps, [&](int t) { impl_->matmul(p, t, x, w, nullptr, y, s); });
}

}  // namespace kiln::cuda

// cuBLASLt algorithm configurations as GemmAlgoConfig (gemm_search.h): read from and
// written to a cublasLtMatmulAlgo_t, and an algorithm's capability lists. Shared by the
// GEMM plans (gemm.cpp) and bench/cuda_gemm_search_bench.cpp.
#pragma once

#include <cublasLt.h>

#include <vector>

#include "backends/cuda/ops/gemm_search.h"

namespace kiln::cuda {

// The configuration attributes of an algorithm, and an algorithm from them (false when
// cuBLASLt refuses any of them).
inline GemmAlgoConfig config_of(const cublasLtMatmulAlgo_t& a) {
  GemmAlgoConfig c;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof c.id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.splitk, sizeof c.splitk, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.reduction, sizeof c.reduction, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swizzle, sizeof c.swizzle, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner, sizeof c.inner, &w);
  return c;
}

template <typename T>
inline bool set_config(cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr, T v) {
  return cublasLtMatmulAlgoConfigSetAttribute(&a, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS;
}

inline bool set_configs(cublasLtMatmulAlgo_t& a, const GemmAlgoConfig& c) {
  return set_config(a, CUBLASLT_ALGO_CONFIG_TILE_ID, c.tile) && set_config(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, c.stages) &&
         set_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, c.splitk) &&
         set_config(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, c.reduction) &&
         set_config(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, c.swizzle) &&
         set_config(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, c.custom) &&
         set_config(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, c.cluster) &&
         set_config(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, c.inner);
}

template <typename T>
inline std::vector<T> cap_list(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) return {};
  std::vector<T> v(bytes / sizeof(T));
  if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, v.data(), bytes, &bytes) != CUBLAS_STATUS_SUCCESS) return {};
  return v;
}

template <typename T>
inline T cap_value(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoCapAttributes_t attr) {
  T v{};
  size_t w = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&a, attr, &v, sizeof v, &w) != CUBLAS_STATUS_SUCCESS) return T{};
  return v;
}

}  // namespace kiln::cuda

// Where a norm op keeps its affine parameters: the gamma / beta input slots and the
// index of its normalized output (the fused Add+Norm ops also output the residual sum).
// Scale folding (SmoothQuant in w8a8.cpp, AWQ in awq.cpp) rewrites gamma and beta.
#pragma once

#include <string>

namespace kiln::quant {

struct NormSlots {
  int gamma = -1, beta = -1, out = -1;  // -1: none (not a norm op, or no beta)
};

inline NormSlots norm_slots(const std::string& op) {
  if (op == "RMSNorm") return {1, -1, 0};
  if (op == "LayerNorm") return {1, 2, 0};
  if (op == "AddRMSNorm") return {2, -1, 1};
  if (op == "AddLayerNorm") return {2, 3, 1};
  return {};
}

}  // namespace kiln::quant

// Rotary position embedding in HF Llama's rotate_half (NeoX) convention, in place. cos/sin
// are computed the way HF does in f32 (θ = float(pos) · inv_freq[i], then cosf/sinf) once
// per token and shared by all heads; the rotation is x1·c − x2·s, x2·c + x1·s without FMA
// contraction (built with -ffp-contract=off), matching PyTorch's separate mul/add. Tested in tests/backends/cpu/rope_test.cpp.
#include <cmath>
#include <memory>

#include "backends/cpu/kernels/kernels.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace kiln::cpu {

void rope(float* x, int64_t t, int64_t heads, int64_t head_dim, int64_t rotary_dim,
          const int32_t* positions, const float* inv_freq) {
  KILN_THROW_IF(rotary_dim % 2 != 0 || rotary_dim > head_dim || rotary_dim <= 0, kInvalidArgument,
                "rope: rotary_dim must be even and in (0, head_dim], got rotary_dim=", rotary_dim,
                " head_dim=", head_dim);
  const int64_t half = rotary_dim / 2;
  ThreadPool::global().parallel_for(t, [&](int64_t b, int64_t e, int) {
    std::unique_ptr<float[]> cs(new float[2 * half]);
    for (int64_t tok = b; tok < e; ++tok) {
      const float pos = float(positions[tok]);
      for (int64_t i = 0; i < half; ++i) {
        const float theta = pos * inv_freq[i];
        cs[i] = std::cos(theta);
        cs[half + i] = std::sin(theta);
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (tok * heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          const float c = cs[i], s = cs[half + i];
          v[i] = x1 * c - x2 * s;
          v[i + half] = x2 * c + x1 * s;
        }
      }
    }
  }, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, heads * head_dim)));
}

}  // namespace kiln::cpu
